"""The ``affidavit`` command line.

Each sub-command lives in its own module exposing ``add_commands(subparsers)``; the module list
below is the only place that names them.  Every handler returns an exit status: 0 success,
1 the action answered with an error envelope (or a check failed), 2 usage or config error
(message on stderr, never a traceback).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

__all__ = ["UsageError", "main", "text_arg"]

COMMAND_MODULES: tuple[str, ...] = (
    "affidavit.cli.call",
    "affidavit.cli.demo",
    "affidavit.cli.diagrams",
    "affidavit.cli.journal",
    "affidavit.cli.operations",
    "affidavit.cli.vault",
)


class UsageError(Exception):
    """A usage or configuration problem: printed on stderr, exit status 2."""


def text_arg(value: str | None, what: str) -> str | None:
    """``value`` if it is valid text.  argv bytes that are not UTF-8 arrive as lone surrogates
    (PEP 383); an identifier or filter holding one is refused here instead of failing with a
    UnicodeEncodeError traceback where SQLite binds it.  The value itself is not echoed."""
    if value is not None:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(f"{what} is not valid UTF-8 text") from None
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="affidavit",
        description="A secrets broker whose every error is backed by durable evidence.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.handler(args)
    except UsageError as exc:
        print(f"affidavit: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`affidavit actions | head`): not our failure to report.
        # Point stdout at /dev/null so the interpreter's final flush cannot raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
