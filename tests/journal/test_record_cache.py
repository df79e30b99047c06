"""``Journal.record`` answers from the writer's projection when that projection is the file's
state, and reads the file whenever it might not be: another writer appended, a batch is in the
writer thread, a batch failed.  Every answer must equal a fresh reader's fold of the file."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.journal import Batch, CommitUnknown, Journal, JournalReader
from affidavit.statemachine import Event, Record
from affidavit.statemachine import EventKind as E

from .helpers import happy, interrupted, until_dispatch

SQLITE_IOERR_FSYNC = 10 | (4 << 8)


def _fresh(path: Path, iid: str) -> Record | None:
    with JournalReader.open(path) as r:
        return r.record(iid, now=0.0)


class ReadCounter:
    """Counts the event reads behind ``record`` (the fallback path) on one journal."""

    def __init__(self, journal: Journal) -> None:
        self.reads = 0
        inner = journal.events

        def counted(invocation_id: str) -> list[Event]:
            self.reads += 1
            return inner(invocation_id)

        journal.events = counted  # type: ignore[method-assign]


@pytest.fixture
def path(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "j.db"


async def test_record_of_what_this_writer_wrote_needs_no_read_and_equals_the_file(
    path: Path,
) -> None:
    async with Journal.open(path) as j:
        reads = ReadCounter(j)
        for ev in happy("a"):
            await j.append(ev)
            assert j.record("a", now=0.0) == _fresh(path, "a")
        for ev in interrupted("b"):
            await j.append(ev, payload={"attrs": ("tuple", "decoded", "as", "list")})
        assert j.record("b", now=0.0) == _fresh(path, "b")
        assert reads.reads == 0
        assert j.record("nobody") is None  # unknown ids still read the file
        assert reads.reads == 1


async def test_tuple_and_mapping_attrs_project_as_a_reader_sees_them(path: Path) -> None:
    # The writer folds the stored (JSON-decoded) attrs, not the caller's objects.
    from types import MappingProxyType

    async with Journal.open(path) as j:
        for ev in until_dispatch("t"):
            await j.append(ev)
        odd = Event(
            E.PROTOCOL_OBSERVED,
            "t",
            MappingProxyType({"protocol": "http", "state": "sent", "facts": {"hops": (1, 2)}}),
        )
        stored = await j.append(odd)
        assert stored.attrs == {"protocol": "http", "state": "sent", "facts": {"hops": [1, 2]}}
        assert j.record("t", now=0.0) == _fresh(path, "t")


async def test_another_writer_appending_makes_record_read_the_file(path: Path) -> None:
    async with Journal.open(path) as mine, Journal.open(path) as other:
        reads = ReadCounter(mine)
        for ev in until_dispatch("x"):
            await mine.append(ev)
        assert mine.record("x", now=0.0) == _fresh(path, "x")
        assert reads.reads == 0
        # A second writer on the same file (as another process would be) extends "x".
        await other.append(Event(E.REQUEST_SENT, "x"))
        got = mine.record("x", now=0.0)
        assert got is not None and got.events == 5
        assert got == _fresh(path, "x")
        assert reads.reads == 1
        # ...and to another invocation: the head moved, so "x" is read again too.
        for ev in until_dispatch("y"):
            await other.append(ev)
        assert mine.record("x", now=0.0) == _fresh(path, "x")
        assert reads.reads == 2
        # The next write of ours reloads its projections from the file and chains on.
        await mine.append(Event(E.REMOTE_RESPONSE_STARTED, "x", {"status": 200}))
        assert mine.record("x", now=0.0) == _fresh(path, "x")
        assert mine.record("x", now=0.0).events == 6  # type: ignore[union-attr]
        assert reads.reads == 2
    with JournalReader.open(path) as r:
        assert r.verify().ok


class HeadCounter:
    """Counts the reads of the journal's last seq (``Journal.head``) on one journal."""

    def __init__(self, journal: Journal) -> None:
        self.heads = 0
        inner = journal.head

        def counted() -> tuple[int, str]:
            self.heads += 1
            return inner()

        journal.head = counted  # type: ignore[method-assign]


OBSERVED = Event(E.PROTOCOL_OBSERVED, "x", {"protocol": "http", "state": "s"})


async def test_the_record_as_committed_after_a_final_barrier_is_that_commits_snapshot(
    path: Path,
) -> None:
    """``record(as_committed=True)`` right after the barrier that made the record final is
    this writer's projection as of that commit, with no read at all: not the events, not the
    journal's last seq.  A row another writer commits later is not in it; a plain ``record``
    reads it."""
    async with Journal.open(path) as mine, Journal.open(path) as other:
        reads, heads = ReadCounter(mine), HeadCounter(mine)
        for ev in interrupted("x"):
            await mine.append(ev, barrier=True)
        got = mine.record("x", now=0.0, as_committed=True)
        assert got is not None and got.final and got == _fresh(path, "x")
        assert (heads.heads, reads.reads) == (0, 0)
        await other.append(OBSERVED)
        kept = mine.record("x", now=0.0, as_committed=True)
        assert kept == got
        assert (heads.heads, reads.reads) == (0, 0)
        fresh = mine.record("x", now=0.0)
        assert fresh is not None and fresh.events == 6 and fresh == _fresh(path, "x")
        assert (heads.heads, reads.reads) == (1, 1)
        # Not folded by this writer: read as any record is.
        assert mine.record("nobody", as_committed=True) is None
        assert reads.reads == 2


async def test_the_record_as_committed_reads_the_head_unless_it_is_final(path: Path) -> None:
    """Before a final barrier another writer may still append to the record (a stale lease's
    ATTEMPT_INTERRUPTED): ``as_committed`` then reads the head as a plain ``record`` does."""
    async with Journal.open(path) as mine, Journal.open(path) as other:
        heads = HeadCounter(mine)
        for ev in until_dispatch("x"):
            await mine.append(ev, barrier=True)
        await other.append(Event(E.ATTEMPT_INTERRUPTED, "x", {"code": "REMOTE_OUTCOME_UNKNOWN"}))
        got = mine.record("x", now=0.0, as_committed=True)
        assert got is not None and got.final and got == _fresh(path, "x")
        assert heads.heads == 1


async def test_the_record_as_committed_reads_the_head_on_a_shared_journal(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a shared journal (PostgreSQL, several brokers at once) the snapshot is not taken:
    the head is read as for any record."""
    async with Journal.open(path) as mine, Journal.open(path) as other:
        for ev in interrupted("x"):
            await mine.append(ev, barrier=True)
        await other.append(OBSERVED)
        heads = HeadCounter(mine)
        monkeypatch.setattr(mine.backend, "shared", True)
        got = mine.record("x", now=0.0, as_committed=True)
        assert got is not None and got.events == 6 and got == _fresh(path, "x")
        assert heads.heads == 1


async def test_the_record_as_committed_after_a_failed_final_barrier_is_the_files(
    path: Path,
) -> None:
    """The final barrier failed (nothing of it committed): its row is never served."""
    async with Journal.open(path) as j:
        reads = ReadCounter(j)
        *first, last = interrupted("x")
        for ev in first:
            await j.append(ev, barrier=True)

        def fail(_: Batch) -> None:
            raise RuntimeError("writer bug in the middle of a batch")

        j.before_commit = fail
        with pytest.raises(Exception, match="writer bug"):
            await j.append(last, barrier=True)
        j.before_commit = None
        got = j.record("x", now=0.0, as_committed=True)
        assert got is not None and not got.final and got == _fresh(path, "x")
        assert reads.reads == 1


async def test_the_record_as_committed_after_a_commit_unknown_is_the_files(path: Path) -> None:
    """The final barrier's COMMIT raised after it landed (its sync failed: ``CommitUnknown``):
    the answer is read from the file, never the writer's projection of a commit unproven."""
    async with Journal.open(path) as j:
        reads = ReadCounter(j)
        *first, last = interrupted("x")
        for ev in first:
            await j.append(ev, barrier=True)
        commit = j.backend.commit

        def landed_then_fails(conn: Any) -> None:
            j.backend.commit = commit  # type: ignore[method-assign]
            commit(conn)
            exc = sqlite3.OperationalError("disk I/O error")
            exc.sqlite_errorcode = SQLITE_IOERR_FSYNC  # type: ignore[attr-defined]
            raise exc

        j.backend.commit = landed_then_fails  # type: ignore[method-assign]
        with pytest.raises(CommitUnknown):
            await j.append(last, barrier=True)
        got = j.record("x", now=0.0, as_committed=True)
        assert got is not None and got == _fresh(path, "x")
        assert reads.reads == 1


async def test_a_batch_in_the_writer_thread_is_not_visible_to_record(path: Path) -> None:
    entered, release = threading.Event(), threading.Event()
    async with Journal.open(path) as j:
        for ev in until_dispatch("z"):
            await j.append(ev)
        before = j.record("z", now=0.0)
        assert before is not None and before.events == 4

        def hold(_: Batch) -> None:  # runs in the writer thread, inside the transaction
            entered.set()
            release.wait(10)

        j.before_commit = hold
        done: list[Any] = []
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:

                async def write() -> None:
                    done.append(await j.append(Event(E.REQUEST_SENT, "z")))

                nursery.start_soon(write)
                try:
                    await trio.to_thread.run_sync(entered.wait, 10)
                    # The projection already holds REQUEST_SENT; the file does not.
                    assert j.record("z", now=0.0) == before == _fresh(path, "z")
                finally:
                    release.set()
        j.before_commit = None
        assert done and j.record("z", now=0.0) == _fresh(path, "z")
        assert j.record("z", now=0.0).events == 5  # type: ignore[union-attr]


async def test_a_failed_batch_leaves_record_equal_to_the_file(path: Path) -> None:
    async with Journal.open(path) as j:
        for ev in until_dispatch("f"):
            await j.append(ev)

        def fail(_: Batch) -> None:
            raise RuntimeError("writer bug in the middle of a batch")

        j.before_commit = fail
        with pytest.raises(Exception, match="writer bug"):
            await j.append(Event(E.REQUEST_SENT, "f"))
        j.before_commit = None
        assert j.record("f", now=0.0) == _fresh(path, "f")
        assert j.record("f", now=0.0).events == 4  # type: ignore[union-attr]
        await j.append(Event(E.REQUEST_SENT, "f"))
        assert j.record("f", now=0.0) == _fresh(path, "f")


async def test_record_from_another_thread_reads_the_file(path: Path) -> None:
    async with Journal.open(path) as j:
        reads = ReadCounter(j)
        for ev in until_dispatch("o"):
            await j.append(ev)
        got = await trio.to_thread.run_sync(lambda: j.record("o", now=0.0))
        assert got == _fresh(path, "o")
        assert reads.reads == 1


async def test_the_owner_of_a_sqlite_journal_answers_record_without_reading_the_head(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon (``owner``) holds the journal's lock exclusively: no other process can append,
    so its writer's last commit is the head and ``record`` reads nothing.  An embedded writer
    shares the file and must still check the head each time."""
    heads = 0
    inner = Journal.head

    def counted(self: Journal) -> tuple[int, str]:
        nonlocal heads
        heads += 1
        return inner(self)

    monkeypatch.setattr(Journal, "head", counted)
    async with Journal.open(path, owner="the daemon") as j:
        assert j.exclusive
        reads = ReadCounter(j)
        for ev in happy("a"):
            await j.append(ev)
            before = heads
            assert j.record("a", now=0.0) == _fresh(path, "a")
            assert heads == before
        assert reads.reads == 0
    async with Journal.open(path) as j:
        assert not j.exclusive
        for ev in until_dispatch("b"):
            await j.append(ev)
        before = heads
        assert j.record("b", now=0.0) == _fresh(path, "b")
        assert heads == before + 1


def _refused_first_rows(iid: str) -> list[tuple[Event, type[Exception]]]:
    """A new id's first row refused by the fold (no call starts interrupted) and by the
    journal's own checks (an observer holding NUL, refused alike on every backend)."""
    from affidavit.journal import JournalError
    from affidavit.statemachine import EvidenceSource, ImpossibleEvent

    nul = Event(
        E.ACTION_ACCEPTED,
        iid,
        dict(happy(iid)[0].attrs),
        source=EvidenceSource.REMOTE_QUERY,
        observer="o\x00bs",
        observer_seq=1,
    )
    return [
        (
            Event(E.ATTEMPT_INTERRUPTED, iid, {"code": "REMOTE_OUTCOME_UNKNOWN", "generation": 1}),
            ImpossibleEvent,
        ),
        (nul, JournalError),
    ]


@pytest.mark.parametrize("batched", [False, True], ids=["append", "post_many"])
@pytest.mark.parametrize("which", [0, 1], ids=["impossible", "journal-error"])
async def test_a_refused_first_row_leaves_no_record_of_its_id(
    path: Path, batched: bool, which: int
) -> None:
    """A refused first row of a new id folded it empty (``Txn.insert``'s load, a batch's
    ``preload``) and that fold stayed cached: ``Journal.record`` answered a record for a call
    never written, where the file (a reader) has none."""
    event, error = _refused_first_rows("new")[which]
    async with Journal.open(path) as j:
        for ev in happy("a"):
            await j.append(ev)
        with pytest.raises(error):
            if batched:
                await (await j.post_many([(event, None)])).wait()
            else:
                await j.append(event)
        assert _fresh(path, "new") is None
        assert j.record("new", now=0.0) is None
        assert j.record("a", now=0.0) == _fresh(path, "a")
