"""What a ``session`` name may be: one definition for every surface that takes one -- an
action's common ``session`` field (``affidavit.protocols.actions.SESSION_FIELD``, published in
the tools' schemas) and the MCP ``list_actions`` tool's argument -- so that whatever names an
action's session also lists its actions.

Printable ASCII, the space included (``"run 1"``): a session travels in journal attrs,
envelopes and query strings, never in a header.  A leaf importing only ``re``: the MCP proxy
loads it, and it loads no broker code (tests/mcp/test_modes.py).
"""

from __future__ import annotations

import re

__all__ = ["MAX_SESSION", "SESSION", "SESSION_CHARS", "SESSION_WORDS"]

SESSION_CHARS = r"[\x20-\x7e]+"
"""The pattern (Python's and ECMA-262's alike) a session name matches whole."""
SESSION = re.compile(SESSION_CHARS)
MAX_SESSION = 255
"""Characters a session name may hold."""
SESSION_WORDS = f"1-{MAX_SESSION} printable ASCII characters"
"""How a refusal says it."""
