"""Item 8c: random valid *and* invalid event sequences through the projection, with the seed's
invariants checked after every step (hypothesis ``RuleBasedStateMachine``).

Exploration walks the lifecycle table itself: ``take_edges`` draws edges of the table (one this
run has not taken yet first), drives there by valid events -- from a fresh invocation when the
current one can no longer get there -- and takes them, so the deep branches (retries, committed
results, store and delivery failures) are reached in most runs instead of by luck (they were
never reached before).  ``test_the_walk_takes_every_table_edge`` proves the walk reaches every
(state, event, destination) edge of the table.  Invariants and event postconditions are the
seed's rules stated directly, not read back from the table or from ``retry.py``."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import hypothesis
import jsonschema
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from affidavit.statemachine import (
    CODES,
    TRANSITIONS,
    Code,
    Event,
    EventKind,
    EvidenceSource,
    ImpossibleEvent,
    Outcome,
    Phase,
    Projector,
    Record,
    Retry,
    compute_retry,
    envelope_schema,
    open_query,
    render_envelope,
)
from affidavit.statemachine.lifecycle import edges
from affidavit.statemachine.retry import RETENTION_MARGIN_S, HintInputs

from .lifecycle_helpers import (
    IID,
    Choose,
    first,
    make_event,
    operation,
    rule_refuses,
    valid_moves,
)
from .test_model_check import ATTRS

E = EventKind
VALIDATOR = jsonschema.Draft202012Validator(envelope_schema())
RESOLVED = (Outcome.REJECTED, Outcome.COMMITTED)
PRE_DISPATCH_FAILURES = {
    E.PREFLIGHT_FAILED,
    E.CREDENTIAL_FAILED,
    E.SETUP_ATTEMPT_FAILED,
    E.SETUP_FAILED,
}


EDGES: list[tuple[str, EventKind, str]] = [(s, EventKind(e), d) for s, e, d in edges()]


def _route(start: str, goal: str) -> list[tuple[EventKind, str]] | None:
    """A shortest (event, destination) path through the table from ``start`` to ``goal``."""
    prev: dict[str, tuple[str, EventKind]] = {}
    todo, seen = [start], {start}
    while todo and goal not in seen:
        s = todo.pop(0)
        for src, kind, dst in EDGES:
            if src == s and dst not in seen:
                seen.add(dst)
                prev[dst] = (src, kind)
                todo.append(dst)
    if goal not in seen:
        return None
    steps: list[tuple[EventKind, str]] = []
    while goal != start:
        src, kind = prev[goal]
        steps.append((kind, goal))
        goal = src
    return steps[::-1]


REACHABLE: dict[str, frozenset[str]] = {
    s: frozenset(g for g in {src for src, _k, _d in EDGES} if _route(s, g) is not None)
    for s in {src for src, _k, _d in EDGES} | {d for _s, _k, d in EDGES}
}
"""For each state, the states (itself included) whose outgoing edges it can still reach."""

WALKABLE = [e for e in EDGES if e[0] != "new"]
"""The edges ``take_edges`` walks to (ACTION_ACCEPTED starts every invocation anyway)."""

POLLS = (E.OPERATION_POLLED, E.OPERATION_POLL_FAILED)

OPERATIONS = st.fixed_dictionaries(
    {
        "idempotent": st.booleans(),
        "key": st.sampled_from([None, "req_01"]),
        "expires_in": st.sampled_from([None, 30.0, 3_600.0]),
        "budget": st.integers(1, 4),
        "max_retry_after": st.sampled_from([0.0, 60.0, 300.0]),
        "batch": st.sampled_from([None, ["a", "b", 3]]),
        "atomic": st.booleans(),
        "remote_contract": st.sampled_from([None, "configured", "none"]),
        # None: a record written before the send window was recorded (judged at the moment).
        "send_window": st.sampled_from([None, 0.0, 35.0, 5_000.0]),
        # False: a record written before requesters were recorded (no read delivers it).
        "requester": st.booleans(),
    }
)


def _chooser(data: st.DataObject) -> Choose[Any]:
    def choose(options: Any) -> Any:
        return data.draw(st.sampled_from(list(options)))

    return choose


def _note(message: str) -> None:
    """``hypothesis.event`` when hypothesis runs the machine (not in the plain walk below)."""
    with contextlib.suppress(hypothesis.errors.InvalidArgument):
        hypothesis.event(message)


class ProjectionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000.0
        self.taken: set[tuple[str, EventKind, str]] = set()
        self._fresh()

    def _fresh(self) -> None:
        """A new, empty invocation (the clock keeps running)."""
        self.p = Projector(IID)
        self.seq = 0
        self.max_retry_after = 300.0
        self.dispatched = False
        self.closed: set[str] = set()  # the linked calls a row closed (``_linked_invariants``)
        self.prev = self.p.record(self.now)

    @initialize(params=OPERATIONS)
    def accept(self, params: dict[str, Any]) -> None:
        self._accept(params)

    def _accept(self, params: dict[str, Any]) -> None:
        expires_in = params["expires_in"]
        op = operation(
            idempotent=params["idempotent"],
            key=params["key"],
            expires_at=None if expires_in is None else self.now + expires_in,
            budget=params["budget"],
            max_retry_after=params["max_retry_after"],
            batch=params["batch"],
            atomic=params["atomic"],
            remote_contract=params["remote_contract"],
            send_window=params.get("send_window"),
        )
        self.max_retry_after = params["max_retry_after"]
        accepted = make_event(self.p, E.ACTION_ACCEPTED, "accepted", self._next(), op=op)
        if not params.get("requester", True):
            attrs = {k: v for k, v in accepted.attrs.items() if k != "requester"}
            accepted = dataclasses.replace(accepted, attrs=attrs)
        self._apply(accepted)

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def _apply(self, event: Event, writing: bool = False) -> bool:
        before = self.p.record(self.now)
        state_before = self.p.state
        try:
            self.p.apply(event, writing=writing)
        except ImpossibleEvent:
            assert self.p.record(self.now) == before, "a refused event changed the record"
            assert self.p.state == state_before
            return False
        after = self.p.record(self.now)
        self.taken.add((state_before, event.kind, self.p.state))
        _event_postconditions(event, before, after)
        _linked_invariants(event, after, self.closed)
        if event.kind is E.DISPATCH_STARTED:
            self.dispatched = True
        if (
            event.kind in PRE_DISPATCH_FAILURES
            and before.outcome is Outcome.UNKNOWN
            and after.outcome is not Outcome.UNKNOWN
        ):
            raise AssertionError(f"{event.kind} after an unknown attempt left {after.outcome}")
        assert after.events == before.events + 1
        return True

    # -- rules ---------------------------------------------------------------------------------

    @rule(data=st.data(), picks=st.lists(st.integers(0, len(WALKABLE) - 1), min_size=1, max_size=3))
    def take_edges(self, data: st.DataObject, picks: list[int]) -> None:
        for pick in picks:
            # An edge this run has not taken yet (any, once it took all): a few runs cover the
            # whole table instead of drawing the same edges over and over.
            fresh = [e for e in WALKABLE if e not in self.taken] or WALKABLE
            edge = fresh[pick % len(fresh)]
            self.take_edge(
                edge,
                choose=_chooser(data),
                fresh_params=lambda: data.draw(OPERATIONS),
                detour=lambda: data.draw(st.integers(0, 2)) == 0,
            )

    @rule(data=st.data())
    def throttled(self, data: st.DataObject) -> None:
        # The one result whose hint weighs everything at once (safety by configuration or key,
        # key retention, Retry-After against the configured maximum, budget): a fresh
        # invocation, drawn settings, answered REMOTE_THROTTLED -- a third of random rejections
        # only, and the seed's throttle rule has four ways to be wrong.
        draw = _chooser(data)

        def choose(options: Any) -> Any:
            return Code.REMOTE_THROTTLED if Code.REMOTE_THROTTLED in options else draw(options)

        self._fresh()
        self._accept(data.draw(OPERATIONS))
        self.seed_invariants()
        self.take_edge(
            ("dispatched", E.REMOTE_RESPONSE_COMPLETE, "completed_rejected"),
            choose=choose,
            fresh_params=lambda: data.draw(OPERATIONS),
            detour=lambda: data.draw(st.integers(0, 2)) == 0,
        )

    def take_edge(
        self,
        edge: tuple[str, EventKind, str],
        choose: Choose[Any],
        fresh_params: Callable[[], dict[str, Any]],
        detour: Callable[[], bool],
    ) -> None:
        # Walk the table to a drawn edge and take it, invariants checked at every step: every
        # draw reaches its edge, so the deep branches (retries, committed results, store and
        # delivery failures) are explored in most runs, not only after a lucky random sequence.
        # An edge this invocation can no longer reach is taken by a fresh invocation.
        src, kind, dst = edge
        rec = self.p.record()
        if (
            src not in REACHABLE[self.p.state]
            or (kind is E.BATCH_ITEMS_RECORDED and rec.items is None)
            or (
                kind in POLLS
                and rec.operation is None
                and self.p.state != "completed_committed"
                and "completed_committed" not in REACHABLE[self.p.state]
            )
            or (kind is E.RETRY_LEASE_ACQUIRED and rec.budget.left <= 0)
        ):
            params = fresh_params()
            if kind is E.BATCH_ITEMS_RECORDED:
                params["batch"] = ["a", "b", 3]
            if kind is E.RETRY_LEASE_ACQUIRED:
                params["budget"] = max(params["budget"], 2)
            self._fresh()
            self._accept(params)
            self.seed_invariants()
        path = _route(self.p.state, src)
        if path is None:
            # Only when the table lost its path to ``src`` since import (a table bug:
            # ``test_the_walk_takes_every_table_edge`` names the edge).
            _note(f"take_edge: {src} unreachable")
            return
        for step_kind, step_dest in [*path, (kind, dst)]:
            if (
                kind in POLLS
                and self.p.state == "completed_committed"
                and self.p.record().operation is None
            ):
                self._step(choose, E.OPERATION_ACCEPTED, "completed_committed")
            if rule_refuses(self.p.record(), step_kind):
                _note(f"take_edge stopped: {step_kind} refused by its rule")
                return  # e.g. a retry lease with the budget spent: the walk ends here
            self._step(choose, step_kind, step_dest)
            self.seed_invariants()
            loops = [m for m in valid_moves(self.p) if m[1] == self.p.state]
            if loops and detour():
                # now and then a self-loop on the way (diagnostics, a failed setup attempt, an
                # inconclusive reconciliation...): the table has as many as it has states
                self._step(choose, *choose(loops))
                self.seed_invariants()

    @rule(data=st.data())
    def valid_event(self, data: st.DataObject) -> None:
        moves = valid_moves(self.p)
        if not moves:
            return
        onward = [m for m in moves if not _absorbing(m[1]) and m[1] != self.p.state]
        if onward and data.draw(st.integers(0, 9)) < 8:
            moves = onward  # mostly go somewhere that still has a future
        kind, dest = data.draw(st.sampled_from(moves))
        self._step(_chooser(data), kind, dest)

    def _step(self, choose: Choose[Any], kind: EventKind, dest: str) -> None:
        event = make_event(self.p, kind, dest, self._next(), choose)
        parent = self.p.record(self.now).code
        if kind is E.BATCH_ITEMS_RECORDED and parent is not None:
            self._items_under_no_success(event, parent)
        else:
            assert self._apply(event), f"valid {kind} -> {dest} was refused in {self.p.state}"
        assert self.p.state == dest

    def _items_under_no_success(self, event: Event, parent: Code) -> None:
        """Items recorded under a parent that was no success: the writer takes exactly the rows
        whose every item the parent backs; a row it refuses (one written before the rule) is
        folded as written when each item is backed or refused with the parent's code beside a
        status of its own, else as every item unknown (statemachine/batch.py)."""
        items = event.attrs["items"]
        written = self._apply(event, writing=True)
        assert written == all(_backed_by(parent, i, writing=True) for i in items), items
        if written:
            return
        assert self._apply(event), "the fold refused a row a stored journal may hold"
        rec = self.p.record(self.now)
        assert rec.items is not None
        got = [(i["outcome"], i["code"]) for i in rec.items]
        if all(_backed_by(parent, i, writing=False) for i in items):
            assert got == [(i["outcome"], i["code"]) for i in items]
        else:
            assert got == [(_UNKNOWN_ITEM[0], _UNKNOWN_ITEM[1])] * len(items)

    @rule(
        kind=st.sampled_from(list(EventKind)),
        attrs=ATTRS,
        source=st.sampled_from(list(EvidenceSource)),
        fresh_seq=st.booleans(),
    )
    def random_event(
        self, kind: EventKind, attrs: dict[str, Any], source: EvidenceSource, fresh_seq: bool
    ) -> None:
        # A stale seq must be refused whatever the event; a fresh one is up to the table.
        seq = self._next() if fresh_seq else max(self.seq - 1, 0)
        self._apply(Event(kind, IID, attrs, source=source, seq=seq))

    @rule(iid=st.sampled_from(["act_other", "act_x"]))
    def event_for_another_invocation(self, iid: str) -> None:
        event = Event(E.PROTOCOL_OBSERVED, iid, {"protocol": "http", "state": "s"}, seq=10**9)
        assert not self._apply(event)

    @rule(dt=st.sampled_from([1.0, 60.0, 3_600.0]))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        self.prev = self.p.record(self.now)

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def seed_invariants(self) -> None:
        rec = self.p.record(self.now)
        prev = self.prev
        _note(f"state {rec.state}")
        if self.dispatched:
            # "The broker never moves it back to not_attempted."
            assert rec.outcome is not Outcome.NOT_ATTEMPTED
            assert rec.evidence["dispatch_started"] is True
        else:
            assert rec.evidence["dispatch_started"] is False
        if prev.outcome in RESOLVED:
            # committed / rejected never become unknown or not_attempted
            assert rec.outcome in RESOLVED
        if prev.outcome is Outcome.UNKNOWN:
            assert rec.outcome is not Outcome.NOT_ATTEMPTED
        assert rec.generation >= prev.generation
        assert rec.budget.used <= rec.budget.total
        # Monotone, except that an attempt refused in its own preflight -- a retry, or the
        # first one -- gives back the one its lease (or ACTION_ACCEPTED) took (issue 9: a
        # refused preflight is no attempt), and so does one its caller withdrew or the broker
        # stopped before its gate (audit 52a: a hang-up sent nothing).
        refund = rec.state in ("credential_failed", "validation_failed", "retry_invalid")
        refund = refund or rec.state == "retry_credential_failed"
        stopped = rec.code in (Code.CALLER_CANCELLED, Code.BROKER_SHUTDOWN)
        refund = refund or (stopped and rec.state in ("setup_failed", "retry_setup_failed"))
        assert rec.budget.used >= prev.budget.used - (1 if refund else 0)
        assert len(rec.attempts) >= len(prev.attempts)
        # an attempt once recorded keeps its number, generation and dispatch seq
        for old, new in zip(prev.attempts, rec.attempts, strict=False):
            for k in ("n", "generation", "seq", "stage"):
                assert old.get(k) == new.get(k)
        if prev.last_seq is not None:
            assert rec.last_seq is not None and rec.last_seq >= prev.last_seq
        assert rec.retry is _expected_retry(rec, self.now, self.max_retry_after)
        _hint_invariants(rec, self.now, self.max_retry_after)
        _item_invariants(rec, prev)
        _operation_invariants(rec, prev)
        env = render_envelope(rec)
        VALIDATOR.validate(json.loads(json.dumps(env)))
        self.prev = rec


_SAFE_PATHS_OUT_OF_UNKNOWN = {Retry.BACKOFF, Retry.SAME_IDEMPOTENCY_KEY, Retry.RECONCILE}
_RESENDS = {Retry.BACKOFF, Retry.SAME_IDEMPOTENCY_KEY}


def _key_usable(rec: Record, now: float) -> bool:
    """Seed: a key makes a resend safe only under a verified remote deduplication contract, and
    automatic retries stop *before* the remote forgets it -- for a retry taken now, before the
    remote may forget it while that retry may still send (its recorded send window)."""
    idem = rec.idempotency
    if not idem or not idem.get("key") or idem.get("remote_contract") == "none":
        return False
    expires = idem.get("expires_at")
    window = idem.get("send_window") or 0.0
    return expires is None or now + window < expires - RETENTION_MARGIN_S


def _hint_invariants(rec: Record, now: float, max_retry_after: float) -> None:
    """The seed's retry rules as properties of the hint, stated without ``compute_retry`` (the
    check above compares the projection with the function it calls, so it cannot catch a wrong
    rule in ``retry.py``)."""
    retry, outcome = rec.retry, rec.outcome
    if rec.budget.left <= 0:
        # "Once the budget is exhausted, return the latest evidence and require reconciliation."
        assert retry not in _RESENDS, f"{retry} with the budget spent"
    if retry is Retry.FETCH_RESULT:
        # Only a stored, definite result is fetched (or one still to come: a pending approval
        # or call); a fetch never stands in for a resend.
        waiting = rec.code is not None and CODES[rec.code].pending
        assert waiting or (outcome in RESOLVED and rec.state.startswith("delivery_failed_"))
    if rec.state.startswith("delivery_failed_"):
        # Seed: "set retry=fetch_result" -- unless no read can deliver it (it names no
        # requester): then "fetch it" would be asked again after every fetch.
        assert (retry is Retry.FETCH_RESULT) is (rec.requester is not None), retry
    undeliverable = rec.state.startswith("delivery_failed_") and rec.requester is None
    if undeliverable and rec.code is None:
        assert retry is Retry.NEVER, retry  # its stored result's: a complete success, use it
    elif undeliverable and rec.code is not Code.REMOTE_THROTTLED:
        # Its stored result's: the code's own hint ("Any other code: its default hint") --
        # reconcile in place of one that resends beside an item the parent does not refuse.
        own = CODES[rec.code].retry
        beside = own in (Retry.AFTER_CORRECTION, *_RESENDS) and _beside_an_item_not_refused(rec)
        assert retry is (Retry.RECONCILE if beside else own), (rec.code, retry)
    if outcome is Outcome.UNKNOWN:
        if rec.state == "store_failed_unknown":
            assert retry is Retry.NEVER  # fix storage, not a retry of the remote action
        elif rec.idempotent and rec.code is Code.RESULT_SIZE_LIMIT:
            # The remote was sending more than max_result: the identical request meets the
            # same limit again, so no resend after a delay -- correct the limit or the request.
            assert retry is Retry.AFTER_CORRECTION, retry
        else:
            # "There are only three safe paths out of unknown."
            assert retry in _SAFE_PATHS_OUT_OF_UNKNOWN, retry
        if retry is Retry.BACKOFF:
            assert rec.idempotent, "a resend of an unknown non-idempotent action"
        if retry is Retry.SAME_IDEMPOTENCY_KEY:
            assert _key_usable(rec, now), "same key without a usable remote contract"
        if not rec.idempotent and not _key_usable(rec, now) and rec.state != "store_failed_unknown":
            assert retry is Retry.RECONCILE, retry
    if outcome is Outcome.COMMITTED:
        # "Do not turn every 5xx into permission to retry a POST."
        assert retry not in _RESENDS, f"{retry} after a committed result"
    if outcome is Outcome.REJECTED and retry is Retry.BACKOFF:
        # Only a throttle with a suitable Retry-After, on an operation safe to resend.
        assert rec.code is Code.REMOTE_THROTTLED, rec.code
        assert rec.retry_after is not None and rec.retry_after <= max_retry_after
        assert rec.idempotent or _key_usable(rec, now)
    if rec.code is Code.REMOTE_THROTTLED and (rec.state in THROTTLE_STATES or undeliverable):
        # ...and such a throttle does permit backoff while the budget lasts; otherwise the
        # caller must look before sending again.
        timely = rec.retry_after is not None and rec.retry_after <= max_retry_after
        safe = rec.idempotent or _key_usable(rec, now)
        allowed = timely and safe and rec.budget.left > 0
        allowed = allowed and not _beside_an_item_not_refused(rec)
        assert retry is (Retry.BACKOFF if allowed else Retry.RECONCILE), (retry, timely, safe)
    if rec.state.startswith("store_failed_"):
        # "What needs fixing is storage, not a retry of the remote action", whatever the
        # outcome the unstored result had.
        assert retry is Retry.NEVER, retry
    if retry is Retry.SAME_IDEMPOTENCY_KEY:
        assert outcome is Outcome.UNKNOWN


THROTTLE_STATES = ("completed_rejected", "stored_rejected", "delivered_rejected")
"""Where a throttle's hint is decided by safety, Retry-After and the budget (a store or
delivery failure has its own hint) -- and a failed delivery of a record naming no requester,
whose hint is its stored result's."""


def _event_postconditions(event: Event, before: Record, after: Record) -> None:
    """What an accepted event must have done, stated by the seed rather than read back from the
    table (a wrong table entry passes every check derived from the table)."""
    kind = event.kind
    if before.outcome in RESOLVED:
        # A complete, authentic remote result is what it is: storing, delivering or failing
        # to deliver it never changes it.
        assert after.outcome is before.outcome, f"{kind}: {before.outcome} -> {after.outcome}"
    if kind is E.REMOTE_RESPONSE_COMPLETE:
        assert after.outcome is Outcome(event.attrs["outcome"])
    if kind is E.RESULT_STORE_FAILED:
        # The remote result (if any) stays what it was; the phase says storage failed.
        assert after.outcome is before.outcome
        assert after.phase is Phase.RESULT_DELIVERY and after.retry is Retry.NEVER
    if kind is E.RESULT_DELIVERY_FAILED:
        # Seed: "Report phase=result_delivery, keep outcome=committed or rejected, and set
        # retry=fetch_result."
        assert after.outcome in RESOLVED and after.phase is Phase.RESULT_DELIVERY
        assert (after.retry is Retry.FETCH_RESULT) is (after.requester is not None)
    if kind is E.RESULT_DELIVERED:
        assert after.retry is not Retry.FETCH_RESULT and after.phase is not Phase.RESULT_DELIVERY


_LINKED = {
    E.RECONCILE_INCONCLUSIVE: "query_invocation",
    E.OPERATION_POLL_FAILED: "poll_invocation",
    E.OPERATION_POLLED: "poll_invocation",
}


def _linked_invariants(event: Event, after: Record, closed: set[str]) -> None:
    """One question at a time, never asked again once answered: no accepted row reopens a
    linked call (a reconciliation query, a poll) a row closed -- the record's open query and
    open poll never name one, a stale row naming it ``open`` included (a no-op when folded).
    ``closed``: the calls a row named without ``open``, kept up to date here.  A row from before
    rows named ``open`` (APPROVAL_PENDING, no ``open``) opens its call as written."""
    name = _LINKED.get(event.kind)
    call = event.attrs.get(name) if name is not None else None
    opened = event.attrs.get("open")
    legacy = (
        opened is None
        and event.kind is not E.OPERATION_POLLED
        and event.attrs.get("code") == Code.APPROVAL_PENDING.value
    )
    if isinstance(call, str) and legacy:
        closed.discard(call)  # folded as written: open again (``rules_lease``, ``operation``)
    queries = after.evidence.get("reconcile_queries", ())
    open_now = {open_query(queries, after.generation), (after.operation or {}).get("open_poll")}
    assert not (open_now & closed), f"{event.kind.value} reopened a closed call: {open_now}"
    if isinstance(call, str) and opened is not True and not legacy:
        closed.add(call)


_UNKNOWN_ITEM = ("unknown", "REMOTE_RESULT_INCOMPLETE", "reconcile")


def _backed_by(parent: Code, item: dict[str, Any], writing: bool) -> bool:
    """The rule (an oracle apart from statemachine/batch.py): under a parent that was no success,
    an item is unknown with no status, or -- under a rejection -- refused with the parent's code
    and a hint no stronger than the code's; a status of its own only in a row written before
    the rule."""
    if (item["outcome"], item["code"], item["retry"]) == _UNKNOWN_ITEM and "status" not in item:
        return True
    return (
        CODES[parent].outcome is Outcome.REJECTED
        and (item["outcome"], item["code"]) == ("rejected", parent.value)
        and item["retry"] in (CODES[parent].retry.value, "reconcile")
        and not (writing and "status" in item)
    )


def _item_invariants(rec: Record, prev: Record) -> None:
    """Seed: a batch's items have outcomes of their own, never better known than the evidence:
    before dispatch each is not_attempted; no item is not_attempted after it; an unresolved
    parent leaves every item sharing its outcome and hint; a complete response that was no
    success gives no item more than the parent proves -- each unknown, or refused with the
    parent's code (audit 48b #3)."""
    if rec.items is None:
        return
    if rec.code is not None and rec.state.startswith("completed_"):
        for i in rec.items:
            unknown = (i["outcome"], i["code"], i["retry"]) == _UNKNOWN_ITEM
            assert (unknown and "status" not in i) or (
                CODES[rec.code].outcome is Outcome.REJECTED
                and (i["outcome"], i["code"]) == ("rejected", rec.code.value)
            ), f"an item says more than its parent's {rec.code.value}: {i}"
    outcomes = {Outcome(i["outcome"]) for i in rec.items}
    if rec.evidence["dispatch_started"]:
        assert Outcome.NOT_ATTEMPTED not in outcomes
    else:
        assert outcomes == {Outcome.NOT_ATTEMPTED}
    if rec.outcome in (Outcome.NOT_ATTEMPTED, Outcome.UNKNOWN):
        assert outcomes == {rec.outcome}
        assert {i["retry"] for i in rec.items} == {rec.retry.value}
    if prev.items is not None:
        assert [i["id"] for i in rec.items] == [i["id"] for i in prev.items]


def _operation_invariants(rec: Record, prev: Record) -> None:
    """Seed: the job is tracked apart from the submission; its terminal state never moves, and
    a poll never takes a job back to none."""
    if prev.operation is not None:
        assert rec.operation is not None and rec.operation["id"] == prev.operation["id"]
        assert rec.operation["polls"] >= prev.operation["polls"]
        if prev.operation["state"] in ("succeeded", "failed"):
            assert rec.operation["state"] == prev.operation["state"]
    if rec.operation is not None:
        assert rec.outcome is Outcome.COMMITTED  # only a complete, committed 202 accepts a job


def _absorbing(state: str) -> bool:
    return all(dest in ("=", state) for dest in TRANSITIONS[state].values())


def _beside_an_item_not_refused(rec: Record) -> bool:
    """Seed: "a single retry hint cannot safely be assigned to the whole batch" -- a resolved
    parent that was no success beside an item it does not refuse gets ``reconcile``."""
    return (
        rec.items is not None
        and rec.code is not None
        and rec.outcome in RESOLVED
        and any(i["outcome"] != "rejected" for i in rec.items)
    )


def _expected_retry(rec: Record, now: float, max_retry_after: float) -> Any:
    idem = rec.idempotency
    hint = compute_retry(
        HintInputs(
            state=rec.state,
            outcome=rec.outcome,
            code=rec.code,
            idempotent=rec.idempotent,
            # A key the remote does not deduplicate on never makes a resend safe.
            has_key=bool(idem and idem.get("key") and idem.get("remote_contract") != "none"),
            key_expires_at=idem.get("expires_at") if idem else None,
            retry_after=rec.retry_after,
            max_retry_after=max_retry_after,
            budget_left=rec.budget.total - rec.budget.used,
            now=now,
            send_window=float(idem.get("send_window") or 0.0) if idem else 0.0,
            deliverable=rec.requester is not None,
        )
    )
    resends = hint in (Retry.AFTER_CORRECTION, *_RESENDS)
    return Retry.RECONCILE if resends and _beside_an_item_not_refused(rec) else hint


ProjectionMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=25, deadline=None
)
TestProjectionMachine = ProjectionMachine.TestCase


PLAIN = {
    "idempotent": False,
    "key": "req_01",
    "expires_in": 3_600.0,
    "budget": 3,
    "max_retry_after": 300.0,
    "batch": None,
    "atomic": False,
    "remote_contract": None,
    "send_window": 35.0,
}


def test_the_walk_takes_every_table_edge() -> None:
    """The proof that ``take_edges`` can explore the whole table: for every (state, event,
    destination) edge the table declares, a fresh machine's walk to it takes it, the seed's
    invariants and the event postconditions checked at every step on the way.  Deterministic
    (first choice everywhere), so an edge the walk cannot reach fails here, not by chance."""
    missed = []
    for edge in WALKABLE:
        m = ProjectionMachine()
        m._accept(dict(PLAIN))
        m.take_edge(edge, choose=first, fresh_params=lambda: dict(PLAIN), detour=lambda: False)
        if edge not in m.taken:
            missed.append(edge)
    assert not missed, f"{len(missed)}/{len(WALKABLE)} edges never taken: {missed}"
