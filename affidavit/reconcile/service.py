"""Reconciliation: settle an ``unknown`` outcome by a second observer, never by a guess.

Seed, "The error envelope must contain evidence": "A second observer may attach a reconciliation
result, but it must not rewrite the original attempt as though no dispatch had taken place";
"``remote_query`` and ``operator_attested`` explain to downstream code why the outcome changed.
An operator is entitled to determine the outcome of an unknown attempt after inspecting the
remote system, but that fact must not be passed off as a response the broker received on the
original connection."  Two ways, one set of rules for every interface:

* ``attest`` -- an operator says what they found: RECONCILED with source ``operator_attested``,
  ``observer`` = the operator's identity, the note kept.  Operators only.
* ``query`` -- the target's configured reconciliation query (``reconcile`` setting) runs as an
  invocation of its own through the same engine (validation, credential injection, its own
  dispatch barrier and record), linked to the one it reconciles.  Only its own complete,
  authoritative result -- its body whole (not withheld, not truncated) and from the target's
  own origin (``engine/readable.py``) --, matched by exactly one of ``committed_if`` /
  ``rejected_if``, is RECONCILED with source ``remote_query`` (``observer`` = the query's
  invocation id); anything else -- the query refused, unknown itself, a body withheld or cut
  (``PARTIAL_BODY``), an answer a redirect fetched from another origin (``OTHER_ORIGIN``), or
  an answer neither or both match -- is RECONCILE_INCONCLUSIVE and the invocation stays
  unknown.  The query is refused (``CONFIG_CHANGED``, nothing sent) when the target now
  reaches another account than the dispatch did (``ConfigSnapshot.moved``).  An *absent*
  finding settles it only if the query was sent at least the target's ``settle`` after the
  attempt ended (a request the broker gave up on may still be in the remote's queues:
  ``affidavit.protocols.settle``); sooner, it is inconclusive with ``not_before``.  A read:
  anyone the broker answers may ask for it (the MCP server offers it, never ``attest``) -- a
  call like any other, under the target's approval policy: one that waited for an operator is
  taken up by the next query, never asked for twice (``approved``).

Either way only a record that can be settled as a whole is: a batch whose remote applies its
items one by one is refused ``BATCH_NOT_ATOMIC`` (``_not_whole``), nothing sent or recorded.

Either way the original DISPATCH_STARTED and ATTEMPT_INTERRUPTED stay as recorded: the event is
appended after them, and the envelope shows the new outcome with ``evidence.source``.

Either way the record is read first and the event appended only after the remote was observed,
which takes time (a query is a whole remote call).  The event names the lease generation of the
record it observed, and the projection refuses it if a same-key retry took the next lease
meanwhile: what was observed predates that attempt -- which may be in flight, or may have
applied the effect -- and must neither close it nor speak for it.  The refusal is answered with
what the record shows now: ``STILL_RUNNING`` (the retry runs), ``NOT_UNKNOWN`` (it ended with a
result, or another observer settled it), ``RETRIED_MEANWHILE`` (it ended unknown again: observe
again), ``QUERY_SUPERSEDED`` (the row leaving the query open was refused: another asker closed
the query meanwhile and opened another -- ``refusals``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from affidavit.approvals import Operator, OperatorError, OperatorPolicy, check_note
from affidavit.engine.approval import needs_approval
from affidavit.engine.asker import asker
from affidavit.engine.delivery import Deliver, deliver_linked, linked_deliver, taken_up
from affidavit.engine.ids import new_invocation_id
from affidavit.engine.readable import OTHER_ORIGIN, PARTIAL_BODY, unreadable
from affidavit.engine.recovery import act_failure, recover_stale
from affidavit.engine.takeup import ClaimRefused
from affidavit.journal import boot_between
from affidavit.protocols import get
from affidavit.protocols.actions import ActionInvalid, parse_action
from affidavit.statemachine import Code, Event, EventKind, EvidenceSource, Outcome, Record
from affidavit.text import printable, utc_time

from . import approved
from .refusals import append, not_at_rest, refusal

if TYPE_CHECKING:
    from affidavit.engine import CallControl, Engine
    from affidavit.protocols import ReconcileContract

__all__ = [
    "ATTESTABLE",
    "CONFIG_SINCE",
    "OTHER_ORIGIN",
    "PARTIAL_BODY",
    "PROXY_ANSWERED",
    "attest",
    "failure",
    "note_refused",
    "query",
]

E = EventKind
ATTESTABLE = (Outcome.COMMITTED.value, Outcome.REJECTED.value)


def failure(
    exc: Exception,
    invocation_id: str,
    *,
    operator: bool = False,
    check: str = "`affidavit record {}`",
) -> tuple[int, str, str]:
    """A reconciliation the journal could not take, as every interface answers it
    (``act_failure``): the query's own call not recorded, the RECONCILED (or inconclusive)
    event's write failed -- 503 JOURNAL_UNAVAILABLE, ``check`` tells once the journal is back
    -- or the record unread; the query's own stored answer failing its verification: 500
    RESULT_UNVERIFIED, nothing reconciled.  ``operator``: the command line's own
    reconciliation (``act_failure``).  ``check``: how the interface's caller reads the record
    (``{}``: the id) -- the command line's ``affidavit record``, the daemon's route and tool
    (``daemon.operators.RECORD_CHECK``), MCP's ``get_record`` (``mcp.backends``), as
    ``internal_failure``'s ``fetch``."""
    return act_failure(
        exc,
        f"the record of {invocation_id}",
        f"the reconciliation of {invocation_id}",
        check.format(invocation_id),
        operator=operator,
    )


def note_refused(query: bool, note: str | None) -> None:
    """A ``note`` with a query is refused (INVALID_FIELD at ``note``), never dropped unsaid: a
    query records none.  Checked before anything else -- a refusal that depends only on what
    was sent, so that the same request is never answered 503 OVERLOADED, then 400."""
    if query and note is not None:
        raise OperatorError(
            "INVALID_FIELD",
            "note: only an attestation takes a note, a query records none",
            400,
            "note",
        )


async def _unknown_at_rest(engine: Engine, invocation_id: str, *, operator: bool) -> Record:
    """The invocation, when it is unknown and no attempt of it is running.  Unless
    ``operator`` (an attestation, whose operator was checked first; a query from an operator's
    channel: the console, the embedded command line), one a caller may not read
    (``Engine.callable_by_caller``: on a target this broker's configuration does not name) is
    refused word for word as an id that names nothing -- before anything else is read of it
    or written (a stale lease closed): neither its state nor its target's is told, so ids
    cannot be probed through a reconciliation as they cannot through a fetch."""
    record = engine.journal.record(invocation_id)
    if record is None or not (operator or engine.callable_by_caller(record)):
        raise OperatorError(
            "NO_SUCH_INVOCATION", f"no invocation {invocation_id}", 404, "invocation_id"
        )
    if not record.final:
        # A holder whose lease ran out is gone: close its attempt with what it proves first.
        record = await recover_stale(engine.recorder, record)
    refusal = not_at_rest(record) or _not_whole(engine, record)
    if refusal is not None:
        raise refusal
    return record


def _not_whole(engine: Engine, record: Record) -> OperatorError | None:
    """BATCH_NOT_ATOMIC when ``record`` is a batch its remote does not apply atomically, else
    None.  Seed: "Retry only the item for which the records and the remote contract permit it,
    or reconcile the batch as a whole if the remote API applies changes atomically."  One
    observation of "the effect" -- a query, an operator's finding -- says nothing of which
    items of a batch applied item by item: settled as a whole, its parent claimed more than any
    evidence (``rejected``/``after_correction`` invited a resend of items that may have
    applied) under items still ``unknown``.  The batch is the one ACTION_ACCEPTED bound, never
    the target's setting now."""
    if record.items is None:
        return None
    batch = None
    for event in engine.journal.events(record.invocation_id):
        if event.kind is E.ACTION_ACCEPTED:
            operation = event.attrs.get("operation")
            batch = operation.get("batch") if isinstance(operation, Mapping) else None
            break
    if isinstance(batch, Mapping) and batch.get("atomic") is True:
        return None
    iid = record.invocation_id
    return OperatorError(
        "BATCH_NOT_ATOMIC",
        f"{iid} is a batch whose remote applies its items one by one (atomic = false when it "
        "was sent): one observation cannot tell which of them applied, so it is not settled as "
        "a whole -- nothing was queried or recorded. Inspect each item on the remote before "
        "sending any again; the record stays unknown",
        409,  # no field: the id is right, nothing in the request is to change (``act_refused``)
    )


def _observed(record: Record) -> dict[str, Any]:
    """What a reconciliation's event names of the record it observed."""
    return {"generation": record.generation}


async def attest(
    engine: Engine,
    policy: OperatorPolicy,
    operator: Operator,
    invocation_id: str,
    outcome: str,
    note: str | None,
) -> dict[str, Any]:
    """Record what ``operator`` found; return the invocation's envelope."""
    policy.require(operator, "attest an outcome")
    if outcome not in ATTESTABLE:
        raise OperatorError(
            "BAD_OUTCOME", "attest: expected committed or rejected", 400, field="attest"
        )
    checked = check_note(note, required=True)
    record = await _unknown_at_rest(engine, invocation_id, operator=True)
    event = Event(
        E.RECONCILED,
        invocation_id,
        {
            "outcome": outcome,
            "note": checked,
            "operator": operator.attrs(),
            "message": f"Attested {outcome} by an operator after inspecting the remote system.",
            **_observed(record),
        },
        source=EvidenceSource.OPERATOR_ATTESTED,
        observer=operator.describe(),
    )
    await append(engine, event)
    return engine.recorder.envelope(await engine.recorder.record(invocation_id))


async def query(
    engine: Engine,
    invocation_id: str,
    *,
    timeout: float | None = None,
    control: CallControl | None = None,
    requester: int | None = None,
    deliver: Deliver | None = None,
    operator: bool = False,
) -> dict[str, Any]:
    """Run the target's reconciliation query once; return ``{"reconciled": bool, "envelope":
    the reconciled invocation's, "query": the query's own envelope}``.  What the query found
    is about the record as it was read before the query ran: if a retry took the invocation
    over meanwhile (or another observer settled it), nothing is reconciled and ``"refused"``
    says what the record shows now (``{code, message}``, ``refusals.append``'s) -- the query's own
    record stays, linked.  ``OperatorError`` is raised only before the query is sent.
    ``deliver``: the surface's (the daemon's answer, MCP's), through which the answer is
    written -- the query's result is recorded delivered only once it was written whole
    (``deliver_linked``); None: returned in-process, which is the transfer.  ``requester``:
    the uid asking (default this process's: ``asker``).  ``operator``: asked through an
    operator's channel (the console, the embedded command line), which may name an invocation
    a caller may not read (``_unknown_at_rest``)."""
    requester = asker(requester, engine.settings)
    record = await _unknown_at_rest(engine, invocation_id, operator=operator)
    target, contract = _queryable(
        invocation_id, record, engine.config.targets.get(record.target or "")
    )
    events = engine.journal.events(invocation_id)
    moved = await engine.snapshot.moved(events, target)
    if moved is not None:
        # The query runs against the target as configured now: another origin, base path,
        # credential or scope observes another account, whose "absent" would settle as
        # rejected an effect the first one holds.  Nothing is sent; an operator who looked can
        # attest.
        raise OperatorError(
            "CONFIG_CHANGED",
            f"the target {target.name} may no longer reach what {invocation_id} was sent to: "
            f"{moved}; nothing was queried (attest the outcome after inspecting the remote)",
            409,
            f"targets.{target.name}",
        )
    # A query still open is taken up, never asked for twice (``approved``).
    answer = await approved.earlier(engine, record, control, timeout)
    taken = asked = answer is not None  # a taken-up query: open until this reads it
    # The query this request runs, or one it took up that its asker asked: its delivery is
    # this answer's.
    ran = None if answer is None else await taken_up(engine, answer, requester)
    # The invocation's bound values: what the query's placeholders are filled with, and what
    # its answer's echo conditions are compared to.
    values = {
        "invocation_id": invocation_id,
        "idempotency_key": (record.idempotency or {}).get("key"),
        "session": record.session,
    }
    if answer is None:
        try:
            action = dict(contract.query(target, values))
        except ValueError as exc:
            raise OperatorError("NO_QUERY", str(exc), 400) from None
        if record.session is not None:
            action["session"] = record.session
        link = {"reconciles": invocation_id}
        query_id = new_invocation_id()
        claim = None
        if _covered(engine, action):  # one question at a time: named in its first write
            claim, asked = approved.claim(engine, record, query_id), True
        try:
            answer = await engine.call(
                action,
                timeout=timeout,
                link=link,
                control=control,
                requester=requester,
                invocation_id=query_id,
                claim=claim,
                deliver=linked_deliver(deliver),
            )
        except ClaimRefused as exc:  # another asker's query is open, or the record moved
            raise await refusal(engine, exc.refusal, claim=True) from None
        ran = query_id
    query_id = answer["invocation_id"]
    if taken and not _judged_alike(engine, invocation_id, query_id, target):
        # Asked under other reconciliation settings than today's: its answer is not judged by
        # today's committed_if / rejected_if, nor the query by today's request or settle.
        settled, reason, seq = None, CONFIG_SINCE, None
    else:
        settled, reason, seq = _settles(engine, query_id, target, contract.verdict, values)
    not_before = None
    if settled is not None and settled[0] is Outcome.REJECTED:
        not_before, reason = _too_soon(engine, invocation_id, query_id, contract.settle(target))
        if not_before is not None:
            settled, seq = None, None
    if settled is not None:
        outcome, matched = settled
        event = Event(
            E.RECONCILED,
            invocation_id,
            {
                "outcome": outcome.value,
                "query_invocation": query_id,
                "matched": matched,
                "message": f"A reconciliation query found the effect {_found(outcome)} "
                f"({matched}).",
                **_observed(record),
            },
            source=EvidenceSource.REMOTE_QUERY,
            observer=query_id,
            observer_seq=seq,
        )
    else:
        error = answer.get("error")
        if error is not None and error.get("code") == Code.APPROVAL_PENDING.value:
            reason = approved.WAITING
        still = asked and approved.still_open(answer)  # the next query takes it up
        event = Event(
            E.RECONCILE_INCONCLUSIVE,
            invocation_id,
            {
                "query_invocation": query_id,
                "code": error["code"] if error else None,
                "reason": reason,
                **({"open": True} if still else {}),
                **({"not_before": not_before} if not_before is not None else {}),
                **_observed(record),
            },
        )
    try:
        await append(engine, event, asked=True)  # the answer of a query asked
    except OperatorError as refused:
        # The query ran -- its record stays, linked -- but what it found is not the record's
        # to take any more.  Answered, not raised: an OperatorError says nothing was invoked.
        envelope = engine.recorder.envelope(await engine.recorder.record(invocation_id))
        found = {
            "reconciled": False,
            "envelope": envelope,
            "query": answer,
            "refused": {"code": refused.code, "message": refused.message},
        }
        return await deliver_linked(engine, found, ran, deliver)
    envelope = engine.recorder.envelope(await engine.recorder.record(invocation_id))
    found = {"reconciled": settled is not None, "envelope": envelope, "query": answer}
    return await deliver_linked(engine, found, ran, deliver)


CONFIG_SINCE = (
    "the query taken up was asked under another configuration of the target than today's: its "
    "answer settles nothing -- query again (a new query is asked under today's)"
)
"""The reason a taken-up query's answer is not judged (``_judged_alike``) -- stable text."""


def _judged_alike(engine: Engine, iid: str, query_id: str, target: Any) -> bool:
    """Whether the query taken up was asked under today's reconciliation settings: its claim's
    ``judged_by`` (``ConfigSnapshot.judging_hash``: the request, committed_if, rejected_if,
    settle -- an approval's ``wait`` edited since changes nothing); for a query claimed
    before claims recorded it, the target's whole snapshot its PREFLIGHT_VALIDATED bound."""
    for event in engine.journal.events(iid):
        if event.attrs.get("query_invocation") == query_id and "judged_by" in event.attrs:
            return bool(event.attrs["judged_by"] == engine.snapshot.judging_hash(target))
    for event in engine.journal.events(query_id):
        if event.kind is E.PREFLIGHT_VALIDATED:
            return bool(event.attrs.get("config_hash") == engine.snapshot.hash(target))
    return False


def _covered(engine: Engine, action: Mapping[str, Any]) -> bool:
    """Whether the target's approval policy covers the query (it may wait for an operator)."""
    try:
        parsed = parse_action(action, engine.config)
    except ActionInvalid:
        return False  # refused by the call itself, before anything is asked
    return needs_approval(parsed, engine.config.targets[parsed.target]) is not None


def _too_soon(
    engine: Engine, invocation_id: str, query_id: str, settle: float
) -> tuple[float | None, str]:
    """Whether an absent finding came too soon to be believed (``affidavit.protocols.settle``):
    (when a query may next settle it, why not now), or (None, "") when it may settle it now.

    The attempt ended, at the latest, when the event that closed it was written (a worker stops
    within its lease; recovery closes a record only after that): nothing of it left the broker
    after that instant.  The query observed the remote no earlier than its own DISPATCH_STARTED
    was written.  Both are wall-clock labels of events -- of two brokers, on a shared journal,
    whose clocks may disagree: on a shared journal the window grows by ``[service]
    lease_margin``, the skew the leases already allow for between the brokers' hosts.  The
    wall clock's span runs from the record's last event (other than RECONCILE_INCONCLUSIVE),
    written no sooner than the end.  A wall clock stepped forward (an NTP step, ``date -s``)
    would stretch that span past the window in a moment, so the boot clock bounds it too
    (``boot_between``: the shorter reading counts): from the mark of the last
    ATTEMPT_INTERRUPTED with no DISPATCH_STARTED after it (``_dispatch_end``) -- nothing left
    the broker after it, whatever was written since (a same-key retry stopped before its
    dispatch, a stale worker's LEASE_LOST) -- to the query's DISPATCH_STARTED mark.  Each
    reading is at least the true span, so their minimum is never laxer than the wall clock's
    alone.  Where the boot clock cannot tell (another boot or host, an older record, a
    dispatch closed otherwise), the wall clock's span alone; after a wall clock stepped back,
    the wall clock's shorter span (stricter)."""
    if settle <= 0:
        return None, ""
    margin = engine.settings.lease_margin if engine.journal.backend.shared else 0.0
    window = settle + margin
    ended = _last(engine, invocation_id, lambda e: e.kind is not E.RECONCILE_INCONCLUSIVE)
    observed = _last(engine, query_id, lambda e: e.kind is E.DISPATCH_STARTED)
    if ended is None or observed is None:
        # Not known: believe nothing sooner than a whole window from now.
        return time.time() + window, "the query's finding could not be placed in time"
    (ended_at, _), (observed_at, observed_mark) = ended, observed
    elapsed = boot_between(
        _dispatch_end(engine, invocation_id), observed_mark, observed_at - ended_at
    )
    if elapsed >= window:
        return None, ""
    # By the query's own clock: the moment a query sent then is ``window`` past the end.
    not_before = observed_at + window - elapsed
    when = utc_time(not_before, "%Y-%m-%dT%H:%M:%S+00:00")
    skew = f" + lease_margin {margin:g}s for the brokers' clocks" if margin else ""
    return not_before, (
        f"the query found the effect absent {max(elapsed, 0.0):.1f}s after the attempt "
        f"ended, within the target's settle window ({settle:g}s{skew}): a request still in the "
        f"remote's queues may yet apply it; query again after {when}"
    )


def _dispatch_end(engine: Engine, iid: str) -> object:
    """The boot mark (``boot``) of ``iid``'s last ATTEMPT_INTERRUPTED when no DISPATCH_STARTED
    follows it -- the moment by which the last dispatch had ended, whatever was written since
    --, else None (a dispatch not so closed, an older record: the boot clock cannot tell)."""
    mark: object = None
    for event in engine.journal.events(iid):
        if event.kind is E.DISPATCH_STARTED:
            mark = None
        elif event.kind is E.ATTEMPT_INTERRUPTED:
            mark = event.attrs.get("boot")
    return mark


def _last(engine: Engine, iid: str, which: Callable[[Event], bool]) -> tuple[float, object] | None:
    """The wall-clock label and the boot mark (``boot``, None if it has none) of ``iid``'s
    last event ``which`` picks."""
    last = None
    for event in engine.journal.events(iid):
        if which(event) and event.at is not None:
            last = (event.at, event.attrs.get("boot"))
    return last


def _found(outcome: Outcome) -> str:
    return "present" if outcome is Outcome.COMMITTED else "absent"


PROXY_ANSWERED = (
    "the query's answer may be the forward proxy's own, not the remote's "
    '(evidence_from.hop is "proxy"): it settles nothing'
)
"""The reason a query answered through a forward proxy with a status the proxy may have written
itself (a 4xx or 5xx, docs/proxies.md) leaves the invocation unknown -- stable text."""


NEITHER = "the query's answer matches neither committed_if nor rejected_if"
"""The reason a complete answer that neither side (or both) matches settles nothing -- stable
text."""

REDIRECTED = "answered by a redirect to {path}: not the queried resource's answer"
"""The reason a query answered through a followed redirect -- on the target's own origin, with
the credential -- leaves the invocation unknown (docs/design-notes.md: only an answer to the
request itself decides).  ``301 -> /v1/maintenance`` then its 404 is no proof the charge is
absent, nor ``302 -> /v1/login`` then a 200 page proof it exists.  Stable text; ``{path}`` is
the final hop's path as the adapter recorded it (``summary.hops[-1].path``: no query, no
``;`` parameters, the credential's forms scrubbed, at most 200 characters --
``adapters/http/client.hop_path``)."""


def redirected(summary: Mapping[str, Any]) -> str | None:
    """``REDIRECTED`` naming the final hop's path when ``summary``'s answer came through a
    followed redirect (more than one hop), else None."""
    hops = summary.get("hops")
    if not isinstance(hops, list) or len(hops) <= 1:
        return None
    last = hops[-1]
    path = last.get("path") if isinstance(last, dict) else None
    return REDIRECTED.format(path=path if isinstance(path, str) else "another resource")


def _settles(
    engine: Engine, query_id: str, target: Any, verdict: Any, values: Mapping[str, str | None]
) -> tuple[tuple[Outcome, str] | None, str, int | None]:
    """Whether the query's own result settles the question: ((outcome, what matched) or None,
    why not, the seq of the query's stored result); ``values``, the reconciled invocation's
    bound values, are what its conditions' placeholders stand for."""
    rec = engine.journal.record(query_id)
    if rec is not None and (rec.evidence.get("evidence_from") or {}).get("hop") == "proxy":
        # docs/proxies.md: through a forward proxy a 4xx or 5xx may be the proxy's own answer
        # (Privoxy's 404 for a domain it cannot resolve): it says nothing of the remote's state,
        # so a "status:404" rejected_if must not read it as the effect's absence.
        return None, PROXY_ANSWERED, None
    if (
        rec is None
        or rec.outcome not in (Outcome.COMMITTED, Outcome.REJECTED)
        or not rec.evidence.get("response_complete")
        or rec.evidence.get("source") != EvidenceSource.REMOTE_RESPONSE.value
    ):
        return None, "the query has no complete, authoritative result of its own", None
    stored = engine.journal.read_result(query_id)
    if stored is None:
        return None, "the query's result was not stored", None
    # A body withheld or cut (a gzip without its trailer, a decompression bomb) may still parse
    # as the prefix of a matching document; an answer from another origin (a followed
    # redirect) is not the target's.  Neither settles anything (engine/readable.py).
    why = unreadable(stored.summary, origin=getattr(target, "origin", None))
    if why is not None:
        return None, why, None
    why = redirected(stored.summary)
    if why is not None:
        return None, why, None
    outcome, matched = verdict(target, stored.summary, stored.streams, values)
    if outcome is None:
        # A protocol may say why (an ambiguous condition, a missing bound value); else NEITHER.
        return None, _reason(matched), None
    result = rec.evidence.get("result") or {}
    return (outcome, str(matched)), "", result.get("seq")


REASON_MAX = 300
"""Longest reason a protocol's ``verdict`` gives for settling nothing that is recorded as it is:
the text goes into the journal and the envelope (docs/adding-a-protocol.md: it names the
condition, never quotes the answer)."""


def _reason(said: object) -> str:
    """A ``verdict``'s reason for settling nothing: its text, escaped of anything that is no
    printable character and cut at ``REASON_MAX`` -- a plugin's own words, bounded -- else
    ``NEITHER``."""
    if not isinstance(said, str) or not said:
        return NEITHER
    text = printable(said)
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 8] + "...[cut]"


_ATTEST = "nothing was queried: attest the outcome after inspecting the remote (--attest)"


def _queryable(invocation_id: str, record: Record, target: Any) -> tuple[Any, ReconcileContract]:
    """``target`` and its protocol's query contract, which reconciles ``record``; or
    ``NO_QUERY`` saying which of the four reasons there is none (one stable code: callers
    branch on it, the words say what to do)."""
    if target is None:  # (a record written before any target was resolved names none)
        named = f" {record.target}" if record.target is not None else ""
        raise OperatorError(
            "NO_QUERY",
            f"the target{named} of {invocation_id} is no longer configured; {_ATTEST}",
            400,
        )
    if target.kind != record.protocol:
        raise OperatorError(
            "NO_QUERY",
            f"the target {target.name} is now of kind {target.kind}, not {record.protocol} as "
            f"when {invocation_id} was sent; {_ATTEST}",
            400,
            f"targets.{target.name}.kind",
        )
    spec = get(target.kind)
    if spec is None:  # (a config naming it was read: the protocol was uninstalled since)
        raise OperatorError("NO_QUERY", f"protocol {target.kind} is not installed; {_ATTEST}", 400)
    if spec.reconcile is None:
        raise OperatorError(
            "NO_QUERY",
            f"protocol {target.kind} has no reconcile query: attest the outcome (--attest)",
            400,
        )
    return target, spec.reconcile
