"""One invocation: accept the action, bind its idempotency key, resume an invocation the key
already names, and run a try -- the credential step, then the attempt, then its ending.

accept → validate against a bound config snapshot → resolve the credential → connection setup
with bounded in-broker retries (``attempt.py``) → DISPATCH_STARTED as a durable barrier → send →
classify the complete result → store it and RESULT_COMMITTED as a barrier → deliver
(``delivery.py``).

Seed, "Validation and credential injection finish before dispatch": a refusal here is
``not_attempted`` -- ACTION_ACCEPTED then PREFLIGHT_FAILED or CREDENTIAL_FAILED, and nothing
has left the machine.  Seed, "Idempotency is defined by the remote contract": a key is bound
to the request's fingerprint before anything is sent, and the same key names the same
invocation from then on.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import trio

from affidavit.config import result_limit
from affidavit.journal import (
    IdempotencyMismatch,
    KeyRetentionPassed,
    Lease,
    LeaseBusy,
    boot_mark,
    boot_stamp,
)
from affidavit.protocols import Binding, Prepared
from affidavit.protocols.actions import (
    ActionInvalid,
    BodyUnread,
    accepted_session,
    fingerprint,
    is_idempotent,
    parse_action,
    request_fingerprint,
)
from affidavit.secrets.credentials import predates_value_digests
from affidavit.statemachine import (
    Code,
    Decision,
    Event,
    EventKind,
    ImpossibleEvent,
    Operation,
    Projector,
    Retry,
    decide,
)

from .approval import (
    APPROVAL_STATES,
    Grant,
    approval_fingerprint,
    await_grant,
    expire_if_due,
    grant_of,
    held_until,
    needs_approval,
    request_approval,
)
from .attempt import lost_or_raise, run_tries
from .binder import BinderGone, fence, judge, record_or_gone
from .contracts import batch_facts, reader
from .control import CallControl
from .credential import Preamble, prepare_after
from .delivery import conclude
from .ids import new_invocation_id
from .rebound import refusal
from .recorder import Recorder
from .recovery import recover_stale
from .sink import StreamSink
from .takeup import ClaimInvalid, ClaimRefused

if TYPE_CHECKING:
    from .engine import Deliver, Engine

__all__ = ["refuse_new", "resume", "start"]

E = EventKind
_CANCELLED = Code.CALLER_CANCELLED.value
_MISMATCH_UNSENT = (
    "this idempotency key is bound in its scope to a different request (another target, "
    "method, path, headers or body; another command or stdin), whose call stopped before it "
    "recorded anything: nothing was sent under the key; correct the request, or use a new key "
    "for a new one"
)


async def start(
    engine: Engine,
    action: object,
    timeout: float | None,
    deliver: Deliver | None,
    link: Mapping[str, Any] | None = None,
    control: CallControl | None = None,
    requester: int | None = None,
    invocation_id: str | None = None,
    claim: Event | None = None,
) -> dict[str, Any]:
    """Accept ``action`` as a new invocation (or resume the one its idempotency key names) and
    run it; return its envelope.  ``link`` (secret-free) is recorded with ACTION_ACCEPTED: the
    invocation this one serves, e.g. the submission whose job a poll queries.  A linked call
    is a request like any other: the target's approval policy covers it as it covers any
    action (a reconciliation query or a poll sent with the credential, unapproved, was a way
    around ``approval = "always"``).  ``requester``: the uid that asked (the daemon's socket
    peer; embedded, this process's), recorded with an approval request so that it cannot
    approve itself.  ``invocation_id``: the new invocation's id when its caller chose it (fresh
    from ``new_invocation_id``: ``Engine.call``); ``claim``: the row naming it on the record it
    serves, at the head of its preamble (``takeup.py``) -- not written when the call is refused
    in validation (closed, nothing asked); refused (``ClaimInvalid``) when its idempotency key
    names an invocation already bound (it would be resumed, taken over or fetched: asked, if at
    all, with no claim naming it).
    """
    now, started = time.time(), trio.current_time()
    iid = invocation_id or new_invocation_id()
    # Validated before anything is journaled: a refused session is recorded bounded, never
    # whole (a 5 MB one grew the journal by 15 MB; a lone surrogate crashed the insert).
    session, refused_session = accepted_session(action)
    recorder = engine.recorder
    took_over: dict[str, Any] | None = None
    try:
        parsed = parse_action(action, engine.config)
    except ActionInvalid as exc:
        stored = _bound_before(engine, exc.action) if isinstance(exc, BodyUnread) else None
        if stored is not None:
            # The same call, bound before its body was refused: answered from its record,
            # never sent again and never bound to this refusal.
            return recorder.envelope(stored)
        return await refuse_new(
            recorder,
            iid,
            session,
            None,
            exc.code,
            exc.field,
            exc.message,
            refused_session,
            requester=requester,
        )

    target = engine.config.targets[parsed.target]
    binding = engine.bindings.get(target.kind)
    if binding is None:  # a configured kind with no binding cannot be run
        return await refuse_new(
            recorder,
            iid,
            session,
            target,
            Code.UNSUPPORTED_ACTION,
            "target",
            "no adapter for this kind",
            requester=requester,
        )
    idempotent = is_idempotent(parsed, target)
    fp = fingerprint(parsed, target, engine.snapshot.hash(target))
    # The first attempt's lease (generation 0): every other worker takes its holder for gone
    # once it runs out, and recovers the record; the attempt ends within it (``run_tries``).
    # Its end is bound with the key too: how long the key is this call's with nothing recorded.
    ttl = engine.lease_ttl(target, timeout)
    lease_ends = now + ttl
    contract = getattr(target, "idempotency", None)
    key: str | None = getattr(parsed, "idempotency_key", None)
    if contract is not None and key is None and not idempotent:
        # A declared remote contract makes an unknown outcome retryable with the same key;
        # the broker mints one so the caller can use it (seed: "Idempotency is defined by
        # the remote contract").
        key = "idem_" + secrets.token_urlsafe(18)
    idem: dict[str, Any] | None = None
    if key is not None:
        if contract is not None:
            scope: str = contract.scope
            expires: float | None = now + contract.retention_s
            idem = {
                "key": key,
                "scope": scope,
                "header": contract.header,
                "retention_s": contract.retention_s,
                "expires_at": expires,
                # How long a retry with the target's default timeout may send (its lease):
                # its hint says same_idempotency_key only while the key outlasts that.
                "send_window": engine.lease_ttl(target, None),
            }
            # When it was bound by the boot clock too: a wall clock stepped back later
            # cannot make the key look younger to a reader on this boot (``key_moment``).
            mark = boot_mark()
            if mark is not None:
                idem["boot"] = mark
        else:
            # The caller's own identifier of the effect (SSH): bound here, so the same key
            # names the same invocation, but no remote deduplicates on it -- it never makes a
            # resend safe (seed: SSH "rarely support[s] an idempotency key at the protocol
            # level").
            scope, expires = f"{target.kind}:{target.name}", None
            idem = {"key": key, "scope": scope, "remote_contract": "none"}
        journal = engine.journal
        # This call holds what it binds from before the binding exists: another call of this
        # broker never takes it for its stopped binder's (``binder.judge``).
        recorder.attempting(iid, 0)
        try:
            bound = await journal.bind_idempotency(
                scope, key, fp, iid, expires, send_by=lease_ends, target=target.name
            )
        except IdempotencyMismatch as exc:
            # Another request, or this one under a changed configuration (``rebound.py``): only
            # the bound invocation's chained record can tell.  Bound with nothing recorded yet,
            # it tells neither -- its binder may be about to send it (another broker of a shared
            # journal), so "another request: new key, send again" may make a duplicate; nor may
            # the answer name that invocation, which may be another target's of a shared scope.
            # Its record is waited for -- or for its binder to be provably gone, when nothing
            # was sent under the key and a new one sends this request once.
            until = None if timeout is None else started + timeout
            found = await record_or_gone(engine, exc.existing, target, control, until)
            if found is None:
                # Its caller went away, the broker stops it, or its deadline came first: this
                # call's own ending (a deadline is the caller's stop, as before any dispatch:
                # CALLER_CANCELLED, retry backoff), nothing sent -- never the bound invocation,
                # which may be another target's of a shared scope (an embedded caller reads
                # this answer; MCP's stop may hand it to a client still connected).
                code = control.code if control is not None else None
                return await close_new(
                    recorder,
                    iid,
                    session,
                    target,
                    Event(E.SETUP_FAILED, iid, {"stage": "accepted", "code": code or _CANCELLED}),
                    requester=requester,
                )
            if isinstance(found, BinderGone):
                # "Nothing was sent" holds only once the binder can no longer send: close its
                # invocation first (``fence``), unless it recorded first (answered from that).
                found = await fence(engine, exc.existing, found) or found
            # Fenced, by this call or by another before it (``Record.fenced``, its first
            # event, even while that call has yet to close it): nothing was sent under the key.
            if isinstance(found, BinderGone) or found.fenced is not None:
                unsent = found.evidence() if isinstance(found, BinderGone) else found.fenced
                return await refuse_new(
                    recorder,
                    iid,
                    session,
                    target,
                    Code.IDEMPOTENCY_MISMATCH,
                    "idempotency_key",
                    _MISMATCH_UNSENT,
                    binder=unsent,
                    requester=requester,
                )
            no = refusal(engine, exc, found, parsed, target)
            return await refuse_new(
                recorder,
                iid,
                session,
                target,
                no.code,
                no.field,
                no.message,
                bound_to=no.bound_to,
                requester=requester,
            )
        if bound.invocation_id != iid:
            if claim is not None:
                # Resumed, taken over or fetched, the call would be asked under the bound id
                # with no claim naming it: refused, nothing written (``bind_idempotency``
                # bound nothing of this call's).
                raise ClaimInvalid(
                    f"the claim ({claim.kind.value} of {claim.invocation_id}) heads a call whose "
                    "idempotency_key names an invocation already bound: it would name no call"
                )
            # Another call bound this key first: the invocation is its.  Nothing of this call
            # may be written into that record unless the journal says this call may act (a
            # lease, or winning the record's first event) -- a loser's stray events landed in
            # the winner's record, and its ACTION_ACCEPTED crashed on the winner's state.
            op = Operation(idempotent=idempotent, fingerprint=fp)
            # The binding row is not chained: the record it names must prove it (its chained
            # ACTION_ACCEPTED names this key and fingerprint), else ``AlteredRow`` -- never
            # another invocation's result answered as this call's.
            if journal.bound_record(bound) is not None:
                return await resume(
                    engine,
                    bound.invocation_id,
                    parsed,
                    target,
                    binding,
                    op,
                    key,
                    timeout,
                    deliver,
                    control,
                    requester=requester,
                )
            # Nothing recorded yet: the binder's while it may still record (``binder.py``) --
            # judged by its window, at most the target's (``lease_ttl`` with no caller
            # timeout), never this caller's: a short timeout here took over an invocation whose
            # binder was still inside its own.
            at, gone = await judge(engine, bound, target)
            if gone is None:
                # The same fingerprint: this target's invocation, in progress; fetch it, never
                # send it again.
                return recorder.envelope(Projector(bound.invocation_id).record(at))
            # The binder stopped between binding the key and recording anything: nothing was
            # sent under it.  Take the invocation over -- if this call wins its first event
            # (below), which records why.
            iid = bound.invocation_id
            recorder.attempting(iid, 0)
            took_over = gone.evidence()
    operation = {
        "target": target.name,
        "protocol": target.kind,
        "idempotent": idempotent,
        "fingerprint": fp,
        "idempotency": idem,
        "budget": target.budget,
    }
    if key is not None:
        # The request alone: a same-key call under another configuration is told apart from
        # another request by it (``rebound.py``).
        keyed = engine.journal.keyed_digest
        operation["request_fingerprint"] = request_fingerprint(parsed, target, keyed)
    boot = boot_stamp(ttl)  # and by the boot clock, which does not step (``recover_stale``)
    batch = batch_facts(parsed, target)
    if batch is not None:
        operation["batch"] = batch  # the items sent, bound before anything is sent
    # Written in the credential step's shielded section (one cancel scope for the three
    # preflight events, instead of one per event).  The action as the caller sent it (no
    # credential is in it yet) is the accepted event's sealed payload: the attrs keep only its
    # fingerprint, and an auditor's copy lets an auditor see what was asked for.
    accepted = Event(
        E.ACTION_ACCEPTED,
        iid,
        {
            "operation": operation,
            "session": session,
            "holder": engine.holder,
            "lease_expires_at": lease_ends,
            **({"lease_boot": boot} if boot is not None else {}),
            **({"link": dict(link)} if link else {}),
            **({"took_over": took_over} if took_over is not None else {}),
            # Who asked, as the daemon's socket names it: a fetch by another is no delivery.
            **({"requester": {"uid": requester}} if requester is not None else {}),
        },
    )
    accepted_payload = (
        {"action": dict(action)}
        if type(action) is dict or isinstance(action, Mapping)  # (a dict: no ABC check)
        else None
    )
    # Which remote account the dispatch reaches: what a later query must reach too.  (Its
    # CA file, when its stat does not vouch for the last read, is read in a worker thread.)
    account_hash = await engine.snapshot.account_hash_async(target)
    validated = Event(
        E.PREFLIGHT_VALIDATED,
        iid,
        {"config_hash": engine.snapshot.hash(target), "account_hash": account_hash},
    )
    # A claim heads the preamble: one write, refused as a whole once the claim is (another
    # call of the record it serves is open) -- a claim exists exactly when its call does.
    head: Preamble = ((claim, None),) if claim is not None else ()
    preamble: Preamble = (*head, (accepted, accepted_payload), (validated, None))
    if took_over is not None:
        # A barrier of its own: the projection refuses a second ACTION_ACCEPTED, so exactly
        # one taker wins the record, and a loser has written nothing into it.
        try:
            await recorder.write(accepted, barrier=True, payload=accepted_payload)
        except ImpossibleEvent:
            journal.bound_record(bound)  # the taker that won wrote the key: proven as above
            return await resume(
                engine,
                iid,
                parsed,
                target,
                binding,
                Operation(idempotent, fp),
                key,
                timeout,
                deliver,
                control,
                requester=requester,
            )
        preamble = ((validated, None),)
    policy = needs_approval(parsed, target)
    try:
        return await run(
            engine,
            iid,
            parsed,
            target,
            binding,
            key,
            timeout,
            deliver,
            generation=0,
            lease=None,
            lease_ends=lease_ends,
            preamble=preamble,
            control=control,
            approval=None if policy is None else (policy, requester),
        )
    except ImpossibleEvent as refused:
        if claim is not None and refused.event.invocation_id == claim.invocation_id:
            raise ClaimRefused(refused) from None  # and every row of the call with it
        raise


async def refuse_new(
    recorder: Recorder,
    iid: str,
    session: str | None,
    target: Any,
    code: Code,
    field_path: str,
    message: str,
    refused_session: Mapping[str, Any] | None = None,
    bound_to: str | None = None,
    binder: Mapping[str, Any] | None = None,
    *,
    requester: int | None,
) -> dict[str, Any]:
    """Accept and at once refuse a new invocation in validation (nothing attempted), asked by
    ``requester`` (``close_new``).
    ``bound_to``: the invocation the call's idempotency key is bound to, when the refusal
    names it (``rebound.Refusal``); ``binder``: why the binder of the key, which recorded
    nothing, is gone (``BinderGone.evidence``), when the refusal rests on that."""
    refused = Event(
        E.PREFLIGHT_FAILED,
        iid,
        {
            "code": code.value,
            "field": field_path,
            "message": message,
            **({"bound_to": bound_to} if bound_to is not None else {}),
            **({"binder_gone": dict(binder)} if binder is not None else {}),
        },
    )
    return await close_new(
        recorder, iid, session, target, refused, refused_session, requester=requester
    )


async def close_new(
    recorder: Recorder,
    iid: str,
    session: str | None,
    target: Any,
    ending: Event,
    refused_session: Mapping[str, Any] | None = None,
    *,
    requester: int | None,
) -> dict[str, Any]:
    """Accept a new invocation that ends at once with ``ending`` (nothing attempted): its
    ACTION_ACCEPTED names the target, no request fingerprint and its asker (``requester``, as
    ``start`` records it on any call's: None only below ``Engine.call``)."""
    operation = {
        "target": target.name if target is not None else None,
        "protocol": target.kind if target is not None else None,
        "idempotent": False,
        "fingerprint": None,
    }
    accepted: dict[str, Any] = {"operation": operation, "session": session}
    if refused_session is not None:
        accepted["refused_session"] = dict(refused_session)
    if requester is not None:
        accepted["requester"] = {"uid": requester}
    await recorder.append(Event(E.ACTION_ACCEPTED, iid, accepted))
    return await recorder.finish(iid, ending)


def _bound_before(engine: Engine, action: Any) -> Any:
    """The record an idempotency key bound before the strict body reading names, when it is
    this very call (the same fingerprint), else None (deployment.md, "Upgrading: batch
    bodies")."""
    target = engine.config.targets.get(action.target)
    contract = getattr(target, "idempotency", None)
    key = action.idempotency_key
    if target is None or contract is None or key is None:
        return None
    bound = engine.journal.find_idempotency(contract.scope, key)
    if bound is None or bound.fingerprint != fingerprint(
        action, target, engine.snapshot.hash(target)
    ):
        return None
    return engine.journal.bound_record(bound)


async def resume(
    engine: Engine,
    iid: str,
    action: Any,
    target: Any,
    binding: Binding,
    op: Operation,
    key: str | None,
    timeout: float | None,
    deliver: Deliver | None,
    control: CallControl | None = None,
    *,
    requester: int | None = None,
) -> dict[str, Any]:
    """The same idempotency key again: answer from the record, or -- when ``decide()`` allows
    a retry -- take the invocation's lease and run one more try under it.  ``requester`` as
    ``start`` has it: a retry of an action that needs approval and was never granted one asks
    for it first."""
    if control is not None:
        control.invocation_id = iid
    recorder = engine.recorder

    async def leased(
        held: tuple[Lease, float],
        timeout: float | None,
        grant: Grant | None,
        version: str | None = None,
        policy: Any = None,
        earlier_dispatch: bool = False,
    ) -> dict[str, Any]:
        """One more try under ``held`` (a lease this engine holds, and its end by this
        broker's clock: ``held_until``); ``policy``: it waits for an operator first (``run``'s
        ``approval``); ``earlier_dispatch``: ``run``'s."""
        lease, ends = held
        return await run(
            engine,
            iid,
            action,
            target,
            binding,
            key,
            timeout,
            deliver,
            generation=lease.generation,
            lease=(engine.holder, lease.generation),
            lease_ends=ends,
            bound_version=version,
            control=control,
            grant=grant,
            approval=None if policy is None else (policy, requester),
            earlier_dispatch=earlier_dispatch,
        )

    record = await expire_if_due(recorder, await recorder.record(iid))
    if record.state in APPROVAL_STATES:
        # Waiting for an operator, or for a dispatcher: this caller waits like the first one
        # did, and dispatches what gets approved (under the dispatch lease).  It joined a
        # request someone else may be waiting for: going away detaches it, never cancels that
        # request (``CallControl.joined``), and its own deadline bounds only its wait for the
        # decision -- a dispatch it takes on runs to the target's own timeout, as the daemon's
        # dispatcher would run it (a short deadline must not end the approved request).
        if control is not None:
            control.joined = True
        policy = getattr(target, "approval", None)
        granted = await await_grant(
            engine,
            iid,
            target,
            policy.wait if policy else 0.0,
            timeout,
            control,
            joined=True,
            requester=requester,
        )
        if isinstance(granted, dict):
            return granted
        claimed, grant, left = granted
        if control is not None and left is not None:
            # Its caller's deadline still bounds its answer: the host answers it then as a
            # caller that ran out of time (IN_PROGRESS), and the dispatch runs on.
            control.run_past(trio.current_time() + left)
        return await leased(claimed, None, grant)
    if not record.final:
        record = await recover_stale(recorder, record)
        if not record.final:
            # Another worker is running it: IN_PROGRESS, fetch later (rendered as such).
            return recorder.envelope(record)
    decision = decide(record, op)
    # decide() is the seed's: for an unknown outcome of an idempotent operation it looks at the
    # operation alone.  The engine adds the limit the seed allows ("it may add rate limits and
    # attempt limits"): a record whose hint says the same request cannot succeed
    # (after_correction -- RESULT_SIZE_LIMIT: it meets the same limit again) is not re-sent.
    retry = decision in (Decision.RETRY_SAME_KEY, Decision.RETRY_NEW_ATTEMPT)
    if retry and record.retry is not Retry.AFTER_CORRECTION:
        if record.budget.left <= 0:
            return await recorder.finish(iid, Event(E.RETRY_BUDGET_EXHAUSTED, iid, {}))
        # A retry reuses an approval only as the gate re-checks it (``Grant.checked`` first:
        # an operator the user database cannot place now leaves the record as it is).
        granted_before = grant_of(record)
        if granted_before is not None:
            granted_before = await granted_before.checked(engine.config.service)
            if granted_before is None:
                return recorder.envelope(record)
        ttl, taken = engine.lease_ttl(target, timeout), time.time()
        same_key = decision is Decision.RETRY_SAME_KEY
        try:
            lease = await engine.journal.acquire_lease(
                iid, engine.holder, ttl, same_key=same_key, requester=requester
            )
        except KeyRetentionPassed as exc:
            # The key's retention ran out by the journal's clock between our read and the
            # lease, or would before the lease (``ttl``: the time this retry may still send)
            # ends: the remote may have forgotten it by then, so it is not resent -- the
            # record's hint at that moment (``exc.now``: reconcile).
            return recorder.envelope(await recorder.record(iid, exc.now))
        except LeaseBusy:
            # Another worker took the lease between our read and our acquire: it is retrying
            # this invocation now.  In progress (fetch it), not the old record's hint -- that
            # would invite this caller to retry again at once.
            return recorder.envelope(await recorder.record(iid), in_progress=True)
        except ImpossibleEvent:
            return recorder.envelope(await recorder.record(iid))
        # A record closed before its approval was asked (its broker stopped, or the journal
        # refused a write, between the preamble and APPROVAL_REQUESTED; a take-over stopped
        # after its ACTION_ACCEPTED) holds no grant: the retry of an action that needs one asks
        # for it, never sends what no operator approved.
        version = (record.evidence.get("credential") or {}).get("version")
        policy = None if granted_before is not None else needs_approval(action, target)
        recorder.attempting(iid, lease.generation)
        held = (lease, held_until(taken, ttl))
        # An earlier attempt dispatched (its outcome the record's): a refusal of this one says
        # only that this retry sent nothing.
        earlier = record.evidence.get("dispatch_started") is True
        return await leased(held, timeout, granted_before, version, policy, earlier)
    # FETCH, RETURN_RECORDED_RESULT, RECONCILE, STOP_FOR_CORRECTION, RETRY_WHEN_ALLOWED:
    # answer from the record; nothing is sent again.
    return recorder.envelope(record)


async def run(
    engine: Engine,
    iid: str,
    action: Any,
    target: Any,
    binding: Binding,
    key: str | None,
    timeout: float | None,
    deliver: Deliver | None,
    *,
    generation: int,
    lease: tuple[str, int] | None,
    lease_ends: float,
    preamble: Preamble = (),
    bound_version: str | None = None,
    control: CallControl | None = None,
    grant: Grant | None = None,
    approval: tuple[Any, int | None] | None = None,
    earlier_dispatch: bool = False,
) -> dict[str, Any]:
    """One try of the invocation: the credential step, the attempt, its ending.  ``approval``
    (the target's policy, the requester's uid): this new invocation waits for an operator
    first (``approval.py``); ``grant``: it was approved, and the gate re-checks that.
    ``lease_ends``: when the lease of ``generation`` runs out (wall clock): the attempt ends
    within it.  ``earlier_dispatch``: the record holds an earlier attempt's dispatch (a retry
    of it): a refusal of this one never says nothing was sent (``Attempt.earlier_dispatch``)."""
    if control is not None:
        control.invocation_id = iid
    engine.recorder.attempting(iid, generation)
    if approval is not None:
        try:
            granted = await request_approval(
                engine, iid, action, target, binding, key, preamble, approval, timeout, control
            )
        except ImpossibleEvent as refused:  # its preamble, refused: a fence or taker was first
            return await lost_or_raise(engine, iid, generation, refused, dispatched=False)
        if isinstance(granted, dict):
            return granted  # pending, denied, expired, or another process dispatches it
        (claimed, lease_ends), grant, timeout = granted
        generation, lease, preamble = claimed.generation, (engine.holder, claimed.generation), ()
        engine.recorder.attempting(iid, generation)
    authorized = await _authorize(
        engine, iid, action, target, binding, key, preamble, bound_version, generation
    )
    if isinstance(authorized, dict):
        return authorized  # refused before dispatch: the envelope
    prepared, version = authorized
    check = None
    if grant is not None:
        # The fingerprint of the dispatch about to happen, for the gate to compare.
        check = (grant, approval_fingerprint(engine, action, target, version, prepared))
    limit = engine.settings.inline_result_limit
    sink = StreamSink(
        engine.journal, iid, prepared.secrets, limit, generation, max_result=result_limit(target)
    )
    attempt, result, failure = await run_tries(
        engine,
        iid,
        target,
        binding,
        prepared,
        sink,
        timeout,
        generation=generation,
        lease=lease,
        lease_ends=lease_ends,
        control=control,
        grant=check,
        earlier_dispatch=earlier_dispatch,
    )
    return await conclude(engine, attempt, result, failure, sink, deliver, reader(action, target))


def _version_changed(bound_version: str) -> str:
    """CONFIG_CHANGED's message for a credential whose version is not the one bound (a bare
    vault counter says it is the upgrade: ``predates_value_digests``)."""
    if predates_value_digests(bound_version):
        return (
            "The credential's bound version predates value digests (a vault entry's counter "
            "alone, recorded before the upgrade): it cannot be matched; reconcile, then start "
            "a new invocation."
        )
    return (
        "The credential's version changed since this invocation was bound; reconcile, then "
        "start a new invocation."
    )


async def _authorize(
    engine: Engine,
    iid: str,
    action: Any,
    target: Any,
    binding: Binding,
    key: str | None,
    preamble: Preamble,
    bound_version: str | None,
    generation: int,
) -> tuple[Prepared, str] | dict[str, Any]:
    """Write the preamble, resolve the credential and prepare the request; CREDENTIAL_AUTHORIZED
    on success (the prepared request and the credential's version), else the refusal's
    envelope.  What is written for the attempt names its ``generation``: a worker whose lease
    was taken over meanwhile is refused, and answered as one stopped before dispatch."""
    try:
        return await _authorize_once(
            engine, iid, action, target, binding, key, preamble, bound_version, generation
        )
    except ImpossibleEvent as refused:
        return await lost_or_raise(engine, iid, generation, refused, dispatched=False)


async def _authorize_once(
    engine: Engine,
    iid: str,
    action: Any,
    target: Any,
    binding: Binding,
    key: str | None,
    preamble: Preamble,
    bound_version: str | None,
    generation: int,
) -> tuple[Prepared, str] | dict[str, Any]:
    recorder = engine.recorder
    # The preflight events and the credential step: a caller's cancellation must not leave it
    # unclear which of them landed.  Preparing awaits nothing unless it fails (then it writes
    # in a shielded section of its own: ``prepare_after``), and success is one queued write,
    # made uncancellable by ``shield=True`` -- no cancel scope entered on this path on every
    # call (issue 15; it was one of the five a call entered).
    prepared_or_refused = await prepare_after(
        engine, iid, action, target, binding, key, preamble, generation
    )
    if isinstance(prepared_or_refused, dict):
        return prepared_or_refused
    credential, prepared = prepared_or_refused
    if bound_version is not None and credential.version != bound_version:
        # Seed: the credential version is bound to the invocation; "if any bound value
        # changes, create a new invocation; do not edit the previous record".  A retry
        # under the old invocation must not silently act with a rotated credential.
        with trio.CancelScope(shield=True):
            await recorder.write_many(preamble)
            return await recorder.finish(
                iid,
                Event(
                    E.PREFLIGHT_FAILED,
                    iid,
                    {
                        "code": Code.CONFIG_CHANGED.value,
                        "field": f"targets.{target.name}.credential",
                        "message": _version_changed(bound_version),
                        "generation": generation,
                    },
                ),
            )
    authorized = Event(
        E.CREDENTIAL_AUTHORIZED,
        iid,
        {
            # The version proves which value was used; the reference (where the broker keeps
            # it) is not the caller's to know -- it is bound by the config hash.
            "version": credential.version,
            **prepared.evidence,
            "generation": generation,
        },
    )
    await recorder.write_many((*preamble, (authorized, None)), shield=True)
    return prepared, credential.version
