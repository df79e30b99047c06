"""Reading the journal: events, projected records, sealed payloads, stored results (whole or
chunk by chunk), auditor copies, leases, idempotency records, the action and session views,
checkpoints, anchors and ``verify`` -- the same code on every backend (``backend.py``).

Reads are synchronous and use their own connection (SQLite's WAL lets them run while the writer
commits, from this process or another; PostgreSQL's MVCC does the same for every broker).
``JournalReader.open`` opens a journal read-only, without the broker key, for views and
``verify``; the key is loaded only when a payload or a result is read.  No read needs a signing
key: checkpoints are checked with public halves.  A read whose connection to a shared database
was lost reconnects once and is tried again; a read that still fails is a ``JournalError``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import os
import time
import weakref
from collections.abc import (
    Callable,
    Generator,
    Hashable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from affidavit.statemachine import Event, ImpossibleEvent, Outcome, Phase, Projector, Record

from . import audit, bindings, checkpoints, results, views
from .backend import Backend, open_backend
from .chain import GENESIS
from .checkpoints import Keys
from .connect import recorded_keys
from .errors import (
    IdempotencyRecord,
    JournalError,
    JournalUnavailable,
    Lease,
    ReadFailed,
    VerifyReport,
)
from .rows import (
    AlteredRow,
    close_rows,
    event_from_row,
    idempotency_from_row,
    lease_from_row,
    unfoldable,
)
from .sealing import BrokerKey, open_audit_payload, payload_aad
from .signing import Anchor, Checkpoint, key_id_of
from .summary import SessionSummary
from .tables import Tables
from .verify import Trust, verify_after, verify_journal

__all__ = ["JournalReader", "default_signing_key"]

T = TypeVar("T")


def _segments_hint(report: VerifyReport, tables: Tables) -> VerifyReport:
    """A broken report on a journal whose long results live in a ``<path>.results/`` that is
    not there: a copy made without it reads as altered chunks, and is -- nothing proves those
    results -- but the operator is told the likelier cause, not left to suspect tampering."""
    missing = getattr(tables, "segments_missing", None)
    if report.ok or "stored result" not in report.reason or missing is None or not missing():
        return report
    directory = getattr(tables, "segments", None)
    return dataclasses.replace(
        report,
        reason=f"{report.reason} -- its results directory {directory} is missing (a copy of "
        "the journal needs it: docs/journal.md)",
    )


def default_signing_key(path: Path) -> Path:
    """Where the signing key lives unless configured: ``<journal>.signing.key``."""
    return Path(f"{path}.signing.key")


class _Source:
    """``verify.Source`` over one read transaction."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables

    def event_rows(self) -> Iterator[tuple[Any, ...]]:
        return self.tables.event_rows()

    def checkpoints(self) -> Iterator[Checkpoint]:
        return self.tables.checkpoints()

    def markers(self) -> Iterator[tuple[str, int, str, str, bytes]]:
        return self.tables.markers()

    def digests(self, invocation_id: str, audit: bool) -> Iterator[tuple[str, int, str]]:
        for stream, idx, data in self.tables.chunks(audit, invocation_id):
            yield stream, idx, hashlib.sha256(data).hexdigest()

    def bindings(self) -> Iterator[tuple[Any, ...]]:
        return self.tables.idempotency_rows()


class JournalReader:
    """Synchronous reads.  Opened on its own (``JournalReader.open``) it is read-only and needs
    no key unless results or payloads are read.  ``path`` is a SQLite file or a
    ``postgresql://`` URL (``where`` names it in messages, without a password)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        key_file: str | os.PathLike[str] | None = None,
        readonly: bool = True,
        clock: Callable[[], float] = time.time,
        backend: Backend | None = None,
        public_keys: Sequence[bytes] = (),
    ) -> None:
        self.backend = backend if backend is not None else open_backend(path)
        self.path = self.backend.path
        """The SQLite file (None for a database)."""
        self.where = self.backend.where
        self._clock = clock
        if key_file is not None:
            self._key_file: Path | None = Path(key_file)
        else:
            self._key_file = Path(f"{self.path}.key") if self.path is not None else None
        self._key: BrokerKey | None = None
        self._key_recorded = False
        """The key's id is the one the journal records: a blob it cannot open was altered."""
        self._known_checkpoints: checkpoints.Known = {}
        """Checkpoints found valid (or signed by this process), whole, by seq."""
        self._recorded: dict[str, bytes] | None = None
        self._pinned = _keys(None, public_keys)
        """Signing keys given by the caller (kept apart from the journal): reads check
        checkpoints with these, never with the keys the journal records."""
        self._streams: weakref.WeakSet[Generator[Any, None, None]] = weakref.WeakSet()
        """Views streamed from this reader and not yet finished (``iter_actions``): closed by
        ``close`` while the connection is still open."""
        self._rconn: Any = None
        self._rconn = self.backend.connect("tool" if readonly else "reader")
        self.tables = self.backend.tables(self._rconn)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        key_file: str | os.PathLike[str] | None = None,
        public_keys: Sequence[bytes] = (),
    ) -> JournalReader:
        """``public_keys``: the signing public keys (raw Ed25519, one per broker of a shared
        journal) every read checks checkpoints with -- an auditor's, kept apart from the
        journal.  Without them reads trust the keys the journal records itself
        (``key_source``), which whoever rewrites the journal can replace."""
        return cls(path, key_file=key_file, readonly=True, public_keys=public_keys)

    def __enter__(self) -> JournalReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        # A stream its consumer left part-way (``affidavit actions | head``: the write failed)
        # still holds an open statement; closed later, by the collector, it would find the
        # connection closed ("Exception ignored ... Cannot operate on a closed database").
        for stream in list(self._streams):
            with contextlib.suppress(Exception):
                stream.close()
        if self._rconn is not None:
            with contextlib.suppress(Exception):
                self.backend.close(self._rconn)

    # -- reading, with a lost connection tried again once -------------------------------------
    # (then ``JournalUnavailable``: an async caller may wait and read again -- ``Recorder``)

    def _read(self, fn: Callable[[Tables], T], what: str) -> T:
        """``fn`` over the tables; ``what`` names what it reads, in messages (``the events of
        invocation act_...``): never a payload, a key or a result."""
        backend = self.backend
        try:
            return fn(self.tables)
        except AlteredRow as exc:  # a row the broker did not write: reading it again won't help
            raise self._altered(what, exc) from None
        except backend.errors as exc:
            if not backend.lost(exc):
                raise self._error(what, exc) from None
        with contextlib.suppress(Exception):
            backend.close(self._rconn)
        try:
            self._rconn = backend.connect("reader")
        except JournalUnavailable as exc:  # no new connection: the database is still away
            raise JournalUnavailable(f"{what} cannot be read: {exc}") from None
        except JournalError as exc:  # a server that answers and refuses: not away
            raise JournalError(f"{what} cannot be read: {exc}") from None
        try:
            self.tables = backend.tables(self._rconn)
            return fn(self.tables)
        except backend.errors as exc:
            if backend.lost(exc):
                raise JournalUnavailable(str(self._error(what, exc))) from None
            raise self._error(what, exc) from None

    def _altered(self, what: str, exc: AlteredRow) -> AlteredRow:
        # Still an ``AlteredRow``: every surface answers it as the journal's fault
        # (JOURNAL_UNREADABLE), never as a stored result that failed its verification.
        return AlteredRow(f"journal {self.where}: {what} cannot be read: {exc}")

    def _error(self, what: str, exc: BaseException) -> JournalError:
        """A database error on a connection that is not lost: ``ReadFailed`` when the database
        only declined this once (``Backend.transient``), else a plain ``JournalError``."""
        cls = ReadFailed if self.backend.transient(exc) else JournalError
        return cls(f"journal {self.where}: {what} cannot be read: {self.backend.describe(exc)}")

    def guarded(self, what: str) -> _Guard:
        """``results.Store``: a database error inside is a ``JournalError`` naming ``what`` (a
        stored row the database cannot hand back -- a text column that is not UTF-8 -- is one,
        like any other altered row)."""
        return _Guard(self, what)

    def snapshot(self) -> contextlib.AbstractContextManager[None]:
        """``results.Store``: one read transaction."""
        return self.backend.snapshot(self._rconn)

    # -- keys ---------------------------------------------------------------------------------

    def _broker_key(self) -> BrokerKey:
        if self._key is None:
            if self._key_file is None:
                raise JournalError(
                    f"journal {self.where}: reading payloads and results needs the broker key "
                    "file ([journal] key_file)"
                )
            key = BrokerKey.load(self._key_file)
            stored = self._read(lambda t: t.meta("key_id"), "the broker key's id")
            if stored is not None and stored != key.key_id:
                raise JournalError(f"broker key file {self._key_file} does not match this journal")
            self._key_recorded = stored is not None
            self._key = key
        return self._key

    def broker_key_matches(self) -> bool | None:
        """Whether the broker key file is this journal's: its id against the one the journal
        records (None: it records none -- every broker records it before its first event).
        ``JournalError`` naming the file if it cannot be loaded (missing, not 0600, not a
        key); a database error as any read's."""
        if self._key_file is None:
            self._broker_key()  # its refusal: no key file for a database without one
        assert self._key_file is not None
        key = BrokerKey.load(self._key_file)
        stored = self._read(lambda t: t.meta("key_id"), "the broker key's id")
        return None if stored is None else stored == key.key_id

    def recorded_public_key(self) -> bytes | None:
        """The signing public key the journal records, when it records exactly one (None
        before signing, or on a shared journal with several brokers' keys)."""
        keys = self.recorded_public_keys()
        return next(iter(keys.values())) if len(keys) == 1 else None

    def recorded_public_keys(self) -> dict[str, bytes]:
        """Every signing public key the journal records (key id -> raw): its one key on
        SQLite, each registered broker's on a shared journal.  The journal holds them, so
        whoever rewrites it can replace them: pass keys kept elsewhere to ``verify`` for an
        independent check."""
        return self._read(recorded_keys, "the signing public keys")

    @property
    def key_source(self) -> str:
        """Where the keys reads check checkpoints with come from: ``public-key`` (given to
        ``open``) or ``journal`` (recorded in the journal itself: not independent of it)."""
        return "public-key" if self._pinned else "journal"

    def trusted_key_ids(self) -> tuple[str, ...]:
        """The ids of the keys reads check checkpoints with."""
        return tuple(sorted(self._trusted_keys()))

    def _trusted_keys(self, refresh: bool = False) -> Keys:
        """The keys a read checks checkpoints with (the writing journal uses its writer's):
        the pinned ones if given, else those the journal records."""
        if self._pinned:
            return self._pinned
        if self._recorded is None or refresh:
            self._recorded = self.recorded_public_keys()
        return self._recorded

    def _cover(self, seq: int) -> tuple[Checkpoint | None, tuple[Any, ...] | None, str | None]:
        """``checkpoints.cover`` with the trusted keys: the checkpoint covering the row at
        ``seq`` and the row, proven as ``verify`` proves them (the rows from it to that
        checkpoint re-hashed from their columns), or why not."""
        known = self._known_checkpoints
        what = f"the checkpoint covering seq {seq}"
        keys = self._trusted_keys()
        got = self._read(lambda t: checkpoints.cover(t, seq, keys, known), what)
        if got[0] is None and self.backend.multi_signer and not self._pinned:
            # A key registered by a broker that joined after these keys were read.
            keys = self._trusted_keys(refresh=True)
            got = self._read(lambda t: checkpoints.cover(t, seq, keys, known), what)
        return got

    def _covered(self, seq: int) -> Checkpoint:
        """The checkpoint covering the row at ``seq`` (``_cover``); ``JournalError`` if none
        does."""
        cp, _, why = self._cover(seq)
        if cp is None:
            raise JournalError(f"journal {self.where}: {why}")
        return cp

    def _proven(self, seq: int, what: str) -> tuple[Checkpoint, tuple[Any, ...]]:
        """The checkpoint and the row at ``seq``, proven (``_cover``) before an auditor read
        opens anything of it; else a ``JournalError`` naming ``what``, the seq, what failed and
        the keys -- never a byte of what it would have opened.  The auditor copy is sealed to
        the auditor's *public* key: anyone can make one, so only the signed chain says which
        copy the broker wrote."""
        cp, row, why = self._cover(seq)
        if cp is None or row is None:
            keys = ", ".join(self.trusted_key_ids()) or "none"
            raise JournalError(
                f"journal {self.where}: {what} is not proven, not opened: {why} (checked with "
                f"key {keys}, {self.key_source}) -- run affidavit journal verify"
            )
        return cp, row

    # -- events and records -------------------------------------------------------------------

    def events(self, invocation_id: str) -> list[Event]:
        def read(t: Tables) -> list[Event]:
            rows = t.invocation_events(invocation_id)
            try:
                return [event_from_row(r) for r in rows]
            finally:
                close_rows(rows)

        return self._read(read, f"the record of invocation {invocation_id}")

    def record(self, invocation_id: str, now: float | None = None) -> Record | None:
        """The invocation's record, its retry hint computed at ``now`` -- by default this
        reader's clock (the wall clock) as it is read: a hint shown to anyone is the hint at
        the moment it is answered, never the one the record had at its last event
        (docs/contract.md, "When the hint is computed")."""
        events = self.events(invocation_id)
        if not events:
            return None
        try:
            return (
                Projector(invocation_id)
                .extend(events)
                .record(self._now(now, f"the record of invocation {invocation_id}"))
            )
        except ImpossibleEvent as exc:  # stored events the broker could not have written
            what = f"the record of invocation {invocation_id}"
            raise self._altered(what, unfoldable(exc)) from None

    def payload(self, seq: int) -> Mapping[str, Any] | None:
        """The broker copy of an event's sealed payload (None if the event has none)."""
        row = self._read(lambda t: t.sealed_at(seq, False), f"the payload of seq {seq}")
        if row is None or row[2] is None:
            return None
        key = self._broker_key()
        try:
            data = key.open(row[2], payload_aad(row[0], row[1]))
        except JournalError:
            if not self._key_recorded:
                raise
            # The key is the one the journal records as its own: the row was altered.
            raise self._altered(
                f"the payload of seq {seq}",
                AlteredRow(
                    f"its sealed payload does not open with broker key file {key.path}, the "
                    "key this journal records as its own: the row was altered"
                ),
            ) from None
        value: Mapping[str, Any] = json.loads(data)
        return value

    def auditor_only(self, seq: int) -> bool:
        """Whether the event's payload was sealed to the auditor alone (``payload_copy=False``:
        no broker copy to open, ``audit_copy`` only)."""
        what = f"the payload of seq {seq}"
        mine = self._read(lambda t: t.sealed_at(seq, False), what)
        theirs = self._read(lambda t: t.sealed_at(seq, True), what)
        return (mine is None or mine[2] is None) and theirs is not None and theirs[2] is not None

    def audit_copy(self, seq: int) -> tuple[str, str, bytes] | None:
        """``(invocation_id, kind, sealed)`` of an event's audit copy, for the auditor to open
        with ``open_audit_payload``; the broker cannot open it.  The row is proven first
        (``_proven``: its hash, its link, a checkpoint signed with a trusted key covering it),
        and what is handed back is the proven row's own columns; ``JournalError`` if it is not
        proven.  None if there is no such event or it has no auditor copy."""
        what = f"the auditor copy of seq {seq}"
        if self._read(lambda t: t.sealed_at(seq, True), what) is None:
            return None
        _, row = self._proven(seq, what)
        iid, kind, sealed = row[2], row[4], row[10]
        if sealed is None:
            return None
        return str(iid), str(kind), bytes(sealed)

    def head(self) -> tuple[int, str]:
        return self._read(lambda t: t.head(), "the journal's head")

    # -- results, leases and idempotency ------------------------------------------------------

    def read_result(
        self, invocation_id: str, *, from_chunk: int = 0
    ) -> results.StoredResult | None:
        """The stored result, or None unless its completeness marker exists.  A read, never a
        re-execution (seed: "treat repeated requests as reads").  ``from_chunk``: each stream
        from that chunk on (resuming a delivery).  ``JournalError`` if anything stored differs
        from its chained hashes."""
        if from_chunk < 0:
            raise ValueError("from_chunk must be >= 0")
        stream = self.result_stream(invocation_id)
        return None if stream is None else stream.read(from_chunk)

    def result_stream(self, invocation_id: str) -> results.ResultStream | None:
        """The stored result for reading chunk by chunk, each verified before it is handed
        out (``ResultStream.chunks``), or None unless its completeness marker exists."""
        with self.guarded(f"the stored result of invocation {invocation_id}"):
            return results.open_result(self, self._broker_key, invocation_id, covered=self._covered)

    def audit_result(
        self, invocation_id: str, private_key_file: str | os.PathLike[str]
    ) -> results.StoredResult | None:
        """The auditor's side: the result's auditor copy opened with the auditor's private key
        and checked against the chained hashes (None if the invocation has no stored result).
        The broker holds no key that opens it."""
        what = f"the auditor copy of invocation {invocation_id}"

        def covered(seq: int) -> Checkpoint:
            return self._proven(seq, f"{what} (its RESULT_COMMITTED event, seq {seq})")[0]

        with self.guarded(what):
            return audit.read_result(self, invocation_id, private_key_file, covered=covered)

    def audit_payload(
        self, seq: int, private_key_file: str | os.PathLike[str]
    ) -> Mapping[str, Any] | None:
        """The auditor's side: an event's sealed payload opened with the auditor's private key
        (None if the event has no auditor copy), once its row is proven (``audit_copy``)."""
        copy = self.audit_copy(seq)
        if copy is None:
            return None
        return open_audit_payload(copy[2], private_key_file, copy[0], copy[1])

    def lease(self, invocation_id: str) -> Lease | None:
        row = self._read(
            lambda t: t.lease(invocation_id), f"the lease of invocation {invocation_id}"
        )
        return lease_from_row(invocation_id, row)

    def find_idempotency(self, scope: str, key: str) -> IdempotencyRecord | None:
        row = self._read(
            lambda t: t.idempotency(scope, key), f"an idempotency record in scope {scope!r}"
        )
        return idempotency_from_row(row)

    def bound_record(self, binding: IdempotencyRecord, now: float | None = None) -> Record | None:
        """The record of the invocation ``binding`` names (``record``), once its chained
        ACTION_ACCEPTED proves the binding: it names the same scope, key and fingerprint
        (``bindings.py``) -- else ``AlteredRow``: a binding row pointed at another invocation
        would answer a retry with that invocation's result.  None while the invocation has no
        event yet (bound, first event not written) -- unless another invocation's chained
        ACTION_ACCEPTED names the key: then the row was pointed away from it (``AlteredRow``;
        one index probe, only on this path: ``Tables.accepted_with_key``)."""
        record = self.record(binding.invocation_id, now)
        if record is None:
            what = f"an idempotency record in scope {binding.scope!r}"
            named = self._read(lambda t: t.accepted_with_key(binding.scope, binding.key), what)
            if named is not None and named[1] != binding.invocation_id:
                raise bindings.unbound(self.where, binding, named[0])
            return None
        why = bindings.mismatch(binding, record)
        if why is not None:
            raise AlteredRow(
                f"journal {self.where}: the idempotency binding in scope {binding.scope!r} names "
                f"invocation {binding.invocation_id}, but {why}: the binding was altered"
            )
        return record

    def database_now(self, purpose: str | None = None) -> float | None:
        """Now by the clock a shared journal records and judges deadlines in -- the database's
        ``clock_timestamp()`` (``Tables.lease_now``) -- read outside any transaction; None
        where the journal has no clock of its own (SQLite: one host, the broker's clock).  A
        same-key retry is decided by it (a key's retention is recorded in that time), and
        decided again inside the transaction that takes its lease (``leases.acquire_op``).
        ``purpose``: the read it is for, named in an error (``the actions view``)."""
        what = "the database's clock" if purpose is None else f"the database's clock for {purpose}"
        return self._read(lambda t: t.lease_now(), what)

    def now(self, purpose: str | None = None) -> float:
        """Now by the clock this journal records and judges deadlines in -- a key's retention
        (a retry hint), an approval's expiry, a binding's age, a lease's end: the database's
        on a shared journal (``database_now``: a read, which may raise ``JournalError``), else
        this reader's clock (SQLite: one host, the broker's own).  The one place that choice
        is made outside a transaction; inside the writer's, ``leases.lease_now`` makes it.
        By each broker's own clock instead, a host running ahead (or behind) judged deadlines
        another broker recorded in the database's time.  ``purpose``: as ``database_now``."""
        shared = self.database_now(purpose)
        return self._clock() if shared is None else shared

    def _now(self, now: float | None, purpose: str) -> float:
        """When a read computes its records' retry hints: ``now`` if the caller gives its
        clock, else ``self.now`` at read time -- never the time of a record's last event,
        which would keep a hint as permissive as it was then (a same-key resend after the
        remote forgot the key)."""
        return self.now(purpose) if now is None else now

    # -- views --------------------------------------------------------------------------------

    def list_actions(
        self,
        session: str | None = None,
        outcome: Outcome | str | None = None,
        phase: Phase | str | None = None,
        since: float | None = None,
        until: float | None = None,
        now: float | None = None,
    ) -> list[Record]:
        """Projected records, oldest first.  ``since``/``until`` bound the time the action was
        accepted (a wall-clock label, inclusive).  ``now``: when every record's retry hint is
        computed (as ``record``: by default the reader's clock, read once for the whole view)."""
        at = self._now(now, "the actions view")
        folded = self._read(lambda t: views.fold(t, session, at), "the actions view")
        return list(_select(folded, outcome, phase, since, until))

    def iter_actions(
        self,
        session: str | None = None,
        outcome: Outcome | str | None = None,
        phase: Phase | str | None = None,
        since: float | None = None,
        until: float | None = None,
        now: float | None = None,
        span: tuple[int, int, int] | None = None,
    ) -> Iterator[Record]:
        """``list_actions``' records one at a time, same order, in bounded memory: the database
        groups the rows by invocation and one projection is held at a time (``affidavit
        actions`` streams its output from this).  A database error while iterating is a
        ``JournalError`` (``JournalUnavailable`` when the connection was lost: a stream is not
        begun again).  ``span``: ``(first, before, through)`` from ``action_spans``, only
        those invocations' records (``session`` must be None).  ``now``: as ``list_actions``
        (one clock reading for the whole stream, taken when it starts)."""
        if span is not None and session is not None:
            raise ValueError("a span of the actions view takes no session filter")
        stream = self._iter_actions(session, outcome, phase, since, until, now, span)
        self._streams.add(stream)
        return stream

    def _iter_actions(
        self,
        session: str | None,
        outcome: Outcome | str | None,
        phase: Phase | str | None,
        since: float | None,
        until: float | None,
        now: float | None,
        span: tuple[int, int, int] | None,
    ) -> Generator[Record, None, None]:
        folded = views.fold_each(self.tables, session, self._now(now, "the actions view"), span)
        want = _select(folded, outcome, phase, since, until)
        try:
            yield from want
        except AlteredRow as exc:
            raise self._altered("the actions view", exc) from None
        except self.backend.errors as exc:
            error = self._error("the actions view", exc)
            if self.backend.lost(exc):  # the database gone mid-stream: away, not altered
                raise JournalUnavailable(str(error)) from None
            raise error from None

    def newest_actions(
        self,
        limit: int,
        session: str | None = None,
        now: float | None = None,
        summary: SessionSummary | None = None,
    ) -> tuple[list[Record], int]:
        """The last ``limit`` of ``iter_actions(session=session)``'s records, in its order, and
        how many it yields in all -- reading the rows of the records shown, not the journal
        (``views.newest``); ``now`` as ``list_actions``.  The actions page of the daemon,
        MCP and the console (``affidavit.views.actions_page``).  ``summary`` (no session):
        the count from it when it keeps one (``SessionSummary.count``), in the same snapshot,
        instead of counting every invocation in the database."""
        if limit < 0:
            raise ValueError("limit must be >= 0")
        at = self._now(now, "the actions view")
        if summary is None or session is not None:
            return self._read(lambda t: views.newest(t, limit, session, at), "the actions view")

        def run(t: Tables) -> tuple[list[Record], int]:
            with self.snapshot():
                return views.newest(t, limit, None, at, summary.count(t, at))

        return self._read(run, "the actions view")

    def action_spans(self, parts: int, min_events: int) -> list[tuple[int, int, int]] | None:
        """``iter_actions`` (without a session filter) cut into ``parts`` spans of about as
        many invocations, each ``(first, before, through)``: their records, concatenated in
        this order, are ``iter_actions``' up to the journal's head now (``through``), so
        several processes may fold one each.  None for a journal of fewer than ``min_events``
        events, or one the backend cannot cut (only SQLite with a checked index can)."""
        cut = self._read(lambda t: t.action_spans(parts, min_events), "the actions view")
        if cut is None:
            return None
        cuts, through = cut
        return [(a, b, through) for a, b in itertools.pairwise(cuts)]

    def sessions(self) -> list[dict[str, Any]]:
        """One entry per session, in order of first appearance: its action count, counts by
        outcome, first and last seen.  Streamed (``views.fold_each``: one projection held at a
        time), so memory is O(sessions), never O(records) -- a caller names its sessions, a
        page of the newest is ``affidavit.views.newest_sessions``."""
        # Counts outcomes only: the hint is never shown, the time it is computed for is moot.
        at = self._clock()
        return self._read(lambda t: _by_session(views.fold_each(t, None, at)), "the sessions view")

    def summarized_sessions(self, summary: SessionSummary) -> list[dict[str, Any]]:
        """``sessions()``, from ``summary`` brought up to this journal's head (reading only
        the invocations with an event since it last read): the same entries."""
        at = self._clock()

        def run(t: Tables) -> list[dict[str, Any]]:
            with self.snapshot():
                return summary.sessions(t, at)

        return self._read(run, "the sessions view")

    def summarized_tallies(
        self, summary: SessionSummary, since: float | None = None
    ) -> dict[Hashable, int]:
        """How many records have each of ``summary``'s tallies, brought up to this journal's
        head as ``summarized_sessions``: ``views.metrics_of`` makes the metrics of the whole
        view from it (``views.metrics_key``: the same as ``metrics(iter_actions())``, or
        ``metrics(iter_actions(since=since))`` given ``since``)."""
        at = self._clock()

        def run(t: Tables) -> dict[Hashable, int]:
            with self.snapshot():
                return summary.tallies(t, at, since)

        return self._read(run, "the actions view")  # (as ``iter_actions`` names it)

    def summarized_page(
        self, summary: SessionSummary, limit: int
    ) -> tuple[dict[Hashable, int], list[Record], int]:
        """``summarized_tallies`` and ``newest_actions(limit)`` read in one snapshot, so the
        counts and the page are of one journal head (the console's unfiltered actions page)."""
        if limit < 0:
            raise ValueError("limit must be >= 0")
        at = self._now(None, "the actions view")

        def run(t: Tables) -> tuple[dict[Hashable, int], list[Record], int]:
            with self.snapshot():
                tallies = summary.tallies(t, at)
                records, total = views.newest(t, limit, None, at, summary.count(t, at))
                return tallies, records, total

        return self._read(run, "the actions view")

    # -- checkpoints, anchors and verify -------------------------------------------------------

    def latest_checkpoint(self) -> Checkpoint | None:
        return self._read(lambda t: t.latest_checkpoint(), "the latest checkpoint")

    def anchor(
        self, public_key: bytes | None = None, *, public_keys: Sequence[bytes] = ()
    ) -> tuple[VerifyReport, Anchor | None]:
        """Verify the journal with ``public_key`` / ``public_keys`` (default: the recorded
        ones) and, in the same read, take its last checkpoint as an anchor to keep elsewhere,
        with the key that signed it.  The anchor is None when the journal does not verify (an
        anchor must vouch only for a journal that does) or has no signed checkpoint.  Rows from
        before signing are accepted here: the anchor covers them as they are now."""
        given = _keys(public_key, public_keys)

        def run(t: Tables) -> tuple[VerifyReport, Checkpoint | None, dict[str, bytes]]:
            with self.snapshot():
                keys = given if given else recorded_keys(t)  # (in the rows' snapshot: verify)
                trust = Trust(keys, "public-key" if given else "journal", None, True)
                return verify_journal(_Source(t), trust), t.latest_checkpoint(), keys

        report, cp, keys = self._read(run, "the rows a verify checks")
        if not report.ok or cp is None or cp.key_id not in keys:
            return report, None
        return report, Anchor(cp, keys[cp.key_id])

    def verify(
        self,
        *,
        public_key: bytes | None = None,
        public_keys: Sequence[bytes] = (),
        anchor: Anchor | None = None,
        accept_unsigned: bool = False,
    ) -> VerifyReport:
        """Check the hash chain, the signed checkpoints, every stored result against its
        chained hashes and, given one, an anchor -- with public keys only; report the first bad
        seq (``verify.py`` says what each key proves).  The checkpoints are checked with
        ``public_key`` / ``public_keys`` (raw Ed25519 bytes: on a shared journal, one per
        broker), else the anchor's key, else the keys the journal records itself."""
        given = _keys(public_key, public_keys)
        fixed: Trust | None = None
        if given:
            fixed = Trust(given, "public-key", anchor, accept_unsigned)
        elif anchor is not None:
            fixed = Trust(_keys(anchor.public_raw, ()), "anchor", anchor, accept_unsigned)

        def run(t: Tables) -> VerifyReport:
            with self.snapshot():
                trust = fixed
                if trust is None:  # the recorded keys, read in the rows' snapshot (verify_since)
                    recorded = recorded_keys(t)
                    source = "journal" if recorded else "none"
                    trust = Trust(recorded, source, None, accept_unsigned)
                return _segments_hint(verify_journal(_Source(t), trust), t)

        return self._read(run, "the rows a verify checks")

    def verify_since(self, base: VerifyReport) -> VerifyReport | None:
        """``verify()``'s report extended to this journal's head from ``base`` (an intact
        report of ``verify()`` with the recorded keys, as the console's journal page keeps
        it): only the rows after the one ``base`` reached are read, with the results they
        commit (``verify.verify_after``
        says what that proves, and what not).  None when ``base`` cannot be extended -- not
        intact, the row it reached is gone or another (the journal was replaced, rewound or
        re-chained), or the recorded keys changed: a whole ``verify()`` is then due."""
        if not base.ok or base.head_hash is None or base.key_source not in ("journal", "none"):
            return None

        def run(t: Tables) -> VerifyReport | None:
            with self.snapshot():
                # The keys in the rows' snapshot: read before it, a broker of a shared journal
                # that registered its key and signed a checkpoint in between would have its
                # checkpoint reported signed by an unrecorded key (an intact journal: BROKEN).
                recorded = recorded_keys(t)
                if tuple(sorted(recorded)) != base.key_ids:
                    return None
                trust = Trust(recorded, "journal" if recorded else "none", None, False)
                here = GENESIS if base.count == 0 else t.hash_at(base.count)
                if here != base.head_hash:
                    return None
                rows = t.event_rows(base.count + 1)
                cps = t.checkpoints_after(base.signed_seq or 0)
                return verify_after(base, rows, cps, trust, (_Source(t), t.marker))

        return self._read(run, "the rows a verify checks")


class _Guard:
    """``JournalReader.guarded``: never swallows; converts the backend's errors."""

    __slots__ = ("reader", "what")

    def __init__(self, reader: JournalReader, what: str) -> None:
        self.reader = reader
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        reader = self.reader
        if exc is not None and isinstance(exc, reader.backend.errors):
            with contextlib.suppress(Exception):
                reader.backend.rollback(reader._rconn)
            error = reader._error(self.what, exc)
            if reader.backend.lost(exc):  # the database gone: away, not altered (as ``_read``)
                raise JournalUnavailable(str(error)) from None
            raise error from None


def _keys(one: bytes | None, more: Sequence[bytes]) -> dict[str, bytes]:
    raws = ([one] if one is not None else []) + list(more)
    return {key_id_of(raw): raw for raw in raws}


def _select(
    folded: Iterable[tuple[Record, float | None, float | None]],
    outcome: Outcome | str | None,
    phase: Phase | str | None,
    since: float | None,
    until: float | None,
) -> Iterator[Record]:
    """The actions view's filters over folded (record, first_at, last_at) entries."""
    want_outcome = Outcome(outcome) if outcome is not None else None
    want_phase = Phase(phase) if phase is not None else None
    for rec, first_at, _ in folded:
        if want_outcome is not None and rec.outcome is not want_outcome:
            continue
        if want_phase is not None and rec.phase is not want_phase:
            continue
        if since is not None and (first_at is None or first_at < since):
            continue
        if until is not None and (first_at is None or first_at > until):
            continue
        yield rec


def _by_session(
    folded: Iterable[tuple[Record, float | None, float | None]],
) -> list[dict[str, Any]]:
    """``JournalReader.sessions``' entries from a stream of ``(record, first_at, last_at)``."""
    by: dict[str | None, dict[str, Any]] = {}
    for rec, first_at, last_at in folded:
        s = by.get(rec.session)
        if s is None:
            s = by[rec.session] = {
                "session": rec.session,
                "actions": 0,
                "outcomes": {},
                "first_seen": first_at,
                "last_seen": last_at,
            }
        s["actions"] += 1
        s["outcomes"][rec.outcome.value] = s["outcomes"].get(rec.outcome.value, 0) + 1
        if first_at is not None and (s["first_seen"] is None or first_at < s["first_seen"]):
            s["first_seen"] = first_at
        if last_at is not None and (s["last_seen"] is None or last_at > s["last_seen"]):
            s["last_seen"] = last_at
    return list(by.values())
