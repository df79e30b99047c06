"""Reading a command's input from fd 0 whatever its blocking mode.

A parent such as node sets O_NONBLOCK on the file description it shares as our fd 0.  Python's
buffered ``read(n)`` / ``readline(n)`` then return what has arrived so far, or None: ``vault
put`` stored a value cut short with exit 0, ``vault init --passphrase-stdin`` set a cut
passphrase, and with nothing arrived yet ``vault put`` and ``call -`` crashed with a traceback.
``InputReader`` reads to the end of input (or the limit) either way: on EAGAIN it waits in
``poll`` for more, as a blocking read would, and it never changes the flag -- the description is
the parent's too, and its other readers and writers rely on the mode it chose.

Linux only, as written and tested: macOS's ``poll`` does not take a terminal (it answers
POLLNVAL at once), so a non-blocking terminal as fd 0 would not be waited on there.
"""

from __future__ import annotations

import os
import select

__all__ = ["InputReader"]

_CHUNK = 64 * 1024


class InputReader:
    """``read(n)`` and ``readline(n)`` with a blocking file's meaning over ``fd``, blocking or
    not: fewer bytes than asked only at the end of input."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def _some(self, n: int) -> bytes:
        """Up to ``n`` bytes, at least one unless the input has ended (b"")."""
        while True:
            try:
                return os.read(self.fd, n)
            except BlockingIOError:
                # Non-blocking and nothing yet: wait for data or the writer's close (POLLHUP,
                # then a read gives b"") without a timeout, as a blocking read waits.
                poller = select.poll()
                poller.register(self.fd, select.POLLIN)
                poller.poll()

    def read(self, n: int) -> bytes:
        """``n`` bytes, or every byte up to the end of input when there are fewer."""
        parts: list[bytes] = []
        left = n
        while left > 0:
            chunk = self._some(min(left, _CHUNK))
            if not chunk:
                break
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)

    def readline(self, n: int) -> bytes:
        """Up to and including the first newline, at most ``n`` bytes, or what there is up to
        the end of input.  Byte by byte: nothing past the line is taken from the input (a
        passphrase line is at most a few KiB)."""
        line = bytearray()
        while len(line) < n:
            byte = self._some(1)
            if not byte:
                break
            line += byte
            if byte == b"\n":
                break
        return bytes(line)
