"""The end of an attempt: record how it ended, store a complete result, deliver the envelope.

Seed, "A result delivery error must not repeat execution" -- the order of writes:

1. Complete and verify the remote response (the adapter's ``RemoteResult``).
2. Append the definite result and its hash to the durable record (REMOTE_RESPONSE_COMPLETE).
3. Commit the retrievable result under the invocation identifier (chunks, completeness marker
   and RESULT_COMMITTED in one barrier transaction).
4. Deliver the result to the caller (RESULT_DELIVERED, or RESULT_DELIVERY_FAILED: the result
   stays fetchable and nothing is sent again).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import trio

from affidavit.adapters.base import RemoteResult
from affidavit.journal import CommitUnknown, JournalError, JournalWriteError, json_copy
from affidavit.secrets.redaction import LEAVES
from affidavit.statemachine import (
    Event,
    EventKind,
    EvidenceSource,
    ImpossibleEvent,
    Record,
)
from affidavit.statemachine.lifecycle import TRANSITIONS

from .attempt import (
    Attempt,
    Failure,
    LeaseRefusal,
    lease_refused,
    observed_events,
    stamped,
)
from .contracts import Reader
from .echoed import stronger, without_received_size, without_size_headers
from .readable import stream_cut
from .recorder import reference_payload, result_payload, stored_payload
from .recovery import CallNotRecorded, closing_event
from .sink import Stored, StreamSink

if TYPE_CHECKING:
    from .engine import Engine

Deliver = Callable[[dict[str, Any]], Awaitable[None]]

__all__ = [
    "AWAITING_DELIVERY",
    "STORE_ONLY",
    "NotAnswered",
    "by_reference",
    "conclude",
    "deliver_linked",
    "deliver_stored",
    "linked_deliver",
]

log = logging.getLogger("affidavit.engine")


class NotAnswered(Exception):
    """A ``deliver`` refused before its first byte was written (the daemon's answer budget
    full: 503 ``ANSWERS_IN_FLIGHT``, "nothing was read"): no delivery was attempted, so none
    failed.  ``deliver_stored`` raises it as itself, as a ``JournalError``: nothing recorded,
    the result stays stored and undelivered, fetched again later."""


E = EventKind


async def _nobody(envelope: dict[str, Any]) -> None:
    raise AssertionError("STORE_ONLY is never called")


STORE_ONLY: Deliver = _nobody
"""``deliver`` for a call nobody waits for (an approved invocation the daemon dispatched after
its caller went away): the result is stored and stays undelivered until the caller fetches it
-- neither RESULT_DELIVERED nor RESULT_DELIVERY_FAILED is recorded."""

AWAITING_DELIVERY = frozenset(
    state for state, row in TRANSITIONS.items() if row.get(E.RESULT_DELIVERED) not in (None, state)
)
"""States whose stored result has not reached its caller (stored, or its answer failed): the
lifecycle table's states that RESULT_DELIVERED moves on."""


def by_reference(answer: Any, iid: str | None) -> bool:
    """Whether ``answer`` (an envelope, or an answer that nests one: a poll's, a query's)
    carries ``iid``'s result only by reference (``reference_payload``: its summary and hash,
    where to fetch it, never the bytes).  Seed, "Mark RESULT_DELIVERED only after the protocol
    has confirmed complete transfer": an answer that names where the result is has transferred
    none of it, so writing it records no delivery -- the result stays stored, awaiting
    delivery (``fetch_result``), until a fetch that transfers it whole records it.  The one
    rule every surface's delivery applies (``conclude``, ``deliver_linked``).  Answers are
    JSON-shaped: ``dict`` and ``list`` (no ABC check on a call's path: test_loop_frames)."""
    if iid is None:
        return False
    if isinstance(answer, dict) and answer.get("invocation_id") == iid and "evidence" in answer:
        # ``iid``'s own envelope (every call's answer): the reference is its result's, if any
        # -- the walk below would read every header and evidence field to find the same (65 us
        # a call, issue 15).
        result = answer.get("result")
        return isinstance(result, dict) and _names(result.get("by_reference"), iid)
    return _refers(answer, iid)


def _names(ref: Any, iid: str) -> bool:
    """``ref`` is a ``by_reference`` naming ``iid``'s result."""
    if not isinstance(ref, dict):
        return False
    fetch = ref.get("fetch")
    return isinstance(fetch, dict) and fetch.get("invocation_id") == iid


def _refers(answer: Any, iid: str) -> bool:
    """An answer nesting envelopes (a poll's, a query's): ``by_reference`` of ``iid`` anywhere."""
    if isinstance(answer, dict):
        if _names(answer.get("by_reference"), iid):
            return True
        return any(_refers(value, iid) for value in answer.values())
    if isinstance(answer, list):
        return any(_refers(value, iid) for value in answer)
    return False


_STORED = frozenset(
    row[E.RESULT_COMMITTED] for row in TRANSITIONS.values() if E.RESULT_COMMITTED in row
)
"""The states RESULT_COMMITTED leads to: a result just stored, not yet delivered."""


async def conclude(
    engine: Engine,
    attempt: Attempt,
    result: RemoteResult | None,
    failure: Failure | None,
    sink: StreamSink,
    deliver: Deliver | None,
    reading: Reader | None = None,
) -> dict[str, Any]:
    """Record the attempt's ending and render its envelope.  The journal-only part runs in one
    shielded section (one cancel scope instead of one per event); delivery to a caller's
    channel is outside it, so a stuck channel stays cancellable.

    Everything recorded here names the attempt's generation (``stamped``).  A worker whose
    lease ran out and was taken over -- or whose attempt recovery closed -- has those writes
    refused: it answers with the record and LEASE_LOST (``lease_refused``), never with what it
    received as the invocation's result, nor with another attempt's result as its own."""
    iid = attempt.iid
    recorder = engine.recorder
    with trio.CancelScope(shield=True):
        # The chunks still in flight settle first: the diagnostic events posted next must not
        # share (and fail with) a transaction that refuses a chunk.
        await sink.drain()
        # A result to commit (no failure): ``_commit`` withholds the sizes of the streams that
        # echoed a secret once the sink has finished, which then knows them without a scan of
        # the bytes its redactors hold back (``redacted_streams``: one per stream per call).
        observed = observed_events(attempt, withhold=failure is not None)
        if isinstance(failure, LeaseRefusal):
            await recorder.write_many(observed)
            return await lease_refused(engine, attempt, failure)
        try:
            if failure is not None:
                await recorder.write_many(observed)
                return await _close(engine, iid, stamped(failure, attempt.generation))
            assert result is not None
            envelope, committed = await _commit(engine, attempt, result, sink, reading, observed)
            sink.release()  # rendered: the envelope holds the result, delivered below
        except ImpossibleEvent as refused:
            return await lease_refused(engine, attempt, refused)
        if not committed or deliver is STORE_ONLY:
            return envelope
        if deliver is None and by_reference(envelope, iid):
            return envelope  # nothing of the result transferred: fetched later (by_reference)
        if deliver is None:
            # In-process return: handing the dict back is the complete transfer.  Its record
            # is queued, not waited for (issue 15: not a barrier); every read of this broker
            # waits for it first (``Recorder.delivered``), so none records a second delivery.
            await recorder.deliver_later(Event(E.RESULT_DELIVERED, iid, {"channel": "return"}))
            return envelope
    assert deliver is not None  # (the scope cannot swallow a return; mypy cannot tell)
    return await _deliver(engine, iid, envelope, deliver)


async def _close(engine: Engine, iid: str, closing: Event) -> dict[str, Any]:
    """Append the attempt's ``closing`` event and render the record.  Refused by a record that
    moved under the same attempt -- a DISPATCH_STARTED whose commit was lost (``CommitUnknown``:
    the gate read the record before it landed, and judged it not sent) landing before this
    write took the head -- the ending is what the record now proves (``closing_event``:
    unknown once DISPATCH_STARTED is on record), never the gate's guess.  A record a newer
    attempt took over, or already closed, is ``lease_refused``'s to answer (re-raised); so is a
    fenced one (``Record.fenced``): no attempt was ever its, and its close is the fence's --
    ``lease_lost`` closes it so if still open and records this worker's LEASE_LOST, whichever of
    the attempt's writes the record refused first."""
    recorder = engine.recorder
    generation = closing.attrs.get("generation")
    try:
        return await recorder.finish(iid, closing)
    except ImpossibleEvent:
        record = await recorder.record(iid)
        if record.fenced is not None:
            raise
        proven = None if record.final else closing_event(record, "journal")
        if record.generation != generation or proven is None or proven.kind is closing.kind:
            raise
    return await recorder.finish(iid, proven)


async def _commit(
    engine: Engine,
    attempt: Attempt,
    result: RemoteResult,
    sink: StreamSink,
    reading: Reader | None,
    observed: list[tuple[Event, None]],
) -> tuple[dict[str, Any], bool]:
    """Store the result and RESULT_COMMITTED (a barrier); return the envelope rendered from
    the durable record and whether the result was committed.  ``observed``: the attempt's
    milestones and protocol summary, written first.  Caller holds a shield.  ``ImpossibleEvent``
    when the record refuses the attempt's complete response or its result (the caller asks
    ``superseded``)."""
    journal, recorder = engine.journal, engine.recorder
    iid, generation = attempt.iid, attempt.generation
    # A stream stored cut short (``stream_cut``) withholds its end; a complete one does not.
    streams = await sink.finish(lambda name: stream_cut(result.summary, name))
    digest = sink.digest()
    # The summary holds what the remote wrote besides the streams (header names and values,
    # the reason phrase): the same forms go (docs/redaction.md, "Surfaces").  Scrubbed first:
    # a head that echoed a secret makes the reason below ``redacted`` (``sink.head_echoed``).
    scrubbed = sink.scrub(result.summary)
    # A stream that echoed a secret, or was not scanned whole (withheld, truncated: the adapter
    # received it, ``received_evidence`` names it): what measures the bytes received goes
    # (``echoed.py``), from ``observed`` (left unstripped by ``conclude``) and the result's
    # headers -- the finished sink knows those streams without scanning held-back bytes
    # (``redacted``).  A withheld stream may have reached no sink at all (a ``br`` body).
    cut: list[str] = []
    received = received_evidence(result, sink, cut)
    redacted = [name for name in streams if sink.redacted(name)]
    # The strongest stream's word (``short_redacted``, ``tail_redacted``: may be ordinary text).
    # A head that held only a short value's forms says ``short_redacted`` (``head_why``).
    head = sink.head_why
    why = "redacted" if not (redacted or head) else stronger(head, *map(sink.why, redacted))
    # The driver's word (HTTP: its head echoed a secret) is never lowered (``stronger``).
    why = stronger(why, result.facts.get("received_withheld"))
    if cut:
        why = "unscanned"
        redacted.extend(cut)
    observed = without_received_size(observed, redacted, why)
    attrs: dict[str, Any] = {
        "outcome": result.outcome.value,
        "code": result.code.value if result.code else None,
        "response_sha256": digest,
        "generation": generation,
    }
    facts, scrub = result.facts, sink.scrub
    # ``redirect_not_followed``: why a 3xx is the result (a redirect an approved request does
    # not follow, an origin the target does not list): adapter-fixed reasons, scrubbed.
    for k in (
        "status",
        "exit_status",
        "exit_signal",
        "remote_request_id",
        "hop",
        "evidence_from",
        "redirect_not_followed",
    ):
        if k in facts:
            v = facts[k]
            # A number: no ``scrub`` call -- ``scrub`` is number-blind; a number an HTTP
            # remote may echo a credential in is redacted where it is parsed (adapters/http:
            # ``Redactor.scrub_parsed``, ``retry_after``).  An SSH ``exit_status`` is not: a
            # process's exit status is 8 bits (0-255, three digits: under ``MIN_LEN``'s four),
            # so only an sshd inventing one sends more -- and that server was sent the password
            # it would echo (a private key never leaves the broker): it needs no echo to tell it.
            attrs[k] = v if type(v) in LEAVES else scrub(v)
    attrs.update(received)
    if result.retry_after is not None:
        attrs["retry_after"] = result.retry_after
    complete = Event(E.REMOTE_RESPONSE_COMPLETE, iid, attrs, source=EvidenceSource.REMOTE_RESPONSE)
    if sink.store_failed:
        await recorder.write_many(observed)
        return await _store_failed(engine, complete)
    # One queued write for the attempt's milestones, the complete response and what the result
    # establishes beyond its outcome (a batch's item outcomes, the job a 202 accepted): they
    # ride along with RESULT_COMMITTED's transaction, queued after the tail chunk (no
    # checkpoint since the drain: the same transaction as before, issue 15).
    rows = [*observed, (complete, None)]
    # The kept streams are joined once (the streams are finished: they stay the same), and
    # only when something reads them: before the commit for ``reading``, else after it.
    kept = sink.kept() if reading is not None else None
    if reading is not None:
        rows.extend((stamped(event, generation), None) for event in reading(iid, result, kept))
    await recorder.write_many(rows)
    summary = {**without_size_headers(scrubbed, bool(redacted)), "streams": streams}
    try:
        committed = await journal.commit_result(
            Event(E.RESULT_COMMITTED, iid, {"sha256": digest, "generation": generation}),
            summary=summary,
            expect=sink.expected(),
            writer=sink.writer,
        )
    except JournalError as exc:
        # ResultStoreFailed: a storage fault failed the whole batch, the rows posted above
        # with it -- or the commit op refused the stored chunks (nothing of it written) and the
        # rest of the batch committed, those rows included.  A plain JournalError is the same
        # refusal in other words ("lacks chunk N", "lacks auditor copies").  Which rows are
        # durable -- the commit too, when a shared journal lost its answer -- the record says
        # (_store_failed); a commit that may yet land (ResultStoreUnknown) it says only later.
        return await _store_failed(
            engine, complete, exc if isinstance(exc, CommitUnknown) else None
        )
    # As the commit of RESULT_COMMITTED left it: the answer to the call that made it durable.
    record = await recorder.record(iid, as_committed=True)
    if reading is None:
        kept = sink.kept()
    if kept is None:
        # Larger than the inline limit: the envelope says what was stored and how to fetch
        # it, and the body stays in the journal -- reading megabytes back, decrypting and
        # decoding them into one JSON value is what made a 50 MiB answer cost 150 MB (issue 15).
        summary = json_copy(summary)
        payload = reference_payload(iid, summary, committed.attrs["sha256"], sink.limit)
        return recorder.render(record, payload), True
    # The result the journal just stored: commit_result(expect=) verified, in the committing
    # transaction, that the stored streams hash to exactly these bytes, and its event
    # carries the stored result's hash -- reading it back would only decrypt and re-hash the
    # same bytes.  The summary goes through JSON as the stored copy did, so this payload
    # equals what fetch_result reads (tests/broker/test_inline_result.py).
    stored = Stored(json_copy(summary), kept, committed.attrs["sha256"])
    return recorder.render(record, result_payload(stored)), True


def received_evidence(
    result: RemoteResult, sink: StreamSink, cut: list[str] | None = None
) -> dict[str, Any]:
    """What the adapter says it received of each stream, before decoding and redaction: facts
    ``<stream>_bytes`` and ``<stream>_sha256`` (HTTP's wire body: docs/redaction.md).  They are
    recorded only for a stream scanned whole in which redaction replaced nothing: the hash of
    bytes holding a secret (echoed, or compressed where no scan saw it) would let whoever reads
    the record test guesses of that secret offline, and their count would give its length.
    Otherwise ``<stream>_received_withheld`` says why (``redacted``, ``tail_redacted`` --
    cut short, its last bytes were withheld whatever they were: ``Redactor.flush`` -- or
    ``unscanned``), never weaker than the head's or the driver's word; the
    ``unscanned`` streams' names are appended to ``cut``."""
    out: dict[str, Any] = {}
    for key in result.facts:
        if not key.endswith("_sha256"):
            continue
        name = key.removesuffix("_sha256")
        # A stream withheld, or cut short (a 3xx that became the result holds only its
        # buffered part), was not scanned whole: what it received past the scan is unseen.
        if stream_cut(result.summary, name):
            out[f"{name}_received_withheld"] = "unscanned"
            if cut is not None:
                cut.append(name)
        elif sink.redacted(name):
            # The driver's word (HTTP: a head, a 1xx's too, held a form the summary's scrub
            # never sees, e.g. a hex Link) is never lowered by a stream that only ended inside a
            # form (``stronger``), nor the summary's scrub (``head_echoed``: SSH has no driver
            # word), which ``why`` -- this stream's redactor alone -- does not see.
            why = stronger(sink.why(name), result.facts.get("received_withheld"), sink.head_why)
            out[f"{name}_received_withheld"] = why
        else:
            out[key] = "sha256:" + str(result.facts[key])
            if f"{name}_bytes" in result.facts:
                out[f"{name}_bytes"] = result.facts[f"{name}_bytes"]
    return out


async def _store_failed(
    engine: Engine, complete: Event, doubt: CommitUnknown | None = None
) -> tuple[dict[str, Any], bool]:
    """A complete response whose storage failed (seed: "Return phase=result_delivery, include
    outcome=committed only when the durability contract allows this to be confirmed by the
    current record, and require immediate operator intervention").  The two small events that
    say so -- the complete response (its outcome and hash), unless the record already holds it,
    and RESULT_STORE_FAILED -- are appended as barriers of their own: a journal that refused
    megabytes may take them, and then the record itself confirms the outcome.  What it does not
    take is rendered in memory on top of the durable record, never claimed as durable, and
    only as what recovery will write (``closing_event``): RESULT_STORE_FAILED when the complete
    response is on record, else ATTEMPT_INTERRUPTED -- outcome unknown, retry reconcile.
    Returns the envelope and whether the result is stored after all (as ``_commit``): a commit
    whose answer a shared journal lost may have landed.

    ``doubt``: the commit's own error when it may yet land (``ResultStoreUnknown``) -- on SQLite
    its frames, in the -wal but read by no connection, are recovered by an open after a crash
    unless a later commit is written over them.  The first of the two small events to commit
    settles that; if neither does, a store failure rendered in memory is a claim the record may
    later contradict (RESULT_COMMITTED): the call is not recorded (``CallNotRecorded``), and its
    record, read once the journal takes writes again, says which."""
    iid = complete.invocation_id
    generation = complete.attrs["generation"]
    recorder = engine.recorder
    # The call's posted rows (its milestones, and the complete response itself when the commit
    # was tried) may have committed or failed: a refused commit is not a failed batch.  Their
    # fate is in the record, read once they settled; the complete response is appended only
    # if the record does not hold it already.
    with contextlib.suppress(JournalError, ImpossibleEvent):  # a row that failed is not in
        await recorder.settle()  # the record read next
    record = await recorder.record(iid)
    if record.generation != generation:
        # Not this attempt's record any more: another worker took the invocation over (its
        # result, stored or not, is not this call's to answer with).
        raise ImpossibleEvent(
            complete,
            record.state,
            f"stale generation {generation}; the current one is {record.generation}",
        )
    if record.state in _STORED:
        # The commit landed: its answer was lost with a shared journal's connection, and no
        # new one could read it back in time ("whether the write is durable is unknown").
        # Read back now, the record holds the result -- the answer, as for any stored result.
        # (The record's generation is this attempt's, and only an attempt stores a result.)
        return recorder.envelope(record), True
    if record.final:
        # Closed by someone else (recovery, a reconciliation) while this worker stalled: its
        # result was refused for that, not for storage -- no operator alarm; a lost lease.
        raise ImpossibleEvent(
            complete, record.state, f"generation {generation}'s attempt is closed"
        )
    log.warning("storing the result of %s failed; operator intervention is required", iid)
    pending = [
        Event(E.RESULT_STORE_FAILED, iid, {"stage": "result_store", "generation": generation})
    ]
    if not record.evidence.get("response_complete"):
        pending.insert(0, complete)
    while pending:
        try:
            await recorder.append(pending[0], barrier=True)
        except JournalWriteError:
            recorder.forget()
            break
        pending.pop(0)
        doubt = None  # a later commit landed: over the doubted one's frames, or after it
    if pending and doubt is not None:
        raise CallNotRecorded(iid) from doubt
    if pending:
        # Shown as what the record will hold: what closes it as it stands (recovery's own
        # ``closing_event``).  The complete response on record: RESULT_STORE_FAILED.  Not on
        # record: the record proves only a dispatch, and recovery closes it ATTEMPT_INTERRUPTED
        # (outcome unknown, retry reconcile) -- a RESULT_STORE_FAILED rendered over it (retry
        # never) was a claim the record later contradicted.  Code, phase, outcome and retry are
        # recovery's; the message is this stage's ("journal": why it is unknown now), where
        # recovery's will say the broker stopped or the lease lapsed (docs/design-notes.md).
        events = engine.journal.events(iid)
        now = recorder.hint_now()
        durable = recorder.projected(events, now)
        if durable.state in _STORED and durable.generation == generation:
            # As at the first read: this generation's result is on record after all -- the
            # answer, never overwritten by a lost lease (audit 53b r3).
            return recorder.envelope(durable), True
        if durable.final or durable.generation != generation:
            # Closed or taken over since it was read above (recovery, a reconciliation): a
            # lost lease, as at the first read -- nothing this call renders is what it holds.
            raise ImpossibleEvent(
                complete, durable.state, f"generation {generation}'s record moved on"
            )
        closing = closing_event(durable, "journal")
        if closing is None:
            # Recovery writes nothing over this record: nothing this call can render is what
            # it will hold.
            raise CallNotRecorded(iid)
        return recorder.render(recorder.projected([*events, closing], now)), False
    return recorder.envelope(await recorder.record(iid)), False


async def _deliver(
    engine: Engine, iid: str, envelope: dict[str, Any], deliver: Deliver
) -> dict[str, Any]:
    recorder = engine.recorder
    try:
        await deliver(envelope)
    except Exception as exc:
        log.warning("delivery of %s failed: %s", iid, type(exc).__name__)
        # The result the call answered with, not read again from the journal: rendering it
        # anew (``Recorder.envelope``) read a stored result whole on the event loop, for a
        # caller that is gone -- the stall and the memory the streamed answers removed.
        return recorder.render(
            await _delivery_failed(engine, iid, "deliver"), envelope.get("result")
        )
    if by_reference(envelope, iid):
        return envelope  # its bytes were not in it: awaiting delivery, fetched (by_reference)
    # Not a barrier (DESIGN, "Durability barriers": recovery never depends on it; a delivery
    # lost with a crash leaves the result stored and fetchable -- a read).  Queued like the
    # in-process return's, not waited for: the daemon serves the connection's next request
    # once this call returns (issue 15); every read of this broker waits for it first.
    with trio.CancelScope(shield=True):
        await recorder.deliver_later(Event(E.RESULT_DELIVERED, iid, {"channel": "deliver"}))
    return envelope


def linked_deliver(deliver: Deliver | None) -> Deliver | None:
    """The ``deliver`` a linked call (a poll, a reconciliation query) runs with when its asker
    answers through ``deliver``: its result is stored and nothing about its delivery recorded
    yet (``STORE_ONLY``) -- the answer that carries it (the poll's, the query's) is written
    after the call returns, and only that write can tell (``deliver_linked``).  No ``deliver``
    (an in-process return): None, the return is the transfer, recorded as any call's."""
    return None if deliver is None else STORE_ONLY


async def deliver_linked(
    engine: Engine, answer: dict[str, Any], linked: str | None, deliver: Deliver | None
) -> dict[str, Any]:
    """Write ``answer`` -- which carries the envelope of the linked call ``linked`` that this
    request ran with ``linked_deliver`` (None: it ran none, or took up another's) -- through
    ``deliver``, and record the linked result's delivery by it: seed, "Mark RESULT_DELIVERED
    only after the protocol has confirmed complete transfer".  The answer written whole:
    RESULT_DELIVERED (channel ``deliver``) for a result awaiting delivery -- just stored, or
    one whose earlier answer failed (a fetch cut short, another answer that carried it), as
    ``deliver_stored`` delivers it; not: RESULT_DELIVERY_FAILED -- the result stays stored,
    fetchable; nothing is sent again -- for a result just stored only (a failure already on
    record says it).  A result delivered meanwhile (a fetch) records nothing more; an answer
    carrying none (the call failed, awaits an operator) is written and nothing recorded.  No
    ``deliver``: ``answer`` as is."""
    if deliver is None:
        return answer
    try:
        await deliver(answer)
    except Exception as exc:
        log.warning("delivery of the answer carrying %s failed: %s", linked, type(exc).__name__)
        with trio.CancelScope(shield=True):  # what happened to the answer is recorded
            if await _in(engine, linked, _STORED):
                assert linked is not None
                await _delivery_failed(engine, linked, "deliver")
        return answer
    # Shielded from the read on: the answer is written whole, and a cancel arriving now must
    # not lose the row that says so -- only a shutdown cancelling the handler can (the daemon's
    # stop cuts a linked answer off only while it is written: app.py ``Answering``).
    # The read checkpoints only while a delivery of ``linked`` is queued or a shared journal
    # reconnects: tests/broker/test_linked_delivery_cancel.py cancels there, both paths.
    with trio.CancelScope(shield=True):
        if not by_reference(answer, linked) and await _in(engine, linked, AWAITING_DELIVERY):
            assert linked is not None
            delivered = Event(E.RESULT_DELIVERED, linked, {"channel": "deliver"})
            await engine.recorder.deliver_later(delivered)
    return answer


async def taken_up(
    engine: Engine, envelope: Mapping[str, Any], requester: int | None
) -> str | None:
    """The id of a poll or query another request asked and this one took up (``envelope``:
    its answer), when ``requester`` is who asked for it (``requested_by``): the answer that
    carries it is then its delivery (``deliver_linked``'s ``linked``).  None for another uid's
    take-up: it reads the result, recording nothing."""
    iid = envelope.get("invocation_id")
    if not isinstance(iid, str):
        return None
    record = await engine.recorder.record(iid)
    return iid if requested_by(record, requester) else None


async def _in(engine: Engine, iid: str | None, states: frozenset[str]) -> bool:
    """Whether ``iid``'s record is in one of ``states`` (``_STORED``: a result stored and not
    yet delivered, nor failed to be; ``AWAITING_DELIVERY``: or failed to be)."""
    return iid is not None and (await engine.recorder.record(iid)).state in states


async def _delivery_failed(engine: Engine, iid: str, channel: str) -> Record:
    """Record that ``channel`` failed to deliver the stored result (RESULT_DELIVERY_FAILED: the
    caller must fetch it) and return the record.  Unless another read delivered the result
    meanwhile -- a fetch by whoever knows the invocation id (or failed to, first): the lifecycle
    refuses the failure then, and the record as it stands is the answer (the result delivered,
    or its delivery failed already); this channel's failure is only logged."""
    recorder = engine.recorder
    try:
        await recorder.append(
            Event(E.RESULT_DELIVERY_FAILED, iid, {"channel": channel}), barrier=True
        )
    except ImpossibleEvent:
        record = await recorder.record(iid)
        log.warning(
            "delivery of %s through %s failed after another read reached it (%s)",
            iid,
            channel,
            record.state,
        )
        return record
    return await recorder.record(iid)


def requested_by(record: Record, reader: int | None) -> bool:
    """Whether the uid ``reader`` is who asked for ``record``'s invocation (``Record.requester``:
    the latest asker's, folded with the record -- no read of its events) --
    authenticated by the kernel (the daemon's socket peer), or this process's user for a call
    made in-process (``asker``).  A session is a label any caller may send: it proves nothing
    and decides nothing here.  A record naming no requester (an older journal's) is delivered
    to no reader: the journal does not say who asked, so no read can be shown to be the
    asker's -- before, any uid's read recorded its delivery.  An in-process reader (the
    operator's ``affidavit result``, an embedded MCP server) reads as its own uid
    (``asker``)."""
    return record.requester is not None and reader is not None and record.requester == reader


NOT_THE_REQUESTER = {
    "recorded": False,
    "why": "read whole by another uid than the call's requester: a read, recording nothing; "
    "the journal does not say the requester received this result",
}
"""An envelope's ``delivery`` when another uid read a result its requester has not been
recorded to receive (``read_by_another``)."""

NO_REQUESTER = {
    "recorded": False,
    "why": "the record names no requester (written before requesters were recorded): no read "
    "can be shown to be its asker's, so this one is a read, recording nothing; the journal "
    "does not say the asker received this result",
}
"""An envelope's ``delivery`` when a record naming no requester was read (``read_by_another``)."""


_NO_ASKER = ("answer", "an answer of it")
"""``delivery``'s key prefix and words for a failed answer of a record naming no requester."""


def read_by_another(engine: Engine, record: Record, defer: bool) -> dict[str, Any]:
    """``record``'s stored result as read by another uid than its requester (or by anyone, when
    it names none: ``NO_REQUESTER``): the record as the journal holds it -- its state,
    ``record_seq`` and every row, never a view the journal never had -- with only its ``error``
    judged without the RESULT_DELIVERY_FAILED rows, which are about the requester's answer,
    not this reader's (their ``retry: fetch_result`` would send this reader to fetch again, for
    ever): none for a committed result, the remote's own code and hint for a rejection.
    ``delivery`` says that this read records nothing and, if the requester's answer failed, at
    which seq the journal says so (``requester_answer_failed_at_seq``; of a record naming no
    requester, an answer of it: ``answer_failed_at_seq``)."""
    recorder = engine.recorder
    events = list(engine.journal.events(record.invocation_id))
    failed = [e for e in events if e.kind is E.RESULT_DELIVERY_FAILED]
    envelope = recorder.envelope(record, whole=True, defer=defer)
    named = record.requester is not None
    delivery: dict[str, Any] = dict(NOT_THE_REQUESTER if named else NO_REQUESTER)
    if failed:
        kept = [e for e in events if e.kind is not E.RESULT_DELIVERY_FAILED]
        error = recorder.render(recorder.projected(kept, recorder.hint_now())).get("error")
        if error is None:
            envelope.pop("error", None)
        else:
            envelope["error"] = error
        seq = failed[-1].seq
        # A record naming no requester has no requester whose answer failed: an answer did.
        key, whose = ("requester_answer", "the requester's answer") if named else _NO_ASKER
        delivery[f"{key}_failed_at_seq"] = seq
        delivery["why"] += f"; {whose} failed (RESULT_DELIVERY_FAILED, seq {seq})"
    envelope["delivery"] = delivery
    return envelope


async def deliver_stored(
    engine: Engine,
    record: Record,
    deliver: Deliver | None,
    *,
    defer: bool = False,
    reader: int | None = None,
) -> dict[str, Any]:
    """A stored result read again by its caller (``fetch_result``): seed, "treat repeated
    requests as reads" -- nothing is sent to the remote.  A result not yet delivered (never, or
    its first answer failed) is delivered by this read: RESULT_DELIVERED (channel ``fetch``) is
    recorded once the envelope was handed over whole (seed: "Mark RESULT_DELIVERED only after
    the protocol has confirmed complete transfer"); an in-process return is that transfer, its
    result read whole and verified before anything is recorded -- a read that fails records
    nothing, whatever the surface.  An already delivered result is only read (no event per
    read).  ``defer``: its streams ``Deferred`` (``stored_payload``), for a ``deliver`` that
    reads them as it writes.
    ``reader``: the uid that reads it (the daemon's peer) -- delivered means answered whole to
    the requesting uid: another uid's read (``requested_by``) records nothing and is answered
    ``read_by_another``; the requester's own read records its uid (``reader``)."""
    recorder = engine.recorder
    if record.state not in AWAITING_DELIVERY:
        return recorder.envelope(record, whole=True, defer=defer)
    if not requested_by(record, reader):
        return read_by_another(engine, record, defer)
    iid = record.invocation_id
    attrs: dict[str, Any] = {"channel": "fetch"}
    if reader is not None:
        attrs["reader"] = {"uid": reader}
    delivered = Event(E.RESULT_DELIVERED, iid, attrs)
    if deliver is None:
        # The in-process return: the result read whole and verified first (as the ``deliver``
        # branch renders it), RESULT_DELIVERED only once that succeeded -- a read that fails (a
        # chunk that differs, a segment file missing: ``JournalError``) raises and records
        # nothing: the result stays stored, undelivered, fetched again later.  Audit 54a: the
        # event was appended first, for a result nobody received.
        stream = engine.journal.result_stream(iid)  # the marker and summary, verified
        payload = stored_payload(stream) if stream is not None else None  # every chunk too
        await recorder.append(delivered)
        return recorder.render(await recorder.record(iid), payload)
    # Rendered as the record will stand once delivered (as _commit renders a store failure):
    # the caller is told what the journal will say, and the journal says it only afterwards.
    stored = engine.journal.result_stream(iid)  # the marker and summary, verified
    envelope = recorder.render(
        recorder.projected([*engine.journal.events(iid), delivered], recorder.hint_now()),
        stored_payload(stored, defer=defer) if stored is not None else None,
    )
    try:
        await deliver(envelope)
    except (JournalError, NotAnswered):
        # The stored result could not be read (``defer``: its writer reads it as it writes,
        # and verifies it first), or the answer was refused before its first byte
        # (``NotAnswered``): raised as itself, as an unread result's is -- no delivery failed,
        # none happened (an answer cut short is none); nothing is recorded and the result
        # stays stored, undelivered.
        raise
    except Exception as exc:
        log.warning("delivery of %s (fetched) failed: %s", iid, type(exc).__name__)
        if record.state.startswith("stored_"):
            return recorder.envelope(
                await _delivery_failed(engine, iid, "fetch"), whole=True, defer=defer
            )
        return recorder.envelope(await recorder.record(iid), whole=True, defer=defer)
    await recorder.append(delivered)  # as in _deliver: no barrier of its own
    await recorder.settle()
    return envelope
