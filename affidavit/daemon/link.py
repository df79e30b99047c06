"""One client connection as the daemon's transport saw it: what counts as delivered.

hypercorn swallows a failed write (the client is gone, so it just closes), so the ASGI ``send``
cannot tell the app whether its answer left.  The daemon therefore hands hypercorn this thin
wrapper of the accepted trio stream, which notes the two facts delivery is judged by:

* ``hung_up``: the client closed its end (end of stream or a broken read).  Seen while a call
  runs, it means nobody is waiting: a call that has not reached its dispatch gate is withdrawn
  (CALLER_CANCELLED, not_attempted); one that has runs on to its result.
* ``broken``: a write failed or was interrupted part-way.

**Delivered** means: no hang-up had been seen when the answer was written, and every byte of it
(status line, headers, body) was accepted by the kernel into the connected client's socket
(``send_all`` returned).  On a Unix socket that is the peer's own receive queue, so a client that
is alive reads it; one killed after that instant loses it unread -- HTTP/1.1 has no receipt to
say otherwise -- and the stored result stays fetchable (``GET /v1/invocations/{id}/result``).
Anything less -- hang-up first, or a failed write -- is RESULT_DELIVERY_FAILED, and the result
is fetched, never re-run (seed, "A result delivery error must not repeat execution").

One answer, one write: the app corks the link around an answer (``cork`` / ``uncork``), so the
head and body hypercorn writes apart leave in one ``send``.  Each write to a Unix socket wakes
the reader; two per answer measurably cost throughput (tests/benchmarks/service_overhead.py).
"""

from __future__ import annotations

from collections.abc import Callable

import trio

__all__ = ["Link"]

_GONE = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class Link:
    """Duck-types ``trio.SocketStream`` for ``hypercorn.trio.tcp_server.TCPServer``."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self.socket = stream.socket
        self.hung_up = trio.Event()
        self.broken = False
        self.on_hang_up: set[Callable[[], object]] = set()
        """Called once, synchronously, when the hang-up is seen (a call's withdrawal): no task
        per request waits for it."""
        self._held: bytearray | None = None

    def cork(self) -> None:
        """Hold writes until ``uncork``."""
        if self._held is None:
            self._held = bytearray()

    async def uncork(self) -> None:
        """Write what was held, in one ``send_all``; ``broken`` says whether it failed."""
        held, self._held = self._held, None
        if held:
            await self._write(bytes(held))

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._held is not None:
            self._held += data
            return
        await self._write(data)

    async def _write(self, data: bytes | bytearray | memoryview) -> None:
        try:
            await self._stream.send_all(data)
        except BaseException:
            # Cancelled part-way counts too: how much left is unknown.
            self.broken = True
            raise

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        try:
            data = await self._stream.receive_some(max_bytes)
        except _GONE:
            self._hang_up()
            raise
        if not data:
            self._hang_up()
        return data

    def _hang_up(self) -> None:
        if self.hung_up.is_set():
            return
        self.hung_up.set()
        for callback in list(self.on_hang_up):
            callback()

    async def send_eof(self) -> None:
        await self.uncork()
        await self._stream.send_eof()

    async def aclose(self) -> None:
        self._hang_up()
        try:
            await self.uncork()  # hypercorn closes right after a `connection: close` answer
        except (*_GONE, trio.BusyResourceError):
            pass
        finally:
            await self._stream.aclose()
