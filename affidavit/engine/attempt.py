"""One attempt: connection setup with bounded in-broker retries, the dispatch gate and the
observer the adapter calls back, and the classification of how the attempt ended.

Seed, "Dispatch shifts the burden of proof": DISPATCH_STARTED is durable before the adapter
writes the first byte.  The adapter awaits our ``gate``; its journal append is shielded from
cancellation so that, afterwards, the journal alone says whether dispatch was recorded.

Seed, "Classify the error by the last proven boundary, not by the function in whose stack the
exception was caught": after a failure the outcome follows ``dispatched()`` -- the gate was
entered, or the protocol machine crossed a dispatch transition -- never the exception's type.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import trio

from affidavit.adapters.base import AttemptContext, AttemptInterrupted, RemoteResult, SetupError
from affidavit.config import ConfigUnread
from affidavit.journal import (
    ApprovalLapsed,
    CommitUnknown,
    JournalError,
    JournalWriteError,
    LeaseLost,
    with_boot_mark,
)
from affidavit.protocols import Binding, Prepared
from affidavit.secrets.credentials import predates_value_digests
from affidavit.secrets.redaction import LEAVES
from affidavit.statemachine import (
    CODES,
    Code,
    Event,
    EventKind,
    ImpossibleEvent,
    Phase,
    ProtocolMachine,
    Record,
    Retry,
    Step,
)

from .approval import Grant, approval_now
from .binder import close_fenced
from .control import CallControl
from .echoed import without_received_counts, without_received_size
from .sink import StreamSink
from .steps import StepPath

if TYPE_CHECKING:
    from .engine import Engine

__all__ = [
    "Attempt",
    "LeaseRefusal",
    "lease_lost",
    "lease_refused",
    "lost_or_raise",
    "observed_events",
    "run_tries",
    "stamped",
    "superseded",
]

log = logging.getLogger("affidavit.engine")

E = EventKind
SETUP_ATTEMPTS = 2
"""In-broker connection attempts per try (seed: "Limit the number of attempts and show them in
a single action record"); only codes whose hint is backoff are retried."""
SETUP_RETRY_DELAY = 0.05
_PRE_DISPATCH_RETRYABLE = frozenset(
    code
    for code, info in CODES.items()
    if info.phase is Phase.CONNECTION_SETUP and info.retry is Retry.BACKOFF
) - {Code.SETUP_FAILED}
"""Setup failures worth a second in-broker try: the contract's connection_setup codes whose hint
is backoff, except the catch-all SETUP_FAILED (a bad URL or a closed pool fails the same way
twice)."""


class _Refused(Exception):
    """The gate refused to write: the bound target config changed, or the approval does not
    cover this dispatch.  ``attrs``: PREFLIGHT_FAILED's (a validation code) -- or, ``kind``
    SETUP_FAILED, the attempt's set-up failed at the gate (the config file could not be read
    again: ``_unread``); nothing was written."""

    def __init__(self, attrs: Mapping[str, Any], kind: EventKind = E.PREFLIGHT_FAILED) -> None:
        self.attrs = attrs
        self.kind = kind
        super().__init__(attrs["code"])


class LeaseRefusal(Exception):
    """The gate was refused for a stale lease generation: at the dispatch gate nothing was
    written to the remote; at a redirect hop's gate the first hop was.  ``recorded``: the
    journal already wrote LEASE_LOST in the refusing transaction."""

    def __init__(self, recorded: bool) -> None:
        self.recorded = recorded
        super().__init__("lease lost")


_APPROVAL_MESSAGES = {
    Code.APPROVAL_STALE: (
        "The request, its credential or its target's configuration changed after approval",
        "nothing was sent under the old approval",
    ),
    Code.APPROVAL_EXPIRED: (
        "The approval window ran out before the request was dispatched",
        "nothing was sent",
    ),
}
"""Per code: why, and what an attempt with no earlier dispatch says of what it sent."""

_PREDATES = (
    "The approval was granted for a credential version recorded before value digests (a vault "
    "entry's counter alone): it cannot be matched",
    "nothing was sent under it",
)

_RETRY_SENT = "this retry sent nothing; an earlier attempt's outcome stands"
"""What a retry of a dispatched attempt says instead (``Attempt.earlier_dispatch``), as a
set-up failure's message words it: the earlier attempt was sent (the record's outcome stands);
only this one is known unsent."""


def _approval_refusal(code: Code, attempt: Attempt, grant: Grant | None = None) -> dict[str, Any]:
    """The gate's refusal of ``attempt``; an APPROVAL_STALE whose grant bound a bare vault
    counter says it is the upgrade (``predates_value_digests``), not a change."""
    version = grant.version if grant is not None else None
    if code is Code.APPROVAL_STALE and version is not None and predates_value_digests(version):
        why, sent = _PREDATES
    else:
        why, sent = _APPROVAL_MESSAGES[code]
    if attempt.earlier_dispatch:
        sent = _RETRY_SENT
    return {"code": code.value, "field": "approval", "message": f"{why}; {sent}."}


def _disowned(grant: Grant, attempt: Attempt) -> dict[str, Any]:
    """The gate's refusal of a grant whose operator is no longer one (``Grant.disowned``)."""
    who = "no operator uid" if grant.operator is None else f"uid {grant.operator}"
    sent = _RETRY_SENT if attempt.earlier_dispatch else "nothing was sent under it"
    return {
        "code": Code.APPROVAL_STALE.value,
        "field": "approval.operator",
        "message": f"The approval was granted by {who}, not an operator by [service] "
        f"operator_uids / operator_gids now; {sent}.",
    }


@dataclass
class Attempt:
    """Per-try bookkeeping shared between the engine and the gate/observer/sink closures."""

    iid: str
    generation: int
    holder: str
    lease: tuple[str, int] | None
    target_name: str
    expected_hash: str
    machine: ProtocolMachine
    n: int
    scrub: Callable[[Any], Any]
    """Redacts the secrets' forms from remote-controlled facts before they are journaled."""
    withheld: Callable[[], tuple[list[str], str]]
    """The result streams redaction has replaced something in so far, or that were not scanned
    whole, and why (``StreamSink.withheld``, ``echoed.py``)."""
    control: CallControl | None = None
    """The host's handle on the call (the daemon's): a stop before the gate wins."""
    grant: tuple[Grant, str] | None = None
    """An approved invocation's grant and the fingerprint of this dispatch, for the gate."""
    earlier_dispatch: bool = False
    """The record holds an earlier attempt's dispatch (this is a retry of it; its outcome is
    the record's): a refusal of this attempt says "this retry sent nothing", never "nothing
    was sent".  Not the generation: an approved call's first attempt already runs under a
    claimed lease (generation 1)."""
    gate_entered: bool = False
    gate_stop: BaseException | None = None
    """What stopped the gate (its journal's answer: a ``LeaseRefusal``, a refusal, a
    ``JournalError``), kept for ``run_tries``: the gate's write is not cancellable, so the
    caller's deadline may fall while it runs -- the adapter, unwinding, then raises the
    deadline's cancellation in place of the gate's error, and the attempt must still end as
    the journal stopped it, never as a connect timeout blamed on the remote."""
    dispatch_recorded: bool = False
    hops: int = 0
    milestones_seen: set[str] = field(default_factory=set)
    pending: list[Event] = field(default_factory=list)
    set_aside: dict[int, list[Event]] = field(default_factory=dict)
    """An earlier hop's milestones, by its hop number, set aside when a later hop's gate passed
    (``_next_hop_milestones``): restored if that hop's answer is the result after all."""
    steps: StepPath = field(default_factory=StepPath)
    """The states the protocol machine went through: run-length encoded and bounded (a peer
    decides how many steps a call takes: ``steps.py``)."""
    facts: dict[str, Any] = field(default_factory=dict)


Failure = Event | LeaseRefusal
"""How an attempt ended without a result: the closing event to append, or a lease refusal."""


async def run_tries(
    engine: Engine,
    iid: str,
    target: Any,
    binding: Binding,
    prepared: Prepared,
    sink: StreamSink,
    timeout: float | None,
    *,
    generation: int,
    lease: tuple[str, int] | None,
    lease_ends: float,
    control: CallControl | None = None,
    grant: tuple[Grant, str] | None = None,
    earlier_dispatch: bool = False,
) -> tuple[Attempt, RemoteResult | None, Failure | None]:
    """Run the attempt within the caller's deadline, trying connection setup again (at most
    ``SETUP_ATTEMPTS`` times) while the failure's code allows it.  The attempt also ends within
    its lease (``lease_ends``, wall clock, less ``lease_margin`` for the other hosts' clocks):
    once the lease runs out, another worker takes this one for gone and closes its attempt, so
    it must not be dispatching then -- however long the credential step took.  A lease already
    out is a lease refusal; a budget already spent (the lease still held) ends the attempt
    not_attempted, with its stop cause: nothing is tried either way.  Returns the last try with its
    result or its failure; the caller records the ending.  A cancellation of the caller is
    recorded here (shielded) with what the boundary proves, then re-raised.  A stop through
    ``control`` (``control.py``) is not re-raised: it ends the attempt with the control's code
    at the boundary the attempt had reached."""
    expected = engine.snapshot.hash(target)
    total = target.timeout.total if timeout is None else min(timeout, target.timeout.total)
    # Who gave up decides the code: the caller's shorter deadline is a cancellation; the
    # target's own total timeout is the remote failing to answer in time.
    callers = total < target.timeout.total
    timeout_code = Code.CALLER_CANCELLED if callers else Code.REMOTE_OUTCOME_UNKNOWN
    # Before dispatch the same: the caller's deadline is the caller's stop (contract: it ends
    # connection setup, not_attempted), never a connect timeout blamed on the remote; the
    # target's own total running out before dispatch is its connection taking too long.
    setup_code = Code.CALLER_CANCELLED if callers else Code.CONNECT_TIMEOUT
    attempt = _new_attempt(engine, iid, generation, lease, target.name, expected, binding, sink, 1)
    attempt.control, attempt.grant = control, grant
    attempt.earlier_dispatch = earlier_dispatch
    now = time.time()
    if now >= lease_ends:
        # The lease itself ran out (a stall before the first try): another worker may take
        # the invocation over at any moment; nothing is tried, LEASE_LOST, recovery closes it.
        return attempt, None, LeaseRefusal(recorded=False)
    within_lease = lease_ends - engine.settings.lease_margin - now
    if within_lease <= 0:
        # The lease still holds, but the budget it was sized by (the caller's timeout, or the
        # target's total) was spent before the first try: nothing was sent, and the record is
        # closed so -- not_attempted, with who gave up.  No lease was lost (a timeout of 0
        # used to be answered LEASE_LOST and leave the record ``authorized`` for good); if
        # another worker did take the invocation over meanwhile, the generation-stamped write
        # is refused and ``conclude`` answers LEASE_LOST from the record (``lease_refused``).
        return attempt, None, _boundary_failure(attempt, after=timeout_code, before=setup_code)
    result: RemoteResult | None = None
    failure: Failure | None = None

    async def tries() -> None:
        nonlocal attempt, result, failure
        for n in range(1, SETUP_ATTEMPTS + 1):
            if n > 1:
                attempt = _new_attempt(
                    engine, iid, generation, lease, target.name, expected, binding, sink, n
                )
                attempt.control, attempt.grant = control, grant
                attempt.earlier_dispatch = earlier_dispatch
            result, failure, again = await _try_once(
                engine, binding, prepared, attempt, sink, deadline
            )
            if not again:
                break
            await trio.sleep(SETUP_RETRY_DELAY)

    # The deadline below, when it is the target's own total (the lease was sized by it, so
    # its end is that total, less the time since the lease began) and not the caller's
    # shorter one: the adapter may end itself a little before, with its own rule's facts.
    deadline = None if callers else trio.current_time() + min(total, within_lease)
    stopped = False
    try:
        # Without a control there is nothing to stop the call but its deadline: one cancel
        # scope, not an idle second one per call (issue 15: a scope's enter and exit cost more
        # than the coroutine frame of ``tries``).
        if control is None:
            with trio.move_on_after(min(total, within_lease)) as scope:
                await tries()
        else:
            with control.scope, trio.move_on_after(min(total, within_lease)) as scope:
                await tries()
            stopped = control.scope.cancelled_caught
    except BaseException as stop:
        # The caller's own cancellation (or an interrupt) after we started: record what the
        # boundary proves, shielded, then let it propagate.  Its cause is the caller's on
        # either side of the boundary (contract: before dispatch it ends connection setup,
        # not_attempted) -- never a connect timeout that did not happen.
        closing = _boundary_failure(
            attempt, after=Code.CALLER_CANCELLED, before=Code.CALLER_CANCELLED
        )
        with trio.CancelScope(shield=True):
            try:
                await record_observed(engine, attempt)
                try:
                    await engine.recorder.write(stamped(closing, attempt.generation), barrier=True)
                except ImpossibleEvent:
                    # Another worker took the invocation over (or recovery closed it) while
                    # this one ran past its lease: its ending is not the record's.  The
                    # caller's own cancellation propagates all the same.
                    if await superseded(engine, attempt.iid, attempt.generation) is None:
                        raise
            except JournalError:
                # The close refused (a full disk, a commit whose landing is unknown): a
                # cancellation is answered from the durable record (``Engine._answered``), as
                # the gate's refused DISPATCH_STARTED is.  An interrupt is not the journal's
                # to swallow: it propagates, the record left as durable for recovery to close.
                if not _interrupt(stop):
                    raise
        raise
    if stopped and result is None and failure is None:
        # Withdrawn (the caller hung up before the gate) or stopped (the daemon's shutdown):
        # the cause is the control's, the outcome the boundary's.
        assert control is not None and control.code is not None
        failure = _boundary_failure(attempt, after=control.code, before=control.code)
    elif scope.cancelled_caught and result is None and failure is None:
        if attempt.gate_stop is not None:
            # The deadline fell while the gate's write ran (a stalled journal: the chain
            # head held, a batch rerun after lost sessions): the journal stopped the attempt.
            failure = _stopped_by(attempt, attempt.gate_stop)
        else:
            failure = _boundary_failure(attempt, after=timeout_code, before=setup_code)
    return attempt, result, failure


def _interrupt(exc: BaseException) -> bool:
    """A ``KeyboardInterrupt`` or ``SystemExit`` (also inside a group): the process is being
    stopped, which no refused journal write may turn into an answer."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup((KeyboardInterrupt, SystemExit)) is not None
    return isinstance(exc, (KeyboardInterrupt, SystemExit))


def _new_attempt(
    engine: Engine,
    iid: str,
    generation: int,
    lease: tuple[str, int] | None,
    target_name: str,
    expected: str,
    binding: Binding,
    sink: StreamSink,
    n: int,
) -> Attempt:
    return Attempt(
        iid=iid,
        generation=generation,
        holder=engine.holder,
        lease=lease,
        target_name=target_name,
        expected_hash=expected,
        machine=ProtocolMachine(binding.table),
        n=n,
        scrub=sink.scrub,
        withheld=sink.withheld,
    )


async def _try_once(
    engine: Engine,
    binding: Binding,
    prepared: Prepared,
    attempt: Attempt,
    sink: StreamSink,
    deadline: float | None = None,
) -> tuple[RemoteResult | None, Failure | None, bool]:
    """One connection attempt: (result, failure event, whether to try setup again)."""
    iid = attempt.iid
    ctx = AttemptContext(
        machine=attempt.machine,
        gate=_gate(engine, attempt),
        observe=_observer(attempt),
        sink=sink,
        attempt=attempt.n,
        fed=sink.fed,
        result_limit=sink.max_result,
        withhold=sink.withhold,
        holds=sink.holds,
        head_word=sink.head_word,
        deadline=deadline,
    )
    try:
        result = await binding.perform(prepared, ctx)
        _result_hop_milestones(attempt, result.hop)
        return result, None, False
    except SetupError as exc:
        if _dispatched(attempt):
            # An adapter bug must never turn a dispatched attempt into not_attempted.
            return None, _interrupted(iid, Code.REMOTE_OUTCOME_UNKNOWN), False
        if exc.code is Code.CONFIG_CHANGED:
            # A setting's content moved since validation recorded it (a CA file edited): the
            # gate's refusal, not a failed set-up -- nothing was sent, a new invocation reads
            # it anew.  Under a granted approval, the gate's answer to any change between the
            # approval and the dispatch: the approval does not cover what would be trusted.
            if attempt.grant is not None:
                refused = _approval_refusal(Code.APPROVAL_STALE, attempt)
                return None, Event(E.PREFLIGHT_FAILED, iid, refused), False
            field = f"targets.{attempt.target_name}" + (f".{exc.setting}" if exc.setting else "")
            return (
                None,
                Event(E.PREFLIGHT_FAILED, iid, {"code": exc.code.value, "field": field}),
                False,
            )
        attrs = {"stage": exc.stage, "code": exc.code.value}
        # Queued, not awaited (a diagnostic riding along with the next barrier): if a newer
        # lease's attempt is under way or this one was closed, the record refuses it there --
        # at the next try's gate (LeaseRefusal) or with this attempt's ending (``conclude``).
        tried = Event(E.SETUP_ATTEMPT_FAILED, iid, {**attrs, "generation": attempt.generation})
        if exc.code in _PRE_DISPATCH_RETRYABLE and attempt.n < SETUP_ATTEMPTS:
            await engine.recorder.append(tried)
            return None, None, True
        if attempt.n > 1:
            # The last try is an attempt of its own (seed: "show them in a single action
            # record ... The final error must not erase the earlier evidence").  SETUP_FAILED
            # alone would be folded into the previous attempt when stage and code repeat.
            await engine.recorder.append(tried)
        if exc.setting is not None:
            # A target setting that cannot work (``SetupError.setting``): the path to fix,
            # as a credential failure names ``targets.<name>.credential`` -- the key only.
            # The code's own meaning would blame the remote ("the server certificate was
            # rejected"); the message says it is the setting (``detail``: the adapter's fixed
            # words for a setting, never a value).
            # "Nothing was sent" is not a retry's to say when an earlier attempt was sent (its
            # outcome is the record's, unknown): this one sent nothing.
            field = f"targets.{attempt.target_name}.{exc.setting}"
            sent = "this retry sent nothing" if attempt.earlier_dispatch else "nothing was sent"
            attrs["field"] = field
            attrs["message"] = f"{exc.detail}: fix {field}; {sent}."
        return None, Event(E.SETUP_FAILED, iid, attrs), False
    except (_Refused, LeaseRefusal, JournalError) as exc:
        return None, _stopped_by(attempt, exc), False
    except AttemptInterrupted as exc:
        if not _dispatched(attempt):
            # Only a dispatched attempt can be interrupted; before the gate it is setup.
            attrs = {"stage": attempt.machine.state, "code": Code.SETUP_FAILED.value}
            return None, Event(E.SETUP_FAILED, iid, attrs), False
        # The facts carry remote-controlled strings (an exit-signal name): the remote may echo
        # the credential it was sent, so they are scrubbed like the observed facts.
        facts = attempt.scrub({k: v for k, v in exc.facts.items() if _jsonable(v)})
        facts = without_received_counts(facts, *attempt.withheld())  # an echo is not measured
        return None, _interrupted(iid, exc.code, facts), False
    except Exception as exc:  # classify by the boundary, never by the exception
        # Type name only: library messages may quote remote bytes or request lines.
        log.warning("attempt %s of %s ended by %s", attempt.n, iid, type(exc).__name__)
        failure = _boundary_failure(
            attempt, after=Code.REMOTE_OUTCOME_UNKNOWN, before=Code.SETUP_FAILED
        )
        return None, failure, False


def _stopped_by(attempt: Attempt, exc: BaseException) -> Failure:
    """The attempt's ending when the gate -- or the journal behind it -- stopped it with
    ``exc`` (a ``_Refused``, a ``LeaseRefusal``, a ``JournalError``): what ``_try_once``
    answers it with, and ``run_tries`` when the caller's deadline fell while the gate's
    uncancellable write ran (``Attempt.gate_stop``)."""
    iid = attempt.iid
    if isinstance(exc, _Refused):
        return Event(exc.kind, iid, dict(exc.attrs))
    if isinstance(exc, LeaseRefusal):
        return exc
    # The gate's own reads and writes (the database's clock for an approval's expiry, its
    # DISPATCH_STARTED): the journal, not a transport, stopped the attempt.  Before the gate
    # was entered (or once its refused barrier left it) nothing was sent.
    log.warning("attempt %s of %s stopped by the journal: %s", attempt.n, iid, type(exc).__name__)
    if _dispatched(attempt):
        return _interrupted(iid, Code.REMOTE_OUTCOME_UNKNOWN)
    stage = "journal" if isinstance(exc, JournalWriteError) else "journal_read"
    attrs = {"stage": stage, "code": Code.SETUP_FAILED.value, "message": _JOURNAL_STOP[stage]}
    return Event(E.SETUP_FAILED, iid, attrs)


def _unread(exc: ConfigUnread) -> dict[str, Any]:
    """SETUP_FAILED's attrs when the gate could not read the config file again (``exc``: no
    file descriptor left, an I/O error): a local failure before dispatch, retry backoff -- not
    CONFIG_CHANGED, which no read proved.  The errno's name only, never the path."""
    name = errno.errorcode.get(exc.errno, str(exc.errno))
    message = (
        f"The config file could not be read again at the dispatch gate ({name}); this attempt"
        " sent nothing."
    )
    return {"stage": "config_reread", "code": Code.SETUP_FAILED.value, "message": message}


_JOURNAL_STOP = {
    # The message of the SETUP_FAILED of an attempt the journal stopped at its dispatch gate:
    # never "Connection setup failed for another transport reason" (no transport failed).  Of
    # this attempt only: an earlier attempt's outcome is the record's (unknown if it was sent).
    "journal": "The journal refused a write at the dispatch gate; this attempt sent nothing.",
    "journal_read": (
        "The journal could not answer a read the dispatch gate checks (the database declined, "
        "was away, or a row failed its check); this attempt sent nothing."
    ),
}


def _boundary_failure(attempt: Attempt, after: Code, before: Code) -> Event:
    """The failure the last proven boundary supports: ``after`` once dispatch may have
    happened (outcome unknown), ``before`` otherwise (not_attempted)."""
    if _dispatched(attempt):
        return _interrupted(attempt.iid, after)
    attrs = {"stage": attempt.machine.state, "code": before.value}
    return Event(E.SETUP_FAILED, attempt.iid, attrs)


def _dispatched(attempt: Attempt) -> bool:
    # The gate was entered: its shielded append decides; machine flag as a second witness.
    return attempt.dispatch_recorded or attempt.gate_entered or attempt.machine.dispatched


def _interrupted(iid: str, code: Code, facts: Mapping[str, Any] | None = None) -> Event:
    """ATTEMPT_INTERRUPTED with what the adapter knew of the interruption (secret-free by the
    driver contract): which hop produced the evidence -- a proxy's own error is not the origin's
    result (seed: "Record which hop produced the evidence") -- and the rest as diagnostics."""
    attrs: dict[str, Any] = {"code": code.value}
    if facts:
        hop = facts.get("evidence_from")
        if isinstance(hop, Mapping):
            attrs["evidence_from"] = dict(hop)
        over = facts.get("result_size_limit")
        if code is Code.RESULT_SIZE_LIMIT and isinstance(over, Mapping):
            # The evidence the code stands on (rules_attempt.py refuses the code without it).
            attrs["result_size_limit"] = dict(over)
            attrs["message"] = _too_large_message(over)
        lifted = ("evidence_from", "result_size_limit")
        rest = {k: v for k, v in facts.items() if k not in lifted and _jsonable(v)}
        if rest:
            attrs["facts"] = rest
    return Event(E.ATTEMPT_INTERRUPTED, iid, with_boot_mark(attrs))


_WITHHELD_WHY = {
    "redacted": "the result echoed a secret",
    # Nothing of such a result is returned: its end is withheld with the rest, not redacted.
    "tail_redacted": "the result was cut short, and the last bytes of an answer cut short are "
    "withheld whatever they are",
    "short_redacted": "the result held a form of a credential value under 8 bytes (it may be "
    "ordinary text)",
    "unscanned": "the result was not scanned whole",
}


def _too_large_message(over: Mapping[str, Any]) -> str:
    """The message beside ``over``: its counts, unless they are withheld (``echoed.py``: the
    stream echoed a secret or was not scanned whole) -- then the limit alone."""
    why = _WITHHELD_WHY.get(str(over.get("received_withheld")))
    if why is not None:
        got = f"the bytes received are not told: {why}"
    else:
        decoded = over.get("decoded_bytes")
        got = f"{over.get('received_bytes')} bytes received"
        if decoded is not None:
            got += f", {decoded} decoded"
    return (
        f"The result passed this target's max_result ({over.get('limit')} bytes; {got}): the "
        "broker stopped reading and closed the connection.  The request was dispatched; nothing "
        "of the partial result is returned."
    )


def stamped(event: Event, generation: int) -> Event:
    """``event`` naming the attempt it belongs to: ``attrs.generation``, which the projection
    refuses unless it is the record's current generation (rules_common.py, ``_stale``).
    Everything an attempt writes is stamped, so that a worker whose lease was taken over --
    before its dispatch or after it -- cannot write into the attempt that took over."""
    return replace(event, attrs={**event.attrs, "generation": generation})


async def superseded(
    engine: Engine, iid: str, generation: int, refused: BaseException | None = None
) -> Record | None:
    """After a write of the attempt of ``generation`` was ``refused``: the record, if it has
    moved past that attempt -- a newer lease's generation, or (the attempt's lease having run
    out) recovery closed it, or it is fenced (``Record.fenced``: no attempt is its), or this
    call's own ACTION_ACCEPTED was refused (another call won the record's first event: a
    taker, a fence; every later write of this call was refused with it, ``Journal.append``'s
    ``after``) -- else None: the refusal is not a lost lease, and the caller raises it (a row
    about another invocation: a linked call's claim on the record it serves, ``takeup.py``).  The
    call's posted rows are settled first, the refused among them dropped (a stale attempt's
    rows are refused with it)."""
    recorder = engine.recorder
    try:
        await recorder.settle()
    except (JournalError, ImpossibleEvent) as exc:
        refused = refused or exc
    if isinstance(refused, ImpossibleEvent) and refused.event.invocation_id != iid:
        return None  # a linked call's claim heading its preamble, refused: no lease lost
    if isinstance(refused, ImpossibleEvent) and _own_first_event(refused, iid):
        # Lost only to another call's first event.  No record at all: the refusal is
        # something else, raised by the caller; a first event of this call's: judged below.
        journal = recorder.journal
        first = await recorder.read(lambda: journal.events(iid)[:1])
        if not first:
            return None
        if not _same_first(first[0], refused.event):
            return await recorder.record(iid)
    record = await recorder.record(iid)
    if record.fenced is not None or record.generation != generation or record.final:
        return record
    return None


def _own_first_event(refused: ImpossibleEvent, iid: str) -> bool:
    """``refused`` is this call's ACTION_ACCEPTED of ``iid``."""
    return refused.event.kind is E.ACTION_ACCEPTED and refused.event.invocation_id == iid


def _same_first(stored: Event, mine: Event) -> bool:
    """``stored``, a record's first event, is ``mine`` (this call's ACTION_ACCEPTED): the same
    holder's and not a fence -- a taker's or a fence's is another's.  Not by its deadline: a
    shared journal stores ``lease_expires_at`` moved into the database's clock, never equal to
    the writer's own copy.  A holder names one broker, which never takes over its own binding
    (``Recorder.running``)."""
    return stored.kind is mine.kind and all(
        stored.attrs.get(k) == mine.attrs.get(k) for k in ("holder", "fenced")
    )


async def lease_lost(
    engine: Engine, iid: str, generation: int, *, dispatched: bool, recorded: bool = False
) -> dict[str, Any]:
    """The envelope of a worker whose lease another worker took over, or whose attempt recovery
    closed after its lease ran out: stopped before its dispatch (nothing was sent), or -- after
    it (``dispatched``) -- refused what it went on to write (what it received is not on
    record).  The record is the answer, with LEASE_LOST saying why this worker did not act on
    it; LEASE_LOST is recorded unless the journal did already (``recorded``).  A fenced record
    (``Record.fenced``: its binder was refused its first event, and nothing was sent) is
    answered with its own code, message and hint, as ``fetch_result`` answers it: LEASE_LOST
    there said fetch_result, whose answer differed."""
    recorder = engine.recorder
    with contextlib.suppress(JournalError, ImpossibleEvent):  # refused with the stale write
        await recorder.settle()
    if not dispatched:
        # Fenced, its binder refused its first event: closed as its fence closes it, if that
        # call has not yet (``close_fenced``) -- never answered as an open record.
        await close_fenced(recorder, await recorder.record(iid))
    if not recorded:
        # The projection refused our stale generation; record that we were stopped.
        attrs: dict[str, Any] = {"generation": generation, "holder": engine.holder}
        if dispatched:
            attrs["after_dispatch"] = True
        with contextlib.suppress(ImpossibleEvent):
            await recorder.append(Event(E.LEASE_LOST, iid, attrs), barrier=True)
    record = await recorder.record(iid)
    if record.fenced is not None and not dispatched:
        return recorder.envelope(record)  # fenced before its first event: nothing was sent
    return recorder.envelope(record, lost=generation, dispatched=dispatched)


async def lost_or_raise(
    engine: Engine, iid: str, generation: int, refused: ImpossibleEvent, *, dispatched: bool
) -> dict[str, Any]:
    """A write of the attempt of ``generation`` was ``refused`` by the record: the envelope of a
    lost lease (``lease_lost``) if the record has moved past that attempt (``superseded``),
    else ``refused`` is raised again -- it is no lost lease."""
    with trio.CancelScope(shield=True):
        if await superseded(engine, iid, generation, refused) is None:
            raise refused
        lost = await lease_lost(engine, iid, generation, dispatched=dispatched)
    return lost


async def lease_refused(
    engine: Engine, attempt: Attempt, refusal: LeaseRefusal | ImpossibleEvent
) -> dict[str, Any]:
    """``attempt``'s lease was lost: its gate was refused (``LeaseRefusal``), or the record
    refused one of its writes (``ImpossibleEvent``, through ``lost_or_raise``)."""
    dispatched = _dispatched(attempt)
    if isinstance(refusal, ImpossibleEvent):
        return await lost_or_raise(
            engine, attempt.iid, attempt.generation, refusal, dispatched=dispatched
        )
    return await lease_lost(
        engine, attempt.iid, attempt.generation, dispatched=dispatched, recorded=refusal.recorded
    )


# -- what the adapter calls back ------------------------------------------------------------


def _gate(engine: Engine, attempt: Attempt) -> Any:
    passing = _passing(engine, attempt)

    async def gate(facts: Mapping[str, Any], meanwhile: Callable[[], None] | None = None) -> None:
        try:
            await passing(facts, meanwhile)
        except (_Refused, LeaseRefusal, JournalError) as exc:
            attempt.gate_stop = exc  # the attempt ends as it says (``Attempt.gate_stop``)
            raise

    return gate


def _passing(engine: Engine, attempt: Attempt) -> Any:
    """The gate's checks and its DISPATCH_STARTED (a redirect hop's PROTOCOL_OBSERVED)."""
    journal = engine.journal

    async def gate(facts: Mapping[str, Any], meanwhile: Callable[[], None] | None = None) -> None:
        # ``meanwhile`` (the adapter's request bytes, made ahead) runs while the barrier's
        # COMMIT is under way, only once its rows were written unrefused (``Writer.submit``):
        # the loop works during the fsync; nothing reaches the transport before we return.
        hop = int(facts.get("hop", 1) or 1)
        if attempt.dispatch_recorded or hop > 1:
            # A redirect hop is a new dispatch boundary with its own durable evidence.
            attempt.hops = max(attempt.hops, hop)
            hop_dispatch = Event(
                E.PROTOCOL_OBSERVED,
                attempt.iid,
                {
                    "protocol": attempt.machine.table.name,
                    "state": "hop_dispatch",
                    "facts": {f"hop{hop}": attempt.scrub(dict(facts))},
                    "generation": attempt.generation,
                },
            )
            try:
                # The lease is checked in the appending transaction, as at the first hop --
                # the first attempt's (no lease row: ``first_gate``) by its recorded deadline.
                # ``shield``: not cancellable (the first hop's append says why).
                await journal.append(
                    hop_dispatch,
                    barrier=True,
                    lease=attempt.lease,
                    first_gate=engine.holder if attempt.lease is None else None,
                    shield=True,
                    meanwhile=meanwhile,
                    after=engine.recorder.unsettled(),
                )
            except LeaseLost:
                raise LeaseRefusal(recorded=True) from None
            except ImpossibleEvent:
                # A newer lease's attempt is under way, or this one was closed (recovery,
                # a reconciliation): this stale worker must not send the next hop (the
                # gate raises; the adapter never writes).
                raise LeaseRefusal(recorded=False) from None
            _next_hop_milestones(attempt, hop)
            return
        # Re-check the bound config immediately before the write (seed: "re-check it
        # immediately before the write"); a change means a new invocation -- and for an
        # approved one, that the approval does not cover what would be sent.
        try:
            changed = await engine.snapshot.changed(attempt.target_name, attempt.expected_hash)
        except ConfigUnread as exc:
            raise _Refused(_unread(exc), E.SETUP_FAILED) from None
        if changed:
            if attempt.grant is not None:
                raise _Refused(_approval_refusal(Code.APPROVAL_STALE, attempt))
            # The field is the section to look at: the target's settings (or the target itself,
            # now removed) are no longer what validation bound.
            raise _Refused(
                {"code": Code.CONFIG_CHANGED.value, "field": f"targets.{attempt.target_name}"}
            )
        if attempt.grant is not None:
            # Seed: "The broker must confirm the fingerprint of the upcoming dispatch and
            # re-check it immediately before the write."
            # Its expiry by the clock it is recorded in (``approval_now``).
            grant, dispatch_fingerprint = attempt.grant
            problem = grant.problem(dispatch_fingerprint, await approval_now(engine.recorder))
            if problem is not None:
                raise _Refused(_approval_refusal(problem, attempt, grant))
            if grant.disowned(engine.config.service):
                raise _Refused(_disowned(grant, attempt))
        attrs: dict[str, Any] = {"generation": attempt.generation, "attempt": attempt.n}
        scrub = attempt.scrub
        for k in ("connection", "reused_connection", "peer", "hop", "origin", "via_proxy"):
            if k in facts:
                v = facts[k]
                # A number, bool or None (most of them) is what ``scrub`` returns it as: no call
                # (``scrub`` is number-blind: these are the broker's own, not parsed remote words).
                attrs[k] = v if type(v) in LEAVES else scrub(v)
        # A withdrawal or stop asked for before this line wins (nothing is written); from the
        # next line on the call is dispatching and a withdrawal is refused.  No checkpoint in
        # between: both sides run on one trio thread (control.py).
        await trio.lowlevel.checkpoint_if_cancelled()
        attempt.gate_entered = True
        if attempt.control is not None:
            attempt.control.dispatching = True
        try:
            # Not cancellable: a caller's cancellation must not leave it unclear whether the
            # barrier landed.  ``shield=True`` makes the append itself so (its one cancellable
            # wait, for room in a full queue, shielded there) instead of a cancel scope entered
            # here on every call (issue 15): the same guarantee, no scope on the common path.
            # The approval's expiry again in the writing transaction, by the clock it is
            # recorded in: the write may wait (for the chain head, a busy writer) past the
            # check above, and the request leaves only once it commits.
            await journal.append(
                Event(E.DISPATCH_STARTED, attempt.iid, with_boot_mark(attrs)),
                barrier=True,
                lease=attempt.lease,
                first_gate=engine.holder if attempt.lease is None else None,
                shield=True,
                meanwhile=meanwhile,
                valid_until=attempt.grant[0].expires_at if attempt.grant is not None else None,
                # This call's posted rows, its preamble among them: one refused (its
                # ACTION_ACCEPTED, another call having won the record's first event) refuses
                # the gate, nothing written into a record that is not this call's.
                after=engine.recorder.unsettled(),
            )
        except ApprovalLapsed:
            _gate_left(attempt)
            raise _Refused(_approval_refusal(Code.APPROVAL_EXPIRED, attempt)) from None
        except LeaseLost:
            _gate_left(attempt)
            raise LeaseRefusal(recorded=True) from None
        except ImpossibleEvent:
            _gate_left(attempt)
            raise LeaseRefusal(recorded=False) from None
        except BaseException as exc:
            # Unknown whether the barrier landed; the journal will tell (see _dispatched).  A
            # journal that cannot be read now (a shared database gone: ``CommitUnknown``) tells
            # nothing: the gate stays entered -- never not_attempted on a guess -- and nothing
            # is sent either way (the gate raises; the adapter never writes).  A commit whose
            # landing is unknown may land after any read (a lost session's COMMIT on its way;
            # on SQLite, a COMMIT that raised, recovered from the -wal after a crash): the
            # record may not be closed not_attempted on a read alone (``Recorder.doubt``).
            if isinstance(exc, CommitUnknown):
                engine.recorder.doubt(attempt.iid)
            with contextlib.suppress(JournalError):
                rec = journal.record(attempt.iid)
                if rec is None or not rec.evidence.get("dispatch_started", False):
                    _gate_left(attempt)
            raise
        attempt.dispatch_recorded = True

    return gate


def _next_hop_milestones(attempt: Attempt, hop: int) -> None:
    """Hop ``hop`` is dispatched: the milestones of the hop before it (its request sent, its
    response's head and status) are set aside, unwritten, and this hop's are recorded -- the
    evidence describes the hop that decides, never a response that hop did not give (design
    notes, "Redirect hops").  Each hop's status stays in the result's ``hops``."""
    kinds = set(attempt.machine.table.milestones.values())
    attempt.set_aside[hop - 1] = [ev for ev in attempt.pending if ev.kind.value in kinds]
    attempt.pending = [ev for ev in attempt.pending if ev.kind.value not in kinds]
    attempt.milestones_seen.clear()


def _result_hop_milestones(attempt: Attempt, hop: int | None) -> None:
    """The result is hop ``hop``'s answer (``RemoteResult.hop``): if a later hop's gate set its
    milestones aside, they are the ones recorded again, the later hops' dropped -- a 3xx that
    stands as the result is never journaled beside another hop's request and status."""
    earlier = attempt.set_aside.get(hop) if hop is not None else None
    if earlier is None:
        return
    kinds = set(attempt.machine.table.milestones.values())
    attempt.pending = [ev for ev in attempt.pending if ev.kind.value not in kinds] + earlier
    attempt.set_aside.clear()


def _gate_left(attempt: Attempt) -> None:
    """The gate's DISPATCH_STARTED was refused (or did not land): nothing was sent, and the
    call is not dispatching -- a hang-up now withdraws it (``CallControl.withdraw``) instead of
    being refused as if a request were on the wire."""
    attempt.gate_entered = False
    if attempt.control is not None:
        attempt.control.dispatching = False


_KINDS = {k._value_: k for k in EventKind}
"""Each kind by its value: a milestone's kind looked up in a dict, not through ``EventKind``'s
call (``EnumType.__call__`` and ``Enum.__new__``, Python frames; twice per call, issue 15).
A value no kind has still goes to ``EventKind`` and its ``ValueError``."""


def _observer(attempt: Attempt) -> Callable[[Step, Mapping[str, Any]], None]:
    milestones = attempt.machine.table.milestones

    def observe(step: Step, facts: Mapping[str, Any]) -> None:
        attempt.steps.append(step.dest)
        attempt.facts.update(facts)
        kind = milestones.get(step.dest)
        if kind is not None and kind not in attempt.milestones_seen and attempt.dispatch_recorded:
            attempt.milestones_seen.add(kind)
            # The observer is synchronous (adapters call it inside their I/O loop), so the
            # milestone waits on the attempt and is appended, in order, when it ends; it is
            # diagnostic-grade evidence that recovery never depends on.
            # (``_milestone_attrs`` inline: two calls a milestone, issue 15)
            attrs = (
                {"status": facts["status"], "generation": attempt.generation}
                if "status" in facts
                else {"generation": attempt.generation}
            )
            attempt.pending.append(Event(_KINDS.get(kind) or EventKind(kind), attempt.iid, attrs))

    return observe


def observed_events(attempt: Attempt, *, withhold: bool = True) -> list[tuple[Event, None]]:
    """The attempt's milestones and protocol summary, to write (``Recorder.write_many``).
    ``withhold`` False: the received sizes are left in, for a caller that withholds them
    itself once the sink has finished (``delivery._commit``: a committed result)."""
    out: list[tuple[Event, None]] = [(ev, None) for ev in attempt.pending]
    if attempt.steps:
        # Facts carry remote-controlled strings (response header names, a redirect's origin).
        # ``_jsonable`` inline: a call per fact (~15 per call) was most of the filter (issue 15).
        facts = attempt.scrub({k: v for k, v in attempt.facts.items() if isinstance(v, _JSONABLE)})
        facts.update(attempt.steps.facts())  # the table's own state names and counts
        # Always said (null unless withheld, here or by the driver: HTTP's ``progress``), so a
        # retry's summary merged over an earlier one never keeps the earlier word.
        facts.setdefault("received_withheld", None)
        summary = {
            "protocol": attempt.machine.table.name,
            "state": attempt.machine.state,
            "facts": facts,
            "generation": attempt.generation,
        }
        out.append((Event(E.PROTOCOL_OBSERVED, attempt.iid, summary), None))
    return without_received_size(out, *attempt.withheld()) if withhold else out


async def record_observed(engine: Engine, attempt: Attempt) -> None:
    """Queue the attempt's milestones and protocol summary, one write (caller holds a
    shield)."""
    await engine.recorder.write_many(observed_events(attempt))


_JSONABLE = (str, int, float, bool, type(None), list, dict)


def _jsonable(value: Any) -> bool:
    return isinstance(value, _JSONABLE)  # a tuple: isinstance with a union type is slower
