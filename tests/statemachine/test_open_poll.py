"""The operation's one open poll, as the projection keeps it (statemachine/operation.py,
``_on_poll``; engine/takeup.py): a second poll named open while one is open is refused in the
writing transaction, and the row closing a poll nothing was sent for (``unsent``) is no poll of
the job -- it clears the open poll without counting (rvG findings 5 and 7)."""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest

from affidavit.statemachine import (
    Event,
    EventKind,
    EvidenceSource,
    ImpossibleEvent,
    Projector,
)

from .lifecycle_helpers import IID
from .test_operation_and_batch import OP_ID, with_operation

E = EventKind
S = EvidenceSource


def _row(seq: int, poll: str, **attrs: Any) -> Event:
    base = {"operation_id": OP_ID, "poll_invocation": poll, "code": None, "reason": "r"}
    return Event(E.OPERATION_POLL_FAILED, IID, {**base, **attrs}, seq=seq)


def _opened() -> tuple[Projector, int]:
    p, seq = with_operation("pending")
    p.apply(_row(seq, "act_p1", open=True))  # named before it is asked
    p.apply(_row(seq + 1, "act_p1", open=True, code="APPROVAL_PENDING"))  # awaits an operator
    return p, seq + 2


def test_a_second_open_poll_is_refused_while_one_is_open() -> None:
    p, seq = _opened()
    before = p.record()
    for second in (_row(seq, "act_p2", open=True), _row(seq, "act_p2", open=True, code="X")):
        with pytest.raises(ImpossibleEvent, match="act_p1 is still open"):
            p.apply(second)
        assert p.record() == before
    p.apply(_row(seq, "act_p1", code="DENIED", unsent=True))  # closed: another may open
    p.apply(_row(seq + 1, "act_p2", open=True))
    op = p.record().operation
    assert op is not None and op["open_poll"] == "act_p2"


def test_a_poll_closed_unsent_is_not_counted() -> None:
    # Nothing was sent: its row awaiting an operator is no poll of the job, nor its close.
    p, seq = _opened()
    assert p.record().operation["polls"] == 0  # type: ignore[index]
    p.apply(_row(seq, "act_p1", code="DENIED", unsent=True))
    op = p.record().operation
    assert op is not None and (op["polls"], op["open_poll"]) == (0, None)
    assert op["last_poll"]["code"] == "DENIED"


def test_a_poll_approved_and_read_is_counted_once() -> None:
    # Its rows while open (awaiting an operator, then being sent with its asker gone) are not
    # polls of the job; the row reading its answer is -- once (before: three).
    p, seq = _opened()
    p.apply(_row(seq, "act_p1", open=True, code="IN_PROGRESS"))  # sent, its answer unread
    p.apply(_row(seq + 1, "act_p1", code="HTTP_STATUS"))  # read: closed
    op = p.record().operation
    assert op is not None and (op["polls"], op["open_poll"]) == (1, None)


@pytest.mark.parametrize("closing", ["unsent", "read", "failed"])
def test_a_row_naming_a_closed_poll_open_is_refused_by_the_writer_and_a_no_op_folded(
    closing: str,
) -> None:
    # A stale asker's row lands after another closed its poll and no poll is open: folded as
    # written, it would reopen the poll and put its stale answer in ``last_poll`` over the
    # closing row's.  The writer refuses it; a stored one (a broker from before the writer
    # refused it wrote it) folds as a no-op for the poll, never as an altered row.
    p, seq = _opened()
    if closing == "read":
        attrs = {"operation_id": OP_ID, "poll_invocation": "act_p1", "state": "pending"}
        p.apply(Event(E.OPERATION_POLLED, IID, attrs, source=S.REMOTE_QUERY, seq=seq))
    else:
        unsent = {"unsent": True} if closing == "unsent" else {}
        p.apply(_row(seq, "act_p1", code="DENIED", **unsent))
    before = p.record()
    stale_rows = (
        _row(seq + 1, "act_p1", open=True, code="APPROVAL_PENDING"),
        _row(seq + 2, "act_p1", open=True, code="IN_PROGRESS"),  # sent, its answer unread
    )
    for n, stale in enumerate(stale_rows):
        with pytest.raises(ImpossibleEvent, match="act_p1 is not open"):
            p.apply(stale, writing=True)  # the writer's check
        p.apply(stale)
        assert p.record().operation == before.operation
        assert p.record().events == before.events + n + 1
    # ``unsent`` while no poll is open: a broker from ab1791b to 530d267 wrote one after a
    # stale open row had reopened the poll in its fold (the next asker took it up, found it
    # denied, closed it).  The writer refuses it; a stored one folds as a no-op too.
    unsent = _row(seq + 3, "act_p1", code="DENIED", unsent=True)
    with pytest.raises(ImpossibleEvent, match="close the open poll it names"):
        p.apply(unsent, writing=True)
    p.apply(unsent)
    assert p.record().operation == before.operation
    assert p.record().events == before.events + 3
    # A row from before rows named ``open`` folds as it was written.
    legacy = _row(seq + 4, "act_p1", code="APPROVAL_PENDING")
    p.apply(legacy, writing=True)
    assert p.record().operation["open_poll"] == "act_p1"  # type: ignore[index]


def test_a_poll_awaiting_an_operator_before_open_rows_is_open() -> None:
    # A journal written before rows named ``open``: the poll's last row, APPROVAL_PENDING and
    # no ``open``, folds as the open poll -- taken up, like a query's (``rules_lease``).
    p, seq = with_operation("pending")
    p.apply(_row(seq, "act_p1", code="APPROVAL_PENDING"))
    op = p.record().operation
    assert op is not None and (op["polls"], op["open_poll"]) == (0, "act_p1")
    with pytest.raises(ImpossibleEvent, match="act_p1 is still open"):
        p.apply(_row(seq + 1, "act_p2", open=True))


@pytest.mark.parametrize(
    "row",
    [
        _row(0, "act_p1", code="DENIED", unsent=1),  # not true
        _row(0, "act_p1", code="DENIED", unsent=True, open=True),  # closes, so not open
        _row(0, "act_other", code="DENIED", unsent=True),  # not the open poll
    ],
    ids=["not-true", "open", "not-the-open-poll"],
)
def test_an_unsent_row_must_close_the_open_poll(row: Event) -> None:
    p, seq = _opened()
    before = p.record()
    with pytest.raises(ImpossibleEvent, match="unsent"):
        p.apply(Event(row.kind, row.invocation_id, row.attrs, seq=seq))
    assert p.record() == before


def test_a_long_lived_job_s_fold_keeps_nothing_per_poll() -> None:
    # A stale row is told from the record as it is (``rules_common._reopened``: a row naming
    # ``open`` with a code, or ``unsent``, while no call is open), so the fold keeps nothing
    # per call: before, it kept every closed poll's id -- a job polled every 10 s grew its
    # fold by ~6 MB a week.  Measured: what a fold holds after 2,000 more polls.
    p, seq = _opened()

    def polls(first: int, count: int) -> None:
        for n in range(first, first + count):
            poll, at = f"act_poll_{n:08d}", seq + 3 * n
            p.apply(_row(at, poll, open=True))  # named
            p.apply(_row(at + 1, poll, open=True, code="APPROVAL_PENDING"))  # awaits an operator
            p.apply(_row(at + 2, poll, code="REMOTE_OUTCOME_UNKNOWN"))  # read: closed

    p.apply(_row(seq, "act_p1", code="DENIED", unsent=True))
    seq += 1
    tracemalloc.start()
    try:
        polls(0, 100)
        held = tracemalloc.get_traced_memory()[0]
        polls(100, 2_000)
        grown = tracemalloc.get_traced_memory()[0] - held
    finally:
        tracemalloc.stop()
    assert p.record().operation["polls"] == 2_100  # type: ignore[index]
    assert grown < 32 * 1024, f"the fold grew {grown} bytes over 2,000 polls"
