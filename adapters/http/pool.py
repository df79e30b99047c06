"""The connection pool: idle keep-alive connections per (scheme, host, port, proxy, trust) --
the trust being the CA file's content, not its path (``trust.py``): a connection verified under
one content is not reused for a call made once the file holds another.

A pooled connection is reused only if it has stayed silent while idle (``looks_stale``: socket
not readable, TLS buffers empty) and not beyond ``idle_timeout``; either check failing discards
it *before* the dispatch boundary, where that costs nothing (seed: "When a reused connection
breaks, the broker may not know whether the other side received the written data" -- so do not
reuse one that already looks broken).  Only a connection with nothing read past its response
is released here (``exchange.finish``), and the exchange checks once more after the gate.

A response's ``Keep-Alive: timeout=N`` (RFC 2068 §19.7.1.1, still sent by Node, Apache) says
the server closes the connection after N idle seconds: reusing it near that moment writes the
request into the server's FIN -- ``unknown`` for a request never processed.  So a connection
released with that hint expires at ``min(idle_timeout, N - max(1, N/10))`` (``idle_limit``),
and one with N <= 1 is not kept at all.
"""

from __future__ import annotations

import logging
import math
import ssl
from collections.abc import Iterable

import trio

from affidavit.adapters.base import AttemptContext

from .connect import Connection, PoolKey, open_connection, step
from .request import HttpRequest
from .trust import TrustStore
from .urls import Url

__all__ = ["Pool", "idle_limit"]

log = logging.getLogger("affidavit.adapters.http")


def _keep_alive_timeout(headers: Iterable[tuple[str, str]]) -> float | None:
    """The smallest ``timeout=N`` of the response's Keep-Alive fields, or None (none, or none
    a non-negative finite number: a malformed hint is no hint)."""
    best: float | None = None
    for name, value in headers:
        if name.lower() != "keep-alive":
            continue
        for param in value.split(","):
            key, eq, raw = param.partition("=")
            if not eq or key.strip().lower() != "timeout":
                continue
            try:
                n = float(raw.strip().strip('"'))
            except ValueError:
                continue
            if math.isfinite(n) and n >= 0 and (best is None or n < best):
                best = n
    return best


def idle_limit(headers: Iterable[tuple[str, str]], idle_timeout: float) -> float | None:
    """How long a connection whose last response had ``headers`` may stay idle and still be
    reused: ``idle_timeout``, shortened by a Keep-Alive hint to leave the server's close a
    margin; None when the hint is too short to reuse it safely (N <= 1)."""
    n = _keep_alive_timeout(headers)
    if n is None:
        return idle_timeout
    if n <= 1:
        return None
    return min(idle_timeout, n - max(1.0, n / 10))


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

    def release(self, conn: Connection, headers: Iterable[tuple[str, str]] = ()) -> None:
        """Keep ``conn`` for reuse (a closed pool closes it instead, as it does a connection
        whose read was cut: ``Connection.read_cut``, or one whose last response's ``headers``
        hint at a close within a second: ``idle_limit``)."""
        limit = idle_limit(headers, self._idle_timeout)
        if self.closed or conn.read_cut or limit is None:
            conn.socket_stream.socket.close()
            return
        conn.idle_since = trio.current_time()
        conn.idle_limit = limit
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
            too_old = now - conn.idle_since > conn.idle_limit
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
