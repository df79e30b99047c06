"""Start ``affidavit mcp``: pick the backend (daemon socket or embedded broker), claim stdio,
serve one connection."""

from __future__ import annotations

import logging
import signal
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import trio

from affidavit.stopping.signals import NOT_MAIN_THREAD, StopSignals, off_the_main_thread

from .backends import Daemon, Embedded
from .server import DEFAULT_GRACE, new_session_id, serve
from .stop import EmbeddedStop
from .transport import StdioTransport

if TYPE_CHECKING:
    from affidavit.config import Config

__all__ = ["McpError", "run"]

log = logging.getLogger("affidavit.mcp")


class McpError(Exception):
    """``run`` cannot start (the message says why; ``code`` is stable), as the daemon's
    ``DaemonError``."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


async def run(
    *,
    config: str | None,
    socket: str | None,
    grace: float | None = None,
    daemon_uid: int | None = None,
    _cli: bool = False,
) -> None:
    """Serve MCP on stdin/stdout until the client leaves or a signal arrives.  ``socket``: a
    proxy to that daemon (whose user is ``daemon_uid``, else ``$AFFIDAVIT_DAEMON_UID``'s);
    else an embedded broker on ``config``.  ``grace`` (``--shutdown-grace``)
    beats the config's ``[service] shutdown_grace``; the proxy reads no config, so without it
    its grace is ``DEFAULT_GRACE``.

    Embedded, called by a program of its own, SIGTERM and SIGINT are trio's receiver's while
    it runs and the handlers found are put back when it returns; a stop past its bound is
    logged, not an exit.  Only ``affidavit mcp`` (``_cli``: private) makes the process the
    broker's: its own signals' thread, exit 74 past the bound, and a signal once it stopped
    ending the process, 0 (``affidavit.stopping.signals``) -- in a caller's program that would
    end the caller.  Called off the main thread it is refused (``McpError``, ``NOT_MAIN_THREAD``):
    no signal could reach its stop."""
    refused = off_the_main_thread("affidavit.mcp.run")
    if refused is not None:
        raise McpError(refused, NOT_MAIN_THREAD)
    session = new_session_id()
    if socket is not None:
        async with Daemon.open(socket, daemon_uid) as daemon, StdioTransport.claim() as transport:
            log.info("session %s, through the daemon at %s", session, socket)
            await serve(daemon, transport, session, grace=DEFAULT_GRACE if grace is None else grace)
        return
    # The config first: a signal from here on is bounded by its terms (the grace, a shared
    # journal's reconnect), the start-up's recovery included.  (Only here: the proxy reads no
    # config, nor imports it.)
    from affidavit.config import load_config

    loaded = load_config(config)
    journal = loaded.journal
    grace = loaded.service.shutdown_grace if grace is None else grace
    reconnect = journal.reconnect if journal.url else None
    if _cli:
        stop = EmbeddedStop(grace, reconnect)
        with StopSignals(stop.signalled, exit_after=True):  # (the process ends once stopped)
            await _stopped(loaded, grace, session, stop)
        return
    stop = EmbeddedStop(grace, reconnect, None)
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_received, signals, stop)
                await _stopped(loaded, grace, session, stop)
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:  # (the receiver's task raises nothing: the run's)
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


async def _received(signals: AsyncIterator[int], stop: EmbeddedStop) -> None:
    async for signum in signals:
        stop.received(signum)


async def _stopped(config: Config, grace: float, session: str, stop: EmbeddedStop) -> None:
    try:
        with stop.starting:
            await _embedded(config, grace, session, stop)
    finally:
        stop.closed()


async def _embedded(config: Config, grace: float, session: str, stop: EmbeddedStop) -> None:
    async with Embedded.open(config=config) as embedded:
        try:
            stop.opened(embedded)
            async with StdioTransport.claim() as transport:
                log.info("session %s, embedded on %s", session, embedded.broker.journal.where)
                await serve(embedded, transport, session, config.service.max_calls, grace, stop)
        finally:
            # The journal's close, next, is bounded whatever ended the session (an arming that
            # fails is logged: it does not replace the failure that ended it).
            stop.arm_on_the_loop()
