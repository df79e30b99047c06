"""A stream's SHA-256 computed beside the event loop: ``OffThreadHash``.

Issue 15: hashing a 50 MiB result's redacted bytes on the event loop's thread was about a
quarter of that thread's work per MiB (~0.8 ms of ~3.4), while the second core waited.
``hashlib`` gives the GIL up while it hashes a buffer of 2 KiB or more, so a large piece hashed
by a worker thread runs while the event loop's thread seals the chunks cut from it and reads the
next piece.  What is hashed, and in which order, does not change: one piece at a time, each
started only once the one before it is done -- the digest is that of the same bytes hashed in
line, and the bytes waiting to be hashed are one piece (bounded by the adapter's largest read),
never a queue.  Every read of the state (``copy``, ``digest``, ``hexdigest``) and every next
``update`` first waits for the piece in flight; the sink awaits ``settled`` before its next
``update``, so that the event loop is not the one kept waiting (other calls' tasks run
meanwhile).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading

import trio
from outcome import Outcome

__all__ = ["OFF_THREAD", "OffThreadHash"]

OFF_THREAD = 256 * 1024
"""Pieces at least this long are hashed on a worker thread; a shorter one in line (a thread's
hand-off costs more than hashing a few KiB, and ``hashlib`` keeps the GIL below 2 KiB)."""


class OffThreadHash:
    """A SHA-256 whose large ``update``s run on a trio worker thread, one at a time, in order."""

    __slots__ = ("_done", "_outcome", "_settled", "_sha")

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self._done: threading.Event | None = None
        self._settled: trio.Event | None = None
        self._outcome: Outcome[None] | None = None

    async def settled(self) -> None:
        """Wait, without blocking the event loop, until no piece is in flight."""
        settled = self._settled
        if settled is not None and not settled.is_set():
            await settled.wait()

    def update(self, data: bytes | memoryview) -> None:
        self._wait()
        if len(data) < OFF_THREAD:
            self._sha.update(data)
            return
        done = self._done = threading.Event()
        settled = self._settled = trio.Event()
        token = trio.lowlevel.current_trio_token()
        sha = self._sha

        def deliver(result: Outcome[None]) -> None:
            self._outcome = result
            done.set()
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(settled.set)

        # ``data`` (immutable bytes, or a view of them) stays referenced by the closure until
        # the worker is done with it.
        trio.lowlevel.start_thread_soon(lambda: sha.update(data), deliver)

    def _wait(self) -> None:
        """Wait for the piece in flight, if any (raising what hashing it raised).  Bounded: one
        piece's hash, run on a thread that needs nothing from this one but the GIL, which this
        wait gives up."""
        done = self._done
        if done is None:
            return
        done.wait()
        self._done = self._settled = None
        result, self._outcome = self._outcome, None
        if result is not None:
            result.unwrap()

    def copy(self) -> hashlib._Hash:
        """A plain ``hashlib`` copy of the state, every piece given so far included."""
        self._wait()
        return self._sha.copy()

    def digest(self) -> bytes:
        self._wait()
        return self._sha.digest()

    def hexdigest(self) -> str:
        self._wait()
        return self._sha.hexdigest()
