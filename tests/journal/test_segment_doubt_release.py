"""A result writer whose call ended is freed as soon as the call and the journal's threads let
go of it -- by reference counting, never left for a full collection -- so the retired segment
its bytes are in is not kept locked by a writer that can no longer commit
(``SegmentStore._close_if_idle`` looks at ``_Segment.users``, a weak set).  The flake this
answers (``test_segment_compact``, a doubted segment still held, busy 2): the writer thread
still held the request whose ``CommitUnknown`` the test had just caught when the test's
``gc.collect()`` ran; that error's traceback named ``Writer.submit``'s frame, which named the
request (a cycle) and the commit's op (the result writer), so the writer outlived the collect
in the oldest generation and held the segment."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from affidavit.journal import Journal, ResultStoreFailed, ResultStoreUnknown
from affidavit.journal import compact as compact_mod

from . import segkit as kit
from .helpers import happy
from .test_segment_compact import _commit, _sync_fails_at_next_commit


@pytest.fixture
def refcount_only() -> Iterator[None]:
    """No cyclic collection while the test runs: what is freed is freed by its last reference
    going, as it must be here."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def _reclaim(db: Path) -> compact_mod.Compaction:
    async with Journal.open(db) as j:
        with trio.fail_after(kit.LIMIT):
            done = await j.reclaim(segments=True)
    assert done.compacted is not None
    return done.compacted


@pytest.mark.usefixtures("refcount_only")
async def test_a_doubted_segment_is_let_go_with_no_collection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The doubt settled by a later commit, the retired segment goes at the next look -- its
    writer gone without a ``gc.collect()``, though the commit's error was held a moment after
    the answer (as the writer thread's hand-off may hold it)."""
    db = tmp_path / "j.db"
    fail = kit.fail_a_sync(monkeypatch, armed=False)
    async with Journal.open(db) as live:
        for ev in happy("inv-done"):
            await live.append(ev)
        done = await kit.put_all(live, "inv-done", kit.DONE)
        with trio.fail_after(kit.LIMIT):
            await done.flush()
        gone = weakref.ref(done)
        _sync_fails_at_next_commit(live)
        with pytest.raises(ResultStoreUnknown) as unknown:
            await _commit(live, done)
        del done, unknown  # its call ended
        fail["next"] = True
        lost = await kit.put_all(live, "inv-lost", kit.body(6))
        with trio.fail_after(kit.LIMIT), pytest.raises(ResultStoreFailed):
            await lost.flush()
        after = await kit.put_all(live, "inv-after", kit.body(6))  # retires the failed one
        with trio.fail_after(kit.LIMIT):
            await after.drain()
        assert (await _reclaim(db)).busy == 2  # the doubt holds it

        await live.append(happy("inv-later")[0], barrier=True)  # settles the doubt
        assert gone() is None
        with trio.fail_after(kit.LIMIT):
            await after.flush()  # its sync round looks at the retired segment again
        got = await _reclaim(db)
        assert (got.segments, got.busy) == (2, 1)  # the writer's current segment alone


@pytest.mark.usefixtures("refcount_only")
async def test_the_sync_thread_keeps_no_flushed_writer(tmp_path: Path) -> None:
    """A writer flushed, then dropped: the sync thread, waiting for its next round, does not
    keep it (it did until that round, which a quiet journal may never have)."""
    db = tmp_path / "j.db"
    async with Journal.open(db) as live:
        for ev in happy("inv-done"):
            await live.append(ev)
        done = await kit.put_all(live, "inv-done", kit.DONE)
        with trio.fail_after(kit.LIMIT):
            await done.flush()
        gone = weakref.ref(done)
        del done
        with trio.fail_after(kit.LIMIT):  # the round may still be poking the writer
            while gone() is not None:
                await trio.sleep(0.01)
