"""Start ``affidavit mcp``: pick the backend (daemon socket or embedded broker), claim stdio,
serve one connection."""

from __future__ import annotations

import logging

from .backends import Daemon, Embedded
from .server import new_session_id, serve
from .transport import StdioTransport

__all__ = ["run"]

log = logging.getLogger("affidavit.mcp")


async def run(*, config: str | None, socket: str | None) -> None:
    """Serve MCP on stdin/stdout until the client leaves or a signal arrives.  ``socket``: a
    proxy to that daemon; else an embedded broker on ``config``."""
    session = new_session_id()
    if socket is not None:
        async with Daemon.open(socket) as daemon, StdioTransport.claim() as transport:
            log.info("session %s, through the daemon at %s", session, socket)
            await serve(daemon, transport, session)
        return
    async with Embedded.open(config) as embedded, StdioTransport.claim() as transport:
        log.info("session %s, embedded on %s", session, embedded.broker.journal.where)
        service = embedded.broker.config.service
        await serve(embedded, transport, session, service.max_calls, service.shutdown_grace)
