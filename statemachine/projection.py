"""Projection: an ordered event list in, the current record out.  Pure and synchronous.

Seed, "The error envelope must contain evidence": store transitions as append-only events, then
project the current state.  The projection refuses impossible events (``ImpossibleEvent``) and
never rewrites history: a refused event leaves the fold exactly as it was, so a caller that
catches the error still holds the last good record.

Each event costs one lookup in a dict compiled from ``lifecycle.TRANSITIONS``: (state, kind) ->
(destination, the kind's rule from ``rules.py``), where the rule checks the event and only then
applies it.  ``fold_rows()`` is that dict, read-only; tests prove it and the ``transitions``
machine agree.  Speed matters -- recovery and the views fold whole journals, and
tests/benchmarks/projection.py holds ``project_all`` within 10x of a bare table-lookup loop --
and two choices here come from that benchmark: ``project_all`` inlines ``Projector.apply``, and
it pauses the cyclic garbage collector (see there for the figures).
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from .batch import items_view, parent_retry
from .contract import CODES, Code, Outcome, Phase, Retry
from .events import Event, EventKind
from .lifecycle import INITIAL, OUTCOME_SPLIT, STATES, TRANSITIONS
from .record import Budget, ImpossibleEvent, Record, Unsealed, shared_budget
from .retry import retry_hint, send_window, static_retry_hint
from .rules import DEFAULT_BUDGET, DEFAULT_MAX_RETRY_AFTER, RULES, SPLITTING, Rule

__all__ = [
    "Budget",
    "ImpossibleEvent",
    "Projector",
    "Record",
    "fold_rows",
    "fold_runs",
    "project",
    "project_all",
]


class Projector:
    """Folds events for one invocation.  ``apply`` is atomic: it validates, then mutates."""

    __slots__ = (
        "_at",
        "_attempts",
        "_batch",
        "_budget_total",
        "_budget_used",
        "_code",
        "_events",
        "_evidence",
        "_fenced",
        "_field",
        "_fingerprint",
        "_generation",
        "_idempotency",
        "_idempotent",
        "_idempotent_recorded",
        "_invocation_id",
        "_last_seq",
        "_max_retry_after",
        "_message",
        "_operation",
        "_protocol",
        "_requester",
        "_result_code",
        "_retry_after",
        "_session",
        "_state",
        "_target",
        "_writing",
    )

    def __init__(self, invocation_id: str | None = None) -> None:
        self._invocation_id = invocation_id
        self._state = INITIAL
        self._code: Code | None = None
        self._message: str | None = None
        self._field: str | None = None
        self._session: str | None = None
        self._requester: int | None = None
        self._target: str | None = None
        self._protocol: str | None = None
        self._idempotent = False
        self._idempotent_recorded = False  # ACTION_ACCEPTED's operation says (``idempotent``)
        self._fingerprint: str | None = None
        # A read-only view, set once by ACTION_ACCEPTED and handed to every record as is.
        self._idempotency: Mapping[str, Any] | None = None
        self._generation = 0
        self._budget_total = DEFAULT_BUDGET
        self._budget_used = 0
        # Attempts are the fold's own dicts: only the last one is ever edited (when the
        # attempt's outcome is learnt), and a record gets read-only views of copies
        # (``record``) or, when the fold is dropped right after (``last_record``), of these.
        self._attempts: list[dict[str, Any]] = []
        # Evidence values are replaced, never edited in place (steps, protocol facts and stale
        # workers grow by copy): a record's snapshot is then one shallow copy of this dict.
        self._evidence: dict[str, Any] = {"dispatch_started": False}
        self._retry_after: float | None = None
        self._result_code: Code | None = None
        self._max_retry_after = DEFAULT_MAX_RETRY_AFTER
        self._last_seq: int | None = None
        self._events = 0
        self._at: float | None = None
        # Read-only views, replaced (never edited) by the operation and batch rules.
        self._operation: Mapping[str, Any] | None = None
        """The job this invocation's complete 202 accepted (``operation.py``), if any."""
        self._batch: Mapping[str, Any] | None = None
        """The items this invocation sent as a batch and their outcomes (``batch.py``)."""
        self._fenced: Mapping[str, Any] | None = None
        """ACTION_ACCEPTED's ``fenced``: a read-only view, set once (``Record.fenced``)."""
        self._writing = False
        """Set by ``apply(writing=True)`` while its rule runs: the writer's check of a new row."""

    @property
    def state(self) -> str:
        return self._state

    @property
    def events(self) -> int:
        """How many events are folded: 0 for a fold of an id no row names (``Record.events``)."""
        return self._events

    @property
    def generation(self) -> int:
        """The current lease generation (0 before any lease): the attempt whose events the
        record accepts."""
        return self._generation

    @property
    def lease(self) -> Mapping[str, Any] | None:
        """``evidence.lease`` as folded so far (the current attempt's lease and deadline),
        without building a record: the dispatch gate reads it in the writing transaction."""
        lease = self._evidence.get("lease")
        return lease if isinstance(lease, Mapping) else None

    # -- folding ------------------------------------------------------------------------------

    def apply(self, event: Event, writing: bool = False) -> str:
        """Fold one event; return the new state.  Raises ``ImpossibleEvent`` and changes nothing
        when the event is not allowed.  ``writing``: the event is a new row the writer checks
        (``journal.txn``) -- the same rules in the same order, and a stale row of a linked call,
        which a stored journal may hold and the fold takes as a no-op, is refused
        (``rules_common._stale_row``): one decision point, the writer's reasons the fold's."""
        # Hot path (recovery folds whole journals; tests/benchmarks/projection.py): one lookup
        # gives the destination and the kind's rule, which checks and then applies the event.
        rule = _ROWS[self._state].get(event.kind)
        seq = event.seq
        iid = self._invocation_id
        attrs = event.attrs
        if (
            rule is None
            or (seq is not None and self._last_seq is not None and seq <= self._last_seq)
            or (iid is not None and event.invocation_id != iid)
            or (type(attrs) is not dict and not isinstance(attrs, Mapping))
        ):
            raise self._refusal(event)
        dest, check_and_apply = rule
        if writing:
            self._writing = True
            try:
                outcome = check_and_apply(self, event)
            finally:
                self._writing = False
        else:
            outcome = check_and_apply(self, event)
        # -- the rule validated and applied the event; record that it happened --
        if outcome is not None:
            dest = _SPLIT[dest][outcome]  # the rule proved outcome is rejected or committed
        self._state = dest
        if seq is not None:
            self._last_seq = seq
        if event.at is not None:
            self._at = event.at
        self._events += 1
        if iid is None:
            self._invocation_id = event.invocation_id
        return dest

    def _refusal(self, event: Event) -> ImpossibleEvent:
        """Why ``apply`` refuses an event the lifecycle or the fold's order rules out."""
        state = self._state
        if event.invocation_id != self._invocation_id and self._invocation_id is not None:
            return ImpossibleEvent(event, state, "belongs to another invocation")
        seq, last = event.seq, self._last_seq
        if seq is not None and last is not None and seq <= last:
            return ImpossibleEvent(event, state, f"seq {seq} does not follow {last}")
        attrs: object = event.attrs  # typed a Mapping; a new event may carry anything
        if type(attrs) is not dict and not isinstance(attrs, Mapping):
            # The rules read attrs as an object: a list or a string is no fact they can check
            # (the journal's rows are checked when decoded; a new event is checked here).
            return ImpossibleEvent(
                event, state, f"attrs are a {type(attrs).__name__}, not an object"
            )
        return ImpossibleEvent(event, state, "no such transition in the lifecycle table")

    def extend(self, events: Iterable[Event]) -> Projector:
        for event in events:
            self.apply(event)
        return self

    # -- reading ------------------------------------------------------------------------------

    def record(self, now: float | None = None) -> Record:
        """A snapshot of the fold: later events do not change it.

        ``now``: the moment the retry hint is computed for (an idempotency key's retention,
        the budget and Retry-After are judged against it).  An answer -- anything shown to a
        caller, an agent or an operator -- passes the clock at the moment it answers
        (docs/contract.md, "When the hint is computed"): a hint computed earlier may still say
        a resend is safe after the remote forgot the key.  None computes it as of the fold's
        last event: a deterministic snapshot for a fold whose hint is not shown (a test, the
        record's other fields); ``project`` and ``project_all`` take no default."""
        return self._build(now, self._evidence.copy(), [a.copy() for a in self._attempts])

    def last_record(self, now: float | None = None) -> Record:
        """``record()`` for a caller that drops the projector right after (``project``,
        ``project_all``, the journal's views): the record takes the fold's own evidence and
        attempts, without copies.  Folding on afterwards would change that record."""
        return self._build(now, self._evidence, self._attempts)

    def _hint(
        self, state: str, outcome: Outcome, code: Code | None, now: float, deliverable: bool
    ) -> Retry:
        """``retry_hint`` on this record's operation, key, Retry-After and budget."""
        idem = self._idempotency
        return retry_hint(
            state,
            outcome,
            code,
            self._idempotent,
            idem.get("expires_at") if idem else None,
            # A key the remote does not deduplicate on (an SSH command's reference) binds
            # the invocation in the journal but never makes a resend safe.
            bool(idem and idem.get("key") and idem.get("remote_contract") != "none"),
            self._retry_after,
            self._max_retry_after,
            self._budget_total - self._budget_used,
            now,
            # How long a retry taken now may still send: the key must outlast it.
            send_window(idem),
            deliverable=deliverable,
        )

    def _build(
        self, now: float | None, evidence: dict[str, Any], attempts: list[dict[str, Any]]
    ) -> Record:
        """The record, with ``evidence`` as its evidence and views of ``attempts``."""
        state = self._state
        phase, outcome, hints, undeliverable = _STATE_INFO[state]
        deliverable = self._requester is not None  # no read delivers a record naming no one
        code = self._code
        retry = (hints if deliverable else undeliverable)[code]
        if now is None:
            now = self._at if self._at is not None else 0.0
        if retry is None:  # the hint depends on the operation, the budget or the clock
            retry = self._hint(state, outcome, code, now, deliverable)
        batch = self._batch
        # Built in a twin without the frozen __setattr__, then made a Record (events.py,
        # ``unfrozen_twin``, says why and what it saves).
        r: Any = _blank(Unsealed)
        r.invocation_id = self._invocation_id or ""
        r.state = state
        r.phase = phase
        r.outcome = outcome
        r.retry = retry
        r.code = code
        r.message = self._message or _MEANING[code]
        r.session = self._session
        r.target = self._target
        r.protocol = self._protocol
        r.idempotent = self._idempotent
        r.idempotent_recorded = self._idempotent_recorded
        r.fingerprint = self._fingerprint
        r.idempotency = self._idempotency
        r.generation = self._generation
        r.budget = shared_budget(self._budget_total, self._budget_used)
        r.attempts = tuple(map(MappingProxyType, attempts))
        r.evidence = MappingProxyType(evidence)
        r.retry_after = self._retry_after
        r.last_seq = self._last_seq
        r.events = self._events
        r.field = self._field
        r.operation = self._operation
        r.fenced = self._fenced
        r.requester = self._requester
        if batch is not None:
            # A throttled item: the rule a throttled request gets, on this record's inputs
            # (in the state of a complete rejection: the item's own, not the parent's).
            r.items = items_view(
                batch,
                outcome,
                code,
                retry,
                lambda: self._hint("completed_rejected", _REJECTED, _THROTTLED, now, deliverable),
                _reconciled_source(state, evidence),
            )
            r.retry = parent_retry(r.items, outcome, code, retry)
        else:
            r.items = None
        r.__class__ = Record
        record: Record = r
        return record


_REJECTED = Outcome.REJECTED
_THROTTLED = Code.REMOTE_THROTTLED


def _reconciled_source(state: str, evidence: Mapping[str, Any]) -> str | None:
    """The source of the reconciliation that settled a ``reconciled_*`` record, else None."""
    if not state.startswith("reconciled_"):
        return None
    found = evidence.get("reconciliation")
    return found.get("source") if isinstance(found, Mapping) else None


# --- the compiled table ------------------------------------------------------------------------

_SPLIT: dict[str, dict[str, str]] = {
    dest: {outcome.value: state for outcome, state in split.items()}
    for dest, split in OUTCOME_SPLIT.items()
}


def _compile_rows() -> dict[str, dict[EventKind, tuple[str, Rule]]]:
    """(state, kind) -> (destination, rule): ``apply``'s single lookup per event."""
    rows: dict[str, dict[EventKind, tuple[str, Rule]]] = {}
    for state, row in TRANSITIONS.items():
        rows[state] = {}
        for kind, dest in row.items():
            if (dest in _SPLIT) != (kind in SPLITTING):
                raise RuntimeError(f"{state} --{kind.value}--> {dest}: rules cannot split this")
            rows[state][kind] = (state if dest == "=" else dest, RULES[kind])
    return rows


_ROWS = _compile_rows()


def fold_rows() -> Mapping[str, Mapping[EventKind, tuple[str, Rule]]]:
    """What ``apply`` looks up, read-only: state -> kind -> (destination, rule).  A destination
    is a state, ``"="`` resolved to the source state; a split one (``"completed_*"``) is
    resolved by the outcome its rule returns (``lifecycle.OUTCOME_SPLIT``)."""
    return MappingProxyType({state: MappingProxyType(row) for state, row in _ROWS.items()})


_Hints = dict[Code | None, Retry | None]


def _static_hints(state: str, outcome: Outcome, deliverable: bool) -> _Hints:
    return {
        code: static_retry_hint(state, outcome, code, deliverable=deliverable)
        for code in (None, *Code)
    }


_STATE_INFO: dict[str, tuple[Phase, Outcome, _Hints, _Hints]] = {
    state: (
        spec.phase,
        spec.outcome,
        _static_hints(state, spec.outcome, True),
        _static_hints(state, spec.outcome, False),
    )
    for state, spec in STATES.items()
}
"""Per state: its phase, its outcome and, per code, the retry hint when those alone decide it
-- of a record naming its requester, then of one naming none (``HintInputs.deliverable``)."""

_MEANING: dict[Code | None, str] = {None: "", **{c: CODES[c].meaning for c in Code}}

_blank = object.__new__


# --- folding whole logs ------------------------------------------------------------------------


def project(events: Iterable[Event], now: float | None) -> Record:
    """Fold one invocation's events (in ``seq`` order) into its record, its retry hint
    computed at ``now`` (``Projector.record``; None: as of the last event).  No default: a
    caller that answers with the record must say when it answers."""
    return Projector().extend(events).last_record(now)


def _fold_all(events: Iterable[Event]) -> dict[str, Projector]:
    """One fold per invocation id over an interleaved log (``project_all`` without records)."""
    folds: dict[str, Projector] = {}
    get = folds.get
    rows, split = _ROWS, _SPLIT
    for event in events:
        iid = event.invocation_id
        p = get(iid)
        if p is None:
            p = folds[iid] = Projector(iid)
        # Projector.apply, inlined: this loop runs once per journal row on recovery and the call
        # cost ~10% of it.  A fold here only ever sees its own invocation's events, and a
        # refusal drops every fold (``project_all`` raises), so the order bookkeeping is done
        # before the rule runs, with one test of ``seq`` instead of two.  ``fold_runs`` inlines
        # the same steps: change both (tests/statemachine compares each with ``apply``).
        rule = rows[p._state].get(event.kind)
        attrs = event.attrs
        if rule is None or (type(attrs) is not dict and not isinstance(attrs, Mapping)):
            raise p._refusal(event)
        seq = event.seq
        if seq is not None:
            last = p._last_seq
            if last is not None and seq <= last:
                raise p._refusal(event)
            p._last_seq = seq
        dest, check_and_apply = rule
        outcome = check_and_apply(p, event)
        p._state = dest if outcome is None else split[dest][outcome]
        at = event.at
        if at is not None:
            p._at = at
        p._events += 1
    return folds


def fold_runs(
    events: Iterable[Event],
) -> Iterator[tuple[Projector, float | None, float | None]]:
    """Fold a log whose events come in runs, one run per invocation in ``seq`` order (the
    journal's grouped views, ``views.fold_each``): each run's projector, with the ``at`` of its
    first and last events, as soon as the run ends (at the next invocation's first event).

    ``Projector.apply``, inlined as in ``_fold_all`` (issue 15: the call was ~2.5% of the
    instructions of ``affidavit actions --json``'s fold over 1M events): an event the lifecycle
    or the order rules out raises ``ImpossibleEvent``, as ``apply`` would, and ends the fold --
    the projector it was for is never handed out, so the order bookkeeping is done before the
    rule runs.  A run is one invocation's by construction (it ends where the invocation id
    changes), so no event is checked against its projector's invocation."""
    rows, split = _ROWS, _SPLIT
    p: Projector | None = None
    first: float | None = None
    last: float | None = None
    for event in events:
        if p is None or event.invocation_id != p._invocation_id:
            if p is not None:
                yield p, first, last
            p = Projector(event.invocation_id)
            first = event.at
        rule = rows[p._state].get(event.kind)
        attrs = event.attrs
        if rule is None or (type(attrs) is not dict and not isinstance(attrs, Mapping)):
            raise p._refusal(event)
        seq = event.seq
        if seq is not None:
            last_seq = p._last_seq
            if last_seq is not None and seq <= last_seq:
                raise p._refusal(event)
            p._last_seq = seq
        dest, check_and_apply = rule
        outcome = check_and_apply(p, event)
        p._state = dest if outcome is None else split[dest][outcome]
        last = event.at
        if last is not None:
            p._at = last
        p._events += 1
    if p is not None:
        yield p, first, last


def project_all(events: Iterable[Event], now: float | None) -> dict[str, Record]:
    """Fold an interleaved log of many invocations; one record per invocation id, each retry
    hint computed at ``now`` (as ``project``; no default).

    The one piece of process state touched here: the cyclic garbage collector is paused for the
    fold (and restored, whatever happens).  The caller holds a large event list while the fold
    allocates many small, acyclic containers (records, evidence dicts, attempt views); every
    automatic full collection re-walks that list.  On the benchmark's 1M-event log that nearly
    doubles the time -- 22x the bare loop instead of 13x on a loaded machine, far past the 10x
    target (tests/benchmarks/projection.py).  Nothing here can form a reference cycle, so pausing
    the collector loses nothing; reference counting still frees everything."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        folds = _fold_all(events)
        # The folds are dropped here, so each record takes its fold's evidence without a copy.
        return {iid: p.last_record(now) for iid, p in folds.items()}
    finally:
        if gc_was_enabled:
            gc.enable()
