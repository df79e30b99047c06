"""Model checks of the operation table (statemachine/operation.py) and the batch item rules
(statemachine/batch.py), the same shapes as the lifecycle's (test_model_check.py): every
(state, event) pair lands where the table says or is refused with the fold unchanged; the
table's graph has no way back; and the seed's rules about jobs and items, one test each."""

from __future__ import annotations

from typing import Any

import pytest

from affidavit.statemachine import (
    Event,
    EventKind,
    EvidenceSource,
    ImpossibleEvent,
    Projector,
    operation_id,
    render_envelope,
)
from affidavit.statemachine import operation as opt
from affidavit.statemachine.graph import reachable

from .lifecycle_helpers import IID, drive, make_event, operation, path_to, projector_in

E = EventKind
OP_EVENTS = (E.OPERATION_ACCEPTED, E.OPERATION_POLLED, E.OPERATION_POLL_FAILED)
OP_ID = operation_id(IID)


def _accepted(p: Projector, seq: int) -> Event:
    return Event(
        E.OPERATION_ACCEPTED,
        IID,
        {"operation_id": OP_ID, "job_id": "j1", "status_url": "http://x/jobs/j1"},
        source=EvidenceSource.REMOTE_RESPONSE,
        seq=seq,
    )


def _polled(seq: int, state: str, source: EvidenceSource = EvidenceSource.REMOTE_QUERY) -> Event:
    attrs = {"operation_id": OP_ID, "poll_invocation": "act_poll", "state": state}
    return Event(E.OPERATION_POLLED, IID, attrs, source=source, seq=seq)


def _poll_failed(seq: int) -> Event:
    attrs = {"operation_id": OP_ID, "poll_invocation": "act_poll", "code": "REMOTE_REJECTED"}
    return Event(E.OPERATION_POLL_FAILED, IID, attrs, seq=seq)


def with_operation(state: str) -> tuple[Projector, int]:
    """A delivered 202 whose operation is in ``state``; for ``none``, a complete 202 not yet
    stored (the only place the lifecycle lets a job be accepted)."""
    p = projector_in("completed_committed")
    seq = p.record().events + 1
    if state == "none":
        return p, seq
    p.apply(_accepted(p, seq))
    seq += 1
    for kind, dest in ((E.RESULT_COMMITTED, "stored_committed"), (E.RESULT_DELIVERED, "")):
        p.apply(make_event(p, kind, dest, seq))
        seq += 1
    if state in ("succeeded", "failed"):
        p.apply(_polled(seq, state))
        seq += 1
    return p, seq


def _event_to(kind: EventKind, dest: str, seq: int) -> Event:
    if kind is E.OPERATION_ACCEPTED:
        return _accepted(Projector(IID), seq)
    if kind is E.OPERATION_POLLED:
        return _polled(seq, dest)
    return _poll_failed(seq)


# -- the table ---------------------------------------------------------------------------------


def test_operation_table_has_no_structural_problems() -> None:
    assert opt.problems() == []
    assert reachable(opt.INITIAL, opt.edges()) == set(opt.STATES)


def test_operation_table_checker_rejects_leaving_a_terminal_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broken = {**opt.TRANSITIONS, "succeeded": {E.OPERATION_POLLED: ("pending",)}}
    monkeypatch.setattr(opt, "TRANSITIONS", broken)
    assert "succeeded --OPERATION_POLLED--> pending leaves a terminal state" in opt.problems()


def test_transitions_machine_agrees_with_the_operation_table() -> None:
    from transitions import MachineError

    triggers = sorted({opt.trigger(s, e, d) for s, e, d in opt.edges()})
    for state in opt.STATES:
        declared = {(opt.trigger(s, e, d), d) for s, e, d in opt.edges() if s == state}
        for trigger in triggers:
            m: Any = opt.build_machine(initial=state)
            dest = dict(declared).get(trigger)
            if dest is None:
                with pytest.raises(MachineError):
                    m.trigger(trigger)
            else:
                m.trigger(trigger)
                assert m.state == dest


@pytest.mark.parametrize("state", sorted(opt.STATES))
def test_every_operation_pair_lands_as_declared_or_is_refused_unchanged(state: str) -> None:
    for kind in OP_EVENTS:
        declared = opt.TRANSITIONS[state].get(kind, ())
        # attrs.state names the destination of a split event; the others have one at most.
        wanted = ("pending", "succeeded", "failed") if kind is E.OPERATION_POLLED else ("",)
        for dest in wanted:
            if len(declared) == 1:
                dest = declared[0]
            p, seq = with_operation(state)
            before = p.record()
            if dest in declared:
                p.apply(_event_to(kind, dest, seq))
                rec = p.record()
                assert rec.operation is not None and rec.operation["state"] == dest
                assert rec.state == before.state  # the invocation's own state never moves
                continue
            with pytest.raises(ImpossibleEvent):
                p.apply(_event_to(kind, dest, seq))
            assert p.record() == before


# -- the seed's rules about jobs ----------------------------------------------------------------


def test_a_job_is_accepted_only_by_a_complete_committed_result() -> None:
    # Seed: "A complete HTTP 202 response confirms that the job was accepted".
    for state in ("dispatched", "interrupted", "completed_rejected", "stored_committed"):
        p = projector_in(state)
        with pytest.raises(ImpossibleEvent):
            p.apply(_accepted(p, 100))
    p = projector_in("completed_committed")
    wrong_source = Event(
        E.OPERATION_ACCEPTED, IID, {"operation_id": OP_ID}, source=EvidenceSource.TRANSPORT_OBSERVED
    )
    with pytest.raises(ImpossibleEvent, match="remote_response"):
        p.apply(wrong_source)
    other = Event(
        E.OPERATION_ACCEPTED, IID, {"operation_id": "op_x"}, source=EvidenceSource.REMOTE_RESPONSE
    )
    with pytest.raises(ImpossibleEvent, match="operation_id"):
        p.apply(other)


def test_a_jobs_state_is_learnt_only_from_a_remote_query() -> None:
    p, seq = with_operation("pending")
    for source in (EvidenceSource.REMOTE_RESPONSE, EvidenceSource.OPERATOR_ATTESTED):
        with pytest.raises(ImpossibleEvent, match="remote_query"):
            p.apply(_polled(seq, "succeeded", source))
    p.apply(_polled(seq, "succeeded"))
    op = p.record().operation
    assert op is not None and op["state"] == "succeeded" and op["polls"] == 1
    assert op["last_poll"] == {
        "invocation_id": "act_poll",
        "seq": seq,
        "state": "succeeded",
        "remote_status": None,
    }


def test_a_failed_poll_keeps_the_state_and_a_terminal_state_is_never_left() -> None:
    p, seq = with_operation("pending")
    p.apply(_poll_failed(seq))
    op = p.record().operation
    assert op is not None and (op["state"], op["polls"]) == ("pending", 1)
    p.apply(_polled(seq + 1, "failed"))
    before = p.record()
    for late in (_polled(seq + 2, "pending"), _polled(seq + 2, "succeeded"), _poll_failed(seq + 2)):
        with pytest.raises(ImpossibleEvent, match="failed"):
            p.apply(late)
        assert p.record() == before


def test_the_envelope_carries_the_operation_beside_the_committed_submission() -> None:
    p, _seq = with_operation("pending")
    env = render_envelope(p.record())
    assert "error" not in env and env["evidence"]["outcome"] == "committed"
    assert env["operation"] == {
        "id": OP_ID,
        "job_id": "j1",
        "status_url": "http://x/jobs/j1",
        "state": "pending",
        "polls": 0,
        "last_poll": None,
    }


def test_operation_ids_name_their_submission() -> None:
    assert opt.operation_id("act_01ABC") == "op_01ABC"
    assert opt.invocation_of("op_01ABC") == "act_01ABC"
    assert opt.invocation_of("act_01ABC") is None and opt.invocation_of("op_") is None


# -- the seed's rules about batch items ---------------------------------------------------------


BATCH = operation(batch=["a", "b", 3])


def _to(state: str) -> Projector:
    return drive(path_to(state), op=BATCH)


def _items(p: Projector) -> list[tuple[Any, str, str | None, str]]:
    items = p.record().items
    assert items is not None
    return [(i["id"], i["outcome"], i["code"], i["retry"]) for i in items]


def test_items_share_the_parents_outcome_until_a_complete_response_gives_their_own() -> None:
    # Before dispatch nothing of any item was attempted.
    assert {o for _i, o, _c, _r in _items(_to("setup_failed"))} == {"not_attempted"}
    # Seed: "receives a complete response for only four of them": a cut response leaves them
    # all unknown, with the parent's hint.
    p = _to("interrupted")
    rec = p.record()
    assert _items(p) == [
        (i, "unknown", rec.code.value if rec.code else None, rec.retry.value) for i in ("a", "b", 3)
    ]


def test_a_complete_response_gives_each_item_its_own_outcome_and_hint() -> None:
    p = _to("completed_committed")
    seq = p.record().events + 1
    items = [
        {"id": "a", "outcome": "committed", "code": None, "retry": "never", "status": 200},
        {"id": "b", "outcome": "rejected", "code": "REMOTE_REJECTED", "retry": "after_correction"},
        {"id": 3, "outcome": "committed", "code": "REMOTE_ERROR", "retry": "reconcile"},
    ]
    event = Event(
        E.BATCH_ITEMS_RECORDED, IID, {"items": items}, EvidenceSource.REMOTE_RESPONSE, seq
    )
    p.apply(event)
    assert _items(p) == [
        ("a", "committed", None, "never"),
        ("b", "rejected", "REMOTE_REJECTED", "after_correction"),
        (3, "committed", "REMOTE_ERROR", "reconcile"),
    ]
    assert render_envelope(p.record())["items"][0]["status"] == 200


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"source": EvidenceSource.TRANSPORT_OBSERVED}, "remote_response"),
        ({"items": [{"id": "a", "outcome": "committed", "code": None, "retry": "never"}]}, "every"),
        ({"first": {"id": "b"}}, "in order"),
        ({"first": {"outcome": "not_attempted"}}, "outcome"),
        ({"first": {"outcome": "rejected", "code": None}}, "without a code"),
        ({"first": {"code": "REMOTE_REJECTED"}}, "cannot classify"),
        ({"first": {"code": "DNS_FAILED", "outcome": "rejected"}}, "cannot classify"),
        ({"first": {"retry": "soon"}}, "retry"),
    ],
)
def test_item_outcomes_are_refused_unless_each_is_consistent(
    change: dict[str, Any], reason: str
) -> None:
    p = _to("completed_committed")
    before = p.record()
    items: list[dict[str, Any]] = [
        {"id": i, "outcome": "committed", "code": None, "retry": "never"} for i in ("a", "b", 3)
    ]
    items[0].update(change.get("first", {}))
    attrs = {"items": change.get("items", items)}
    source = change.get("source", EvidenceSource.REMOTE_RESPONSE)
    with pytest.raises(ImpossibleEvent, match=reason):
        p.apply(Event(E.BATCH_ITEMS_RECORDED, IID, attrs, source, before.events + 1))
    assert p.record() == before


def test_a_resolved_parent_without_item_outcomes_leaves_every_item_unknown() -> None:
    # The parent's store failed, taking the item outcomes with it: the records do not say what
    # happened to any item.
    assert _items(_to("store_failed_committed")) == [
        (i, "unknown", "REMOTE_RESULT_INCOMPLETE", "reconcile") for i in ("a", "b", 3)
    ]


def _answered(outcome: str, code: str, op: Any = BATCH) -> Projector:
    """A batch of ("a", "b", 3) (or ``op``'s) whose complete response was no success:
    ``outcome``, ``code``."""
    moves = path_to(f"completed_{outcome}")
    assert moves[-1][0] is E.REMOTE_RESPONSE_COMPLETE
    p = drive(moves[:-1], op=op)
    attrs = {"outcome": outcome, "code": code, "status": 500, "generation": p.generation}
    seq = p.record().events + 1
    p.apply(Event(E.REMOTE_RESPONSE_COMPLETE, IID, attrs, EvidenceSource.REMOTE_RESPONSE, seq))
    return p


def _recorded(p: Projector, items: list[dict[str, Any]], *, writing: bool) -> None:
    seq = p.record().events + 1
    attrs = {"items": items}
    p.apply(
        Event(E.BATCH_ITEMS_RECORDED, IID, attrs, EvidenceSource.REMOTE_RESPONSE, seq),
        writing=writing,
    )


_UNKNOWN = {"outcome": "unknown", "code": "REMOTE_RESULT_INCOMPLETE", "retry": "reconcile"}
_APPLIED = {"outcome": "committed", "code": None, "retry": "never", "status": 200}
_REFUSED = {"outcome": "rejected", "code": "REMOTE_REJECTED", "retry": "after_correction"}


@pytest.mark.parametrize(
    ("outcome", "code", "item"),
    [
        ("rejected", "REMOTE_REJECTED", _APPLIED),  # a 401 whose body lists every item 200
        ("rejected", "REMOTE_THROTTLED", _REFUSED),  # another code than the parent's
        ("committed", "REMOTE_ERROR", {**_REFUSED, "status": 400}),  # a 500 listing 400s
        ("committed", "REMOTE_ERROR", _REFUSED),
        ("committed", "REMOTE_REDIRECTED", _APPLIED),  # a 303 listing 200s
    ],
)
def test_items_never_say_more_than_a_parent_that_was_no_success(
    outcome: str, code: str, item: dict[str, Any]
) -> None:
    items = [{"id": i, **item} for i in ("a", "b", 3)]
    p = _answered(outcome, code)
    before = p.record()
    # The writer refuses the row, the record unchanged ...
    with pytest.raises(ImpossibleEvent, match=f"more than its parent's {code}"):
        _recorded(p, items, writing=True)
    assert p.record() == before
    # ... and a row written before the rule is folded as what the parent proves: unknown.
    _recorded(p, items, writing=False)
    assert _items(p) == [(i, *_UNKNOWN.values()) for i in ("a", "b", 3)]
    assert p.record().code is not None and p.record().code.value == code


def test_an_old_row_refusing_items_with_their_own_refusal_under_a_refusal_reads_as_written() -> (
    None
):
    # Written before the rule: a 400 whose body listed each item 422 gave each its status.  The
    # writer refuses that now (no item status under a parent that was no success) -- but the
    # status agrees with the parent's code, so the old row is folded as written, not unknown.
    items = [{"id": i, **_REFUSED, "status": 422} for i in ("a", "b", 3)]
    p = _answered("rejected", "REMOTE_REJECTED")
    with pytest.raises(ImpossibleEvent, match="more than its parent's REMOTE_REJECTED"):
        _recorded(p, items, writing=True)
    _recorded(p, items, writing=False)
    assert _items(p) == [(i, *_REFUSED.values()) for i in ("a", "b", 3)]
    # Beside an item the parent does not back, the whole row says no more than the parent.
    p = _answered("rejected", "REMOTE_REJECTED")
    _recorded(p, [{"id": "a", **_APPLIED}, *items[1:]], writing=False)
    assert _items(p) == [(i, *_UNKNOWN.values()) for i in ("a", "b", 3)]


def test_an_old_row_matched_by_position_reads_as_written_only_when_every_item_has_a_status() -> (
    None
):
    # Before the rule a positional reader matched results[:len(ids)] even for a short list: a
    # 400 listing one 422 for three items gave item 0 that status -- maybe another item's.
    by_position = operation(batch=[0, 1, 2])
    short = [{"id": 0, **_REFUSED, "status": 422}, *({"id": n, **_UNKNOWN} for n in (1, 2))]
    p = _answered("rejected", "REMOTE_REJECTED", by_position)
    _recorded(p, short, writing=False)
    assert _items(p) == [(n, *_UNKNOWN.values()) for n in (0, 1, 2)]
    # Every item answered (the list was whole): as written.
    whole = [{"id": n, **_REFUSED, "status": 422} for n in (0, 1, 2)]
    p = _answered("rejected", "REMOTE_REJECTED", by_position)
    _recorded(p, whole, writing=False)
    assert _items(p) == [(n, *_REFUSED.values()) for n in (0, 1, 2)]
    # Matched by id, a short list attributed nothing wrongly: as written.
    by_id = [{"id": "a", **_REFUSED, "status": 422}, *({"id": i, **_UNKNOWN} for i in ("b", 3))]
    p = _answered("rejected", "REMOTE_REJECTED")
    _recorded(p, by_id, writing=False)
    assert _items(p) == [("a", *_REFUSED.values()), *((i, *_UNKNOWN.values()) for i in ("b", 3))]
    # A row the writer takes now (no item status) reads as written, by position too.
    p = _answered("rejected", "REMOTE_REJECTED", by_position)
    _recorded(p, [{"id": n, **_REFUSED} for n in (0, 1, 2)], writing=True)
    assert _items(p) == [(n, *_REFUSED.values()) for n in (0, 1, 2)]


@pytest.mark.parametrize(
    ("outcome", "code", "item"),
    [
        ("rejected", "REMOTE_REJECTED", _REFUSED),
        (
            "rejected",
            "REMOTE_THROTTLED",
            {**_REFUSED, "code": "REMOTE_THROTTLED", "retry": "reconcile"},
        ),
        ("rejected", "REMOTE_REJECTED", _UNKNOWN),
        ("committed", "REMOTE_ERROR", _UNKNOWN),
    ],
)
def test_items_sharing_what_the_parent_proves_are_recorded(
    outcome: str, code: str, item: dict[str, Any]
) -> None:
    p = _answered(outcome, code)
    _recorded(p, [{"id": i, **item} for i in ("a", "b", 3)], writing=True)
    assert _items(p) == [(i, item["outcome"], item["code"], item["retry"]) for i in ("a", "b", 3)]


def test_item_outcomes_need_a_batch() -> None:
    p = projector_in("completed_committed")
    items = [{"id": "a", "outcome": "committed", "code": None, "retry": "never"}]
    with pytest.raises(ImpossibleEvent, match="batch"):
        p.apply(
            Event(E.BATCH_ITEMS_RECORDED, IID, {"items": items}, EvidenceSource.REMOTE_RESPONSE)
        )
    for bad in (
        {"items": "a"},
        {"items": ["a", "a"]},
        {"items": [1.5]},
        {"items": [], "atomic": 1},
    ):
        q = Projector(IID)
        with pytest.raises(ImpossibleEvent, match="batch"):
            q.apply(
                make_event(q, E.ACTION_ACCEPTED, "accepted", 1, op={**operation(), "batch": bad})
            )


def test_the_operation_table_is_diagrammed_and_tabled_in_the_contract() -> None:
    from affidavit import docgen as dg

    files = dg.generated_files()
    assert files["diagrams/operation.mmd"] == dg.mermaid_source(dg.operation_graph())
    assert files["diagrams/operation.dot"] == dg.dot_source(dg.operation_graph())
    contract = files["docs/contract.md"]
    for src, ev, dst in opt.edges():
        assert f"| `{src}` | `{opt.trigger(src, ev, dst)}` | `{dst}` |" in contract
    for name, spec in opt.STATES.items():
        assert f"| `{name}` | {'yes' if spec.terminal else 'no'} | {spec.doc} |" in contract
    ended = [e for e in dg.operation_graph().edges if e.style == "complete"]
    assert sorted(e.dst for e in ended) == ["failed", "succeeded"]
