"""Posted writes: diagnostic events and a result's tail ride along with the next barrier's
transaction (DESIGN, "Durability barriers": "Diagnostic events between barriers may ride along
with the next barrier's transaction; recovery must never depend on them")."""

from __future__ import annotations

import hashlib

import pytest
import trio

from affidavit.journal import Batch, Journal, JournalError, ResultStoreFailed, writer
from affidavit.statemachine import Event, ImpossibleEvent
from affidavit.statemachine import EventKind as E

from ..helpers import happy, until_dispatch
from .conftest import Place, storage_fault

LIMIT = 10


def _count_commits(j: Journal) -> list[int]:
    commits = [0]

    def count(_: Batch) -> None:
        commits[0] += 1

    j.before_commit = count
    return commits


async def test_posted_events_commit_with_the_barrier_that_follows_in_one_transaction(
    place: Place,
) -> None:
    async with place.open() as j:
        commits = _count_commits(j)
        *diagnostic, dispatch = until_dispatch("inv-1")
        with trio.fail_after(LIMIT):
            posted = [await j.post(ev) for ev in diagnostic]
            stored = await j.append(dispatch, barrier=True)
            # Queue order: everything posted before the barrier is committed once it returns.
            assert all(p.finished for p in posted)
            answers = [await p.wait() for p in posted]
        assert commits[0] == 1
        assert [e.seq for e in answers] == [1, 2, 3]
        assert stored.seq == 4
        assert [e.kind for e in j.events("inv-1")] == [e.kind for e in until_dispatch("inv-1")]
        assert j.verify().ok


async def test_several_events_posted_as_one_write_are_each_validated_and_chained(
    place: Place,
) -> None:
    """``post_many``: one queued write, the same rows as separate posts -- a row refused (a
    second ACTION_ACCEPTED) is not written; the write answers with that refusal, and every
    row before it, and the next write's, is stored and chained in order."""
    async with place.open() as j:
        writes: list[int] = []
        j.before_commit = lambda batch: writes.append(batch.writes)
        accepted, validated, authorized, dispatch = until_dispatch("inv-1")
        with trio.fail_after(LIMIT):
            posted = await j.post_many(
                [(accepted, {"action": {"path": "/x"}}), (validated, None), (accepted, None)]
            )
            more = await j.post_many([(authorized, None)])
            stored = await j.append(dispatch, barrier=True)
            with pytest.raises(ImpossibleEvent):
                await posted.wait()
            [auth] = await more.wait()
        assert writes == [3]  # two posted writes and the barrier, one transaction
        assert auth.seq == 3 and stored.seq == 4
        assert [e.kind for e in j.events("inv-1")] == [e.kind for e in until_dispatch("inv-1")]
        assert j.payload(1) == {"action": {"path": "/x"}}
        assert j.verify().ok
        with trio.fail_after(LIMIT), pytest.raises(ValueError, match="barrier"):
            await j.post_many([(Event(E.DISPATCH_STARTED, "inv-1", {"attempt": 1}), None)])


async def test_a_refused_row_stops_the_later_rows_of_its_write_for_that_invocation(
    place: Place,
) -> None:
    """One write's rows are one task's consecutive facts, each presupposing those before it:
    a late binder's ACTION_ACCEPTED, refused because a taker won the record's first event,
    must not let its PREFLIGHT_VALIDATED and CREDENTIAL_AUTHORIZED land in the taker's record
    (they did: each was validated alone against the taker's record).  Its rows for another
    invocation, and another write in the same transaction, are written whole."""
    async with place.open() as j:
        writes: list[int] = []
        j.before_commit = lambda batch: writes.append(batch.writes)
        with trio.fail_after(LIMIT):
            taker = await j.append(until_dispatch("inv-1")[0], barrier=True)
            binder = until_dispatch("inv-1")[:3]
            other = until_dispatch("inv-2")[:3]
            late = await j.post_many(
                [(ev, None) for ev in binder] + [(until_dispatch("inv-3")[0], None)]
            )
            whole = await j.post_many([(ev, None) for ev in other])
            stored = await j.append(until_dispatch("inv-2")[3], barrier=True)
            with pytest.raises(ImpossibleEvent):
                await late.wait()
            written = await whole.wait()
        assert writes == [1, 3]  # the taker's first event, then one transaction for the rest
        assert [e.seq for e in j.events("inv-1")] == [taker.seq]  # the taker's row alone
        assert [e.kind for e in j.events("inv-3")] == [E.ACTION_ACCEPTED]
        assert [e.kind for e in written] == [e.kind for e in other]
        assert [e.kind for e in j.events("inv-2")] == [
            *(e.kind for e in other),
            stored.kind,
        ]
        assert j.verify().ok


async def test_a_refused_row_of_a_joined_write_stops_its_later_rows_of_every_invocation(
    place: Place,
) -> None:
    """``joined``: one fact about several invocations -- a linked call's claim on the record
    it serves, then the call's own first rows (``engine/takeup.py``).  The claim refused, the
    call's rows are refused with it (nothing of the call is written), and a later write of the
    call presupposing them is refused too; an unjoined write of the same rows keeps them."""
    async with place.open() as j:
        with trio.fail_after(LIMIT):
            taker = await j.append(until_dispatch("inv-1")[0], barrier=True)
            call = until_dispatch("inv-2")[:2]
            head = (until_dispatch("inv-1")[0], None)  # refused: inv-1 has its first event
            joined = await j.post_many([head, *((ev, None) for ev in call)], joined=True)
            with pytest.raises(ImpossibleEvent) as later:
                await j.append(until_dispatch("inv-2")[2], barrier=True, after=[joined])
            with pytest.raises(ImpossibleEvent) as first:
                await joined.wait()
            assert later.value is first.value and first.value.event.invocation_id == "inv-1"
            assert j.events("inv-2") == []
            loose = await j.post_many([head, *((ev, None) for ev in call)])
            await j.append(until_dispatch("inv-2")[2], barrier=True)
            with pytest.raises(ImpossibleEvent):
                await loose.wait()
        assert [e.seq for e in j.events("inv-1")] == [taker.seq]
        assert [e.kind for e in j.events("inv-2")] == [e.kind for e in until_dispatch("inv-2")[:3]]
        assert j.verify().ok


@pytest.mark.parametrize(
    "late",
    [until_dispatch("inv-1")[0], Event(E.ACTION_ACCEPTED, "inv-\x00", {})],
    ids=["impossible-event", "journal-error"],
)
async def test_a_joined_write_refused_at_a_later_row_keeps_none_of_its_rows(
    place: Place, late: Event
) -> None:
    """``joined`` is all or nothing: a row refused after others of the write were validated
    and queued -- by the projection (a second first event) or by the journal (an id holding
    NUL) -- drops those too (a claim never outlives a call that was refused).  The rows queued
    before it in the same transaction stand, the chain has no gap, and a later write of that
    transaction is judged by the record without the dropped rows (the writer's projection of
    the claim's invocation is folded again: a cached one still held the dropped row and refused
    this first event as a second)."""
    async with place.open() as j:
        writes: list[int] = []
        j.before_commit = lambda batch: writes.append(batch.writes)
        with trio.fail_after(LIMIT):
            taker = await j.append(until_dispatch("inv-1")[0], barrier=True)
            claim = until_dispatch("inv-2")[0]
            before = await j.post(until_dispatch("inv-3")[0])
            joined = await j.post_many([(claim, None), (late, None)], joined=True)
            after = await j.post(claim)
            stored = await j.append(until_dispatch("inv-3")[1], barrier=True)
            with pytest.raises((ImpossibleEvent, JournalError)):
                await joined.wait()
            [kept] = [await before.wait()]
            again = await after.wait()
        assert writes == [1, 4]  # the taker's row, then one transaction for the rest
        assert [e.seq for e in j.events("inv-1")] == [taker.seq]
        assert [(e.seq, e.kind) for e in j.events("inv-2")] == [(again.seq, E.ACTION_ACCEPTED)]
        assert [e.seq for e in j.events("inv-3")] == [kept.seq, stored.seq]
        assert (kept.seq, again.seq, stored.seq) == (taker.seq + 1, taker.seq + 2, taker.seq + 3)
        assert j.verify().ok


async def test_a_write_presupposing_a_refused_write_of_its_invocation_is_refused_too(
    place: Place,
) -> None:
    """``after``: a task's later write about an invocation presupposes its posted ones not
    yet read -- one refused (a late binder's ACTION_ACCEPTED) refuses it with the same
    refusal, nothing written, in the same transaction or once that refusal is answered (a
    post's ``wait`` raises it, as any refusal); a write about another invocation is not
    affected."""
    async with place.open() as j:
        writes: list[int] = []
        j.before_commit = lambda batch: writes.append(batch.writes)
        accepted, validated, authorized, _ = until_dispatch("inv-1")
        with trio.fail_after(LIMIT):
            taker = await j.append(accepted, barrier=True)
            late = await j.post_many([(accepted, None)])
            with pytest.raises(ImpossibleEvent) as same_txn:
                await j.append(validated, barrier=True, after=[late])
            assert late.finished
            with pytest.raises(ImpossibleEvent) as first:
                await late.wait()
            assert same_txn.value is first.value
            answered = await j.post(authorized, after=[late])  # once its refusal is answered
            other = await j.append(until_dispatch("inv-2")[0], barrier=True, after=[late])
            with pytest.raises(ImpossibleEvent) as refused:
                await answered.wait()
            assert refused.value is first.value
        assert writes == [1, 2, 2]
        assert [e.seq for e in j.events("inv-1")] == [taker.seq]
        assert [e.seq for e in j.events("inv-2")] == [other.seq]
        assert j.verify().ok


async def test_a_full_queue_makes_writers_wait_and_keeps_their_order(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Back-pressure: past ``MAX_QUEUED`` queued writes a writer waits for the writer task to
    take a batch, then queues; nothing is lost or reordered."""
    monkeypatch.setattr(writer, "MAX_QUEUED", 2)
    async with place.open() as j:
        events = happy("inv-1")
        with trio.fail_after(LIMIT):
            # No checkpoint between the posts but the third's wait for room.
            posted = [await j.post(ev) for ev in events[:3]]
            stored = [await p.wait() for p in posted]
            await j.append(events[3], barrier=True)
        assert [e.seq for e in stored] == [1, 2, 3]
        assert [e.kind for e in j.events("inv-1")] == [e.kind for e in events[:4]]
        assert j.verify().ok


async def test_barrier_appends_past_a_full_queue_wait_and_keep_their_order(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``submit`` queues a barrier write itself only while the queue has room (issue 15): past
    ``MAX_QUEUED`` it waits for the writer task as a post does; every write lands, in order."""
    monkeypatch.setattr(writer, "MAX_QUEUED", 2)
    async with place.open() as j:
        sizes: list[int] = []
        j.before_commit = lambda batch: sizes.append(batch.writes)

        async def calls(iid: str) -> None:
            for ev in happy(iid):
                await j.append(ev, barrier=True)

        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                for i in range(6):
                    nursery.start_soon(calls, f"inv-{i}")
        assert max(sizes) == 2  # six writers, never more than two queued at once
        for i in range(6):
            assert [e.kind for e in j.events(f"inv-{i}")] == [e.kind for e in happy(f"inv-{i}")]
        assert j.verify().ok


async def test_a_shielded_append_is_not_cancelled_while_it_waits_for_room(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``append(shield=True)`` -- the dispatch gate's DISPATCH_STARTED, which enters no cancel
    scope of its own (issue 15) -- is as uncancellable as under a shielded scope: a
    cancellation pending while it waits for room in a full queue does not stop it; it queues,
    lands and answers, and the cancellation is left to the caller's next checkpoint."""
    monkeypatch.setattr(writer, "MAX_QUEUED", 2)
    async with place.open() as j:
        accepted, validated, authorized, _ = until_dispatch("inv-1")
        stored: Event | None = None
        with trio.fail_after(LIMIT):
            posted = [await j.post(ev) for ev in (accepted, validated)]  # the queue is full
            with trio.CancelScope() as scope:
                scope.cancel()
                stored = await j.append(authorized, barrier=True, shield=True)
                await trio.lowlevel.checkpoint()  # where the cancellation is delivered
            assert scope.cancelled_caught
            assert [(await p.wait()).seq for p in posted] == [1, 2]
        assert stored is not None and stored.seq == 3
        assert [e.kind for e in j.events("inv-1")] == [
            accepted.kind,
            validated.kind,
            authorized.kind,
        ]
        assert j.verify().ok


async def test_a_shielded_post_is_not_cancelled_while_it_waits_for_room(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``post_many(shield=True)`` -- the preflight section's one write (the credential step's
    events), which enters no cancel scope of its own (issue 15): a cancellation pending while
    it waits for room in a full queue does not stop it; it is queued and lands."""
    monkeypatch.setattr(writer, "MAX_QUEUED", 2)
    async with place.open() as j:
        accepted, validated, authorized, dispatch = until_dispatch("inv-1")
        with trio.fail_after(LIMIT):
            first = [await j.post(ev) for ev in (accepted, validated)]  # the queue is full
            with trio.CancelScope() as scope:
                scope.cancel()
                posted = await j.post_many([(authorized, None)], shield=True)
                await trio.lowlevel.checkpoint()  # where the cancellation is delivered
            assert scope.cancelled_caught
            await j.append(dispatch, barrier=True)
            assert [(await p.wait()).seq for p in first] == [1, 2]
            assert [e.seq for e in await posted.wait()] == [3]
        assert [e.kind for e in j.events("inv-1")] == [e.kind for e in until_dispatch("inv-1")]
        assert j.verify().ok


async def test_an_append_to_a_closed_journal_is_refused(place: Place) -> None:
    async with place.open() as j:
        with trio.fail_after(LIMIT):
            await j.append(until_dispatch("inv-1")[0], barrier=True)
    with trio.fail_after(LIMIT), pytest.raises(JournalError, match="is closed"):
        await j.append(until_dispatch("inv-1")[1], barrier=True)


async def test_a_durability_barrier_cannot_be_posted(place: Place) -> None:
    async with place.open() as j:
        with trio.fail_after(LIMIT):
            for ev in until_dispatch("inv-1")[:3]:
                await j.append(ev)
            for kind in (E.DISPATCH_STARTED, E.RESULT_COMMITTED):
                with pytest.raises(ValueError, match="barrier"):
                    await j.post(Event(kind, "inv-1", {"attempt": 1}))
        assert len(j.events("inv-1")) == 3


async def test_a_refused_posted_event_raises_at_wait_and_writes_nothing(place: Place) -> None:
    async with place.open() as j:
        with trio.fail_after(LIMIT):
            refused = await j.post(Event(E.REQUEST_SENT, "never-accepted"))
            with pytest.raises(ImpossibleEvent):
                await refused.wait()
            ok = await j.post(until_dispatch("inv-1")[0])
            assert (await ok.wait()).seq == 1
        assert j.events("never-accepted") == []


async def test_a_result_tail_and_its_commit_share_one_transaction(place: Place) -> None:
    body = b'{"id":"pay_1"}'
    async with place.open() as j:
        with trio.fail_after(LIMIT):
            for ev in happy("inv-1"):
                await j.append(ev)
        commits = _count_commits(j)
        with trio.fail_after(LIMIT):
            await j.post_result_chunk("inv-1", "body", 0, body)
            await j.commit_result(
                Event(E.RESULT_COMMITTED, "inv-1"),
                summary={"status": 201},
                expect={"body": hashlib.sha256(body).hexdigest()},
            )
        assert commits[0] == 1
        result = j.read_result("inv-1")
        assert result is not None and result.streams == {"body": body}


async def test_a_lost_tail_fails_the_commit_instead_of_completing_an_older_attempt(
    place: Place,
) -> None:
    """An earlier, uncommitted attempt left chunk 0; this attempt's tail is lost with a failed
    batch.  Without ``expect`` the commit would complete the *old* bytes; with it, it fails and
    nothing is kept (the engine then records RESULT_STORE_FAILED)."""
    new = b"this attempt's body"
    async with place.open() as j:
        with trio.fail_after(LIMIT):
            for ev in happy("inv-1"):
                await j.append(ev)
            await j.put_result_chunk("inv-1", "body", 0, b"an earlier attempt's partial body")

        def disk_error(_: Batch) -> None:
            raise storage_fault(place)

        with trio.fail_after(LIMIT):
            j.before_commit = disk_error
            tail = await j.post_result_chunk("inv-1", "body", 0, new)
            with pytest.raises(ResultStoreFailed):
                await tail.wait()
            j.before_commit = None
            with pytest.raises(ResultStoreFailed, match="differ"):
                await j.commit_result(
                    Event(E.RESULT_COMMITTED, "inv-1"),
                    summary={"status": 201},
                    expect={"body": hashlib.sha256(new).hexdigest()},
                )
        assert j.read_result("inv-1") is None
        assert E.RESULT_COMMITTED not in [e.kind for e in j.events("inv-1")]


async def test_posting_events_without_payload_seals_nothing(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15: ``post_many`` hands ``_seal_payload`` only the events that carry a payload
    (one in seven per call); the others' rows are stored and chained all the same."""
    async with place.open() as j:
        sealed: list[object] = []
        real = j._seal_payload

        def seal(event: Event, payload: object) -> object:
            sealed.append(payload)
            return real(event, payload)  # type: ignore[arg-type]

        monkeypatch.setattr(j, "_seal_payload", seal)
        accepted, validated, authorized, dispatch = until_dispatch("inv-1")
        with trio.fail_after(LIMIT):
            posted = await j.post_many(
                [(accepted, {"action": {"path": "/x"}}), (validated, None), (authorized, None)]
            )
            await j.append(dispatch, barrier=True)
            await posted.wait()
        assert sealed == [{"action": {"path": "/x"}}]
        assert [e.kind for e in j.events("inv-1")] == [e.kind for e in until_dispatch("inv-1")]
        assert j.payload(1) == {"action": {"path": "/x"}} and j.verify().ok
