"""Shared pieces of the tests of a shared (PostgreSQL) journal that goes away: a daemon on such
a journal, and the database stopped for a while (tests/broker/test_journal_away_*.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import trio

from tests.daemon.kit import DaemonProc, client_env, start_daemon, stop, write_daemon_config
from tests.external import require_module
from tests.postgres import Cluster

from .helpers import TOKEN_ENV, http_target
from .test_journal_away_mid_call import journal_table


@asynccontextmanager
async def database_stopped(pg: Cluster) -> AsyncIterator[None]:
    """PostgreSQL stopped for the block, started again after it."""
    await trio.to_thread.run_sync(pg.stop)
    try:
        yield
    finally:
        await trio.to_thread.run_sync(pg.start)


@asynccontextmanager
async def daemon_on(
    tmp: Path, remote_url: str, pg_url: str, token: str, **target: Any
) -> AsyncIterator[tuple[Path, DaemonProc]]:
    """A daemon process journaling to ``pg_url`` with one target ``api`` at ``remote_url``
    (``target``: overrides of its table): its socket and process, stopped after the block."""
    socket = tmp / "affidavit.sock"
    cfg = write_daemon_config(
        tmp,
        {"api": http_target(remote_url, **target)},
        socket=socket,
        journal=journal_table(tmp, pg_url),
    )
    daemon = await start_daemon(cfg, socket, tmp / "daemon.log", token)
    try:
        yield socket, daemon
    finally:
        stop(daemon)


@asynccontextmanager
async def mcp_on(
    tmp: Path, remote_url: str, pg_url: str, token: str, **target: Any
) -> AsyncIterator[Any]:
    """An embedded ``affidavit mcp`` process journaling to ``pg_url``, target ``api`` at
    ``remote_url`` (``target``: overrides of its table); its log is ``tmp / "mcp.log"``.
    Skipped without the MCP SDK."""
    require_module("mcp", "dev")
    from tests.mcp.kit import connected

    cfg = write_daemon_config(
        tmp,
        {"api": http_target(remote_url, **target)},
        socket=tmp / "unused.sock",
        journal=journal_table(tmp, pg_url),
    )
    env = {**client_env(), TOKEN_ENV: token}
    async with connected(["--config", str(cfg)], env, tmp / "mcp.log") as mcp:
        yield mcp


def clean(text: str, password: str | None, *also: str) -> None:
    """``text`` (a log, stderr, a page, a tool's answer) holds no traceback, no ASGI framework
    error, not the database's password, nor any of ``also``."""
    assert password, "a password to look for"
    for bad in ("Traceback", "Error in ASGI", password, *also):
        assert bad not in text, text


def event_count(pg_url: str, iid: str) -> int:
    """How many events the record holds, read afresh from the journal."""
    from affidavit.journal import JournalReader

    with JournalReader.open(pg_url) as reader:
        return len(reader.events(iid))


def state_of(pg_url: str, iid: str) -> str:
    """The record's state, read afresh from the journal."""
    from affidavit.journal import JournalReader

    with JournalReader.open(pg_url) as reader:
        rec = reader.record(iid)
    assert rec is not None
    return rec.state


@asynccontextmanager
async def mcp_through_daemon(
    tmp: Path, url: str, pg_url: str, token: str, **target: Any
) -> AsyncIterator[Any]:
    """``affidavit mcp --socket`` to a daemon on ``pg_url`` (``daemon_on``); on leaving, the
    daemon is still alive and its log is clean, with its one "cannot be read now" line."""
    from tests.mcp.kit import connected

    async with daemon_on(tmp, url, pg_url, token, **target) as (socket, daemon):
        async with connected(["--socket", str(socket)], client_env(), tmp / "mcp.log") as mcp:
            yield mcp
        assert daemon.proc.poll() is None, daemon.log_text()  # alive until stopped
        log = daemon.log_text()
        clean(log, urlsplit(pg_url).password)
        assert log.count("the journal cannot be read now") == 1, log  # its one line


MCP_MODES: dict[str, Callable[..., Any]] = {"embedded": mcp_on, "daemon": mcp_through_daemon}
"""An MCP server over a journal on ``pg_url``: embedded, or a proxy to a daemon."""
