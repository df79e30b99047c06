"""The writing journal: ``async with Journal.open(path_or_url) as j`` opens (or creates) the
journal, starts the single writer task, and offers every write the engine needs -- append with
or without a barrier, post a diagnostic event, leases, idempotency bindings, result chunks and
the result's commit.  ``Journal`` is the interface the engine, the views, recovery and the
daemon hold; the database behind it is a backend (``backend.py``: SQLite or PostgreSQL).

Where the parts live: ``backend.py`` chooses the backend (``sqlite.py``, ``postgres.py``),
``connect.py`` binds the keys, ``writer.py`` is the writer task with group commit (its
requests in ``requests.py``, each batch's transaction in ``commit.py``), ``txn.py`` one
transaction's rows (projection check and hash chain), ``leases.py`` and ``results_write.py``
the writes of their tables (``results_read.py`` reads results back), ``tables.py`` every
statement, ``reader.py`` every read (``Journal`` is a ``JournalReader`` too; its parts in
``reader_base.py``, ``reader_proofs.py``, ``reader_views.py``), ``views.py`` the action and
session folds, ``reclaim.py`` the chunks of results never committed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import trio

from affidavit.privatefile import unlink_if_made
from affidavit.statemachine import BARRIER_KINDS, Event, EventKind, Record

from . import compact, leases, reclaim, results
from .backend import Lock, open_backend
from .chain import canonical_json
from .checkpoints import Keys
from .connect import Made, bind_keys
from .errors import (
    ApprovalLapsed,
    CommitUnknown,
    IdempotencyRecord,
    JournalError,
    Lease,
    LeaseEventRefused,
)
from .names import refuse_left_beside
from .reader import JournalReader, default_signing_key
from .reader_base import default_key_file
from .requests import Around, Batch, Fail, Hook, Posted, presupposed
from .rows import BARRIER_VALUES, attrs_json, decode_attrs
from .sealing import AuditSealer, BrokerKey, UnsealedPayload, payload_aad
from .segment_tables import SEGMENT_LOCKS, SEGMENT_REFS
from .segments import SegmentStore, SegmentWriter
from .signing import SigningKey
from .txn import Txn
from .writer import Writer

__all__ = ["Batch", "Journal", "Posted"]


class _Opener:
    """``async with Journal.open(...) as j``: open, start the writer, drain and close."""

    def __init__(self, args: dict[str, Any]) -> None:
        self._args = args
        self._journal: Journal | None = None

    async def __aenter__(self) -> Journal:
        j = await trio.to_thread.run_sync(lambda: Journal(**self._args))
        try:
            await j._writer.start()
        except BaseException:
            j.close()
            raise
        self._journal = j
        return j

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._journal is not None
        try:
            await self._journal._writer.stop()
        finally:
            # Off the event loop: the segment threads may be finishing a write and a sync, and
            # a shared journal's connection closes over the network.
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._journal.close)


CANCELLABLE_KINDS = frozenset(
    {EventKind.SETUP_FAILED, EventKind.ATTEMPT_INTERRUPTED, EventKind.RESULT_STORE_FAILED}
)
"""The events a ``cancellable`` append may write: those that close an attempt with what its
record proves (``recovery.closing_event``) -- recovery would write the same one later."""


def _refuse_lease_event(event: Event) -> None:
    """``LeaseEventRefused`` for a lease event: ``acquire_lease`` alone writes one, in the
    transaction of its lease row (``leases.acquire_op``) -- the row acquire decides from, and
    ``verify`` holds to the event (``verify_leases``).  Appended without it, the journal
    would verify BROKEN; a hostile caller must not write lease events without their row."""
    if event.kind in leases.LEASE_KINDS:
        raise LeaseEventRefused(event.invocation_id, event.kind.value)


def _refuse_cancellable(
    event: Event,
    lease: tuple[str, int] | None,
    lapsed: bool,
    valid_until: float | None,
    meanwhile: Callable[[], None] | None,
    first_gate: str | None,
) -> None:
    """``Journal.append(cancellable=True)`` of anything but a plain closing event: a
    ``ValueError`` naming what was refused (the caller's bug, never the journal's)."""
    if event.kind not in CANCELLABLE_KINDS:
        raise ValueError(f"cancellable append of {event.kind.value}: only a closing event")
    for name, given in (
        ("lease", lease is not None),
        ("lapsed", lapsed),
        ("first_gate", first_gate is not None),
        ("valid_until", valid_until is not None),
        ("meanwhile", meanwhile is not None),
    ):
        if given:
            raise ValueError(f"cancellable append with {name}: its answer cannot be given up")


class Journal(JournalReader):
    """The writing journal.  Use ``async with Journal.open(path_or_url) as j``.

    Two hooks see the writer's transactions, each given a ``Batch`` (how many queued writes it
    carries, whether one is a barrier, the durability it commits under); both run in the writer
    thread and may be set or cleared at any time:

    * ``before_commit(batch)`` -- fault injection and counting: called inside every
      transaction, after all of its rows are written and before its ``COMMIT``.  Raising the
      backend's error (``sqlite3.Error``, ``psycopg.Error``) there fails the batch exactly as a
      storage fault would (rolled back; every write in it raises ``JournalWriteError`` or
      ``ResultStoreFailed``); blocking there holds the transaction open (crash tests kill the
      process at that point; on a shared journal it holds the chain head for every broker).
    * ``around_transaction(batch)`` -- instrumentation: a context manager entered before the
      transaction begins and exited after it committed or rolled back (the benchmarks time,
      profile and count transactions with it)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        key_file: str | os.PathLike[str] | None = None,
        signing_key: str | os.PathLike[str] | None = None,
        auditor_public_key: str | os.PathLike[str] | None = None,
        payload_copy: bool = True,
        clock: Callable[[], float] = time.time,
        owner: str | None = None,
        reconnect_within: float | None = None,
    ) -> None:
        options = {} if reconnect_within is None else {"reconnect_within": reconnect_within}
        backend = open_backend(path, options=options)
        self._owner = owner
        # Before anything else: a journal the daemon owns is not opened for writing at all.
        named = backend.path  # its key files, which a root writer's refusal names (``lock.py``)
        keys = (
            ()
            if named is None
            else (
                default_key_file(named) if key_file is None else Path(key_file),
                default_signing_key(named) if signing_key is None else Path(signing_key),
            )
        )
        self._writer_lock: Lock | None = backend.writer_lock(owner, keys)
        try:
            super().__init__(path, key_file=key_file, readonly=False, clock=clock, backend=backend)
        except BaseException:
            if self._writer_lock is not None:
                self._writer_lock.release()
            raise
        try:
            self._audit = AuditSealer.load(auditor_public_key) if auditor_public_key else None
            self._payload_copy = payload_copy or self._audit is None
            if signing_key is not None:
                self.signing_key_file = Path(signing_key)
            elif self.path is not None:
                self.signing_key_file = default_signing_key(self.path)
            else:
                raise JournalError(
                    f"journal {self.where}: a shared journal needs its key files named "
                    "([journal] key_file and signing_key)"
                )
            if self.path is not None:  # before ``_bind`` makes one that is not there
                refuse_left_beside(path, ".signing.key", "signing key", self.signing_key_file)
            if self._key_file is None:
                raise JournalError(
                    f"journal {self.where}: a shared journal needs its key files named "
                    "([journal] key_file and signing_key)"
                )
            self._writer = Writer(backend, backend.connect("writer"), clock)
            self._key, signer = self._bind(self._key_file, self.signing_key_file)
            # ``bind_keys`` recorded the key's id, or found it recorded and matching: a sealed
            # row it cannot open was altered (``payload``), as any reader of the journal says.
            self._key_recorded = True
            backend.opened()  # after the opening transaction: the head is not held
            self._writer.signer = signer
            self._writer.keys = (
                self.recorded_public_keys()
                if backend.multi_signer
                else {signer.key_id: signer.public_raw}
            )
            self._known_checkpoints = self._writer.signed
            self._segments = (
                None
                if backend.segments is None
                else SegmentStore(backend.segments, self.where, self._key, self._audit)
            )
        except backend.errors as exc:
            self.close()
            raise backend.open_error(exc) from None
        except BaseException:
            self.close()
            raise

    def _bind(self, key_file: Path, signing_key_file: Path) -> tuple[BrokerKey, SigningKey]:
        """Create or upgrade the schema and bind the keys, in one transaction."""
        backend, writer = self.backend, self._writer
        made: Made = []
        committing = False
        # Bounded like every write's wait for the chain head (``commit.attempts``): any login
        # role may take the advisory lock, granted nothing, and hold it for ever -- the open
        # refused after ``reconnect`` (``HeadHeld``, naming the holder), not stalled.
        backend.begin(
            writer.conn, barrier=True, wait=backend.reconnect_within if backend.shared else None
        )
        try:
            schema = backend.create(writer.conn)
            bound = bind_keys(
                backend, writer.tables, key_file, signing_key_file, self._clock, schema, made
            )
            committing = True
            backend.commit(writer.conn)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                backend.rollback(writer.conn)
            # The key files this transaction made: no row records their ids, and left beside
            # the journal they would mark it as one whose -wal was lost (``names.refuse_lost``)
            # -- the corrected retry refused.  A COMMIT that raised and may have landed keeps
            # them: the journal may record their ids.
            landed = committing and (
                not isinstance(exc, backend.errors)
                or backend.commit_may_have_landed(exc)
                or backend.lost(exc)
            )
            if not landed:  # (each only while its path names the file made: none shared)
                for path, ident in made:
                    with contextlib.suppress(OSError):
                        unlink_if_made(path, ident)
            raise
        return bound

    @classmethod
    def open(  # type: ignore[override]
        cls,
        path: str | os.PathLike[str],
        *,
        key_file: str | os.PathLike[str] | None = None,
        signing_key: str | os.PathLike[str] | None = None,
        auditor_public_key: str | os.PathLike[str] | None = None,
        payload_copy: bool = True,
        clock: Callable[[], float] = time.time,
        owner: str | None = None,
        reconnect_within: float | None = None,
    ) -> _Opener:
        """Open (creating if absent) and start the single writer task.  ``path`` is a SQLite
        file or a ``postgresql://`` URL (the schema is created on first open).  ``key_file``
        (the sealing key) defaults to ``<path>.key``, ``signing_key`` (the Ed25519 key that
        signs each transaction's checkpoint) to ``<path>.signing.key`` -- a database has no
        path: name both; each is created 0600 if absent.  ``payload_copy=False`` with an
        auditor key makes payloads write-only: sealed to the auditor alone.  ``owner`` (the
        daemon's description) opens a SQLite journal as its only writer (``lock.py``); without
        it, a journal an owner holds raises ``JournalLocked``.  ``reconnect_within``: how long
        a writer on a shared journal tries to reconnect after losing its connection."""
        return _Opener(
            {
                "path": path,
                "key_file": key_file,
                "signing_key": signing_key,
                "auditor_public_key": auditor_public_key,
                "payload_copy": payload_copy,
                "clock": clock,
                "owner": owner,
                "reconnect_within": reconnect_within,
            }
        )

    @property
    def exclusive(self) -> bool:
        """This process is the journal's only writer (the daemon's exclusive lock on a SQLite
        journal): every record left open belongs to a process that stopped.  Never on a shared
        journal, whose other brokers may be running the calls they left open."""
        return self._owner is not None and not self.backend.shared

    @property
    def before_commit(self) -> Hook | None:
        return self._writer.before_commit

    @before_commit.setter
    def before_commit(self, hook: Hook | None) -> None:
        self._writer.before_commit = hook

    @property
    def around_transaction(self) -> Around | None:
        return self._writer.around_transaction

    @around_transaction.setter
    def around_transaction(self, hook: Around | None) -> None:
        self._writer.around_transaction = hook

    def unanswered_writes(self) -> list[tuple[str, str]]:
        """(invocation id, event kind) of each write taken and not answered yet
        (``Writer.unanswered``): what a stop that could not wait for the journal names."""
        return self._writer.unanswered()

    def last_answered_ago(self) -> float | None:
        """Seconds since the writer last finished a transaction (None: none yet) -- a journal
        that stopped answering told from a slow one."""
        at = self._writer.answered_at
        return None if at is None else time.monotonic() - at

    @property
    def write_connection(self) -> Any:
        """The writer's own connection, for storage-fault tests (SQLite: ``PRAGMA
        max_page_count`` fills the disk, ``PRAGMA query_only`` makes it read-only, ``close()``
        takes the I/O path away; PostgreSQL: its backend pid, to terminate it).  Touch it only
        while no write is in flight."""
        return self._writer.conn

    # -- reads served from the writer's projections -------------------------------------------

    def record(
        self, invocation_id: str, now: float | None = None, *, as_committed: bool = False
    ) -> Record | None:
        """As ``JournalReader.record``; for an invocation this writer has folded, answered from
        its projection without reading the events back -- but only when that projection is the
        journal's state: called on the trio thread while no batch is in the writer thread, and
        the journal's last seq is the one this writer committed (another process may append to
        the same journal; then the events are read and folded as usual).  The writer's
        projection folds the same stored events a reader would (attrs decoded from their stored
        JSON).  The owner of a SQLite journal (``exclusive``: the daemon) skips reading the
        last seq: its lock keeps every other writer out, so this writer's last commit is the
        head (one read per call fewer on the daemon's thread, issue 15).

        ``as_committed``: a call's own answer right after the barrier that made its record
        final (``Recorder.record``: RESULT_COMMITTED's, a closing event's) -- the record as this
        writer's last commit left it, without reading the last seq either: a snapshot as of
        that commit.  Each transaction starts from the journal's head and catches up with the
        rows another writer appended before it (``commit._catch_up``), so every fact in the
        snapshot is durable and none committed before it is missing; rows another writer
        commits later (a reader's RESULT_DELIVERED, a RECONCILED) are not in it -- the next
        plain read has them.  That is the call's truthful answer only because its record is
        final: no other writer can then append ATTEMPT_INTERRUPTED (a stale lease's reclaim),
        the state machine refuses it, so nothing committed later takes back what this
        answer says.  So the shortcut is taken only for a final record, and only on SQLite
        (another process writing the same file is caught up with by the next transaction, as
        above); a record that is not final, or a shared journal (PostgreSQL: several brokers
        writing at once, which this reasoning was not checked against), reads the head as
        above (issue 15: that read was ~30 us of a call's critical path, embedded)."""
        p = self._writer.committed_projector(invocation_id)
        if p is not None:
            what = f"the record of invocation {invocation_id}"
            if as_committed and not self.backend.shared and not self.exclusive:
                at = self._now(now, what)
                record = p.record(at)
                if record.final:
                    return self.current(record, at)
            if self.exclusive or self.head()[0] == self._writer.known_head:
                at = self._now(now, what)
                return self.current(p.record(at), at)
        return super().record(invocation_id, now)

    def _trusted_keys(self, refresh: bool = False) -> Keys:
        # The writer checks with its own key (SQLite), not with whatever key the file records;
        # on a shared journal with the registered brokers' keys it last loaded.
        writer = self._writer
        if refresh and self.backend.multi_signer:
            writer.keys = {**self.recorded_public_keys(), **writer.keys}
        return writer.keys

    @property
    def public_key(self) -> bytes:
        """The signing key's public half (raw Ed25519), for auditors."""
        signer = self._writer.signer
        assert signer is not None
        return signer.public_raw

    def keyed_digest(self, label: str, data: bytes) -> str:
        """``BrokerKey.digest``: a digest of ``data`` that changes with it and reveals nothing
        of it without this journal's broker key -- the same in every process of the journal
        (and across restarts), so what it binds stays comparable."""
        assert self._key is not None
        return self._key.digest(label, data)

    def close(self) -> None:
        segments = getattr(self, "_segments", None)
        if segments is not None:
            segments.close()
        writer = getattr(self, "_writer", None)
        if writer is not None:
            with contextlib.suppress(Exception):
                self.backend.close(writer.conn)
        super().close()
        lock = getattr(self, "_writer_lock", None)
        if lock is not None:
            lock.release()

    # -- public writes --------------------------------------------------------------------------

    def _seal_payload(
        self, event: Event, payload: Mapping[str, Any] | None
    ) -> tuple[UnsealedPayload | None, bytes | None]:
        """The payload's broker copy, for the single writer to seal once the event's seq is
        assigned (``UnsealedPayload``), and its audit copy, sealed here."""
        if payload is None:
            return None, None
        try:
            data = canonical_json(payload).encode("utf-8")
        except (TypeError, ValueError, RecursionError) as exc:
            raise JournalError(
                f"{event.kind.value} payload of invocation {event.invocation_id} is not JSON: "
                f"{type(exc).__name__}"
            ) from None
        assert self._key is not None
        mine = UnsealedPayload(self._key, data) if self._payload_copy else None
        if self._audit is None:
            return mine, None
        return mine, self._audit.seal(data, payload_aad(event.invocation_id, event.kind.value))

    async def append(
        self,
        event: Event,
        *,
        barrier: bool = False,
        payload: Mapping[str, Any] | None = None,
        lease: tuple[str, int] | None = None,
        shield: bool = False,
        lapsed: bool = False,
        deadline: float | None = None,
        meanwhile: Callable[[], None] | None = None,
        valid_until: float | None = None,
        cancellable: bool = False,
        first_gate: str | None = None,
        after: Sequence[Posted[Any]] = (),
        unleased: bool = False,
    ) -> Event:
        """Append one event; return it with ``seq`` and ``at`` assigned.

        Raises ``ImpossibleEvent`` (nothing written) if the lifecycle refuses it, ``LeaseLost``
        if ``lease=(holder, generation)`` is stale or expired (checked in the same transaction)
        -- or, with ``first_gate`` (the first attempt's dispatch gate, which holds no lease: its
        DISPATCH_STARTED and every redirect hop's barrier after it; the gate writer's holder),
        if ACTION_ACCEPTED's holder is another or its ``lease_expires_at`` has passed
        (``leases.check_first_deadline``),
        ``JournalWriteError`` on a storage fault.  DISPATCH_STARTED and RESULT_COMMITTED are
        always barriers.  Once queued, the write is waited for uncancellably; ``shield``: so is
        a wait for room in a full queue before it (``Writer.submit``) -- the whole append is
        then what a caller's ``CancelScope(shield=True)`` around it made it.  ``lapsed``: a
        recovery's closing event, written only if the invocation's lease -- its lease row and
        ``deadline``, generation 0's -- has run out by the database's clock, checked in the same
        transaction (``leases.check_lapsed``); else ``LeaseBusy``, nothing written.
        ``meanwhile`` (a barrier's): run on the loop during the barrier's COMMIT, before this
        returns or raises -- or never (``Writer.submit``).  ``valid_until``: an approved
        dispatch's approval expiry -- written only while the clock leases are judged by (the
        database's on a shared journal), read in the same transaction, is before it; else
        ``ApprovalLapsed``, nothing written.  ``cancellable``: the wait for the answer, once
        queued, may be given up (``Writer.submit``) -- the write goes on, landing or not
        unread: only for a write recovery would make all the same (``internal_close``), so
        only a closing event (``CANCELLABLE_KINDS``) with no lease, ``lapsed``,
        ``valid_until`` or ``meanwhile`` -- anything else is a ``ValueError``, nothing queued:
        a boundary whose answer was given up would leave unclear what the record proves.
        ``after``: the caller's earlier posted writes whose answers it has not read yet (the
        call's unsettled posts): one about this invocation that was refused, or failed to be
        stored, fails this event with the same error, nothing written -- a task's facts about
        an invocation presuppose those it wrote before (``requests.presupposed``).
        ``unleased``: written only while no live lease holds the invocation
        (``leases.check_unleased``), else ``LeaseBusy``, nothing written.  A lease event
        (RETRY_/DISPATCH_LEASE_ACQUIRED) is ``LeaseEventRefused``, nothing written: only
        ``acquire_lease`` writes one, with its lease row."""
        _refuse_lease_event(event)
        if cancellable and unleased:
            raise ValueError("cancellable append with unleased: its answer cannot be given up")
        if cancellable:
            _refuse_cancellable(event, lease, lapsed, valid_until, meanwhile, first_gate)
        if first_gate is not None and lease is not None:
            raise ValueError("first_gate append with a lease: a retry's gate checks its lease")
        attrs_text = attrs_json(event)
        # Encoded and decoded here, in the submitting task, not in the single writer.
        decoded = decode_attrs(attrs_text)
        if payload is None:
            args: tuple[Any, ...] = (event, attrs_text, None, None, decoded)
        else:
            args = (event, attrs_text, *self._seal_payload(event, payload), decoded)
        barrier = barrier or event.kind._value_ in BARRIER_VALUES
        pre = presupposed(after, {event.invocation_id}) if after else None
        if (
            lease is None
            and not (lapsed or unleased)
            and valid_until is None
            and first_gate is None
        ):
            return await self._writer.submit(
                None,
                args,
                barrier=barrier,
                shield=shield,
                meanwhile=meanwhile,
                cancellable=cancellable,
                after=pre,
            )
        clock = self._clock

        def op(txn: Txn) -> Event | Fail:
            iid = event.invocation_id
            if lease is not None:
                refused = leases.check_lease(txn, iid, lease, clock)
            elif first_gate is not None:  # no lease row: ACTION_ACCEPTED holds holder, deadline
                refused = leases.check_first_deadline(txn, iid, first_gate, clock)
            elif lapsed:
                refused = leases.check_lapsed(txn, iid, deadline)
            elif unleased:
                refused = leases.check_unleased(txn, iid, clock)
            else:
                refused = None
            if refused is not None:
                return refused
            if valid_until is not None and leases.lease_now(txn, clock) >= valid_until:
                return Fail(ApprovalLapsed(iid))
            return txn.insert(*args)

        return await self._writer.submit(
            op,
            barrier=barrier,
            shield=shield,
            meanwhile=meanwhile,
            cancellable=cancellable,
            after=pre,
            about=(event.invocation_id, event.kind.value),
        )

    async def post(
        self,
        event: Event,
        *,
        payload: Mapping[str, Any] | None = None,
        after: Sequence[Posted[Any]] = (),
    ) -> Posted[Event]:
        """Queue a diagnostic (non-barrier) event and return without waiting for its commit.

        DESIGN, "Durability barriers": diagnostic events between barriers may ride along with
        the next barrier's transaction; recovery never depends on them.  The single writer keeps
        queue order, so once any write queued later has returned, this event has been committed
        in that transaction or an earlier one -- or it failed, and ``Posted.wait()`` raises why
        (``ImpossibleEvent``, ``JournalWriteError``, as ``append`` would have).  Barrier kinds
        (DISPATCH_STARTED, RESULT_COMMITTED) cannot be posted, nor lease events
        (``LeaseEventRefused``, as ``append``).  ``after``: as ``append``'s."""
        _refuse_lease_event(event)
        if event.kind in BARRIER_KINDS:
            raise ValueError(f"{event.kind.value} is a durability barrier: use append()")
        attrs_text = attrs_json(event)
        args = (event, attrs_text, *self._seal_payload(event, payload), decode_attrs(attrs_text))
        pre = presupposed(after, {event.invocation_id}) if after else None
        return await self._writer.post(None, args, after=pre)

    async def post_many(
        self,
        items: Sequence[tuple[Event, Mapping[str, Any] | None]],
        *,
        shield: bool = False,
        after: Sequence[Posted[Any]] = (),
        joined: bool = False,
    ) -> Posted[list[Event]]:
        """``post`` of several diagnostic events (each with its payload or None) as one queued
        write: one request for the single writer instead of one per event (issue 15), the rows
        computed here, in the submitting task.  Each row is validated, chained and written as
        its own ``post`` would be -- in queue order, in one transaction -- except that the
        rows are one task's consecutive facts about an invocation, each presupposing those
        before it: once a row is refused, the later rows for the same invocation are refused
        too, not written (a late binder's preamble after its refused ACTION_ACCEPTED landed in
        the record of the taker that won that first event).  Its rows for other invocations,
        and every other write of the transaction, are not affected.  ``Posted.wait()`` raises
        the first refusal, else returns the stored events.  ``shield``: not cancellable while
        it waits for room in a full queue (``append``'s ``shield``); ``after``: as
        ``append``'s, refusing the whole write.  ``joined``: the rows are one fact about
        several invocations -- all written, or none: a row refused, the whole write is (a
        linked call's claim on the record it serves, then the call's first rows: a claim
        refused, nothing of the call is written; a call's row refused, nor is its claim)."""
        rows: list[tuple[Any, ...]] = []
        for event, payload in items:
            _refuse_lease_event(event)
            if event.kind in BARRIER_KINDS:
                raise ValueError(f"{event.kind.value} is a durability barrier: use append()")
            text = attrs_json(event)
            if payload is None:  # most of them: no ``_seal_payload`` call to say (None, None)
                rows.append((event, text, None, None, decode_attrs(text)))
            else:
                rows.append((event, text, *self._seal_payload(event, payload), decode_attrs(text)))
        pre = presupposed(after, {e.invocation_id for e, _ in items}) if after else None
        return await self._writer.post(
            None, tuple(rows), many=True, joined=joined, shield=shield, after=pre
        )

    async def acquire_lease(
        self,
        invocation_id: str,
        holder: str,
        ttl: float,
        *,
        kind: EventKind = EventKind.RETRY_LEASE_ACQUIRED,
        same_key: bool = False,
        requester: int | None = None,
    ) -> Lease:
        """Take the invocation's lease: bump the generation, write the lease row and its event
        -- RETRY_LEASE_ACQUIRED for a retry, DISPATCH_LEASE_ACQUIRED for the dispatch of an
        approved invocation -- in one barrier transaction.  ``LeaseBusy`` if a lease is
        unexpired (``holder``'s own too: it names a broker, whose tasks share it) and its
        attempt not over (the record final at its generation);
        ``ImpossibleEvent`` if the lifecycle refuses the event; ``same_key``: a resend with the
        record's idempotency key, ``KeyRetentionPassed`` on a shared journal whose clock says
        the key's retention has passed, or on either backend when it would pass before the
        lease (``ttl``) ends (``leases.acquire_op``).  ``requester``: the uid whose call takes
        it, recorded on the event (the asker this attempt answers)."""
        if not (ttl > 0 and math.isfinite(ttl)):
            raise ValueError("ttl must be a positive number of seconds")
        op = leases.acquire_op(invocation_id, holder, ttl, self._clock, kind, same_key, requester)
        return await self._writer.submit(op, barrier=True, about=(invocation_id, kind.value))

    async def bind_idempotency(
        self,
        scope: str,
        key: str,
        fingerprint: str,
        invocation_id: str,
        expires_at: float | None,
        *,
        send_by: float | None = None,
        target: str | None = None,
    ) -> IdempotencyRecord:
        """Bind an idempotency key to a request fingerprint (durable).  The first binding wins;
        the same fingerprint returns it; another fingerprint raises ``IdempotencyMismatch``.
        ``send_by``: the lease end (this writer's clock) the binder's ACTION_ACCEPTED will carry
        -- recorded, in the lease clock, as ``IdempotencyRecord.send_by``; ``target``: the
        binder's target name (``IdempotencyRecord.target``)."""
        op = leases.bind_op(
            scope, key, fingerprint, invocation_id, expires_at, self._clock, send_by, target
        )
        binding = (invocation_id, "idempotency binding")
        return await self._writer.submit(op, barrier=True, about=binding)

    async def put_result_chunk(
        self,
        invocation_id: str,
        stream: str,
        index: int,
        data: bytes,
        *,
        generation: int | None = None,
    ) -> None:
        """Store one sealed chunk of a result stream (not complete until ``commit_result``).
        Index 0 starts the stream over, dropping chunks of an earlier, uncommitted attempt.
        ``generation``: the attempt's -- ``ResultStoreFailed`` unless it is the record's
        current one (``results.chunk_op``)."""
        assert self._key is not None
        op = results.chunk_op(
            self._key, self._audit, invocation_id, stream, index, data, generation=generation
        )
        await self._writer.submit(op, barrier=False, result_store=True)

    async def post_result_chunk(
        self,
        invocation_id: str,
        stream: str,
        index: int,
        data: bytes,
        *,
        log: results.ChunkLog | None = None,
        generation: int | None = None,
    ) -> Posted[None]:
        """``put_result_chunk`` without waiting for its commit (see ``post``), so that the last
        chunk shares the transaction of the ``commit_result`` that follows.  Pass that call
        ``expect=`` the streams' hashes: a chunk lost with a failed batch then makes the commit
        fail instead of completing a result without it.  ``log`` records what was sealed, for
        that commit to check the stored chunks against (``ChunkLog``).  ``generation``: as
        ``put_result_chunk``."""
        assert self._key is not None
        op = results.chunk_op(
            self._key, self._audit, invocation_id, stream, index, data, log, generation
        )
        return await self._writer.post(op, result_store=True)

    def result_writer(
        self, invocation_id: str, generation: int | None = None
    ) -> results.ResultWriter:
        """How one result's chunks are stored as they arrive (one writer per run of an
        invocation; pass it to ``commit_result``): in this journal's segment files when it has
        them (SQLite: ``segments.py``), else posted to the journal's tables
        (``results.PostingWriter``).  ``generation``: the attempt's, for each posted chunk
        (``put_result_chunk``); a segment file's chunks become rows only with the commit, whose
        RESULT_COMMITTED names it."""
        if self._segments is not None:
            return self._segments.writer(invocation_id)

        async def post(stream: str, index: int, data: bytes, log: results.ChunkLog) -> Posted[None]:
            return await self.post_result_chunk(
                invocation_id, stream, index, data, log=log, generation=generation
            )

        return results.PostingWriter(invocation_id, post)

    async def reclaim_chunks(self) -> list[str]:
        """Drop the stored chunks no committed result names, of every final record
        (``reclaim.py``: side storage, outside the chain -- ``verify`` is unaffected); return the
        invocations whose chunks were dropped.  Nothing is appended (``reclaim``)."""
        return (await self.reclaim()).dropped

    async def reclaim(
        self, *, dry_run: bool = False, measure: bool = False, segments: bool = False
    ) -> reclaim.Reclamation:
        """``reclaim_chunks``, also answering which records keep theirs, still open, and with
        ``measure`` what each dropped invocation had stored (chunk rows, auditor copies, bytes);
        ``dry_run``: what it would drop now, nothing written (``affidavit journal reclaim``).
        ``segments`` (SQLite): then compact the segment files (``compact.py``), in a thread
        abandoned on cancellation (every step is crash-safe; the next reclaim finishes it).

        The candidates are read off the event loop, on a connection of their own (the shared
        reader's is not thread-safe): a read of ``chunk_owners`` (``reclaim.py``), small, but a
        database read all the same, which a daemon's calls must not wait for.  Cancellable at
        every wait: a cancellation while the read runs leaves its thread to finish and close
        that connection; between batches nothing is left half-done (each batch is one
        transaction)."""
        candidates = await trio.to_thread.run_sync(self._reclaim_candidates, abandon_on_cancel=True)
        done = reclaim.Reclamation([], [], [])
        for start in range(0, len(candidates), reclaim.BATCH):  # the head held per batch
            batch = candidates[start : start + reclaim.BATCH]
            op = reclaim.reclaim_op(batch, dry_run=dry_run, measure=measure)
            part = await self._writer.submit(op, barrier=False)
            done.dropped.extend(part.dropped)
            done.kept.extend(part.kept)
            done.measured.extend(part.measured)
        if segments and self.backend.segments is not None:
            compacted = await trio.to_thread.run_sync(
                self._compact_segments, dry_run, abandon_on_cancel=True
            )
            done = dataclasses.replace(done, compacted=compacted)
        return done

    def _compact_segments(self, dry_run: bool) -> compact.Compaction:
        """``compact.compact`` of this journal's segment files, their reference rows read on a
        connection opened (and closed) here, in the calling thread -- refused (``refused``,
        nothing touched) where there are segment files while a writer of an earlier affidavit,
        which leaves its segments unlocked, may still write the journal (no ``SEGMENT_LOCKS``:
        ``compact.py``).  A segment written after the newest row is spared (``spare_after``):
        the commits naming its bytes may be in a lost -wal."""
        backend, what = self.backend, "the result segments' references"
        conn = backend.connect("tool")

        def read_refs(names: Sequence[str]) -> Iterator[tuple[Any, Any, Any]]:
            sql = SEGMENT_REFS.format(",".join("?" * len(names)))
            return iter(conn.execute(sql, tuple(names)).fetchall()) if names else iter(())

        try:
            proven = backend.tables(conn).meta(SEGMENT_LOCKS) is not None
            newest = conn.execute("SELECT at FROM events ORDER BY seq DESC LIMIT 1").fetchone()
            try:  # (no row, or one altered to hold no time: every segment spared)
                after = float(newest[0]) if newest else 0.0
            except (TypeError, ValueError):
                after = 0.0
            after = after if math.isfinite(after) else 0.0
            return compact.compact(
                backend.segments, read_refs, proven=proven, dry_run=dry_run, spare_after=after
            )
        except backend.errors as exc:
            raise self._error(what, exc) from None
        except OSError as exc:
            raise JournalError(
                f"journal {self.where}: compacting the result segments failed: "
                f"{exc.strerror or exc}"
            ) from None
        finally:
            with contextlib.suppress(Exception):
                backend.close(conn)

    def _reclaim_candidates(self) -> list[str]:
        """``Tables.unmarked_chunk_owners`` on a read-only connection opened (and closed) here,
        in the calling thread -- not bounded like the event loop's reads (the reader role's
        ``statement_timeout``): it stalls no call; a database error is a ``JournalError``
        (``ReadFailed`` when declined)."""
        backend, what = self.backend, "the stored chunks no marker names"
        conn = backend.connect("tool")
        try:
            return backend.tables(conn).unmarked_chunk_owners()
        except backend.errors as exc:
            raise self._error(what, exc) from None
        finally:
            with contextlib.suppress(Exception):
                backend.close(conn)

    async def commit_result(
        self,
        event: Event,
        *,
        summary: Mapping[str, Any],
        expect: Mapping[str, str] | None = None,
        log: results.ChunkLog | None = None,
        writer: results.ResultWriter | None = None,
    ) -> Event:
        """Write the completeness marker and RESULT_COMMITTED in one barrier transaction.

        The marker holds each stream's chunk count and SHA-256 and the whole result's SHA-256;
        the returned event's attrs carry ``sha256``, ``chunks`` and ``bytes`` (and so does the
        hash chain).  Any storage fault raises ``ResultStoreFailed``; nothing of it is kept --
        unless it is ``ResultStoreUnknown``: its COMMIT raised, and whether it landed is
        unknown.
        ``expect`` ({stream: hex SHA-256 of its bytes}): the stored streams must be exactly
        these, or ``ResultStoreFailed`` is raised and nothing is written.  ``log`` (with
        ``expect``): the ``ChunkLog`` the chunks were posted with -- the stored chunks are then
        checked to be the ones sealed, not read back, decrypted and hashed again.  ``writer``
        (with ``expect``): the ``result_writer`` the chunks were put through, flushed here first
        (``ResultStoreFailed`` if that fails; nothing is written then)."""
        if event.kind is not EventKind.RESULT_COMMITTED:
            raise ValueError("commit_result takes a RESULT_COMMITTED event")
        assert self._key is not None
        op = results.commit_op(self._key, self._audit, event, summary, expect, log, writer)
        if writer is not None:
            await writer.flush()
        try:
            return await self._writer.submit(
                op, barrier=True, result_store=True, about=(event.invocation_id, event.kind.value)
            )
        except CommitUnknown:
            # Its rows, naming the bytes in ``writer``'s segments, may be recovered after a
            # crash: keep those segments locked from a compaction until a later commit is
            # written over them (``Writer.appended``) or the store closes.
            if self._segments is not None and isinstance(writer, SegmentWriter):
                w, before = self._writer, self._writer.appended
                self._segments.doubt(writer, lambda: w.appended != before)
            raise
