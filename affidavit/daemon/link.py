"""One client connection as the daemon's transport saw it: what counts as delivered.

The HTTP driver (``h11server.py``) reads and writes the accepted trio stream through this thin
wrapper, which notes the two facts delivery is judged by:

* ``hung_up``: the client closed its end (end of stream or a broken read) -- or only shut its
  write side (``shutdown(SHUT_WR)``, ``nc -N``): a read cannot tell a half-close from a close,
  so a client keeps its write side open until its answer (docs/deployment.md, "A caller that
  goes away").  Seen while a call runs, it means nobody is waiting: a call that has not
  reached its dispatch gate is withdrawn (CALLER_CANCELLED, not_attempted); one that has runs
  on to its result.  The driver keeps reading while a request is handled so that it is seen.
* ``broken``: a write failed or was interrupted part-way (by the driver's ``WRITE_WAIT`` too:
  a client that does not read its answer).

**Delivered** means: no hang-up had been seen when the answer was written, and every byte of it
(status line, headers, body) was accepted by the kernel into the connected client's socket
(``send_all`` returned).  On a Unix socket that is the peer's own receive queue, so a client that
is alive reads it; one killed after that instant loses it unread -- HTTP/1.1 has no receipt to
say otherwise -- and the stored result stays fetchable (``GET /v1/invocations/{id}/result``).
Anything less -- hang-up first, or a failed or timed-out write -- is RESULT_DELIVERY_FAILED, and
the result is fetched, never re-run (seed, "A result delivery error must not repeat execution").

One answer, one write: the driver hands ``send_all`` the head and body together.  Each write to
a Unix socket wakes the reader; two per answer measurably cost throughput
(tests/benchmarks/service_overhead.py) -- but for a body over ``h11server.JOINED`` (64 KiB),
written after its head instead of copied into one buffer with it.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

__all__ = ["GONE", "Link"]

GONE = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
"""What a read or write on a connection the client has left raises."""


class Link:
    """An accepted ``trio.SocketStream`` that notes hang-ups and failed writes."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self.stream = stream
        """The stream itself, for a connection answered without HTTP (``admission.py``'s
        refusals): what goes through it is not noted."""
        self.socket = stream.socket
        self.hung_up = trio.Event()
        self.broken = False
        self.on_hang_up: set[Callable[[], object]] = set()
        """Called once, synchronously, when the hang-up is seen (a call's withdrawal): no task
        per request waits for it."""

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
        except GONE:
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

    async def aclose(self) -> None:
        self._hang_up()
        await self._stream.aclose()
