"""``affidavit mcp``: the broker as MCP tools on stdin/stdout (docs/mcp.md).

With ``--socket`` or ``$AFFIDAVIT_SOCKET``, a proxy to ``affidavit serve`` that holds no secret
(the recommended deployment); else an embedded broker on ``--config``.  ``--shutdown-grace``
sets how long calls in flight may finish once it stops (the proxy reads no config).  Runs until
the client closes its end or SIGTERM/SIGINT arrives.  Log lines go to stderr -- stdout is the
protocol's -- and name ids, codes and counts, never a secret.  Exit 2 when it cannot start (a
bad config, a journal another process writes), with the reason on stderr; embedded, exit 74
when its stop ran out of its bound because the journal did not answer
(``affidavit.mcp.stop``, docs/mcp.md).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from affidavit.cli import (
    SECRETS_ALWAYS,
    UsageError,
    add_socket_arg,
    config_refusal,
    daemon_socket,
    journal_refusal,
)

__all__ = ["add_commands"]


def add_commands(sub: Any) -> None:
    p = sub.add_parser("mcp", help="serve the broker as MCP tools over stdio")
    p.add_argument(
        "--config", help="config file (embedded; default: $AFFIDAVIT_CONFIG or ./affidavit.toml)"
    )
    add_socket_arg(p)
    p.add_argument(
        "--shutdown-grace",
        metavar="SECONDS",
        help="how long calls in flight may finish after SIGTERM or the end of input (seconds or "
        'a duration like "2m"; default: [service] shutdown_grace embedded, 30 through the '
        "daemon, whose own grace is the daemon's)",
    )
    p.set_defaults(handler=_mcp, holds_secrets=SECRETS_ALWAYS)


def _grace(value: str | None) -> float | None:
    """``--shutdown-grace``: a positive number of seconds or a duration (as ``[service]
    shutdown_grace``); anything else is INVALID_FIELD, named."""
    if value is None:
        return None
    from affidavit.config import parse_duration

    try:
        try:
            seconds: object = float(value)
        except ValueError:
            seconds = value
        return parse_duration(seconds)
    except ValueError as exc:
        raise UsageError(f"--shutdown-grace: {exc}", "INVALID_FIELD") from None


def _mcp(args: argparse.Namespace) -> int:
    import functools
    import logging

    import trio

    socket = daemon_socket(args, "config")
    grace = _grace(args.shutdown_grace)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s affidavit mcp[%(process)d] %(levelname)s %(message)s",
    )
    logging.getLogger("mcp").setLevel(logging.WARNING)
    try:
        from affidavit.mcp import run
        from affidavit.mcp.transport import BoundedLog
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] not in ("mcp", "mcp_types"):
            raise
        raise UsageError(
            "affidavit mcp needs the MCP SDK, an optional part: pip install 'affidavit[mcp]'",
            "DEPENDENCY_MISSING",
        ) from None
    for handler in logging.getLogger().handlers:  # the SDK's lines quote client ids whole
        handler.addFilter(BoundedLog())

    if socket is None:  # embedded: this process runs the calls, as ``serve``'s does
        from affidavit.engine import tune_collector
        from affidavit.heap import keep_freed_buffers

        tune_collector()
        for words in keep_freed_buffers():
            logging.getLogger("affidavit.mcp").warning("heap: %s", words)
    try:
        path, uid = (None, None) if socket is None else (socket.path, socket.uid)
        trio.run(
            functools.partial(
                run, config=args.config, socket=path, grace=grace, daemon_uid=uid, _cli=True
            )
        )
    except Exception as exc:
        if socket is None:
            _embedded_failure(exc)
        raise
    return 0


def _embedded_failure(exc: Exception) -> None:
    from affidavit.config import ConfigError
    from affidavit.journal import JournalError

    if isinstance(exc, ConfigError):
        raise config_refusal(exc) from None
    if isinstance(exc, JournalError):
        raise journal_refusal(exc) from None
    if isinstance(exc, OSError):
        raise UsageError(f"cannot start: {exc.strerror or exc}", "SERVE_FAILED") from None
