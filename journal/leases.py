"""Leases and idempotency records: the writes that decide who may act on an invocation.

Seed, "Idempotency is defined by the remote contract": "the broker still needs to take a lease
on the invocation, record the retry generation, and allow only one active attempt", and the key,
fingerprint, scope and retention are persisted before dispatch.  Each check runs inside the
writer's transaction, which holds the chain head (``Backend.begin``), so two processes sharing
a file -- or two brokers sharing a database -- cannot both win.  Lease expiry is wall-clock time
read inside that transaction (``lease_now``): on SQLite the journal's ``clock`` (one host); on
a shared PostgreSQL the database's own ``clock_timestamp()``, so every broker takes and judges
a lease by one clock -- a broker whose clock runs ahead cannot take over, or close
(``check_lapsed``), another's live attempt.  Generation 0's deadline is the ``lease_expires_at``
its broker wrote into ACTION_ACCEPTED, which the writer records in that clock's time
(``Txn.lease_offset``; docs/journal.md, "Clocks").  A lease event also records its end by the
boot clock (``lease_boot``, ``boot.py``): recovery on the same boot judges it by that clock
too, which a wall clock stepped forward does not move.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from affidavit.statemachine import (
    Event,
    EventKind,
    ImpossibleEvent,
    Record,
    Retry,
    key_moment,
    send_window,
)

from . import bindings
from .boot import boot_elapsed, boot_stamp
from .errors import (
    IdempotencyMismatch,
    IdempotencyRecord,
    KeyRetentionPassed,
    Lease,
    LeaseBusy,
    LeaseLost,
)
from .requests import Fail
from .rows import idempotency_from_row, lease_from_row
from .txn import Txn, row_args

__all__ = [
    "LEASE_KINDS",
    "acquire_op",
    "bind_op",
    "check_first_deadline",
    "check_lapsed",
    "check_lease",
    "check_unleased",
    "gate_now",
    "lease_now",
]


def _current_lease(txn: Txn, iid: str) -> Lease | None:
    return lease_from_row(iid, txn.tables.lease(iid))


def lease_now(txn: Txn, clock: Callable[[], float]) -> float:
    """Now, by the clock leases are judged by on this journal, read inside ``txn``: the
    database's where it has one (``Tables.lease_now``), else ``clock`` (the writer's) --
    ``JournalReader.now``'s choice, made in the writing transaction.  (``check_lapsed`` reads
    ``Tables.lease_now`` itself: on SQLite it judges nothing, by no clock.)"""
    now = txn.tables.lease_now()
    return clock() if now is None else now


def gate_now(txn: Txn, clock: Callable[[], float]) -> float:
    """Now by the lease clock, for a dispatch gate: the writer's ``clock`` plus the
    transaction's offset to the lease clock (``Txn.lease_offset``: read once per transaction,
    so a group commit of N gates makes one round trip to a shared database, not N).  The
    offset is read writer-clock first, so a round trip's delay only makes it larger: the gate
    judges a deadline passed no later than the lease clock would -- stricter, never laxer."""
    offset = txn.lease_offset()
    return clock() if offset is None else txn.writer.clock() + offset  # the offset's own clock


def check_lapsed(txn: Txn, iid: str, deadline: float | None) -> Fail | None:
    """None if the invocation's lease has run out by the database's clock: its lease row,
    and ``deadline`` (the one its closer read: generation 0's, from ACTION_ACCEPTED); else
    ``LeaseBusy`` -- a recovery judged by a clock running ahead must not close a live
    attempt.  A journal with no clock of its own (SQLite: one host) leaves the judgment to the
    closer, as before."""
    now = txn.tables.lease_now()
    if now is None:
        return None
    current = _current_lease(txn, iid)
    if current is not None and current.expires_at > now:
        return Fail(LeaseBusy(current))
    if deadline is not None and deadline > now:
        holder = current.holder if current is not None else "the first attempt's holder"
        return Fail(LeaseBusy(Lease(0, deadline, holder, iid, None)))
    return None


def check_unleased(txn: Txn, iid: str, clock: Callable[[], float]) -> Fail | None:
    """None unless a live lease holds the invocation by the lease clock, read in ``txn``
    (``lease_now``); else ``LeaseBusy``: an operator's revoke of a grant never lands while a
    holder may be dispatching it (APPROVAL_REVOKED)."""
    current = _current_lease(txn, iid)
    if current is not None and current.expires_at > lease_now(txn, clock):
        return Fail(LeaseBusy(current))
    return None


def check_lease(
    txn: Txn, iid: str, lease: tuple[str, int], clock: Callable[[], float]
) -> Fail | None:
    """None if ``lease`` (holder, generation) is the invocation's current, unexpired lease;
    otherwise write LEASE_LOST (when the lifecycle allows it) and answer ``LeaseLost``."""
    holder, generation = lease
    current = _current_lease(txn, iid)
    if (
        current is not None
        and current.holder == holder
        and current.generation == generation
        and current.expires_at > gate_now(txn, clock)
    ):
        return None
    attrs: dict[str, object] = {"generation": generation, "holder": holder}
    if _dispatched(txn, iid, generation):
        # A redirect's next hop: the record holds this generation's DISPATCH_STARTED, so the
        # worker stopped here had sent its first hop -- as the engine's own LEASE_LOST after a
        # dispatch says.
        attrs["after_dispatch"] = True
    lost = Event(EventKind.LEASE_LOST, iid, attrs=attrs)
    try:
        seq = txn.insert(*row_args(lost)).seq
    except ImpossibleEvent:
        seq = None
    return Fail(LeaseLost(iid, holder, generation, current, seq))


def check_first_deadline(
    txn: Txn, iid: str, holder: str, clock: Callable[[], float]
) -> Fail | None:
    """The first attempt's dispatch gate (generation 0, no lease row), written by ``holder``:
    None while its lease is ``holder``'s and runs -- the holder and ``lease_expires_at`` its
    broker wrote into ACTION_ACCEPTED, the deadline recorded in the clock leases are judged by
    -- by that clock in this transaction (``gate_now``: the database's on a shared journal), as
    a retry's gate judges its lease row (``check_lease``); else LEASE_LOST written (when the
    lifecycle allows it) and ``LeaseLost``.  Its broker checked its own clock before the gate,
    but the write may wait (for the chain head, a busy writer) past the lease's end, when
    another worker may take the holder for gone and close the attempt, or take the invocation
    over by winning its first event -- at generation 0 too, under a later deadline: a request
    sent then overlaps the taker's.  The same for each redirect hop's barrier after it
    (``Journal.append(first_gate=holder)``).  A record at another generation (a retry's gate
    checks its row) or with no recorded deadline is not judged here."""
    proj = txn.projector(iid)
    if proj.generation != 0:
        return None
    lease = proj.lease  # not a whole record: this runs at every first dispatch
    if lease is None:
        return None
    expires = lease.get("expires_at")
    if not isinstance(expires, (int, float)):
        return None
    ours = lease.get("holder") == holder
    if ours and gate_now(txn, clock) < expires:
        return None
    attrs: dict[str, object] = {"generation": 0, "holder": holder}
    if ours and _dispatched(txn, iid, 0):
        # A redirect's next hop: its first hop was sent.  Another holder's record holds none
        # of this worker's dispatches (its first event was refused).
        attrs["after_dispatch"] = True
    lost = Event(EventKind.LEASE_LOST, iid, attrs=attrs)
    try:
        seq = txn.insert(*row_args(lost)).seq
    except ImpossibleEvent:
        seq = None
    return Fail(LeaseLost(iid, holder, 0, None, seq))


def _dispatched(txn: Txn, iid: str, generation: int) -> bool:
    attempts = txn.projector(iid).record().attempts
    return any(a["generation"] == generation and a["stage"] == "dispatch" for a in attempts)


LEASE_KINDS = frozenset({EventKind.RETRY_LEASE_ACQUIRED, EventKind.DISPATCH_LEASE_ACQUIRED})
"""What a lease's event may be: a retry's, or the dispatch of an approved invocation."""


def acquire_op(
    invocation_id: str,
    holder: str,
    ttl: float,
    clock: Callable[[], float],
    kind: EventKind = EventKind.RETRY_LEASE_ACQUIRED,
    same_key: bool = False,
    requester: int | None = None,
) -> Callable[[Txn], Lease | Fail]:
    """Bump the generation, write the lease row and the lease's event (see
    ``Journal.acquire_lease``).  ``same_key``: a resend with the record's idempotency key --
    on a shared journal refused (``KeyRetentionPassed``, nothing written) unless the record's
    hint, computed here by the database's clock, is still ``same_idempotency_key``: the
    caller decided by a reading taken before this transaction.  On either backend refused too
    when the hint would no longer be ``same_idempotency_key`` when the lease ends (``ttl``
    from now): the key's retention could run out while the retry may still send it.
    ``requester``: the uid whose call takes the lease (the daemon's socket peer), recorded on
    the event: the asker this attempt answers (``delivery.requested_by``)."""
    if kind not in LEASE_KINDS:
        raise ValueError(f"{kind.value} is not a lease event")

    def op(txn: Txn) -> Lease | Fail:
        current = _current_lease(txn, invocation_id)
        now = lease_now(txn, clock)
        shared = txn.writer.backend.shared  # ``now`` is the database's clock (PostgreSQL)
        proj = txn.projector(invocation_id)
        record = proj.record(now)
        # On SQLite the engine's reading is this clock and the check stays the engine's.
        if same_key and shared and record.retry is not Retry.SAME_IDEMPOTENCY_KEY:
            return Fail(KeyRetentionPassed(invocation_id, now))
        # The retry may send at any moment its lease runs (the dispatch gate closes only
        # ``lease_margin`` before its end), and the remote checks the key when the request
        # arrives: the key must still be usable -- retention less its margin -- at the end of
        # the lease, not merely now.  A lease longer than what is left of the key's retention
        # (a target timeout past the margin) could send it after the remote forgot the key: a
        # second effect.  Judged by the record's own rule at that moment; by either backend's
        # clock, as the check above.  The rule already keeps the recorded send window (the
        # lease a retry takes with the target's default timeout) free after its moment: the
        # lease's end is the last moment this retry sends, so it is judged with none after.
        # With the default timeout the hint at ``now`` decides it; a longer lease (the
        # service's lease_margin raised since) is refused here.
        # The key's age is judged at its moment (``key_moment``): by the boot clock its binding
        # recorded when that says it is older than the clock read here does -- a wall clock
        # stepped back re-opened a retention the remote had closed, and the same key was sent
        # again; by a clock reading before the binding, no retention is left to judge.
        idem = record.idempotency
        window = send_window(idem)
        moment = key_moment(idem, now, boot_elapsed(idem.get("boot") if idem else None))
        if (
            same_key
            and record.retry is Retry.SAME_IDEMPOTENCY_KEY
            and (
                math.isinf(moment)
                or proj.record(moment + ttl - window).retry is not Retry.SAME_IDEMPOTENCY_KEY
            )
        ):
            return Fail(KeyRetentionPassed(invocation_id, now + ttl, lease=ttl))
        # A live lease is busy to everyone, its holder's other tasks too: the holder names a
        # broker, not a task, so two of its same-key calls must not both retry (each spending
        # the budget, one told LEASE_LOST) nor both send an approved request.  Nothing renews
        # a lease; a renewal would have to name the generation it renews.  A lease taken
        # before the approval was asked is no dispatch lease of it (a retry that then asked
        # for approval): nothing may be sent under it, so it keeps no one out.
        # Nor does the lease of an attempt that is over (the record rests in a final state at
        # that generation: its holder answered, or recovery closed it): nothing can be written
        # under it any more, and a same-key retry refused by it was told IN_PROGRESS -- "has
        # not finished" -- for the rest of a lease whose attempt had finished.
        if (
            current is not None
            and current.expires_at > now
            and not (
                kind is EventKind.DISPATCH_LEASE_ACQUIRED and _before_approval(record, current)
            )
            and not (record.final and current.generation <= record.generation)
        ):
            return Fail(LeaseBusy(current))
        recorded = record.generation
        generation = max(recorded, current.generation if current else 0) + 1
        expires = now + ttl
        attrs: dict[str, object] = {"generation": generation, "holder": holder}
        attrs["expires_at"] = expires
        boot = boot_stamp(ttl)  # its end by the boot clock too, for recovery on this boot
        if boot is not None:
            attrs["lease_boot"] = boot
        if requester is not None:
            attrs["requester"] = {"uid": requester}
        ev = Event(kind, invocation_id, attrs=attrs, at=now)
        stored = txn.insert(*row_args(ev))
        assert stored.seq is not None
        txn.tables.put_lease(invocation_id, holder, generation, expires, stored.seq)
        return Lease(generation, expires, holder, invocation_id, stored.seq)

    return op


def _before_approval(record: Record, lease: Lease) -> bool:
    """``lease`` was taken before the record's approval was asked (its event's seq is below
    APPROVAL_REQUESTED's)."""
    approval = record.evidence.get("approval")
    requested = approval.get("requested_seq") if isinstance(approval, Mapping) else None
    return type(requested) is int and type(lease.seq) is int and lease.seq < requested


def bind_op(
    scope: str,
    key: str,
    fingerprint: str,
    invocation_id: str,
    expires_at: float | None,
    clock: Callable[[], float],
    send_by: float | None = None,
    target: str | None = None,
) -> Callable[[Txn], IdempotencyRecord | Fail]:
    """Bind a key to a fingerprint; the first binding wins (see
    ``Journal.bind_idempotency``).  A key with no binding row that a chained ACTION_ACCEPTED
    names was bound once and its row removed (the broker binds before that event and never
    deletes a binding): ``AlteredRow``, not a second binding -- a retry with that key would be
    sent again (``bindings.py``).  A key found bound pays no second query."""

    def op(txn: Txn) -> IdempotencyRecord | Fail:
        existing = idempotency_from_row(txn.tables.idempotency(scope, key))
        if existing is not None:
            if existing.fingerprint == fingerprint:
                return existing
            return Fail(IdempotencyMismatch(existing, fingerprint))
        named = txn.tables.accepted_with_key(scope, key)
        if named is not None:
            raise bindings.removed(txn.writer.backend.where, scope, named[0])
        # When it was bound, by the clock every broker judges "bound a moment ago" by
        # (``lease_now``: the database's on a shared journal): by the binder's own, a broker
        # whose clock ran behind bound a key another took for abandoned long ago.
        created = lease_now(txn, clock)
        # The key's retention, computed by the binder's clock, recorded in that same clock as
        # ACTION_ACCEPTED's ``expires_at`` is (``Txn.lease_offset``): the row and the event
        # name one instant, not one an hour late because the binder's clock runs ahead.
        # The binder's send deadline likewise: the lease end its ACTION_ACCEPTED will carry,
        # which the writer records in that clock too -- so the row names the instant its
        # dispatch gate judges by (``check_first_deadline``).
        offset = None if expires_at is None and send_by is None else txn.lease_offset()
        expires, deadline = (
            (t if t is None or offset is None else t + offset) for t in (expires_at, send_by)
        )
        rec = IdempotencyRecord(
            scope, key, fingerprint, invocation_id, expires, created, deadline, target
        )
        txn.tables.insert_idempotency(
            (scope, key, fingerprint, invocation_id, expires, rec.created_at, deadline, target)
        )
        return rec

    return op
