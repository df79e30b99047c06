"""Appending, group commit, barriers and reading (issue 3: store, durability barriers)."""

from __future__ import annotations

import contextlib
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import trio
import trio.testing

from affidavit.journal import Batch, JournalError, JournalReader, JournalWriteError
from affidavit.statemachine import Event, ImpossibleEvent, Outcome
from affidavit.statemachine import EventKind as E

from ..helpers import accepted, happy, interrupted, until_dispatch
from .conftest import Place, storage_fault


async def test_append_assigns_monotonic_seq_and_remembers_the_session(place: Place) -> None:
    async with place.open() as j:
        stored = [await j.append(ev) for ev in happy("inv-1")]
        assert [e.seq for e in stored] == list(range(1, 8))
        assert all(e.at is not None for e in stored)
        events = j.events("inv-1")
        assert [e.kind for e in events] == [e.kind for e in happy("inv-1")]
        assert [e.seq for e in events] == [e.seq for e in stored]
    sessions = {r[0] for r in place.rows("SELECT session_id FROM events")}
    assert sessions == {"sess-1"}


async def test_impossible_event_is_refused_and_nothing_is_written(place: Place) -> None:
    async with place.open() as j:
        await j.append(accepted("inv-1"))
        with pytest.raises(ImpossibleEvent):
            await j.append(Event(E.DISPATCH_STARTED, "inv-1"))
        with pytest.raises(ImpossibleEvent):
            await j.append(Event(E.REQUEST_SENT, "never-accepted"))
        assert [e.kind for e in j.events("inv-1")] == [E.ACTION_ACCEPTED]
        assert j.events("never-accepted") == []
        # The projection was not advanced by the refused event: the real next step still fits.
        ev = await j.append(Event(E.PREFLIGHT_VALIDATED, "inv-1"))
        assert ev.seq == 2
        assert j.verify().ok


async def test_attrs_that_are_not_json_are_a_clear_error(place: Place) -> None:
    async with place.open() as j:
        await j.append(accepted("inv-1"))
        with pytest.raises(JournalError, match="not JSON"):
            await j.append(Event(E.PREFLIGHT_VALIDATED, "inv-1", {"blob": b"\x00"}))
        assert len(j.events("inv-1")) == 1


async def test_concurrent_barriers_share_commits(place: Place) -> None:
    commits = 0
    async with place.open() as j:

        def count(_: Batch) -> None:
            nonlocal commits
            commits += 1

        j.before_commit = count

        async def invocation(i: int) -> None:
            for ev in happy(f"inv-{i}"):
                await j.append(ev, barrier=True)

        with trio.fail_after(30):
            async with trio.open_nursery() as n:
                for i in range(64):
                    n.start_soon(invocation, i)
        total = 64 * len(happy("x"))
        assert len({e.seq for i in range(64) for e in j.events(f"inv-{i}")}) == total
        # Group commit: one transaction (one fsync) serves many queued barriers.
        assert commits <= total // 4
        assert j.verify().ok and j.verify().count == total


_IN_FORCE = {
    # What the write connection runs with, as the database reports it: SQLite's PRAGMA
    # synchronous (2 FULL, 1 NORMAL), PostgreSQL's synchronous_commit.
    "sqlite": ("PRAGMA synchronous", {"FULL": 2, "NORMAL": 1}),
    "postgresql": ("SHOW synchronous_commit", {"FULL": "on", "NORMAL": "off"}),
}


async def test_barrier_kinds_are_always_committed_with_full_sync(place: Place) -> None:
    """The durability a transaction commits under is read from the database inside it (the
    ``before_commit`` hook runs on the writer thread, inside it, just before COMMIT) -- not only
    the label ``Batch.synchronous`` that ``begin`` returns, which could say FULL over a
    connection left at NORMAL."""
    probe, expected = _IN_FORCE[place.kind]
    modes: list[tuple[str, object]] = []
    async with place.open() as j:

        def read(batch: Batch) -> None:
            modes.append((batch.synchronous, j.write_connection.execute(probe).fetchone()[0]))

        j.before_commit = read
        full, normal = ("FULL", expected["FULL"]), ("NORMAL", expected["NORMAL"])
        for ev in until_dispatch("inv-1")[:3]:
            await j.append(ev)  # diagnostics-grade: no barrier requested
        assert modes == [normal] * 3
        await j.append(Event(E.DISPATCH_STARTED, "inv-1"), barrier=False)
        assert modes[-1] == full
        await j.append(Event(E.REQUEST_SENT, "inv-1"), barrier=True)
        assert modes[-1] == full
        await j.append(Event(E.REMOTE_RESPONSE_STARTED, "inv-1"))  # and back again
        assert modes[-1] == normal


async def test_around_transaction_wraps_every_transaction_committed_or_not(
    place: Place,
) -> None:
    """The instrumentation hook is entered before BEGIN and left after COMMIT or ROLLBACK, once
    per transaction, committed or failed; ``before_commit`` runs inside it."""
    log: list[tuple[str, int, bool]] = []

    @contextlib.contextmanager
    def around(batch: Batch) -> Iterator[None]:
        log.append(("enter", batch.writes, batch.barrier))
        try:
            yield
        finally:
            log.append(("exit", batch.writes, batch.barrier))

    def disk_error(batch: Batch) -> None:
        log.append(("commit", batch.writes, batch.barrier))
        raise storage_fault(place)

    async with place.open() as j:
        j.around_transaction = around
        await j.append(accepted("inv-1"))
        await j.append(Event(E.PREFLIGHT_VALIDATED, "inv-1"), barrier=True)
        j.before_commit = disk_error
        with pytest.raises(JournalWriteError):
            await j.append(Event(E.CREDENTIAL_AUTHORIZED, "inv-1"), barrier=True)
        j.before_commit = None
        j.around_transaction = None
        await j.append(Event(E.CREDENTIAL_AUTHORIZED, "inv-1"))
        assert len(j.events("inv-1")) == 3
    assert log == [
        ("enter", 1, False),
        ("exit", 1, False),
        ("enter", 1, True),
        ("exit", 1, True),
        ("enter", 1, True),
        ("commit", 1, True),
        ("exit", 1, True),
    ]


async def test_a_barrier_is_readable_by_another_connection_when_append_returns(
    place: Place,
) -> None:
    async with place.open() as j:
        for ev in until_dispatch("inv-1"):
            await j.append(ev, barrier=ev.kind is E.DISPATCH_STARTED)
        kinds = [r[0] for r in place.rows("SELECT kind FROM events ORDER BY seq")]
        assert kinds[-1] == "DISPATCH_STARTED"


async def test_a_cancelled_appender_still_learns_its_queued_barrier_committed(
    place: Place,
) -> None:
    async with place.open() as j:
        for ev in until_dispatch("inv-1")[:3]:
            await j.append(ev)
        result: list[Event] = []
        with trio.CancelScope() as scope:
            scope.cancel()  # already cancelled: the append's wait must not be interruptible
            result.append(await j.append(Event(E.DISPATCH_STARTED, "inv-1")))
        assert result and result[0].seq == 4
        assert j.events("inv-1")[-1].kind is E.DISPATCH_STARTED


async def test_leaving_the_block_drains_queued_appends_and_then_refuses(place: Place) -> None:
    events = happy("inv-1")
    async with place.open() as j:
        await j.append(events[0])
        got: list[Event] = []

        async def late() -> None:
            for ev in events[1:]:
                got.append(await j.append(ev))

        async with trio.open_nursery() as n:
            n.start_soon(late)
    assert len(got) == len(events) - 1
    with pytest.raises(JournalError, match="closed"):
        await j.append(Event(E.PROTOCOL_OBSERVED, "inv-1", {"protocol": "http", "state": "x"}))
    with place.reader() as r:
        assert len(r.events("inv-1")) == len(events)


async def test_reopen_continues_the_chain_and_the_projection(place: Place) -> None:
    async with place.open() as j:
        for ev in interrupted("inv-1"):
            await j.append(ev)
    async with place.open() as j:
        rec = j.record("inv-1")
        assert rec is not None and rec.outcome is Outcome.UNKNOWN
        with pytest.raises(ImpossibleEvent):  # the reopened writer still knows the state
            await j.append(Event(E.PREFLIGHT_VALIDATED, "inv-1"))
        lease = await j.acquire_lease("inv-1", "w1", ttl=60)
        assert lease.generation == 1 and lease.seq == 6
        assert j.verify().ok


async def test_reads_work_from_a_second_process_while_the_writer_runs(place: Place) -> None:
    script = textwrap.dedent(
        f"""
        from affidavit.journal import JournalReader
        with JournalReader.open({place.location!r}) as r:
            rec = r.record("inv-1")
            print(r.verify().count, rec.state, rec.outcome.value)
        """
    )
    async with place.open() as j:
        for ev in interrupted("inv-1"):
            await j.append(ev)
        with trio.fail_after(60):
            proc = await trio.run_process(
                [sys.executable, "-c", script],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        assert proc.returncode == 0, proc.stderr.decode()
        assert proc.stdout.decode().split() == ["5", "interrupted", "unknown"]


def test_read_only_open_needs_no_key_and_refuses_a_missing_journal(place: Place) -> None:
    async def fill() -> None:
        async with place.open() as j:
            for ev in happy("inv-1"):
                await j.append(ev)
            await j.put_result_chunk("inv-1", "body", 0, b"{}")
            await j.commit_result(Event(E.RESULT_COMMITTED, "inv-1"), summary={"status": 201})

    trio.run(fill)
    place.key_file.unlink()
    with place.reader() as r:
        assert r.verify().ok
        assert r.record("inv-1") is not None
        assert len(r.list_actions()) == 1
        with pytest.raises(JournalError, match=r"journal\.key"):
            r.read_result("inv-1")
    with place.reader(key_file=None) as r, pytest.raises(JournalError, match="key"):
        r.read_result("inv-1")
    absent = place.location.rsplit("/", 1)[0] + "/absent"
    with pytest.raises(JournalError, match="no journal"):
        JournalReader.open(absent if place.cluster is None else _no_schema(place))


def _no_schema(place: Place) -> str:
    """A database that exists but holds no journal."""
    assert place.cluster is not None
    return place.cluster.database()


def test_reading_attrs_the_writer_did_not_write(place: Place) -> None:
    """Rows are decoded with the JSON scanner directly; JSON with whitespace still reads, and
    a malformed row raises a JSON error (a ValueError), never the scanner's StopIteration."""
    import json

    from affidavit.journal.rows import decode_attrs

    assert decode_attrs(' {"a": [1, 2]} ') == {"a": [1, 2]}
    assert decode_attrs('{"a":1}') == {"a": 1}
    for bad in ("", "{", '{"a":1} trailing', "nope"):
        with pytest.raises(json.JSONDecodeError):
            decode_attrs(bad)

    async def fill() -> None:
        async with place.open() as j:
            await j.append(accepted("ws"))

    trio.run(fill)
    place.tamper("UPDATE events SET attrs = ' ' || attrs || ' ' WHERE seq = 1")
    with place.reader() as r:
        assert r.events("ws")[0].attrs["session"] == "sess-1"
        assert r.verify().first_bad_seq == 1


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ({"observer_seq": 2**63}, "observer_seq"),
        ({"observer_seq": 2**64 + 1}, "observer_seq"),
        ({"observer_seq": -1}, "observer_seq"),
        ({"at": float("nan")}, "at"),
        ({"at": float("inf")}, "at"),
        ({"at": float("-inf")}, "at"),
        ({"at": 10**400}, "at"),
    ],
)
async def test_an_event_the_database_cannot_store_fails_alone_not_its_batch(
    place: Place, bad: dict[str, Any], said: str
) -> None:
    """An ``observer_seq`` past a 64-bit integer (or negative) or an ``at`` that is no finite
    number is refused by ``Txn.insert`` before its row is queued (``JournalError`` naming the
    field), as an id holding NUL is: the database refusing the row would fail the whole group
    commit, every other caller's write in the same batch with it."""
    async with place.open() as j:
        await j.append(accepted("held"))
        entered, release = threading.Event(), threading.Event()
        batches: list[Batch] = []

        def hold(batch: Batch) -> None:  # the writer thread, inside the first transaction
            batches.append(batch)
            if len(batches) == 1:
                entered.set()
                release.wait(10)

        j.before_commit = hold
        good: list[Event] = []
        refused: list[BaseException] = []

        async def write(event: Event) -> None:
            try:
                good.append(await j.append(event, barrier=True))
            except JournalError as exc:
                refused.append(exc)

        with trio.fail_after(30):
            async with trio.open_nursery() as n:
                n.start_soon(write, Event(E.PREFLIGHT_VALIDATED, "held"))
                await trio.to_thread.run_sync(entered.wait, 10)
                # The writer is held in its first batch: these queue up for the next one.
                for i in range(8):
                    n.start_soon(write, accepted(f"good-{i}"))
                n.start_soon(write, Event(E.ACTION_ACCEPTED, "bad", accepted("bad").attrs, **bad))
                await trio.testing.wait_all_tasks_blocked()
                release.set()
        j.before_commit = None
        assert len(refused) == 1 and said in str(refused[0]), refused
        assert len(good) == 9, refused
        assert [b.writes for b in batches] == [1, 9]  # the bad write rode in the good ones' batch
        assert [e.kind for e in j.events("bad")] == []
        assert all(len(j.events(f"good-{i}")) == 1 for i in range(8))
        assert j.verify().ok


async def test_events_through_a_seq_are_the_records_rows_up_to_it_and_no_later(
    place: Place,
) -> None:
    # An operation's submission is read through its ``accepted_seq``, not the polls after it:
    # the rows up to the seq, by seq, on every backend; another invocation's rows between them
    # are not its; a seq before its first row reads none, and any seq a caller names is an
    # answer (the largest a database stores and past it, below the first), never a driver error.
    async with place.open() as j:
        rows = happy("inv-1")
        mine = [await j.append(ev) for ev in rows[:3]]
        other = await j.append(accepted("inv-2"))
        mine += [await j.append(ev) for ev in rows[3:]]
        through = mine[3].seq
        assert other.seq < through < mine[-1].seq
        read = j.events("inv-1", through=through)
        assert [e.seq for e in read] == [e.seq for e in mine[:4]]
        assert [e.kind for e in read] == [e.kind for e in rows[:4]]
        assert read == j.events("inv-1")[:4]
        assert j.events("inv-1", through=0) == []
        assert j.events("inv-1", through=-(2**70)) == []
        assert [e.seq for e in j.events("inv-1", through=2**70)] == [e.seq for e in mine]
        assert [e.seq for e in j.events("inv-2", through=through)] == [other.seq]
        assert j.events("inv-2", through=other.seq - 1) == []
    with place.reader() as r:
        assert [e.seq for e in r.events("inv-1", through=through)] == [e.seq for e in mine[:4]]
