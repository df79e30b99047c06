"""The connection pool: idle keep-alive connections per (scheme, host, port, proxy, trust) --
the trust being the CA file's content, not its path (``trust.py``): a connection verified under
one content is not reused for a call made once the file holds another.

A pooled connection is reused only if it has stayed silent while idle (``looks_stale``: socket
not readable, TLS buffers empty) and not beyond ``idle_timeout``; either check failing discards
it *before* the dispatch boundary, where that costs nothing (seed: "When a reused connection
breaks, the broker may not know whether the other side received the written data" -- so do not
reuse one that already looks broken).  Only a connection with nothing read past its response
is released here (``exchange.finish``), and the exchange checks once more after the gate.
"""

from __future__ import annotations

import logging
import ssl

import trio

from affidavit.adapters.base import AttemptContext

from .connect import Connection, PoolKey, open_connection, step
from .request import HttpRequest
from .trust import TrustStore
from .urls import Url

__all__ = ["Pool"]

log = logging.getLogger("affidavit.adapters.http")


class Pool:
    def __init__(self, *, max_per_origin: int, idle_timeout: float) -> None:
        self._max_idle = max_per_origin
        self._idle_timeout = idle_timeout
        self._idle: dict[PoolKey, list[Connection]] = {}
        self.trust = TrustStore()
        self._next_id = 0
        self.closed = False

    async def aclose(self) -> None:
        self.closed = True
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for c in conns:
                await trio.aclose_forcefully(c.stream)

    def idle_connections(self) -> int:
        return sum(len(v) for v in self._idle.values())

    async def _trust_key(self, request: HttpRequest, target: Url) -> str | None:
        """The trust part of a pool key for a new call (``PoolKey``): the CA file's digest the
        call was validated with, else what the file holds now.  A file unusable now matches
        no pooled connection; the handshake reports it."""
        if target.scheme != "https" or request.ca_file is None:
            return None
        if request.ca_sha256 is not None:
            return request.ca_sha256
        try:
            return (await self.trust.resolve(request.ca_file)).ca_sha256
        except (OSError, ssl.SSLError):
            return "unusable"

    def _new_id(self) -> str:
        self._next_id += 1
        return f"http-{self._next_id}"

    def release(self, conn: Connection) -> None:
        """Keep ``conn`` for reuse (a closed pool closes it instead, as it does a connection
        whose read was cut: ``Connection.read_cut``)."""
        if self.closed or conn.read_cut:
            conn.socket_stream.socket.close()
            return
        conn.idle_since = trio.current_time()
        idle = self._idle.setdefault(conn.key, [])
        idle.append(conn)
        while len(idle) > self._max_idle:
            old = idle.pop(0)
            old.socket_stream.socket.close()

    async def acquire(
        self, request: HttpRequest, ctx: AttemptContext, hop: int, target: Url
    ) -> tuple[Connection, bool]:
        """A connection to ``target`` and whether it is a reused one."""
        trust = await self._trust_key(request, target)
        key: PoolKey = (target.scheme, target.host, target.port, request.proxy, trust)
        idle = self._idle.get(key, [])
        now = trio.current_time()
        while idle:
            conn = idle.pop()  # most recently used first: least likely to have been closed
            too_old = now - conn.idle_since > self._idle_timeout
            if too_old or conn.looks_stale():
                await trio.aclose_forcefully(conn.stream)
                log.debug("discarded idle connection %s to %s", conn.id, target.origin)
                step(
                    ctx,
                    "stale_connection_discarded",
                    {
                        "hop": hop,
                        "connection": conn.id,
                        "reason": "idle_timeout" if too_old else "readable_while_idle",
                    },
                )
                continue
            origin = target.origin
            step(
                ctx,
                "reuse",
                {
                    "hop": hop,
                    "connection": conn.id,
                    "origin": origin,
                    "requests_before": conn.requests,
                    "peer": conn.peer,
                    "via_proxy": conn.via_proxy,
                },
            )
            log.debug("reusing connection %s to %s", conn.id, origin)
            return conn, True
        conn = await open_connection(
            request, ctx, hop, target, key, trust=self.trust.resolve, new_id=self._new_id
        )
        return conn, False
