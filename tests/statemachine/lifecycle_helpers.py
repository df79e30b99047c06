"""Building valid lifecycle events for any (state, event, destination) — shared by the model
checks, the rule-based machine, the decide() property and the benchmark.

Every choice an event could vary on (which validation code, which outcome, which reconciliation
source...) goes through ``choose`` so hypothesis can explore it (``choose = data.draw(...)``) and
plain tests stay deterministic (``choose = first``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from hypothesis import strategies as st

from affidavit.statemachine import (
    CODES,
    TRANSITIONS,
    Code,
    Event,
    EventKind,
    EvidenceSource,
    Outcome,
    Phase,
    Projector,
    ProtocolMachine,
    ProtocolTable,
    Record,
    Retry,
    open_query,
    operation_id,
)
from affidavit.statemachine.check import protocol_paths
from affidavit.statemachine.lifecycle import INITIAL, STATES, edges, expand

T = TypeVar("T")
Choose = Callable[[Sequence[T]], T]

E = EventKind
IID = "act_test"
OPERATOR = {"uid": 1001, "name": "ops", "via": "socket"}
APPROVAL_FP = "sha256:a990"


def first(options: Sequence[T]) -> T:
    return options[0]


def codes_of(phase: Phase, outcome: Outcome | None = None) -> list[Code]:
    return [
        c
        for c in Code
        if CODES[c].phase is phase
        and (outcome is None or CODES[c].outcome is outcome)
        and not CODES[c].pending  # a waiting record's code ends nothing
    ]


CREDENTIAL_CODES = sorted(
    codes_of(Phase.CREDENTIAL_INJECTION), key=lambda c: CODES[c].retry is not Retry.BACKOFF
)
"""Backoff codes first: the deterministic walk (first choice) must reach credential_failed's
retry lease, which only such a refusal takes."""
PRE_DISPATCH_SETUP_CODES = [
    c for c in codes_of(Phase.CONNECTION_SETUP) if CODES[c].outcome is Outcome.NOT_ATTEMPTED
]
INTERRUPT_CODES = [
    Code.REMOTE_OUTCOME_UNKNOWN,
    Code.REMOTE_RESULT_INCOMPLETE,
    Code.CALLER_CANCELLED,
    Code.RESULT_SIZE_LIMIT,
]
REJECT_CODES = codes_of(Phase.REMOTE_EXECUTION, Outcome.REJECTED)
COMMIT_CODES: list[Code | None] = [None, *codes_of(Phase.REMOTE_EXECUTION, Outcome.COMMITTED)]


def operation(
    *,
    idempotent: bool = False,
    fingerprint: str = "sha256:aaaa",
    key: str | None = None,
    expires_at: float | None = None,
    budget: int = 3,
    max_retry_after: float = 300.0,
    batch: Sequence[str | int] | None = None,
    atomic: bool = False,
    remote_contract: str | None = None,
    send_window: float | None = None,
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "target": "payments",
        "protocol": "http",
        "idempotent": idempotent,
        "fingerprint": fingerprint,
        "budget": budget,
        "max_retry_after": max_retry_after,
    }
    if key is not None:
        idem: dict[str, Any] = {"key": key, "scope": "payments.create"}
        if expires_at is not None:
            idem["expires_at"] = expires_at
        if remote_contract is not None:
            idem["remote_contract"] = remote_contract
        if send_window is not None:
            idem["send_window"] = send_window
        op["idempotency"] = idem
    if batch is not None:
        op["batch"] = {"items": list(batch), "atomic": atomic}
    return op


def rule_refuses(rec: Record, kind: EventKind) -> bool:
    """Declared in the current state, yet refused by its rule whatever its attrs: a lease with
    the budget spent, item outcomes of an invocation that sent no batch, an operation event the
    operation table does not allow in the operation's state."""
    if kind is E.RETRY_LEASE_ACQUIRED:
        if rec.state == "credential_failed" and (
            rec.code is None or CODES[rec.code].retry is not Retry.BACKOFF
        ):
            return True  # only a refusal that asks to back off (APPROVAL_LIMIT) is retried
        return rec.budget.used >= rec.budget.total
    if kind is E.BATCH_ITEMS_RECORDED:
        return rec.items is None
    if kind is E.OPERATION_ACCEPTED:
        return rec.operation is not None
    if kind in (E.OPERATION_POLLED, E.OPERATION_POLL_FAILED):
        return rec.operation is None or rec.operation["state"] != "pending"
    return False


def valid_moves(p: Projector) -> list[tuple[EventKind, str]]:
    """Every (event, destination) the table allows now and whose event rules can be met."""
    rec = p.record()
    out = []
    for kind in sorted(TRANSITIONS[p.state]):
        if rule_refuses(rec, kind):
            continue
        for dest in expand(p.state, kind):
            out.append((kind, dest))
    return out


def make_event(
    p: Projector,
    kind: EventKind,
    dest: str,
    seq: int | None,
    choose: Choose[Any] = first,
    op: Mapping[str, Any] | None = None,
) -> Event:
    """A valid event of ``kind`` that takes ``p`` to ``dest`` (for ``p``'s own invocation, when
    it was made for one: an operation's id names its submitting invocation)."""
    iid = p._invocation_id or IID
    rec = p.record()
    attrs: dict[str, Any] = {}
    source = EvidenceSource.TRANSPORT_OBSERVED
    observer = observer_seq = None
    if kind is E.ACTION_ACCEPTED:
        # Naming its asker, as every record written now does (``Record.requester``).
        op = dict(op) if op is not None else operation()
        attrs = {"operation": op, "session": "s1", "requester": {"uid": 1000}}
    elif kind is E.PREFLIGHT_VALIDATED:
        attrs = {"config_hash": "sha256:c0f1"}
    elif kind is E.PREFLIGHT_FAILED:
        attrs = {"code": choose(codes_of(Phase.VALIDATION)).value, "field": "body.amount"}
    elif kind is E.CREDENTIAL_AUTHORIZED:
        attrs = {"credential": "payments-api", "version": 3, "inject": "bearer"}
    elif kind is E.CREDENTIAL_FAILED:
        attrs = {"code": choose(CREDENTIAL_CODES).value}
    elif kind is E.APPROVAL_REQUESTED:
        attrs = {"fingerprint": APPROVAL_FP, "expires_at": 1_900_000_000.0, "credential": "env:T"}
    elif kind is E.APPROVAL_GRANTED:
        approval = rec.evidence.get("approval") or {}
        attrs = {"fingerprint": approval.get("fingerprint", APPROVAL_FP), "operator": OPERATOR}
    elif kind in (E.APPROVAL_DENIED, E.APPROVAL_REVOKED):
        attrs = {"code": Code.APPROVAL_DENIED.value, "operator": OPERATOR, "note": "no"}
    elif kind is E.DISPATCH_LEASE_ACQUIRED:
        attrs = {"generation": rec.generation + choose([1, 2]), "holder": choose(["w1", "w2"])}
    elif kind in (E.SETUP_ATTEMPT_FAILED, E.SETUP_FAILED):
        attrs = {
            "code": choose(PRE_DISPATCH_SETUP_CODES).value,
            "stage": choose(["dns", "tcp_connect", "tls_handshake", "ssh_auth"]),
        }
    elif kind is E.RETRY_LEASE_ACQUIRED:
        attrs = {"generation": rec.generation + choose([1, 2]), "holder": choose(["w1", "w2"])}
    elif kind is E.DISPATCH_STARTED:
        attrs = {"generation": rec.generation, "connection": "c1"}
    elif kind is E.LEASE_LOST:
        attrs = {"generation": choose(sorted({0, rec.generation}))}
    elif kind is E.REMOTE_RESPONSE_STARTED:
        attrs = {"status": choose([200, 201, 401, 429, 500])}
    elif kind is E.REMOTE_RESPONSE_COMPLETE:
        outcome = STATES[dest].outcome
        code = choose(REJECT_CODES) if outcome is Outcome.REJECTED else choose(COMMIT_CODES)
        attrs = {
            "outcome": outcome.value,
            "code": code.value if code is not None else None,
            "status": 200,
            "response_sha256": "sha256:beef",
        }
        if code is Code.REMOTE_THROTTLED:
            ra = choose([None, 1.0, 30.0, 3_600.0])
            if ra is not None:
                attrs["retry_after"] = ra
        source = EvidenceSource.REMOTE_RESPONSE
    elif kind is E.ATTEMPT_INTERRUPTED:
        code = choose(INTERRUPT_CODES)
        attrs = {"code": code.value}
        if code is Code.RESULT_SIZE_LIMIT:  # the evidence it stands on
            attrs["result_size_limit"] = {"limit": 1024, "received_bytes": 1025}
    elif kind is E.RESULT_COMMITTED:
        attrs = {"sha256": "sha256:beef", "chunks": 1}
    elif kind is E.RECONCILED:
        attrs = {"outcome": STATES[dest].outcome.value, "note": "checked by id"}
        source = choose([EvidenceSource.REMOTE_QUERY, EvidenceSource.OPERATOR_ATTESTED])
        observer, observer_seq = "ops-console", choose([1, 17])
    elif kind is E.RECONCILE_INCONCLUSIVE:
        queries = rec.evidence.get("reconcile_queries", ())
        named = [q["query_invocation"] for q in queries]
        current = open_query(queries, rec.generation)
        attrs = _linked("query_invocation", _pool("act_q", seq, named), current, choose)
        if not attrs.get("open"):
            attrs["code"] = choose([None, "REMOTE_OUTCOME_UNKNOWN"])
        if choose([False, True]):
            attrs["not_before"] = 1.8e9
    elif kind is E.BATCH_ITEMS_RECORDED:
        ids = [i["id"] for i in rec.items] if rec.items is not None else ["a"]
        attrs = {"items": [_item(i, choose, rec.code) for i in ids]}
        source = EvidenceSource.REMOTE_RESPONSE
    elif kind is E.OPERATION_ACCEPTED:
        attrs = {
            "operation_id": operation_id(iid),
            "job_id": "j123",
            "status_url": "https://api.example/jobs/j123",
            "status_path": "/jobs/j123",
        }
        source = EvidenceSource.REMOTE_RESPONSE
    elif kind is E.OPERATION_POLLED:
        state = choose(["pending", "succeeded", "failed"])
        attrs = {
            "operation_id": operation_id(iid),
            # a poll that read a state is never open
            "poll_invocation": choose(_pool("act_p", seq, _polls(rec))[1:]),
            "state": state,
            "remote_status": state,
        }
        source = EvidenceSource.REMOTE_QUERY
    elif kind is E.OPERATION_POLL_FAILED:
        current = rec.operation.get("open_poll") if rec.operation is not None else None
        attrs = {
            "operation_id": operation_id(iid),
            **_linked("poll_invocation", _pool("act_p", seq, _polls(rec)), current, choose),
        }
        if not attrs.get("open"):
            attrs["code"] = Code.REMOTE_OUTCOME_UNKNOWN.value
    elif kind is E.PROTOCOL_OBSERVED:
        attrs = {"protocol": "http", "state": "headers_sent", "facts": {"reused": False}}
    return Event(
        kind,
        iid,
        attrs,
        source=source,
        seq=seq,
        observer=observer,
        observer_seq=observer_seq,
    )


def _pool(prefix: str, seq: int | None, named: Sequence[object]) -> list[str]:
    """The calls a linked call's row may name: a fresh one first (a claim's: ``prefix`` and
    ``seq``), then ``prefix`` 1 and 2 and those ``named`` on the record -- so that rows name
    calls earlier rows opened and closed (a stale row: ``statemachine/rules_common._reopened``)."""
    known = [f"{prefix}1", f"{prefix}2", *(n for n in named if isinstance(n, str))]
    return [f"{prefix}{seq}-fresh", *dict.fromkeys(known)]


def _polls(rec: Record) -> list[object]:
    """The polls the record names: its job's open poll and the last one that read it."""
    op = rec.operation or {}
    last = op.get("last_poll") or {}
    return [op.get("open_poll"), last.get("invocation_id")]


def _linked(name: str, pool: Sequence[str], current: object, choose: Choose[Any]) -> dict[str, Any]:
    """A linked call's row (its attribute ``name``): a claim (``open``, no code) naming the
    ``current`` open call or else a fresh one (``pool[0]``: a broker names a new call by a new
    id); an answer leaving a call open (APPROVAL_PENDING) naming ``current``, or else any call
    of ``pool`` -- a stale row, a no-op when folded; or a row closing a call of ``pool`` or
    ``current``.  An open row never names another call while one is open (refused: one call
    at a time), and a row that does not name ``open`` never says APPROVAL_PENDING (a row from
    before ``open`` rows: it opens its call as written)."""
    form = choose(["close", "claim", "answer"])
    named = [current] if isinstance(current, str) else []
    if form == "claim":
        return {name: (named or pool)[0], "open": True, "code": None}
    if form == "answer":
        return {name: named[0] if named else choose(pool), "open": True, "code": "APPROVAL_PENDING"}
    return {name: choose([*named, *pool[1:]])}


ITEM_RESULTS: list[tuple[Outcome, Code | None, str]] = [
    (Outcome.COMMITTED, None, "never"),
    (Outcome.REJECTED, Code.REMOTE_REJECTED, "after_correction"),
    (Outcome.REJECTED, Code.REMOTE_THROTTLED, "backoff"),
    (Outcome.COMMITTED, Code.REMOTE_ERROR, "reconcile"),
    (Outcome.UNKNOWN, Code.REMOTE_RESULT_INCOMPLETE, "reconcile"),
]
"""What a complete response may say of one item: (outcome, code, retry)."""


def _item(item_id: object, choose: Choose[Any], parent: Code | None = None) -> dict[str, Any]:
    """One item a complete response may record: any of ``ITEM_RESULTS`` under a success.  Under
    a parent that is no success (its ``code``), mostly what the writer accepts -- unknown or, a
    rejection, the parent's code (statemachine/batch.py) -- and now and then any item, with or
    without a status of its own: a row the writer refuses, which a journal written before the
    rule may hold (the fold reads it as documented).  ``first`` draws an accepted one."""
    results = ITEM_RESULTS
    status = None
    if parent is not None:
        backed = [ITEM_RESULTS[-1]]
        if CODES[parent].outcome is Outcome.REJECTED:
            backed.append((Outcome.REJECTED, parent, CODES[parent].retry.value))
        results = [*backed, *backed, *ITEM_RESULTS]
        status = choose([None, None, 422, 200])
    outcome, code, retry = choose(results)
    item = {
        "id": item_id,
        "outcome": outcome.value,
        "code": code.value if code is not None else None,
        "retry": retry,
    }
    if status is not None:
        item["status"] = status
    return item


def path_to(target: str) -> list[tuple[EventKind, str]]:
    """A shortest (event, destination) path from the initial state to ``target``."""
    prev: dict[str, tuple[str, EventKind]] = {}
    todo = deque([INITIAL])
    seen = {INITIAL}
    while todo:
        s = todo.popleft()
        if s == target:
            break
        for src, ev, dst in edges():
            if src == s and dst not in seen:
                seen.add(dst)
                prev[dst] = (src, EventKind(ev))
                todo.append(dst)
    if target not in seen:
        raise AssertionError(f"{target} is unreachable")
    steps: list[tuple[EventKind, str]] = []
    s = target
    while s != INITIAL:
        src, ev = prev[s]
        steps.append((ev, s))
        s = src
    return steps[::-1]


@st.composite
def protocol_walks(draw: st.DrawFn, table: ProtocolTable, max_targets: int = 4) -> list[str]:
    """Event sequences for a protocol table that walk its own graph: draw an edge still
    reachable from the current state, follow the table's shortest path there and take it, a few
    times over -- with now and then any event, or one no table has, on the way to exercise
    refusals.  Uniformly random event lists stay in the first setup states (they took 10 of
    HTTP's 99 edges and 4 of SSH's 80 and never crossed dispatch); this reaches past dispatch,
    into redirects, completion and the failures."""
    everything = sorted({ev for row in table.transitions.values() for ev in row})
    m = ProtocolMachine(table)
    events: list[str] = []
    for _ in range(draw(st.integers(1, max_targets))):
        paths = protocol_paths(table, m.state)
        targets = [e for e in table.edges() if e[0] in paths]
        if not targets:
            break
        src, target, _dst = draw(st.sampled_from(targets))
        for ev in [*paths[src], target]:
            if draw(st.integers(0, 9)) == 0:
                stray = draw(st.sampled_from([*everything, "not-an-event"]))
                if not m.allows(stray):
                    events.append(stray)  # refused: the state stays, the path still holds
            events.append(ev)
            m.fire(ev)
    return events


def projector_in(state: str, op: Mapping[str, Any] | None = None) -> Projector:
    """A projector driven to ``state`` by valid events (seq 1, 2, ...)."""
    p = Projector(IID)
    for seq, (kind, dest) in enumerate(path_to(state), start=1):
        got = p.apply(make_event(p, kind, dest, seq, op=op))
        assert got == dest
    return p


def drive(
    moves: Sequence[tuple[EventKind, str]],
    op: Mapping[str, Any] | None = None,
    choose: Choose[Any] = first,
) -> Projector:
    p = Projector(IID)
    for seq, (kind, dest) in enumerate(moves, start=1):
        assert p.apply(make_event(p, kind, dest, seq, choose, op=op)) == dest
    return p
