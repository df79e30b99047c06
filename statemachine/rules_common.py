"""What every projection rule shares: the ``Rule`` type, the refusals, the attrs checks.

The rules themselves (``rules_intake``, ``rules_attempt``, ``rules_lease``; the table that maps
each event kind to its rule is ``rules.RULES``) check an event against the fold before they
change anything; the helpers here are those checks' vocabulary.  Names keep their leading
underscore: like the ``Projector`` fields the rules write, they are the package's own, not an
interface.  Speed notes below (enum lookups through plain dicts, exact-type checks before the
general one) come from tests/benchmarks/projection.py: these functions run once per journal row
when a whole journal is folded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeGuard

from .contract import CODES, Code, EvidenceSource, Outcome, Phase
from .events import Event, EventKind
from .lifecycle import STATES
from .record import ImpossibleEvent

if TYPE_CHECKING:
    from .projection import Projector

__all__ = [
    "DEFAULT_BUDGET",
    "DEFAULT_MAX_RETRY_AFTER",
    "Rule",
    "refuse_reclaiming",
]

DEFAULT_BUDGET = 3
DEFAULT_MAX_RETRY_AFTER = 300.0

Rule = Callable[["Projector", Event], str | None]
"""Validates one event against the fold, raising ``ImpossibleEvent`` before changing anything,
then applies its effect.  Returns the outcome that picks a split destination, else None."""


_RESOLVED = frozenset({Outcome.REJECTED, Outcome.COMMITTED})
_FENCED = (
    "the invocation is fenced (its ACTION_ACCEPTED's fenced): it takes no attempt of its own, "
    "and nothing is ever sent in it"
)
"""Why a fenced record refuses PREFLIGHT_VALIDATED and a retry lease (``Record.fenced``)."""
_FENCED_CLOSE = (
    "the invocation is fenced (its ACTION_ACCEPTED's fenced): its close is the fence's, "
    "PREFLIGHT_FAILED IDEMPOTENCY_MISMATCH with the fenced facts as binder_gone"
)
"""Why a fenced record refuses any other close (``binder.fenced_close``: whoever writes it)."""


# Enum lookups by value through plain dicts: ``Code(raw)`` goes through EnumMeta.__call__ and an
# exception for unknown values, several times slower than a dict get on the hot path.
_CODE_BY_VALUE: dict[str, Code] = {c.value: c for c in Code}
_SOURCE: dict[EvidenceSource, str] = {s: s.value for s in EvidenceSource}
_UNKNOWN, _NOT_ATTEMPTED = Outcome.UNKNOWN.value, Outcome.NOT_ATTEMPTED.value
# Enum members the rules compare against, as module constants: ``Code.X`` is a lookup through
# the enum's metaclass each time (~70 ns, as much as a small rule's whole effect).
_COMMITTED = Outcome.COMMITTED
_REMOTE_RESPONSE = EvidenceSource.REMOTE_RESPONSE
_VALIDATION, _CREDENTIAL_INJECTION, _CONNECTION_SETUP, _REMOTE_EXECUTION = (
    Phase.VALIDATION,
    Phase.CREDENTIAL_INJECTION,
    Phase.CONNECTION_SETUP,
    Phase.REMOTE_EXECUTION,
)
_STORE_FAILED, _DELIVERY_FAILED, _REMOTE_REJECTED, _APPROVAL_PENDING = (
    Code.RESULT_STORE_FAILED,
    Code.RESULT_DELIVERY_FAILED,
    Code.REMOTE_REJECTED,
    Code.APPROVAL_PENDING,
)
_RESOLVED_BY_VALUE: dict[str, Outcome] = {o.value: o for o in _RESOLVED}


def _refuse(p: Projector, event: Event, reason: str) -> NoReturn:
    raise ImpossibleEvent(event, p._state, reason)


_LINKED: dict[EventKind, tuple[str, str]] = {
    EventKind.RECONCILE_INCONCLUSIVE: ("reconciliation query", "query_invocation"),
    EventKind.OPERATION_POLL_FAILED: ("poll", "poll_invocation"),
}
"""The rows that may leave a linked call open or close one nothing was sent for: its kind (for
the reason) and the attribute naming it."""

LINKED_ATTRS: tuple[str, ...] = tuple(sorted({name for _, name in _LINKED.values()}))
"""Every attribute naming a linked call: the writer indexes each row's (``journal``'s
``linked_calls``), so a claim's check reads the rows naming its call, not the whole record."""


_UNSENT_CLOSES = "attrs.unsent must be true, and close the open poll it names"
"""Why a poll's ``unsent`` row is refused: one not closing the open poll, and -- written, the
fold's stale no-op aside (``_stale_row``) -- one naming a poll while none is open."""


def open_query(items: Iterable[Mapping[str, Any]], generation: int) -> str | None:
    """The reconciliation query still open under ``generation``: the last one a row opened
    (``open``, that generation) that no later row naming it closed; else None.  Read from the
    end back to that row -- only the rows after it can have closed it -- so a claim, which
    the rules check against the open query, reads the rows since the record's last query
    opened, not every query the record holds (tests/benchmarks/claim_check.py); the reading
    from the start, which defines it, answers the same (tests/statemachine/test_open_query.py)."""
    rows = items if isinstance(items, Sequence) else list(items)
    after: list[Any] = []
    for item in reversed(rows):
        if item.get("open") and item.get("generation") == generation:
            current = item.get("query_invocation")
            if not isinstance(current, str) or any(name == current for name in after):
                return None
            return current
        after.append(item.get("query_invocation"))
    return None


def _open_call(p: Projector, kind: EventKind) -> str | None:
    """The record's open linked call of ``kind``'s sort: its open query, its job's open poll."""
    if kind is EventKind.RECONCILE_INCONCLUSIVE:
        return open_query(p._evidence.get("reconcile_queries", ()), p._generation)
    op = p._operation
    current = None if op is None else op.get("open_poll")
    return current if isinstance(current, str) else None


def _reopened(p: Projector, event: Event) -> bool:
    """Whether ``event`` is a stale row of a linked call (a reconciliation query, a poll): it
    names ``open`` with a code (what the call answered: awaiting an operator, being sent) --
    or, a poll's, ``unsent`` -- a call while none is open (while another is, the rules refuse
    it: one call at a time).  Its writer read the call open before that changed: another
    asker took it up and closed it (read its answer, or gave it up).  A claim (``open``, no
    code) is not one: it names a fresh id (``new_invocation_id``; ``refuse_reclaiming``).

    A poll's ``unsent`` row comes after a stale open row: from ab1791b to 530d267 the writer
    accepted a stale open row (A's APPROVAL_PENDING for a poll B had closed unsent) and its
    fold reopened the poll, so the next asker took that poll up, found it denied and closed
    it unsent again -- accepted then.  Today's fold no-ops the open row, so the poll that
    ``unsent`` row closes is closed already: the fold no-ops it too, never an altered row.

    Stateless, with nothing kept per call: every broker since rows named ``open`` (95c6220 for
    queries, 858d764 for polls) wrote an open row with a code only for a call it had claimed
    or taken up open (``asked``), and a call, once open, is not open again until a row closes
    it -- a query's under a newer generation too, but such a row names the generation it
    read and is refused (``rules_lease._observed``).  So a stored row this finds was stale
    when written.

    The writer refuses it and a stored one is folded as a no-op for the call (``_stale_row``,
    called by the rules in ``rules_lease`` and ``operation``): a broker from before the writer
    refused it wrote it whenever no other call was open, so it is no sign of an altered row,
    and folded as written it would reopen a call its record shows closed (a denied query
    open again) and, for a poll, put the stale answer in ``last_poll`` over what the closing
    row read."""
    linked = _LINKED.get(event.kind)
    if linked is None:
        return False
    attrs = event.attrs
    if attrs.get("open") is True:
        if attrs.get("code") is None:
            return False
    elif event.kind is not EventKind.OPERATION_POLL_FAILED or attrs.get("unsent") is not True:
        return False
    return type(attrs.get(linked[1])) is str and _open_call(p, event.kind) is None


def refuse_reclaiming(
    p: Projector, event: Event, named: Projector, earlier: Iterable[Mapping[str, Any]]
) -> None:
    """The writer's check of a claim on ``p``'s record (``claimed_call``), given the fold of the
    call it names (``named``) and the attrs of ``p``'s rows that may name it (``earlier``: the
    writer passes the rows ``journal``'s ``linked_calls`` indexes under that call; any row of
    the record is judged alike):
    refuse it (``ImpossibleEvent``, nothing changed) unless that call has no record yet and no
    row of ``p``'s names it.  A claim names a new call (``new_invocation_id``) and heads that
    call's first write, before its ACTION_ACCEPTED (``engine/takeup.py``); one naming a call
    that exists -- one a row already closed above all -- would, folded as written, reopen it (a
    denied query open again).  Its own record is not enough: before 530d267 a claim was written
    on its own, ahead of its call's first rows, so a call claimed and closed may have none.
    The fold cannot tell (it sees one record and keeps nothing per call); the writer reads both
    in one transaction -- ``earlier`` a seek, flat in the record's length."""
    what, name = _LINKED[event.kind]
    call = event.attrs.get(name)
    if named._events:
        _refuse(p, event, f"the {what} {call} already has a record: a claim names a new call")
    if any(_is_mapping(attrs) and attrs.get(name) == call for attrs in earlier):
        _refuse(p, event, f"the {what} {call} is named by an earlier row: a claim names a new call")


def claimed_call(event: Event) -> str | None:
    """The call a claim (a linked call's row naming it ``open``, no code) names; else None."""
    linked = _LINKED.get(event.kind)
    if linked is None:
        return None
    attrs = event.attrs
    named = attrs.get(linked[1])
    if attrs.get("open") is True and attrs.get("code") is None and type(named) is str:
        return named
    return None


def _stale_row(p: Projector, event: Event) -> bool:
    """Whether ``event`` is a stale row of a linked call (``_reopened``), which the fold takes as
    a no-op for the call; a new row the writer checks (``Projector.apply(writing=True)``) is
    refused instead (``ImpossibleEvent``, nothing changed).  Called by the rules at the point
    where they no-op, after their own checks: the writer refuses for the fold's reasons, in the
    fold's order."""
    if not _reopened(p, event):
        return False
    if p._writing:
        if event.attrs.get("open") is not True:  # a poll's ``unsent`` row: no stale answer
            _refuse(p, event, _UNSENT_CLOSES)
        what, name = _LINKED[event.kind]
        call = event.attrs.get(name)
        _refuse(
            p, event, f"the {what} {call} is not open: an earlier row closed it; this row is stale"
        )
    return True


def _stale(p: Projector, event: Event, generation: object) -> NoReturn:
    """Refuse an attempt's event that names a generation other than the record's current one:
    its worker's lease was taken over (seed, "Retry code must be simple and testable": "the
    generation check must stop it").  Every event an attempt writes -- before its dispatch and
    after it -- names the attempt's generation (``attrs.generation``; absent in journals
    written before it did, and then unchecked): the lifecycle alone would accept a stale
    worker's complete response, result or interruption in the states of the attempt that took
    over, and the record would give one attempt's evidence as another's.

    The kinds are ``events.ATTEMPT_KINDS``.  Each of their rules in rules_intake.py and
    rules_attempt.py checks inline, first thing (the two in batch.py and operation.py are
    wrapped: ``rules._generation_checked``): one wrapper for all
    of them cost a call per such event, ~5% of the whole-journal fold, and the fold then missed
    its 10x target (tests/benchmarks/projection.py).  tests/statemachine/test_model_check.py
    proves every kind in the set is checked wherever the lifecycle takes it."""
    _refuse(
        p,
        event,
        f"stale generation {generation}; the current lease generation is {p._generation}",
    )


_CLOSED = frozenset(name for name, spec in STATES.items() if spec.final)
"""States in which the current generation's attempt is closed: its worker ended it, recovery
closed it (naming that generation), or a second observer settled it -- the generation stays
current until a retry takes the next lease, and the attempt is not open again."""


def _closed(p: Projector, event: Event, generation: object) -> NoReturn:
    """Refuse an attempt's event that names the current generation after that attempt was
    closed (``_CLOSED``): its stalled worker resuming must not add to the record -- neither what
    it received nor the dispatch of a redirect's next hop."""
    _refuse(p, event, f"generation {generation}'s attempt is closed ({p._state})")


def _code_of(event: Event) -> Code | None:
    raw = event.attrs.get("code")
    return _CODE_BY_VALUE.get(raw) if type(raw) is str else None


def _resolved_outcome(event: Event) -> Outcome | None:
    """attrs.outcome when it names a resolved outcome (rejected | committed), else None."""
    raw = event.attrs.get("outcome")
    return _RESOLVED_BY_VALUE.get(raw) if type(raw) is str else None


def _is_int(value: object) -> TypeGuard[int]:
    # bool is an int subclass; True must not pass for generation 1.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def _is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    # ``type() is dict`` first: the ABC instance check is slow and events are nearly always dicts
    return type(value) is dict or isinstance(value, Mapping)


def _asked_by(p: Projector, event: Event) -> None:
    """``Record.requester``: the uid an asker's row names (``requester.uid``); a row naming
    none (the daemon's dispatcher taking a lease) changes nothing, one naming no valid uid
    leaves no requester -- its attempt's asker is not known."""
    attrs = event.attrs
    if "requester" in attrs:
        named = attrs["requester"]
        uid = named.get("uid") if _is_mapping(named) else None
        p._requester = uid if _is_int(uid) else None


def _phase_code(p: Projector, event: Event, phase: Phase) -> Code:
    """attrs.code, refused unless it is a known code of ``phase``."""
    code = _code_of(event)
    if code is None:
        _refuse(p, event, "attrs.code must be a known code")
    info = CODES[code]
    if info.pending:
        _refuse(p, event, f"{code.value} says an invocation waits; it ends nothing")
    if info.phase is not phase and not (
        # A stop cause may strike before the dispatch gate (contract: CodeInfo.before_dispatch).
        phase is Phase.CONNECTION_SETUP and info.before_dispatch is not None
    ):
        _refuse(p, event, f"{code.value} is a {info.phase.value} code, not {phase.value}")
    return code


def _set_error(p: Projector, event: Event, code: Code | None) -> None:
    p._code = code
    p._message = event.attrs.get("message")
    p._field = event.attrs.get("field")


def _lease_evidence(event: Event, gen: int, expires: object) -> dict[str, Any]:
    """``evidence.lease``: the current attempt's lease -- its generation, holder, event and
    deadline (``expires_at``, in the journal's lease clock; absent when the event has none).
    While the record rests in no final state, the deadline says until when a live attempt
    holds the invocation: a same-key call answers IN_PROGRESS until then, and only after it
    may recovery close the attempt (docs/contract.md, "When the hint is computed")."""
    lease = {"generation": gen, "holder": event.attrs.get("holder"), "seq": event.seq}
    if _is_number(expires):
        lease["expires_at"] = expires
    return lease
