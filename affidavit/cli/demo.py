"""``affidavit demo``: the newcomer's first command.

Starts a scripted HTTP server on 127.0.0.1, writes a throw-away config and journal into a
temporary directory, and runs a handful of calls through the real broker — a success, a
rejection, a connection dropped after dispatch, a caller timeout, and a retry with the same
idempotency key — printing each envelope and one line on why its outcome is what the evidence
says.  No network beyond loopback and no secrets of the user's are needed.

The tour itself (server, config, scenes) is ``affidavit.cli.tour``: it needs trio and h11, which
no other command's parser may pay for (every parser imports this module).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from affidavit.cli import SECRETS_ALWAYS

__all__ = ["add_commands"]


def add_commands(sub: Any) -> None:
    p = sub.add_parser("demo", help="run a scripted tour against a local server (no network)")
    p.add_argument("--keep", action="store_true", help="keep the temporary config and journal")
    p.add_argument("--json", action="store_true", help="print full envelopes as JSON lines")
    p.set_defaults(handler=_demo, holds_secrets=SECRETS_ALWAYS)


def _demo(args: argparse.Namespace) -> int:
    import functools
    import os
    import secrets
    import tempfile

    from affidavit.cli import Terminated
    from affidavit.cli.call import run_journal
    from affidavit.cli.tour import run_demo

    os.environ.setdefault("AFFIDAVIT_DEMO_TOKEN", "demo-" + secrets.token_urlsafe(16))
    tmp = Path(tempfile.mkdtemp(prefix="affidavit-demo-"))
    try:
        # As every command writing a journal: SIGTERM closes the call in flight where it stood
        # (CALLER_CANCELLED) before the process ends, exit 143 -- not killed mid-call.
        run_journal(functools.partial(run_demo, tmp, sys.stdout, as_json=args.json, keep=args.keep))
    except Terminated:
        raise Terminated(_kept(tmp, keep=args.keep)) from None
    finally:
        if not args.keep:
            for p in sorted(tmp.iterdir(), reverse=True):
                p.unlink()
            tmp.rmdir()
    return 0


def _kept(tmp: Path, *, keep: bool) -> str:
    """What a demo SIGTERM stopped says was kept: only what is there -- the journal if the
    broker had opened it (where each call stood, a call under way closed CALLER_CANCELLED:
    ``run_journal``), never that a call was under way (the signal may land before the broker
    opens, or between two calls)."""
    if not keep:
        return "the demo's temporary directory is removed"
    journal = tmp / "demo.db"
    if journal.exists():
        return f"its journal is kept: `affidavit actions --journal {journal}` lists its calls"
    return f"it had not opened its journal; {tmp} is kept"
