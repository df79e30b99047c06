"""Approval in the engine: bind the request to a fingerprint, wait for the decision, take the
dispatch lease, and re-check everything immediately before the write.

Seed, "Validation and credential injection finish before dispatch": "Before approval, bind the
normalized target, the credential version, the resolved injection method, and the request
fingerprint to the invocation.  ...  The broker must confirm the fingerprint of the upcoming
dispatch and re-check it immediately before the write.  A mismatch yields validation/
not_attempted and does not permit sending a new request under the old approval."

So an action the target's ``approval`` covers goes:

1. ``request``: resolve the credential (its non-secret version) and prepare the request (the
   resolved injection), then APPROVAL_REQUESTED -- a barrier -- with the *approval fingerprint*
   (``approval_fingerprint``: request fingerprint, credential reference -- a keyed digest --
   and version, injection, config snapshot hash), the expiry, the requester's uid, and,
   sealed, what will be sent where (for the operator; never the credential).
2. ``wait``: the caller waits up to the policy's ``wait`` (and its own timeout) for an
   operator's decision (``affidavit.approvals``); past it, the answer is APPROVAL_PENDING.
3. ``claim``: whoever dispatches an approved invocation -- the waiting caller, or the daemon's
   dispatcher (``dispatch_approved``) for one whose caller went away -- first takes its
   DISPATCH_LEASE_ACQUIRED lease; the gate's lease check then lets only one of them write.
4. The dispatch gate (``attempt.py``) re-checks ``Grant``: the fingerprint of the dispatch it is
   about to write against the granted one, the config snapshot, and the expiry.  A mismatch is
   APPROVAL_STALE, a late dispatch APPROVAL_EXPIRED -- both validation, not_attempted, and
   nothing is sent.  A same-key retry of an approved invocation passes the same gate, so it
   reuses the approval only while the fingerprint matches and the approval has not expired.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import pwd
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from affidavit.config import canonical_json
from affidavit.config.service import ServiceConfig
from affidavit.journal import JournalError, JournalUnavailable, Lease, LeaseBusy, ReadFailed
from affidavit.protocols import Binding, Prepared, get
from affidavit.protocols.actions import ActionInvalid, fingerprint, parse_action
from affidavit.statemachine import KEYED_PREFIX, Code, Event, EventKind, ImpossibleEvent, Record

from .asker import asker
from .control import CallControl
from .credential import Preamble, prepare_after
from .recorder import Recorder

if TYPE_CHECKING:
    from .engine import Deliver, Engine

__all__ = [
    "APPROVAL_STATES",
    "ApprovalBoard",
    "Grant",
    "admits_uid",
    "approval_fingerprint",
    "approval_now",
    "await_grant",
    "claim",
    "dispatch_approved",
    "expire_if_due",
    "grant_of",
    "needs_approval",
    "ready",
    "refresh",
    "request_approval",
    "request_attrs",
    "wait",
    "watch",
]

log = logging.getLogger("affidavit.engine")

E = EventKind
APPROVAL_STATES = frozenset({"awaiting_approval", "approved"})
"""Where an invocation waits for an operator, or for its dispatcher."""
POLL = 0.1
"""A waiting caller re-reads the record at least this often (another process may decide);
a decision made in this process wakes it at once (``ApprovalBoard``)."""
GRACE = 0.5
"""How long a daemon's dispatcher leaves an approved request another process asked for (on a
shared journal) to that process's waiting caller, which re-reads its record every ``POLL``:
the caller that waits gets its answer, and the dispatcher sends the request of a caller gone
(or of a daemon stopped) at its next sweep.  The dispatch lease keeps it to one send either
way; this only keeps a waiting caller from being answered IN_PROGRESS for a call it awaits."""


class ApprovalBoard:
    """What one broker process knows of approvals in flight -- only to save work: every decision
    is read from, and every claim made in, the journal."""

    def __init__(self) -> None:
        self.waiting: set[str] = set()
        """Invocations whose caller in this process waits for the decision (and will dispatch
        it): the daemon's dispatcher leaves them to it."""
        self.open: set[str] = set()
        """Invocations awaiting a decision or a dispatcher, for the daemon's dispatcher."""
        self.asked: set[str] = set()
        """Of ``open``, those asked in this process: its waiting callers are in ``waiting``,
        so a grant of one nobody here waits for is dispatched at once."""
        self.seen: dict[str, float] = {}
        """Of ``open``, those asked elsewhere and learnt while this process runs (``learn``),
        by when (``trio.current_time``) this process learnt of their grant -- or, not granted
        yet, of their request: dispatched only ``GRACE`` after.  Those found open at
        start (``watch``) are not in it: their callers went away with the daemon that
        stopped, as far as a daemon starting can know (sent at once, as they always were)."""
        self.through: int | None = None
        """The journal's seq through which the dispatcher has learnt the approvals asked and
        granted (``refresh``); None: this process does not watch (no dispatcher)."""
        self.dispatching: set[str] = set()
        self.pending: dict[str, float] = {}
        """Of ``open``, those ``ready`` last read awaiting a decision, by their approval's
        ``expires_at`` (the clock ``approval_now`` reads): not read again at each sweep, only
        once it has passed or a grant of it is learnt (``learn``)."""
        self.unsendable: dict[str, float] = {}
        """Of ``open``, approved ones this broker's configuration cannot send as approved, on a
        journal this broker does not hold alone (``dispatch_approved``), by their approval's
        ``expires_at``: logged once, and not read again at each sweep until then (another
        broker may send it meanwhile; at the expiry it is closed APPROVAL_STALE).  A
        configuration is loaded only at start: a daemon restarted on another one starts with an
        empty board."""
        self.requesters: dict[str, int] = {}
        """Invocations this process asked approval for (or found open at start: ``watch``),
        by requester uid: what ``max_pending_approvals`` counts, each re-read before it is
        counted (dropped once decided, expired or gone)."""
        self.reserved: dict[str, int] = {}
        """Invocations of a requester between the count and their APPROVAL_REQUESTED: counted
        too, so concurrent requests of one uid never get past the bound together."""
        self._changed = trio.Event()

    def learn(self, iid: str, granted: bool = False) -> None:
        """``iid`` may need the dispatcher: asked or decided elsewhere (``refresh``), or a
        grant recorded here (``affidavit.approvals.decide``).  ``granted``: what was learnt is
        its grant, from which ``GRACE`` counts -- not from its request, seen perhaps long
        before: a caller waiting for it elsewhere learns of the grant no sooner than this."""
        self.open.add(iid)
        if granted:
            self.pending.pop(iid, None)  # decided: ``ready`` reads it again
        if iid not in self.asked:
            now = trio.current_time()
            self.seen[iid] = now if granted else self.seen.get(iid, now)

    def close(self, iid: str) -> None:
        """``iid`` needs no dispatcher any more (decided otherwise, expired, dispatched)."""
        self.open.discard(iid)
        self.asked.discard(iid)
        self.seen.pop(iid, None)
        self.pending.pop(iid, None)
        self.unsendable.pop(iid, None)

    def changed(self) -> None:
        """A decision was recorded in this process: wake whoever waits for one."""
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self, timeout: float) -> None:
        with trio.move_on_after(timeout):
            await self._changed.wait()


@dataclass(frozen=True)
class Grant:
    """An approval as the dispatch gate re-checks it, read from the durable record."""

    fingerprint: str
    expires_at: float
    version: str | None = None
    """The credential version the approval was asked for (its fingerprint holds it too)."""
    operator: int | None = None
    """The uid of the operator who granted it, as APPROVAL_GRANTED recorded it."""
    admitted: tuple[str, int] | None = None
    """What admitted that operator, as APPROVAL_GRANTED recorded it (``operator.admitted``):
    ``("uid", n)`` or ``("gid", n)``; None in a grant recorded before it was."""

    def problem(self, dispatch_fingerprint: str, now: float) -> Code | None:
        if dispatch_fingerprint != self.fingerprint:
            return Code.APPROVAL_STALE
        if now >= self.expires_at:
            return Code.APPROVAL_EXPIRED
        return None

    groups: tuple[int, ...] | None = None
    """The operator's groups by the user database, looked up before the dispatch lease was
    taken (``checked``) for a grant recorded without ``admitted``: what the gate re-checks
    the group list against, with no lookup under the lease."""

    async def checked(self, service: ServiceConfig) -> Grant | None:
        """This grant as the gate will re-check it, or None when whether its operator is one
        cannot be told now -- recorded without ``admitted``, its uid not listed, and the user
        database failing to look its groups up (the uid unknown here, ``userdel``, NSS away):
        nothing may be sent under it, and nothing proves it disowned either, so this attempt
        is refused retryably before the dispatch lease (logged), the record left approved for a
        later sweep, a caller coming back, or its expiry.  Looked up in a worker thread."""
        uid = self.operator
        if uid is None or self.admitted is not None or uid in service.operator_uids:
            return self
        if not service.operator_gids:
            return self
        lookup = functools.partial(groups_of, uid)
        groups = await trio.to_thread.run_sync(lookup, abandon_on_cancel=True)
        if groups is None:
            log.warning("the operator uid %d of a grant: its groups cannot be looked up", uid)
            return None
        return dataclasses.replace(self, groups=tuple(groups))

    def disowned(self, service: ServiceConfig) -> bool:
        """Whether the operator who granted it is not one by the operator settings as they are
        now (``[service] operator_uids`` / ``operator_gids``, a reloaded file's or a restarted
        daemon's): removed since, the grant no longer stands -- the gate sends nothing under it
        (APPROVAL_STALE).  What admitted them at the decision (``admitted``: the uid, or the
        group of the kernel's credentials) is re-checked against the lists, nothing looked up:
        the decision took the caller's kernel groups, which the user database need not know.
        A grant recorded before ``admitted`` was: its uid listed, else the groups ``checked``
        looked up (none looked up: nothing shows it an operator).  No uid: disowned."""
        uid = self.operator
        if uid is None:
            return True
        if self.admitted is not None:
            how, n = self.admitted
            listed = service.operator_uids if how == "uid" else service.operator_gids
            return n not in listed
        if uid in service.operator_uids:
            return False
        groups = self.groups or ()
        return not any(g in service.operator_gids for g in groups)


def admits_uid(uids: Collection[int], gids: Collection[int], uid: int) -> bool:
    """Whether a local ``uid`` is an operator by ``uids`` / ``gids`` as the user database tells
    it: the uid, its primary group or a supplementary one (``getgrouplist``) named.  Where only
    a uid is known: the console's places (a socket's owner: ``OperatorPolicy.admits_uid``) --
    a decision itself is ``OperatorPolicy.is_operator``'s, on the kernel's credentials of the
    caller, and a grant records what admitted it (``Grant.disowned``).  Blocking."""
    if uid in uids:
        return True
    if not gids:
        return False
    groups = groups_of(uid)
    return groups is not None and any(g in gids for g in groups)


def groups_of(uid: int) -> list[int] | None:
    """The primary and supplementary groups of ``uid`` by the user database; None when it
    cannot tell (the uid unknown, a lookup failing).  Blocking: off the event loop."""
    try:
        entry = pwd.getpwuid(uid)
        return os.getgrouplist(entry.pw_name, entry.pw_gid)
    except (KeyError, OSError):
        return None


def grant_of(record: Record) -> Grant | None:
    """The granted approval an invocation's dispatches must match (None: it needed none)."""
    approval = record.evidence.get("approval")
    if not isinstance(approval, Mapping) or approval.get("state") != "granted":
        return None
    version = approval.get("version")
    who = approval.get("operator")
    uid = who.get("uid") if isinstance(who, Mapping) else None
    return Grant(
        str(approval["fingerprint"]),
        float(approval["expires_at"]),
        version if isinstance(version, str) else None,
        uid if type(uid) is int else None,
        _admitted(who.get("admitted") if isinstance(who, Mapping) else None),
    )


def _admitted(value: Any) -> tuple[str, int] | None:
    """``operator.admitted`` as recorded: ``{"uid": n}`` or ``{"gid": n}``; anything else
    admits nobody -- ``("uid", -1)``, never listed -- and None only where it is absent."""
    if value is None:
        return None
    if isinstance(value, Mapping) and len(value) == 1:
        ((how, n),) = value.items()
        if how in ("uid", "gid") and type(n) is int:
            return how, n
    return ("uid", -1)


def needs_approval(action: Any, target: Any) -> Any:
    """The target's approval policy when it covers ``action``, else None."""
    policy = getattr(target, "approval", None)
    if policy is None:
        return None
    spec = get(target.kind)
    check = spec.action.needs_approval if spec is not None else None
    covered = check(action, target) if check is not None else policy.always
    return policy if covered else None


def approval_fingerprint(
    engine: Engine, action: Any, target: Any, version: str, prepared: Prepared
) -> str:
    """``sha256:`` over what an approval binds: the request fingerprint (method, path, caller
    headers, body hash / command, stdin hash -- and the target snapshot), the credential
    reference and its non-secret version, the resolved injection (``prepared.evidence``) and
    the config snapshot hash.  The reference enters as a digest keyed by the journal's key, and
    so does the snapshot that holds it (``ConfigSnapshot.hash``, v3; v2 hashed it plainly):
    every other part is in the caller's evidence, and the fingerprint too, so a reference
    hashed as written could be confirmed by guessing (``env:NAME``, ``file:/path``) offline --
    the reference the caller is not told (``request_attrs``).  An approval granted for an
    older version's fingerprint matches no dispatch: APPROVAL_STALE, nothing sent."""
    target_hash = engine.snapshot.hash(target)
    doc = {
        "v": 3,
        "request": fingerprint(action, target, target_hash),
        "credential": engine.journal.keyed_digest(
            "approval-credential", target.credential.encode("utf-8")
        ),
        "version": version,
        "injection": dict(prepared.evidence),
        "config_hash": target_hash,
    }
    return "sha256:" + hashlib.sha256(canonical_json(doc)).hexdigest()


def request_attrs(
    engine: Engine,
    action: Any,
    target: Any,
    policy: Any,
    version: str,
    prepared: Prepared,
    requester: int,
    key: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """APPROVAL_REQUESTED's attrs (secret-free, machine-relevant) and its sealed payload (what
    will be sent where, for the operator).  ``key``: the idempotency key the request is sent
    with -- the caller's, or the one the broker chose for it (``invocation.accept``), which the
    operator view is given in the action it shows."""
    now = time.time()
    attrs = {
        "fingerprint": approval_fingerprint(engine, action, target, version, prepared),
        "expires_at": now + policy.ttl,
        "ttl": policy.ttl,
        "version": version,
        "injection": dict(prepared.evidence),
        "config_hash": engine.snapshot.hash(target),
        "requester": {"uid": requester},
    }
    spec = get(target.kind)
    view = spec.action.operator_view if spec is not None else None
    if key is not None and getattr(action, "idempotency_key", key) is None:
        action = dataclasses.replace(action, idempotency_key=key)
    what = (
        view(action, target)
        if view is not None
        else (spec.action.fingerprint(action, target) if spec is not None else {})
    )
    # The credential's reference is for the operator deciding (sealed), not in the attrs a
    # caller reads back as evidence.
    payload = {
        "target": target.name,
        "kind": target.kind,
        "credential": target.credential,
        "request": dict(what),
    }
    return attrs, payload


async def request_approval(
    engine: Engine,
    iid: str,
    action: Any,
    target: Any,
    binding: Binding,
    key: str | None,
    preamble: Preamble,
    approval: tuple[Any, int | None],
    timeout: float | None,
    control: CallControl | None,
) -> tuple[tuple[Lease, float], Grant, float | None] | dict[str, Any]:
    """Write the preamble and APPROVAL_REQUESTED (the credential resolved for its version and
    injection, not yet used), then wait for the decision (``await_grant``)."""
    policy, requester = approval
    uid = asker(requester, engine.settings)
    recorder, board = engine.recorder, engine.approvals
    started = trio.current_time()
    board.reserved[iid] = uid  # before the count: a concurrent request of this uid counts it
    try:
        with trio.CancelScope(shield=True):
            refused = await _over_limit(engine, iid, uid, key, preamble)
            if refused is not None:
                return refused
            prepared_or_refused = await prepare_after(
                engine, iid, action, target, binding, key, preamble
            )
            if isinstance(prepared_or_refused, dict):
                return prepared_or_refused
            await recorder.write_many(preamble)
            credential, prepared = prepared_or_refused
            attrs, payload = request_attrs(
                engine, action, target, policy, credential.version, prepared, uid, key
            )
            # The credential was resolved only for its version and the resolved injection:
            # dropped now, not held for the wait (which may last the approval's ``wait``).  The
            # approved request resolves it again, as it is then (docs/security.md).
            del credential, prepared, prepared_or_refused
            await recorder.write(
                Event(E.APPROVAL_REQUESTED, iid, attrs), barrier=True, payload=payload
            )
        board.requesters[iid] = uid
    finally:
        board.reserved.pop(iid, None)
    board.open.add(iid)
    board.asked.add(iid)
    if timeout is not None:
        timeout = max(0.0, timeout - (trio.current_time() - started))
    # The uid APPROVAL_REQUESTED names: the lease its grant takes names the same asker.
    return await await_grant(engine, iid, target, policy.wait, timeout, control, requester=uid)


async def _over_limit(
    engine: Engine, iid: str, uid: int, key: str | None, preamble: Preamble
) -> dict[str, Any] | None:
    """None while ``uid`` has fewer than ``[service] max_pending_approvals`` requests awaiting
    a decision (its others reserved now included); else the refusal, recorded after the
    preamble before anything is asked or sent: CREDENTIAL_FAILED with APPROVAL_LIMIT
    (credential_injection, not_attempted, retry backoff) -- so a caller cannot bury a real
    request among thousands of its own on the operator's list."""
    board, recorder = engine.approvals, engine.recorder
    limit = engine.config.service.max_pending_approvals
    waiting = sum(1 for other, u in board.reserved.items() if u == uid and other != iid)
    now = await approval_now(recorder)
    for other in [o for o, u in board.requesters.items() if u == uid]:
        record = await recorder.read(functools.partial(engine.journal.record, other))
        approval = record.evidence.get("approval") if record is not None else None
        if (
            record is None
            or record.state != "awaiting_approval"
            or not isinstance(approval, Mapping)
            or now >= float(approval["expires_at"])  # expired: the next sweep closes it
        ):
            board.requesters.pop(other, None)
        else:
            waiting += 1
    if waiting < limit:
        return None
    message = (
        f"{waiting} requests of uid {uid} already await an operator's decision (at most "
        f"{limit}: [service] max_pending_approvals); nothing was sent. Call again once some are "
        "decided or expire"
    )
    if key is not None:
        # The key stays bound to this invocation, and a same-key call retries it: decide()
        # takes backoff before dispatch for a new attempt, and the lifecycle lets this refusal
        # (credential_failed) take a retry lease -- which asks again, counted like any request.
        message += (
            " -- the same idempotency_key then asks again for this invocation (nothing was sent"
            " under it)"
        )
    await recorder.write_many(preamble)
    refused = Event(
        E.CREDENTIAL_FAILED,
        iid,
        {
            "code": Code.APPROVAL_LIMIT.value,
            "field": "service.max_pending_approvals",
            "message": message + ".",
        },
    )
    return await recorder.finish(iid, refused)


async def await_grant(
    engine: Engine,
    iid: str,
    target: Any,
    wait_s: float,
    timeout: float | None,
    control: CallControl | None,
    joined: bool = False,
    requester: int | None = None,
) -> tuple[tuple[Lease, float], Grant, float | None] | dict[str, Any]:
    """Wait (at most ``wait_s`` and the caller's timeout) for the decision; once approved, take
    the dispatch lease.  The lease (with its end by this broker's clock: ``claim``), the grant
    and the caller's time left -- or the envelope to answer with: APPROVAL_PENDING (nobody
    decided yet), the denial or expiry, or IN_PROGRESS
    (approved, and dispatched by whoever holds its lease -- or, the caller having run out of
    time or gone away, left to the daemon's dispatcher).  ``joined``: a same-key caller's
    wait; the lease it takes is sized by the target alone (its dispatch is not bounded by the
    joiner's deadline: ``resume``).  ``requester``: the uid of the caller waiting, recorded on
    the dispatch lease it takes (``claim``)."""
    started = trio.current_time()
    seconds = wait_s if timeout is None else min(wait_s, timeout)
    board = engine.approvals
    # Until the claim below, this caller is the one to dispatch: the daemon's dispatcher keeps
    # off (the lease would stop it anyway; this only saves it the try).
    board.waiting.add(iid)
    try:
        record = await wait(engine, iid, seconds, control)
        grant = grant_of(record)
        if timeout is not None:
            timeout = max(0.0, timeout - (trio.current_time() - started))
        gone = control is not None and control.gone
        if record.state != "approved" or grant is None or gone or timeout == 0.0:
            return engine.recorder.envelope(record)
        grant = await grant.checked(engine.config.service)
        if grant is None:  # its operator cannot be told one now: sent later, or expired
            return engine.recorder.envelope(record)
        ttl = engine.lease_ttl(target, None if joined else timeout)
        claimed = await claim(engine, iid, ttl, requester)
    finally:
        board.waiting.discard(iid)
    if claimed is None:
        return engine.recorder.envelope(await engine.recorder.record(iid))
    return claimed, grant, timeout


async def wait(engine: Engine, iid: str, seconds: float, control: CallControl | None) -> Record:
    """Wait up to ``seconds`` for the invocation to leave ``awaiting_approval`` (or for the
    caller to go away: ``control`` withdrawn or stopped); return the record as it then is."""
    recorder = engine.recorder
    deadline = trio.current_time() + seconds
    while True:
        record = await recorder.record(iid)
        left = deadline - trio.current_time()
        gone = control is not None and control.gone
        if record.state != "awaiting_approval" or left <= 0 or gone:
            return await expire_if_due(recorder, record)
        await engine.approvals.wait_changed(min(POLL, left))


async def approval_now(recorder: Recorder) -> float:
    """Now, by the clock an approval's expiry (and a dispatch lease's) is recorded and judged
    in: the database's on a shared journal (the journal moves APPROVAL_REQUESTED's
    ``expires_at`` into it), this broker's own on SQLite (docs/journal.md, "Clocks").  Judged
    by each broker's own clock, one running ahead recorded APPROVAL_EXPIRED for an approval
    still valid, and one running behind dispatched an approval already expired."""
    return await recorder.read(recorder.hint_now)


async def expire_if_due(recorder: Recorder, record: Record, engine: Engine | None = None) -> Record:
    """Close an approval nobody decided on, or nobody dispatched, before its expiry
    (``approval_now``): APPROVAL_EXPIRED (validation, not_attempted) -- or, for a granted one
    that ``engine``'s configuration cannot send as approved either (``unsendable``: its
    target changed since), APPROVAL_STALE with the field naming it: the change, not the
    window, is why it was not sent.  Anything else is returned as it is."""
    approval = record.evidence.get("approval")
    if record.state not in APPROVAL_STATES or not isinstance(approval, Mapping):
        return record
    if await approval_now(recorder) < float(approval["expires_at"]):
        return record
    field = unsendable(engine, record) if engine is not None else None
    if record.state == "approved" and field is not None:
        attrs = {
            "code": Code.APPROVAL_STALE.value,
            "field": field,
            "message": "The target changed after approval and no broker sent the request as "
            "approved before its approval ran out; nothing was sent.",
        }
    else:
        attrs = {
            "code": Code.APPROVAL_EXPIRED.value,
            "field": "approval",
            "message": "The approval window ran out before the request was dispatched; "
            "nothing was sent.",
        }
    expired = Event(E.PREFLIGHT_FAILED, record.invocation_id, attrs)
    with contextlib.suppress(ImpossibleEvent):  # decided or dispatched meanwhile
        await recorder.append(expired, barrier=True)
    return await recorder.record(record.invocation_id)


async def claim(
    engine: Engine, iid: str, ttl: float, requester: int | None = None
) -> tuple[Lease, float] | None:
    """The dispatch lease of an approved invocation and when it ends by this broker's clock
    (``held_until``), or None when another process holds a live one (or the invocation moved
    on: decided otherwise, expired, dispatched).  ``requester``: the uid of the caller that
    will dispatch and be answered (none for the daemon's dispatcher: it answers no one)."""
    taken = time.time()
    try:
        lease = await engine.journal.acquire_lease(
            iid, engine.holder, ttl, kind=E.DISPATCH_LEASE_ACQUIRED, requester=requester
        )
    except (LeaseBusy, ImpossibleEvent):
        return None
    return lease, held_until(taken, ttl)


def held_until(taken: float, ttl: float) -> float:
    """When a lease of ``ttl`` asked for at ``taken`` (this broker's clock, read before the
    journal took it) runs out, by this broker's clock: the attempt under it ends within that
    (``run_tries``).  Not the lease's recorded ``expires_at``: on a shared PostgreSQL that is
    the database's time (docs/journal.md, "Clocks"), and compared with this broker's clock it
    ended the attempt an hour late on a host an hour behind -- still in flight when another
    broker may take the invocation over -- or refused every lease on a host an hour ahead.
    Read before the lease was taken, it can only end earlier than the lease does."""
    return taken + ttl


async def stale(recorder: Recorder, iid: str, field: str, message: str) -> dict[str, Any]:
    """APPROVAL_STALE for an approved invocation that can no longer be sent as approved."""
    event = Event(
        E.PREFLIGHT_FAILED,
        iid,
        {"code": Code.APPROVAL_STALE.value, "field": field, "message": message},
    )
    with contextlib.suppress(ImpossibleEvent):
        await recorder.append(event, barrier=True)
    return recorder.envelope(await recorder.record(iid))


async def dispatch_approved(
    engine: Engine,
    iid: str,
    deliver: Deliver,
    control: CallControl | None = None,
    timeout: float | None = None,
) -> dict[str, Any] | None:
    """Dispatch an approved invocation whose caller is gone (the daemon's dispatcher): claim it,
    read back the action it accepted (the broker's sealed copy), and run it as approved --
    through the same gate, which re-checks the grant.  None when there is nothing to do (not
    approved, or another process holds its lease).  ``timeout``: the caller's, as ``call``'s
    (a reconciliation taking up its query: what is left of its own)."""
    from .invocation import run  # (invocation imports this module)

    board, recorder = engine.approvals, engine.recorder
    board.dispatching.add(iid)
    try:
        record = await expire_if_due(recorder, await recorder.record(iid), engine)
        grant = grant_of(record)
        if record.state != "approved" or grant is None:
            return None
        field = unsendable(engine, record)
        if field is not None:
            if engine.journal.exclusive:  # the daemon's lock: no other broker can send it
                return await stale(recorder, iid, field, "The target changed after approval.")
            if iid not in board.unsendable:
                log.warning("approved %s is left unsent here: %s changed since", iid, field)
            board.unsendable[iid] = grant.expires_at
            return None
        target = engine.config.targets[record.target or ""]
        grant = await grant.checked(engine.config.service)
        if grant is None:  # its operator cannot be told one now: the next sweep, or expiry
            return None
        action = await _accepted_action(engine, iid)
        if action is None:
            # Payloads sealed to the auditor alone: the broker cannot read the request back.
            # Only its caller, resuming with the same key, can still send it (until expiry).
            log.warning("approved %s cannot be dispatched: its action is not readable", iid)
            board.close(iid)
            return None
        ttl = engine.lease_ttl(target, None)
        held = await claim(engine, iid, ttl)
        if held is None:
            return None
        lease, ends = held
        try:
            parsed = parse_action(action, engine.config)
        except ActionInvalid as exc:
            return await stale(
                recorder,
                iid,
                exc.field,
                "The request no longer validates against the configuration it was approved "
                f"under ({exc.code.value}); nothing was sent.",
            )
        target = engine.config.targets[parsed.target]
        binding = engine.bindings.get(target.kind)
        if binding is None or target.kind != record.protocol:
            return await stale(recorder, iid, "target", "The target changed after approval.")
        key = (record.idempotency or {}).get("key")
        return await run(
            engine,
            iid,
            parsed,
            target,
            binding,
            key,
            timeout,
            deliver,
            generation=lease.generation,
            lease=(engine.holder, lease.generation),
            lease_ends=ends,
            control=control,
            grant=grant,
        )
    finally:
        board.dispatching.discard(iid)


def unsendable(engine: Engine, record: Record) -> str | None:
    """The configuration field (``targets.<name>``) that keeps this broker from sending
    ``record`` as it was approved -- its target gone, of another protocol, or bound to another
    snapshot (``config_hash``) -- or None when it can.  Checked before the dispatch lease is
    taken (``dispatch_approved``): held by this broker's exclusive lock (``Journal.exclusive``:
    the daemon's on its SQLite file -- no other broker exists) it ends the grant APPROVAL_STALE
    at once; else nothing is written -- another broker (the asker's, one whose configuration
    already or still matches during a rolling change, or an embedded one on the same SQLite
    file) may send it -- and at its expiry a broker that cannot send it either closes it
    APPROVAL_STALE (``expire_if_due``).  What this host's files hold now (a config file edited
    since it was loaded, a CA file edited in place: the account) is the gate's to re-check
    under the lease, as for every dispatch; a record from before the hash was recorded (or a
    plain one, from before keyed hashes) too."""
    name = record.target or ""
    target = engine.config.targets.get(name)
    if target is None or target.kind != record.protocol:
        return f"targets.{name}"
    bound = record.evidence.get("config_hash")
    keyed = isinstance(bound, str) and bound.startswith(KEYED_PREFIX)
    return f"targets.{name}" if keyed and bound != engine.snapshot.hash(target) else None


def watch(engine: Engine) -> None:
    """Learn every invocation the journal has waiting for a decision or a dispatcher (the
    daemon at start: its own calls add theirs as they ask, and ``refresh`` what the journal
    gains after -- other brokers' requests and decisions on a shared one)."""
    board, journal = engine.approvals, engine.journal
    board.through = journal.head()[0]  # read first: an approval asked meanwhile is read twice
    for record in journal.iter_actions():  # streamed: one projection held at a time
        if record.state in APPROVAL_STATES:
            board.open.add(record.invocation_id)
            board.seen.pop(record.invocation_id, None)
    for iid in board.open:
        requested = next((e for e in journal.events(iid) if e.kind is E.APPROVAL_REQUESTED), None)
        who = requested.attrs.get("requester") if requested is not None else None
        uid = who.get("uid") if isinstance(who, Mapping) else None
        if type(uid) is int:
            board.requesters[iid] = uid  # each re-read before it is counted


async def refresh(engine: Engine) -> None:
    """Add to ``open`` every invocation an approval was asked or granted for since the last
    refresh (``JournalReader.approvals_after``: the rows appended since, not a scan) -- so a
    daemon dispatches a grant recorded for a request asked through another daemon that has
    stopped since, and closes an approval asked elsewhere and left undecided past its expiry.
    ``ready`` reads each one's record before anything is done with it.  Nothing before
    ``watch``, and nothing while this broker has nothing to learn it for: no target of its
    configuration needs approval (a grant for a target with none here binds a snapshot this
    one is not: never sendable here) and nothing is open on its board -- an idle daemon's
    sweep reads nothing, and never holds its loop on a journal that does not answer."""
    board = engine.approvals
    if board.through is None:
        return
    if not board.open and not _approving(engine):
        return
    through, iids = await engine.recorder.read(
        functools.partial(engine.journal.approvals_after, board.through)
    )
    for iid, granted in iids.items():
        board.learn(iid, granted)
    board.through = through


def _approving(engine: Engine) -> bool:
    """Whether any target of this broker's configuration needs approval for some action."""
    return any(getattr(t, "approval", None) is not None for t in engine.config.targets.values())


async def ready(engine: Engine) -> list[str]:
    """Approved invocations to dispatch now: no caller in this process waits for them, no live
    dispatch lease holds them, and their approval has not expired -- an expired one is closed
    on the way (APPROVAL_EXPIRED).  One asked in another process and learnt while this one
    runs is returned only ``GRACE`` after this process learnt of its grant (its waiting
    caller there may take it).  What the
    journal gained since the last sweep is learnt first (``refresh``).  One read awaiting a
    decision is not read again until its expiry or a grant of it is learnt
    (``ApprovalBoard.pending``); the others' record and lease are read as every read is
    (``Recorder.read``: a shared journal's reconnect waited out).  Each one returned is
    marked ``dispatching`` until ``dispatch_approved`` is done with it (or
    ``ApprovalBoard.dispatching`` is cleared).  A
    ``JournalError`` (a shared journal away) marks none: the next sweep looks at them all again."""
    board, journal, recorder = engine.approvals, engine.journal, engine.recorder
    out: list[str] = []
    await refresh(engine)
    try:
        candidates = sorted(board.open - board.waiting - board.dispatching)
        now = await approval_now(recorder) if candidates else 0.0
        for iid in candidates:
            until = board.pending.get(iid, board.unsendable.get(iid))
            if until is not None and now < until:
                continue  # awaiting a decision (read again once a grant is learnt), or not
                # sendable here (until a reload): read again once expired
            record = await recorder.read(functools.partial(journal.record, iid))
            if record is not None:
                record = await expire_if_due(recorder, record, engine)
            if record is None or record.state not in APPROVAL_STATES:
                board.close(iid)
                continue
            approval = record.evidence.get("approval")
            if record.state == "awaiting_approval" and isinstance(approval, Mapping):
                board.pending[iid] = float(approval["expires_at"])
                continue
            board.pending.pop(iid, None)
            lease = await recorder.read(functools.partial(journal.lease, iid))
            # The lease's expiry is recorded in the same clock as the approval's (``now``).
            if record.state == "approved" and (lease is None or lease.expires_at <= now):
                first = board.seen.get(iid)
                if first is not None and trio.current_time() - first < GRACE:
                    continue
                board.dispatching.add(iid)
                out.append(iid)
    except BaseException:
        board.dispatching.difference_update(out)  # never returned: nobody would dispatch them
        raise
    return out


async def _accepted_action(engine: Engine, iid: str) -> Mapping[str, Any] | None:
    """The action as ACTION_ACCEPTED sealed it (no credential was in it); None when the broker
    cannot open it.  Read as a call reads (``Recorder.read``): a shared journal away beyond its
    reconnect window is ``JournalUnavailable``, and a read the database declined this once (a
    statement timeout, a lock not granted) is ``ReadFailed`` -- unread, not unreadable, and
    never a reason to give the approval up: raised, for the next sweep to try again."""
    journal, read = engine.journal, engine.recorder.read
    for event in await read(lambda: journal.events(iid)):
        seq = event.seq
        if event.kind is E.ACTION_ACCEPTED and seq is not None:
            try:
                payload = await read(functools.partial(journal.payload, seq))
            except (JournalUnavailable, ReadFailed):
                raise
            except JournalError:  # an altered row, or sealed to a key this broker lacks
                return None
            action = payload.get("action") if payload is not None else None
            return action if isinstance(action, Mapping) else None
    return None
