"""The broker's idle view readers (``Broker.view``): read-only ``JournalReader`` s kept open
between views, so a view does not open a connection of its own -- on PostgreSQL a new session
and its set-up queries -- for every record or page a caller asks for.

A reader is taken by one view thread at a time and given back after a clean read, reset to what
a new reader knows (``JournalReader.reset``: no snapshot, key or proof carried into the next
read); one whose read raised (a lost connection, an altered row, anything) or whose view was
abandoned is closed instead.  At most ``keep`` (the returning view's limiter's threads) wait
idle; ``close`` (the broker's) closes them, and a reader given back after it is closed there
and then -- never kept, never used after."""

from __future__ import annotations

import contextlib
import os
import threading

from affidavit.journal import JournalReader

__all__ = ["ViewReaders"]


class ViewReaders:
    """Idle read-only readers of one journal; thread-safe (taken and given back in view
    threads, closed on the event loop)."""

    def __init__(
        self, location: str | os.PathLike[str], key_file: str | os.PathLike[str] | None
    ) -> None:
        self._location = location
        self._key_file = key_file
        self._lock = threading.Lock()
        self._idle: list[JournalReader] = []
        self._closed = False
        self.opened = 0
        """Readers opened so far (each a connection: the pool's measure)."""

    def take(self) -> JournalReader:
        """An idle reader, else a new one (``JournalError`` as ``JournalReader.open`` raises)."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
        reader = JournalReader.open(self._location, key_file=self._key_file)
        with self._lock:
            self.opened += 1
        return reader

    def give_back(self, reader: JournalReader, keep: int) -> None:
        """``reader`` after a clean read: kept for the next view if it resets cleanly, fewer
        than ``keep`` wait and the pool is open; else closed."""
        try:
            reader.reset()
        except Exception:
            self.discard(reader)
            return
        with self._lock:
            if not self._closed and len(self._idle) < keep:
                self._idle.append(reader)
                return
        self.discard(reader)

    @staticmethod
    def discard(reader: JournalReader) -> None:
        with contextlib.suppress(Exception):
            reader.close()

    def idle(self) -> int:
        with self._lock:
            return len(self._idle)

    def close(self) -> None:
        """Every idle reader closed; one given back later is closed then."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for reader in idle:
            self.discard(reader)
