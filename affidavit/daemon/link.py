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
"""

from __future__ import annotations

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

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
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
            self.hung_up.set()
            raise
        if not data:
            self.hung_up.set()
        return data

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def aclose(self) -> None:
        self.hung_up.set()
        await self._stream.aclose()
