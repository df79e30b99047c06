"""``affidavit call``, ``affidavit result`` and ``affidavit init``.

Exit status: 0 when the envelope has no ``error``, 1 when it has one, 2 for usage or config
errors (message on stderr).  Exactly one envelope is printed on stdout as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import trio

from affidavit.cli import UsageError, text_arg
from affidavit.config import ConfigError, config_path, load_config, sample_config

__all__ = ["add_commands", "load_or_usage"]


def add_commands(sub: Any) -> None:
    p = sub.add_parser("call", help="perform one action and print its envelope")
    p.add_argument("action", nargs="?", default="-", help="action JSON file, or - for stdin")
    p.add_argument("--config", help="config file (default: $AFFIDAVIT_CONFIG or ./affidavit.toml)")
    p.add_argument("--timeout", type=float, help="caller timeout in seconds")
    p.set_defaults(handler=_call)

    p = sub.add_parser("result", help="print the stored envelope of an invocation (no re-run)")
    p.add_argument("invocation_id")
    p.add_argument("--config")
    p.set_defaults(handler=_result)

    p = sub.add_parser("init", help="write a commented sample config and an empty journal")
    p.add_argument("--config", help="where to write the config (default: ./affidavit.toml)")
    p.add_argument("--force", action="store_true", help="overwrite an existing config")
    p.set_defaults(handler=_init)


def load_or_usage(path: str | None) -> Any:
    try:
        return load_config(path)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot read config: {exc.strerror}") from None


def _read_action(source: str) -> Any:
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read action {source}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"action {source} is not UTF-8 text") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"action is not valid JSON (line {exc.lineno}, column {exc.colno})"
        ) from None


def _print(envelope: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(envelope, sort_keys=True, indent=2) + "\n")
    sys.stdout.flush()


def _call(args: argparse.Namespace) -> int:
    from affidavit.api.broker import Broker

    # NaN or a negative deadline made trio.fail_after raise after ACTION_ACCEPTED was
    # journaled (a traceback, and a record never closed); it is a usage error before anything.
    if args.timeout is not None and not args.timeout >= 0:
        raise UsageError("--timeout must be a number of seconds >= 0")
    config = load_or_usage(args.config)
    action = _read_action(args.action)

    delivering = False

    async def deliver(envelope: dict[str, Any]) -> None:
        # Delivery is the write to stdout; a closed pipe is RESULT_DELIVERY_FAILED, and the
        # result stays fetchable with `affidavit result ID`.
        nonlocal delivering
        delivering = True
        _print(envelope)

    async def main() -> dict[str, Any]:
        async with Broker.open(config=config) as broker:
            return await broker.call(action, timeout=args.timeout, deliver=deliver)

    envelope = trio.run(main)
    if not delivering:
        # The engine calls ``deliver`` only for a stored remote result; every other envelope
        # (preflight, setup, unknown, busy) is printed here — exactly one envelope either way.
        _print(envelope)
    return 1 if "error" in envelope else 0


def _result(args: argparse.Namespace) -> int:
    from affidavit.api.broker import Broker

    text_arg(args.invocation_id, "the invocation id")
    config = load_or_usage(args.config)

    async def main() -> dict[str, Any] | None:
        async with Broker.open(config=config) as broker:
            return await broker.fetch_result(args.invocation_id)

    envelope = trio.run(main)
    if envelope is None:
        raise UsageError(f"no invocation {args.invocation_id} in {config.journal.path}")
    _print(envelope)
    return 1 if "error" in envelope else 0


def _init(args: argparse.Namespace) -> int:
    from affidavit.journal import Journal

    path = config_path(args.config)
    if path.exists() and not args.force:
        raise UsageError(f"{path} exists; use --force to overwrite")
    path.write_text(sample_config(), encoding="utf-8")
    config = load_or_usage(str(path))

    async def create() -> None:
        async with Journal.open(
            config.journal.path,
            key_file=config.journal.key_file,
            auditor_public_key=config.journal.auditor_public_key,
        ):
            pass

    trio.run(create)
    print(f"wrote {path} and an empty journal at {config.journal.path}")
    return 0
