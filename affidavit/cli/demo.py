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
        if args.keep:
            where = tmp / "demo.db"
            raise Terminated(f"where a call under way stood is recorded in {where}, kept") from None
        raise Terminated("the demo's temporary config and journal are removed") from None
    finally:
        if not args.keep:
            for p in sorted(tmp.iterdir(), reverse=True):
                p.unlink()
            tmp.rmdir()
    return 0
