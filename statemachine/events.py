"""Lifecycle events: what the journal stores and the projection folds.

An event is a fact the broker (or a second observer) recorded about one invocation.  The journal
assigns ``seq`` — the only order that counts (seed: "Record monotonic sequence numbers; do not rely
on wall-clock ordering").  ``at`` is a wall-clock label for operators, never used for ordering.

Rule: an event's ``attrs`` hold machine-relevant, secret-free facts only (ids, codes, stages,
fingerprints, hashes, statuses).  Sensitive detail (bodies, stdout) goes to the journal's sealed
payload, never here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from .contract import EvidenceSource

__all__ = [
    "ATTEMPT_KINDS",
    "BARRIER_KINDS",
    "Event",
    "EventKind",
    "stored_event",
    "unfrozen_twin",
]


class EventKind(StrEnum):
    # --- the seed's durable happy path -----------------------------------------------------
    ACTION_ACCEPTED = "ACTION_ACCEPTED"
    """An invocation exists.  attrs: operation (target, protocol, idempotent, fingerprint,
    request_fingerprint when a key is bound (the request alone, keyed: a same-key call under a
    changed configuration is CONFIG_CHANGED by it, not IDEMPOTENCY_MISMATCH -- absent from older
    records), idempotency contract or None, budget), session; requester ({uid}: the daemon's socket
    peer that asked, or this process's user for a call made in-process, one refused at once included
    -- absent from older records, whose results no read delivers, and from a fence's: written by the
    call that fenced it, not by its asker, it holds no result). The contract: key, scope, header,
    retention_s, expires_at (when the remote forgets the key) and send_window (seconds a retry with
    the target's default timeout may send: its lease; the hint says same_idempotency_key only while
    the key outlasts it -- absent from older records, which judge the key at the moment itself),
    boot ({id, at}: the binding's moment by the boot clock, ``journal/boot.py``; a wall clock
    stepped back cannot make the key look younger on that boot -- ``key_moment``).
    took_over, when this call took over an invocation whose key its binder bound and then stopped
    before recording anything (nothing was sent under it): why its binder is gone (``only_writer``:
    this broker is the journal's only writer; ``send_by_passed``: the binder's own send deadline,
    ``send_by``, bound with the key, had passed at ``judged_at``; ``window_over``, a binding from
    before that deadline was bound: the window ``window`` seconds from ``bound_at`` was over at
    ``judged_at``), and ``recorded: nothing``.  fenced, instead, when a call with a different
    request under the key closed such an invocation before answering IDEMPOTENCY_MISMATCH (the same
    facts; the operation then names only the binder's target, bound with the key -- ``(unknown)``,
    which no caller reads, for a binding from before it was bound -- and the binding's key, scope
    and fingerprint): a binder that resumes is refused its first event.  Its ``rules`` (2,
    ``FENCE_RULES``) say the record is fenced under the rules below: a record so fenced is
    recognised by it (``Record.fenced``, the facts without ``rules``), from this first write on: it
    takes no attempt of its own (PREFLIGHT_VALIDATED, a retry lease, and an attempt's events naming
    a generation are refused), and its close is PREFLIGHT_FAILED IDEMPOTENCY_MISMATCH with these
    facts as binder_gone, whoever writes it (any other close -- its binder's SETUP_FAILED,
    recovery's -- is refused).  A fence written before them (no ``rules``) is not ``Record.fenced``:
    its binder's rows may follow it in an honest journal, and the record shows what they prove (a
    dispatch among them: sent, outcome unknown)."""
    PREFLIGHT_VALIDATED = "PREFLIGHT_VALIDATED"
    """The action is valid against the bound config snapshot.  attrs: config_hash, and
    account_hash (the keyed hash of what decides the remote account reached: origin,
    base path, credential reference, idempotency scope, CA file content, pinned host keys, proxy --
    absent from older records)."""
    CREDENTIAL_AUTHORIZED = "CREDENTIAL_AUTHORIZED"
    """The credential was resolved (never its value).  attrs: version, the injection's
    secret-free facts (inject for HTTP; auth, client_key for SSH), generation -- not the
    reference, which is bound through config_hash (a record written before it was withheld
    holds it as credential)."""
    DISPATCH_STARTED = "DISPATCH_STARTED"
    """Durable barrier written *before* the first byte of the application request (or the SSH
    ``exec`` request) is handed to the transport.  attrs: attempt, generation, connection...;
    boot ({id, at}: the moment by the boot clock, ``journal/boot.py`` -- a reconciliation
    query's is how long after the attempt's end it observed, ``boot_between``; absent from
    older records and on a host without the clock)."""
    REQUEST_SENT = "REQUEST_SENT"
    """The complete request was handed to the transport (not proof the remote read it).  attrs:
    generation."""
    REMOTE_RESPONSE_STARTED = "REMOTE_RESPONSE_STARTED"
    """Final response headers / exec acceptance were received.  attrs: status, generation."""
    REMOTE_RESPONSE_COMPLETE = "REMOTE_RESPONSE_COMPLETE"
    """A complete, authentic final result was received and classified.  attrs: outcome
    (rejected|committed), code (or None for success), status / exit_status, retry_after, the
    stored response's hash, and what was received of each stream where it reveals no secret
    (``body_sha256``/``body_bytes`` or ``body_received_withheld``: docs/redaction.md),
    generation; remote_request_id (X-Request-Id), and for a 3xx that is the result
    redirect_not_followed (why: reason and origin -- and method for a redirect that would have
    changed the request --, or the next hop's failed setup, or the hop, method, origin and
    status of a next hop sent without the credential that refused it, or the reason alone
    for a 304 to a request that was not a conditional GET or HEAD), both also in the
    envelope's evidence."""
    RESULT_COMMITTED = "RESULT_COMMITTED"
    """Durable barrier: the result and its hash are stored under the invocation id.  attrs:
    sha256, chunks, bytes, generation."""
    RESULT_DELIVERED = "RESULT_DELIVERED"
    """The caller's channel confirmed complete transfer.  attrs: channel (return: the envelope
    handed back in process; deliver: the daemon's or MCP's answer written whole -- for a poll
    or a reconciliation query, the poll's or the query's answer that carries its envelope;
    fetch: a whole read by the requesting uid -- the latest asker's requester, the socket peer
    or an in-process caller's own uid; a session is a label any caller may send and decides
    nothing; another uid's fetch, or any fetch of a record naming no requester, is a read and
    records nothing; an answer that carries the result only ``by_reference``, or a page of
    it, transferred none or part of it and records nothing); reader ({uid}), the uid whose
    fetch it was.  Delivered means
    answered whole to the requesting uid.  Not a barrier: written after the hand-over
    and queued without waiting for its commit (the call returns first).  The broker's async
    reads wait for it (a fetch right after records no second delivery; a view no longer than
    ``view_wait``); its synchronous reads show what is committed (``Broker.settled`` first).
    A crash right after may lose it: the result stays stored and fetchable."""
    # --- stopping before dispatch ------------------------------------------------------------
    PREFLIGHT_FAILED = "PREFLIGHT_FAILED"
    """Validation refused the action.  attrs: code (a validation code), field; generation when
    an attempt's gate refused it (config changed, approval stale or expired); bound_to, the
    invocation a same-key call's key is bound to, when CONFIG_CHANGED names it (the envelope's
    ``evidence.idempotency.bound_to``); binder_gone, when IDEMPOTENCY_MISMATCH answers a key
    whose binder stopped before recording anything (ACTION_ACCEPTED's took_over: why) -- in the
    refused call's record and in the bound invocation's, which that call closed (fenced)."""
    APPROVAL_REQUESTED = "APPROVAL_REQUESTED"
    """A human approval was requested for the bound fingerprint (seed: "Before approval, bind
    the normalized target, the credential version, the resolved injection method, and the
    request fingerprint").  attrs: fingerprint (the approval fingerprint), expires_at (in the
    clock leases are judged by: the database's on a shared journal, which moves it), ttl,
    version, injection, config_hash, requester; the sealed payload says what will be sent and
    where, and the credential reference, for the operator (never in the attrs a caller reads)."""
    APPROVAL_GRANTED = "APPROVAL_GRANTED"
    """An operator approved the bound fingerprint; it is re-checked immediately before the
    write.  attrs: fingerprint (must be the requested one), operator, note."""
    APPROVAL_DENIED = "APPROVAL_DENIED"
    """An operator denied the invocation.  attrs: code (APPROVAL_DENIED), operator, note."""
    APPROVAL_REVOKED = "APPROVAL_REVOKED"
    """An operator took a grant back before it was dispatched: written only while the
    invocation is approved and no live dispatch lease holds it (both checked in the writing
    transaction), so it and a dispatch never both happen.  Ends it like a denial.  attrs: code
    (APPROVAL_DENIED), operator, note."""
    DISPATCH_LEASE_ACQUIRED = "DISPATCH_LEASE_ACQUIRED"
    """The process that will dispatch an approved invocation took its lease (attrs: generation,
    strictly increasing; holder; expires_at; requester ({uid}) when a waiting caller took it --
    the asker its answer goes to, absent for the daemon's dispatcher).  Its dispatch gate checks
    the lease, so two processes never both send; no retry budget is spent."""
    CREDENTIAL_FAILED = "CREDENTIAL_FAILED"
    """The credential could not be obtained or injected.  attrs: code, field (the setting to
    fix: ``targets.<name>.credential``, or ``service.max_pending_approvals`` for
    APPROVAL_LIMIT), message (naming neither the reference nor a path), generation; a
    credential's refusal seals the operator's detail (the reference, the file or vault read) in
    its payload."""
    SETUP_ATTEMPT_FAILED = "SETUP_ATTEMPT_FAILED"
    """One in-broker connection attempt failed before dispatch.  attrs: stage, code,
    generation."""
    SETUP_FAILED = "SETUP_FAILED"
    """Connection setup gave up before dispatch.  attrs: code, stage, generation; field and
    message when a target setting that cannot work is the cause (``targets.<name>.ca_file``).
    With CALLER_CANCELLED (the caller withdrew: it hung up) or BROKER_SHUTDOWN, the stop, not
    the target, ended an attempt that sent nothing: it spends no budget -- the unit its lease
    (or ACTION_ACCEPTED) took is given back, as for a refused preflight -- and, after an
    earlier attempt's dispatch, the record says this retry sent nothing and the earlier
    outcome stands (in older records too).  So too recovery's close of an attempt whose worker
    stopped before its gate (code SETUP_FAILED, stage broker_stopped or lease_lapsed: no
    DISPATCH_STARTED in its generation proves nothing was sent).  Not after a
    SETUP_ATTEMPT_FAILED in its generation, nor with any other code (a refused connection, a
    failed handshake): the target was tried, its budget stays spent.  A connection or TLS
    handshake the caller (or the broker's stop) cut short before it failed is no tried target:
    no SETUP_ATTEMPT_FAILED is written for it (no request byte left), so its stop is refunded.
    Consecutive refunded
    stops, whatever their stage or code, are one ``attempts`` entry whose ``repeated`` counts
    them and whose ``stops`` counts them per stage and code (at most 16 rows), across
    generations, so withdrawals cannot grow the record."""
    # --- after dispatch ------------------------------------------------------------------------
    ATTEMPT_INTERRUPTED = "ATTEMPT_INTERRUPTED"
    """The dispatched attempt ended without a complete result.  attrs: code
    (REMOTE_OUTCOME_UNKNOWN | REMOTE_RESULT_INCOMPLETE | RESULT_SIZE_LIMIT | CALLER_CANCELLED |
    BROKER_SHUTDOWN), generation; with RESULT_SIZE_LIMIT, result_size_limit {limit,
    received_bytes, decoded_bytes?}: the target's ``max_result`` and what had arrived when the
    broker stopped reading -- {limit, received_withheld} (redacted | short_redacted |
    tail_redacted | unscanned),
    and a message without counts, when the result echoed a secret, was not scanned whole, or
    had its end withheld (any answer cut short, of a target with a secret: docs/redaction.md,
    its counts would measure the secret); boot ({id, at}: the attempt's end by the boot clock,
    as DISPATCH_STARTED's -- a wall clock stepped forward cannot cut a reconciliation's settle
    window short on that boot; absent from older records)."""
    RESULT_STORE_FAILED = "RESULT_STORE_FAILED"
    """Storing the result failed; rendered from what the durable record proves.  attrs: stage,
    generation."""
    RESULT_DELIVERY_FAILED = "RESULT_DELIVERY_FAILED"
    """The stored result could not be delivered; the caller must fetch it (code
    RESULT_DELIVERY_FAILED, retry fetch_result).  On a record naming no requester (an older
    record's: no read delivers it) the code and hint stay the stored result's -- fetching it is
    a read that can never be recorded as its delivery."""
    # --- retries, leases, reconciliation ---------------------------------------------------------
    RETRY_LEASE_ACQUIRED = "RETRY_LEASE_ACQUIRED"
    """A worker took the invocation's retry lease, spending one unit of the retry budget
    (given back when the retry ends before its dispatch gate: refused in its preflight, or
    withdrawn or stopped -- SETUP_FAILED).  attrs: generation (strictly increasing), holder,
    expires_at; requester ({uid}: the daemon's socket peer whose same-key call retries, or
    this process's user for an in-process one -- the asker this attempt answers; absent from
    older records)."""
    LEASE_LOST = "LEASE_LOST"
    """A worker whose lease is no longer the invocation's was stopped: at a dispatch gate (its
    first hop's or a redirect's next hop's), or -- after its dispatch -- when what it received
    or how it ended was refused (not recorded: the attempt that took over, or the closing by
    recovery or a reconciliation, stands).  attrs: generation, holder, after_dispatch; the
    record lists each in ``evidence.stale_workers`` (generation, seq, holder: after a take-over
    two workers ran generation 0).  Every event an attempt writes names its generation, refused
    unless it is the record's current one and its attempt is still open."""
    RETRY_BUDGET_EXHAUSTED = "RETRY_BUDGET_EXHAUSTED"
    """No retry attempts remain; the latest evidence stands."""
    RECONCILED = "RECONCILED"
    """A second observer resolved an unknown outcome.  attrs: outcome (rejected|committed),
    note, and query_invocation (remote_query) or operator (operator_attested); generation, the
    lease generation of the record the observer read (refused once a retry took a newer one);
    the event's source must be remote_query or operator_attested, its observer names who."""
    RECONCILE_INCONCLUSIVE = "RECONCILE_INCONCLUSIVE"
    """A reconciliation query ran as a linked invocation and did not settle the outcome (no
    complete answer -- through a forward proxy, a 4xx or 5xx the proxy may have written itself,
    docs/proxies.md --, one whose body was withheld or truncated or that a redirect fetched
    from another origin (``engine/readable.py``), one any followed redirect reached, even on
    the target's origin ("answered by a redirect to PATH: not the queried resource's answer"),
    one both or neither of ``committed_if`` and ``rejected_if`` match, one a condition reads
    ambiguously (its typed value fails where its text would have matched: "the condition
    CONDITION does not hold of the answer's typed value, yet its text would have matched
    ..."), a condition naming a value the invocation lacks ("the invocation has no
    {idempotency_key} to compare the answer with"), or an absent
    finding within the target's ``settle`` window after the attempt ended): the invocation stays
    unknown; the query's evidence is on its own record.  attrs: query_invocation, code, reason,
    generation (as RECONCILED's); not_before (seconds since the epoch: when a query may settle
    it) for a finding that came too soon; open (true: the query is asked, or waits for an
    operator, and is the invocation's one open query until a row naming it without open reads
    or gives it up -- refused while another query is open under the same generation)."""
    # --- what a complete result says beyond its outcome -------------------------------------
    BATCH_ITEMS_RECORDED = "BATCH_ITEMS_RECORDED"
    """A complete response gave the batch's items their own outcomes (seed: "Record the parent
    transport outcome and five child outcomes") -- read from its body only when whole
    (``engine/readable.py``), else every item ``unknown``; under a parent that was no success,
    each item is ``unknown`` or shares the parent's rejection (``batch.py``).  attrs: items [{id,
    outcome, code, retry, status}], one per item sent, in order; generation; source
    remote_response."""
    OPERATION_ACCEPTED = "OPERATION_ACCEPTED"
    """A complete 202 accepted a job that runs on after the response (seed: "Record the job
    identifier and its status resource ... and then track the job as a separate operation").
    attrs: operation_id, job_id, status_url, status_path, generation; source remote_response.
    The operation's own table (``operation.py``) folds it and the polls below."""
    OPERATION_POLLED = "OPERATION_POLLED"
    """A linked invocation queried the job's status resource and read its state.  attrs:
    operation_id, poll_invocation, state (pending | succeeded | failed), remote_status;
    source remote_query."""
    OPERATION_POLL_FAILED = "OPERATION_POLL_FAILED"
    """A status query gave no readable state (no complete 2xx, a body withheld or truncated, an
    answer a redirect fetched from another origin -- ``engine/readable.py`` --, or no status in
    it); the operation keeps its state.  attrs: operation_id, poll_invocation, code, reason;
    open (true: the poll is asked, or waits for an operator, and is the operation's one open
    poll until a poll event naming it without open reads or gives it up -- refused while
    another poll is open; with code null it only names the poll before it is asked, no poll
    counted)."""
    # --- diagnostics ---------------------------------------------------------------------
    PROTOCOL_OBSERVED = "PROTOCOL_OBSERVED"
    """A protocol machine's fine-grained step (e.g. http.informational, ssh.exec_accepted).
    attrs: protocol, state, plus facts; generation, when an attempt observed it.  The facts'
    `path` lists the states the machine went through, a run of one state repeated once (a
    self-loop: every body piece is a `body` step), with `path_repeats` [index in `path`, steps in
    that run] for each run that repeats ([] if none); past 64 runs only the first and the last 32
    are listed, and `path_left_out` {after: index in `path`, runs, steps, states} counts what
    came between `path[after - 1]` and `path[after]`, and names its states (null if nothing
    was left out).  The three come together, so a later summary (a retry's) replaces an earlier
    one's counts (affidavit/engine/steps.py).  With `received_withheld` the counts are null (a
    body in 1-byte chunks would count its size: affidavit/engine/echoed.py), and a block of a
    withheld stream's runs, with the states between them (SSH's stderr between stdout chunks)
    and what was left out there, lists each state once, in the order they came; the byte
    counts withheld (`body_bytes`, `total`, `<stream>_bytes`) are null, not left out, and every
    summary says `received_withheld` (null if nothing was withheld), so a retry's shows neither
    an earlier attempt's counts nor its word.  Improves the evidence, never changes the outcome."""


BARRIER_KINDS: frozenset[EventKind] = frozenset(
    {EventKind.DISPATCH_STARTED, EventKind.RESULT_COMMITTED}
)
"""Kinds the engine must await as durable before acting (DESIGN: durability barriers).  The
engine also makes the last event of every call a barrier before it answers the caller."""


ATTEMPT_KINDS: frozenset[EventKind] = frozenset(
    {
        EventKind.PREFLIGHT_FAILED,  # the gate's re-check (config changed, approval stale)
        EventKind.CREDENTIAL_AUTHORIZED,
        EventKind.CREDENTIAL_FAILED,
        EventKind.SETUP_ATTEMPT_FAILED,
        EventKind.SETUP_FAILED,
        EventKind.DISPATCH_STARTED,
        EventKind.REQUEST_SENT,
        EventKind.REMOTE_RESPONSE_STARTED,
        EventKind.REMOTE_RESPONSE_COMPLETE,
        EventKind.ATTEMPT_INTERRUPTED,
        EventKind.RESULT_COMMITTED,
        EventKind.RESULT_STORE_FAILED,
        EventKind.BATCH_ITEMS_RECORDED,
        EventKind.OPERATION_ACCEPTED,
        EventKind.PROTOCOL_OBSERVED,
    }
)
"""Kinds an attempt writes, each naming the attempt's lease generation (``attrs.generation``):
the projection refuses one unless that is the record's current generation and its attempt is
still open -- a worker whose lease was taken over, or whose attempt recovery or a
reconciliation closed, writes nothing into the record (rules_common.py: ``_stale``,
``_closed``).  An event naming none (journals written before they did) is not checked.  The
deliveries name no attempt: they are about the stored result."""


_NO_ATTRS: Any = object()
"""``Event``'s ``attrs`` left out: a new empty dict (the field's ``default_factory``)."""


@dataclass(frozen=True, slots=True, init=False)
class Event:
    """One recorded fact.  Immutable; the journal assigns ``seq`` when it appends."""

    kind: EventKind
    invocation_id: str
    attrs: Mapping[str, Any] = field(default_factory=dict)
    source: EvidenceSource = EvidenceSource.TRANSPORT_OBSERVED
    seq: int | None = None
    at: float | None = None
    """Wall-clock label (seconds since the epoch).  Never used for ordering."""
    observer: str | None = None
    """Name of the second observer an imported event came from (None: this broker)."""
    observer_seq: int | None = None
    """The observer's own local sequence number, kept as imported."""

    def __init__(
        self,
        kind: EventKind,
        invocation_id: str,
        attrs: Mapping[str, Any] = _NO_ATTRS,
        source: EvidenceSource = EvidenceSource.TRANSPORT_OBSERVED,
        seq: int | None = None,
        at: float | None = None,
        observer: str | None = None,
        observer_seq: int | None = None,
    ) -> None:
        # The generated frozen ``__init__``, with each field stored by its slot's own setter
        # instead of ``object.__setattr__(self, name, value)`` (a lookup by name each): about
        # half the cost, and a call builds a dozen events (issue 15).  Same signature, same
        # defaults (tests/statemachine/test_events_init.py).
        _set_kind(self, kind)
        _set_invocation_id(self, invocation_id)
        _set_attrs(self, {} if attrs is _NO_ATTRS else attrs)
        _set_source(self, source)
        _set_seq(self, seq)
        _set_at(self, at)
        _set_observer(self, observer)
        _set_observer_seq(self, observer_seq)

    def get(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)


(
    _set_kind,
    _set_invocation_id,
    _set_attrs,
    _set_source,
    _set_seq,
    _set_at,
    _set_observer,
    _set_observer_seq,
) = (Event.__dict__[f.name].__set__ for f in fields(Event))


def unfrozen_twin(cls: type) -> type:
    """A class with the slots of the frozen dataclass ``cls`` and none of its frozen
    ``__setattr__``.  An instance filled by plain attribute stores becomes a ``cls`` by assigning
    ``__class__`` (allowed: same slots, same layout): an ordinary frozen instance, equal to one
    the constructor makes.  Why: the generated frozen ``__init__`` stores every field through
    ``object.__setattr__``, several times slower; readers build one ``Event`` per journal row and
    the projection one ``Record`` per invocation (issue 15, tests/benchmarks/projection.py and
    actions_view.py).  Whoever fills a twin must set every field (tests compare with the
    constructor's result)."""
    slots: tuple[str, ...] = cls.__dict__["__slots__"]
    return type(f"_Unfrozen{cls.__name__}", (), {"__slots__": slots})


_UnfrozenEvent = unfrozen_twin(Event)
_new = object.__new__


def stored_event(
    kind: EventKind,
    invocation_id: str,
    attrs: Mapping[str, Any],
    source: EvidenceSource,
    seq: int | None,
    at: float | None,
    observer: str | None,
    observer_seq: int | None,
) -> Event:
    """``Event(kind, invocation_id, attrs, source, seq, at, observer, observer_seq)``, built
    through ``unfrozen_twin``: what the journal's readers make of every row (the constructor
    was ~10% of ``affidavit actions --json`` over 1M events)."""
    e: Any = _new(_UnfrozenEvent)
    e.kind = kind
    e.invocation_id = invocation_id
    e.attrs = attrs
    e.source = source
    e.seq = seq
    e.at = at
    e.observer = observer
    e.observer_seq = observer_seq
    e.__class__ = Event
    event: Event = e
    return event
