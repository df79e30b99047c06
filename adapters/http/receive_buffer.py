"""h11's receive buffer without its copies of a body read taken whole (issue 15).

h11 (0.16) hands a body's bytes out of its buffer with ``maybe_extract_at_most``, which slices
what it returns twice (once to test for emptiness, once to take it) -- two copies of every
body byte, and a 1 MiB read each.  When a reader takes everything the buffer holds (a
``Content-Length`` or chunked body read that ends inside the body: nearly every read of a
large response), this buffer hands over the bytearray itself and starts an empty one: the same
bytes, the same state after (empty, line searches reset), no copy.  Every other case is h11's
own code.  ``client_connection`` installs it; if h11's internals ever differ from what this
relies on, it leaves the stock buffer in place (tests/http/test_receive_buffer.py pins the
events equal to a stock connection's).
"""

from __future__ import annotations

import h11

try:
    from h11._receivebuffer import ReceiveBuffer
except ImportError:  # pragma: no cover - another h11 layout: the stock buffer stays
    ReceiveBuffer = None  # type: ignore[assignment,misc]

__all__ = ["client_connection"]


if ReceiveBuffer is not None:

    class _TakingBuffer(ReceiveBuffer):
        def maybe_extract_at_most(self, count: int) -> bytearray | None:
            data = self._data
            if not data or count < len(data):
                return super().maybe_extract_at_most(count)
            # h11's result here is a copy of the whole buffer, which it then empties.
            self._data = bytearray()
            self._next_line_search = 0
            self._multiple_lines_search = 0
            return data


def _fits(conn: h11.Connection) -> bool:
    buf = getattr(conn, "_receive_buffer", None)
    return (
        ReceiveBuffer is not None
        and type(buf) is ReceiveBuffer
        and not buf
        and all(hasattr(buf, a) for a in ("_data", "_next_line_search", "_multiple_lines_search"))
    )


def client_connection() -> h11.Connection:
    """``h11.Connection(h11.CLIENT)`` whose receive buffer hands a body read over uncopied."""
    conn = h11.Connection(h11.CLIENT)
    if _fits(conn):
        conn._receive_buffer = _TakingBuffer()
    return conn
