"""Segment compaction at reclaim (``journal/compact.py``): the bytes of long results that never
committed go back to the filesystem -- a segment no reference names removed, its tail cut, the
gaps punched out -- while every committed result reads back byte-identical and ``verify``
passes; a segment a live writer holds (a result in flight) is never touched; a crash between
any two steps leaves a journal that opens and verifies, and a rerun finishes the job."""

from __future__ import annotations

import gc
import hashlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from affidavit.journal import Journal, JournalReader, ResultStoreFailed, ResultStoreUnknown
from affidavit.journal import compact as compact_mod
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E

from . import segkit as kit
from .helpers import happy


async def _reclaim(db: Path, *, dry_run: bool = False) -> compact_mod.Compaction:
    async with Journal.open(db) as j:
        with trio.fail_after(kit.LIMIT):
            done = await j.reclaim(dry_run=dry_run, segments=True)
    assert done.compacted is not None
    return done.compacted


async def test_reclaim_returns_the_bytes_no_committed_result_names(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    await kit.build(db)
    before = kit.allocated(db)
    names = {p.name for p in kit.segments(db)}

    dry = await _reclaim(db, dry_run=True)
    assert kit.allocated(db) == before and {p.name for p in kit.segments(db)} == names
    assert dry.segments == 2 and dry.removed == 1 and dry.busy == 0
    assert dry.bytes > 3 * 40 * kit.CHUNK * 0.9  # about three interrupted bodies

    done = await _reclaim(db)
    after = kit.allocated(db)
    assert before - after == done.bytes
    assert done.removed == 1 and done.bytes >= dry.bytes * 0.95
    # What is left is about the committed result's spilled chunks, no more.
    assert after < len(kit.DONE) * 1.1
    [left] = kit.segments(db)
    assert os.stat(left).st_size == max(r[4] + r[5] for r in kit.refs(db, "inv-done"))
    kit.check(db)

    again = await _reclaim(db)
    assert again.bytes == 0 and again.removed == 0 and kit.allocated(db) == after
    kit.check(db)


async def test_a_segment_a_live_writer_holds_is_left_alone(tmp_path: Path) -> None:
    """A result in flight -- written, not yet committed, so named by no row -- in a segment of
    a writer still open: a reclaim beside it skips that segment, and the result commits and
    reads back whole."""
    db = tmp_path / "j.db"
    async with Journal.open(db) as live:
        for ev in happy("inv-done"):
            await live.append(ev)
        writer = await kit.put_all(live, "inv-done", kit.DONE)
        with trio.fail_after(kit.LIMIT):
            await writer.drain()
        [segment] = kit.segments(db)
        size = os.stat(segment).st_size

        got = await _reclaim(db)
        assert (got.segments, got.busy, got.removed, got.bytes) == (1, 1, 0, 0)
        assert kit.segments(db) == [segment] and os.stat(segment).st_size == size

        with trio.fail_after(kit.LIMIT):
            await live.commit_result(
                Event(E.RESULT_COMMITTED, "inv-done"),
                summary={"status": 200},
                expect={"body": hashlib.sha256(kit.DONE).hexdigest()},
                writer=writer,
            )
    kit.check(db)


async def test_an_empty_segment_is_left_for_the_writer_that_made_it(tmp_path: Path) -> None:
    """A writer creates its segment, then locks it: an empty one may be in that instant, so it
    is neither removed nor held (nor counted busy) -- its writer would write to a name gone."""
    db = tmp_path / "j.db"
    await kit.build(db)
    empty = Path(f"{db}.results") / ("ab" * 16 + ".seg")
    empty.touch(mode=0o600)
    got = await _reclaim(db)
    assert (got.segments, got.busy, got.removed) == (3, 0, 1)
    assert empty.exists()
    kit.check(db)


async def _commit(j: Journal, writer: object) -> None:
    with trio.fail_after(kit.LIMIT):
        await j.commit_result(
            Event(E.RESULT_COMMITTED, "inv-done"),
            summary={"status": 200},
            expect={"body": hashlib.sha256(kit.DONE).hexdigest()},
            writer=writer,  # type: ignore[arg-type]
        )


async def test_a_failed_segment_stays_held_while_a_result_synced_there_may_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sync fails after a result's bytes were synced: the segment is retired (the next
    result goes to a new one), yet the synced result may still commit -- so its writer keeps
    the segment locked, and a reclaim beside it leaves it alone."""
    db = tmp_path / "j.db"
    fail = kit.fail_a_sync(monkeypatch, armed=False)
    async with Journal.open(db) as live:
        for ev in happy("inv-done"):
            await live.append(ev)
        done = await kit.put_all(live, "inv-done", kit.DONE)
        with trio.fail_after(kit.LIMIT):
            await done.flush()
        fail["next"] = True
        lost = await kit.put_all(live, "inv-lost", kit.body(6))
        with trio.fail_after(kit.LIMIT), pytest.raises(ResultStoreFailed):
            await lost.flush()
        after = await kit.put_all(live, "inv-after", kit.body(6))  # retires the failed one
        with trio.fail_after(kit.LIMIT):
            await after.drain()
        assert len(kit.segments(db)) == 2

        got = await _reclaim(db)
        assert (got.segments, got.busy, got.removed) == (2, 2, 0)
        await _commit(live, done)
    kit.check(db)


SQLITE_IOERR_FSYNC = 10 | (4 << 8)


def _fsync_error() -> sqlite3.OperationalError:
    """What SQLite raises when the -wal's sync failed."""
    exc = sqlite3.OperationalError("disk I/O error")
    exc.sqlite_errorcode = SQLITE_IOERR_FSYNC  # type: ignore[attr-defined]
    return exc


def _sync_fails_at_next_commit(j: Journal) -> None:
    """The journal's next COMMIT raises as one whose -wal sync failed (whether it landed
    unknown: ``CommitUnknown``); the commits after it go through."""
    backend = j.backend
    commit = backend.commit

    def once(conn: object) -> None:
        backend.commit = commit  # type: ignore[method-assign]
        raise _fsync_error()  # (no local names it: this frame, in its traceback, no cycle)

    backend.commit = once  # type: ignore[method-assign]


async def test_a_failed_segment_stays_held_while_a_result_there_may_have_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A result's commit ends ``CommitUnknown`` (its rows, naming its bytes, may be recovered by
    an open after a crash) and its writer is gone with its call; then a sync fails and the
    segment is retired.  No writer keeps it now, yet it stays locked -- a reclaim beside it
    leaves the bytes those rows may name -- until a later commit is written over them."""
    db = tmp_path / "j.db"
    fail = kit.fail_a_sync(monkeypatch, armed=False)
    async with Journal.open(db) as live:
        for ev in happy("inv-done"):
            await live.append(ev)
        done = await kit.put_all(live, "inv-done", kit.DONE)
        with trio.fail_after(kit.LIMIT):
            await done.flush()
        _sync_fails_at_next_commit(live)
        with pytest.raises(ResultStoreUnknown):
            await _commit(live, done)
        del done  # its call ended
        gc.collect()
        fail["next"] = True
        lost = await kit.put_all(live, "inv-lost", kit.body(6))
        with trio.fail_after(kit.LIMIT), pytest.raises(ResultStoreFailed):
            await lost.flush()
        after = await kit.put_all(live, "inv-after", kit.body(6))  # retires the failed one
        with trio.fail_after(kit.LIMIT):
            await after.drain()
        assert len(kit.segments(db)) == 2
        got = await _reclaim(db)
        assert (got.segments, got.busy, got.removed) == (2, 2, 0)

        await live.append(happy("inv-later")[0], barrier=True)  # written over the doubted one
        with trio.fail_after(kit.LIMIT):
            await after.flush()  # its sync round looks at the retired segment again
        # (before the flush returns: the round marks the bytes synced and looks in one step)
        got = await _reclaim(db)
        assert (got.segments, got.busy) == (2, 1)  # the writer's current segment alone
    with JournalReader.open(db) as r:
        assert r.verify().ok
        assert r.read_result("inv-done") is None  # the later commit settled it: never landed


@pytest.mark.parametrize("step", ["locked", "unlinked", "truncated", "punched"])
async def test_a_crash_between_steps_leaves_a_journal_a_rerun_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    clean = tmp_path / "clean" / "j.db"
    clean.parent.mkdir()
    await kit.build(clean)
    await _reclaim(clean)
    target = kit.allocated(clean)

    db = tmp_path / "j.db"
    await kit.build(db)

    class Crash(Exception):
        pass

    def crash(name: str) -> None:
        if name == step:
            raise Crash(name)

    monkeypatch.setattr(compact_mod, "_step", crash)
    with pytest.raises(Crash):
        await _reclaim(db)
    monkeypatch.undo()
    kit.check(db)

    await _reclaim(db)
    kit.check(db)
    assert len(kit.segments(db)) == 1
    assert kit.allocated(db) == target


@pytest.mark.parametrize("kind", ["file", "dangling-link"])
def test_a_segment_path_that_is_not_a_directory_is_refused_not_absent(
    tmp_path: Path, kind: str
) -> None:
    """``<path>.results`` there but not a directory: refused with its own code (none looked at,
    nothing touched) -- not "no segment directory", which only an absent path is."""
    where = tmp_path / "j.db.results"
    assert compact_mod.compact(where, lambda names: iter(()), proven=True).absent
    if kind == "file":
        where.write_bytes(b"not a segment directory")
    else:
        where.symlink_to(tmp_path / "gone")

    def no_read(names: object) -> Iterator[tuple[object, object, object]]:
        raise AssertionError("nothing is read")

    got = compact_mod.compact(where, no_read, proven=True)
    assert got.refused == compact_mod.NOT_A_DIRECTORY == "SEGMENT_DIR_UNUSABLE"
    assert not got.absent and (got.segments, got.bytes) == (0, 0)
    assert os.path.lexists(where)
    message = compact_mod.refusal_message("j.db", got.refused)
    assert "j.db.results is not a directory" in message and "does not exist" not in message
