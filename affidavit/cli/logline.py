"""What loading the config logs while a command runs (its caveats, ``affidavit.config``), shown
as the CLI's other warnings are: ``affidavit: warning: ...``, one line on stderr.

Without a handler of its own such a record reached Python's fallback handler, which printed the
bare message; ``affidavit serve`` and ``affidavit mcp`` set up a log of their own (the root
logger's handlers), and their records go there, in its format, as before.  Other loggers are
left alone: the fallback handler prints a logged exception's traceback, which this line would
drop."""

from __future__ import annotations

import logging
import sys

__all__ = ["show_logged_warnings"]


class _Shown(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return  # the command set up its log: the record propagates there
        try:
            # sys.stderr as it is now: the command's escaping stream (``affidavit.cli``).
            sys.stderr.write(f"affidavit: {record.levelname.lower()}: {record.getMessage()}\n")
        except Exception:
            self.handleError(record)


def show_logged_warnings() -> None:
    """Show the config's logged warnings the CLI's way (once installed, each call after is a
    no-op)."""
    logger = logging.getLogger("affidavit.config")
    if not any(isinstance(h, _Shown) for h in logger.handlers):
        logger.addHandler(_Shown(logging.WARNING))
