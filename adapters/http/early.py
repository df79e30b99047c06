"""An early final response: what the peer sent while the request body was being written.

RFC 9112 §9.5: "A client sending a message body SHOULD monitor the network connection for an
error response while it is transmitting the request."  Servers (nginx, Go) answer a body they
refuse -- 413, 401, 400 -- at its head and stop reading it; a body larger than the socket
buffers then stalls or breaks the write although a complete, authentic answer waits in the
receive queue.  ``EarlyResponse`` holds those bytes and says whether they are a *complete*
final response, parsed by an h11 connection of its own: the exchange's machine is fed them only
once the write has ended (``exchange._Hop.send_body``) -- after ``send_body`` when the body was
written whole, so the journal's steps keep their order.  Only a complete final response decides
anything; an end of stream is never fed here, so a close-delimited body never counts as one.
"""

from __future__ import annotations

from typing import Final

import h11

__all__ = ["EARLY_BYTES", "EarlyResponse"]

EARLY_BYTES: Final = 64 * 1024
"""The most read while the body is written: an error answer is small; past it the rest waits
for the read after the write, as any response does."""


class EarlyResponse:
    def __init__(self, method: str, unparsed: bytes = b"") -> None:
        """``unparsed``: bytes the exchange's h11 holds and has not parsed yet (the start of a
        response after an interim one read in the expect-continue wait) -- parsed here first,
        not kept (the exchange's h11 has them)."""
        self.data = bytearray()
        self.eof = False
        self.complete = False
        self.unparsable = False
        self.status = 0
        """The final response's status, once its head is parsed."""
        self._h11 = h11.Connection(h11.CLIENT)
        self._h11.send(h11.Request(method=method, target="/", headers=[("Host", "early")]))
        if unparsed:
            self._parse(unparsed)

    @property
    def refusal(self) -> bool:
        """A complete error answer (>= 400): the server does not want the body (RFC 9112
        §9.5).  A complete 2xx/3xx does not stop the write: an origin may answer at the head and
        still read the body to its end."""
        return self.complete and self.status >= 400

    @property
    def done(self) -> bool:
        """Nothing more is worth reading before the write ends."""
        return self.complete or self.unparsable or self.eof or len(self.data) >= EARLY_BYTES

    def add(self, data: bytes) -> None:
        """Bytes read from the connection (``b""``: its end)."""
        if not data:
            self.eof = True
            return
        self.data += data
        self._parse(data)

    def _parse(self, data: bytes) -> None:
        if self.complete or self.unparsable:
            return
        try:
            self._h11.receive_data(data)
            while True:
                event = self._h11.next_event()
                if event is h11.NEED_DATA or event is h11.PAUSED:
                    return
                if isinstance(event, h11.Response):
                    self.status = event.status_code
                elif isinstance(event, h11.EndOfMessage) and self.status:
                    self.complete = True
                    return
        except h11.RemoteProtocolError:
            self.unparsable = True  # the exchange's own h11 says so when it is fed them
