"""Text for a terminal: ``affidavit.text.printable``, the one rule, re-exported for the views."""

from __future__ import annotations

from affidavit.text import printable

__all__ = ["printable"]
