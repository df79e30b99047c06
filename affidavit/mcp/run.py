"""Start ``affidavit mcp``: pick the backend (daemon socket or embedded broker), claim stdio,
serve one connection."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from affidavit.stopping.signals import StopSignals

from .backends import Daemon, Embedded
from .server import DEFAULT_GRACE, new_session_id, serve
from .stop import EmbeddedStop
from .transport import StdioTransport

if TYPE_CHECKING:
    from affidavit.config import Config

__all__ = ["run"]

log = logging.getLogger("affidavit.mcp")


async def run(
    *,
    config: str | None,
    socket: str | None,
    grace: float | None = None,
    daemon_uid: int | None = None,
) -> None:
    """Serve MCP on stdin/stdout until the client leaves or a signal arrives.  ``socket``: a
    proxy to that daemon (whose user is ``daemon_uid``, else ``$AFFIDAVIT_DAEMON_UID``'s);
    else an embedded broker on ``config``.  ``grace`` (``--shutdown-grace``)
    beats the config's ``[service] shutdown_grace``; the proxy reads no config, so without it
    its grace is ``DEFAULT_GRACE``."""
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
    stop = EmbeddedStop(grace, journal.reconnect if journal.url else None)
    with StopSignals(stop.signalled, exit_after=True):  # (the process ends once stopped)
        try:
            with stop.starting:
                await _embedded(loaded, grace, session, stop)
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
