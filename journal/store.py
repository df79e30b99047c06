"""The journal: append-only SQLite store with durability barriers and group commit.

Seed, "Dispatch shifts the burden of proof": DISPATCH_STARTED must be durable before the first
byte reaches the transport, and RESULT_COMMITTED before delivery.  ``append(..., barrier=True)``
returns only after the commit that makes the event durable (WAL, ``synchronous=FULL``: SQLite
fsyncs the WAL at that commit).  One writer task batches everything queued into one transaction,
so concurrent invocations share one fsync (group commit).  A batch with no barrier commits with
``synchronous=NORMAL``: it survives a process crash (the WAL is in the OS cache) and becomes
power-loss durable with the next barrier's fsync, which covers every earlier WAL frame — recovery
never depends on such events.

``seq`` and ``prev_hash`` are computed inside ``BEGIN IMMEDIATE``, so a second process appending
to the same file (SQLite serialises writers) extends the same chain instead of forking it.

Reading methods are synchronous and use their own connection: WAL lets them run while the writer
commits, and from other processes.  ``JournalReader`` opens a journal read-only, without the
broker key, for views and ``verify``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import json
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import trio

from affidavit.statemachine import (
    BARRIER_KINDS,
    Event,
    EventKind,
    EvidenceSource,
    ImpossibleEvent,
    Outcome,
    Phase,
    Projector,
    Record,
)

from .chain import (
    EVENT_COLUMNS,
    GENESIS,
    SCHEMA,
    SCHEMA_VERSION,
    canonical_json,
    row_digest,
    verify_connection,
)
from .errors import (
    IdempotencyMismatch,
    IdempotencyRecord,
    JournalError,
    JournalWriteError,
    Lease,
    LeaseBusy,
    LeaseLost,
    ResultStoreFailed,
    VerifyReport,
)
from .sealing import AuditSealer, BrokerKey, open_audit

__all__ = ["Journal", "JournalReader", "Posted", "StoredResult"]

T = TypeVar("T")

BUSY_TIMEOUT_MS = 30_000
MAX_BATCH = 2048
_PROJECTOR_CACHE = 50_000
_KINDS = {k.value: k for k in EventKind}
_BARRIER_VALUES = frozenset(k.value for k in BARRIER_KINDS)
"""By value: ``kind in BARRIER_KINDS`` hashes the enum in Python (``Enum.__hash__``)."""
_SOURCES = {s.value: s for s in EvidenceSource}
_READ_COLUMNS = "seq, at, invocation_id, session_id, kind, source, observer, observer_seq, attrs"


@dataclass(frozen=True, slots=True)
class StoredResult:
    """A complete stored result: only ever built from a completeness marker whose hashes match."""

    invocation_id: str
    summary: Mapping[str, Any]
    streams: dict[str, bytes]
    sha256: str
    seq: int
    """The RESULT_COMMITTED event's seq."""


_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _loads(text: str) -> Any:
    """``json.loads`` for the journal's own canonical JSON (no surrounding whitespace): the C
    scanner straight away, skipping ``loads``' argument checks and whitespace regexes (one call
    per row read); anything else goes through ``json.loads`` and its errors."""
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        return json.loads(text)
    if end != len(text):
        return json.loads(text)
    return value


def _event_from_row(row: tuple[Any, ...]) -> Event:
    return Event(
        _KINDS[row[4]], row[2], _loads(row[8]), _SOURCES[row[5]], row[0], row[1], row[6], row[7]
    )


def _aad(*parts: str | int) -> bytes:
    return "\0".join(str(p) for p in parts).encode("utf-8")


def payload_aad(invocation_id: str, kind: str) -> bytes:
    """Associated data of an event payload (broker copy and audit copy)."""
    return _aad("payload", invocation_id, kind)


def open_audit_payload(
    sealed: bytes, private_key_file: str | os.PathLike[str], invocation_id: str, kind: str
) -> Mapping[str, Any]:
    """The auditor's side: open an event's audit copy with the auditor's private key."""
    data = open_audit(sealed, private_key_file, payload_aad(invocation_id, kind))
    value: Mapping[str, Any] = json.loads(data)
    return value


def _whole_sha256(per_stream: Mapping[str, Mapping[str, Any]]) -> str:
    """The whole result's hash: SHA-256 of the canonical JSON ``{stream: stream_sha256}``."""
    return hashlib.sha256(
        canonical_json({s: v["sha256"] for s, v in per_stream.items()}).encode()
    ).hexdigest()


def _lease_from_row(invocation_id: str, row: tuple[Any, ...] | None) -> Lease | None:
    if row is None:
        return None
    return Lease(
        generation=row[1], expires_at=row[2], holder=row[0], invocation_id=invocation_id, seq=row[3]
    )


def _idem_from_row(row: tuple[Any, ...] | None) -> IdempotencyRecord | None:
    if row is None:
        return None
    return IdempotencyRecord(
        scope=row[0],
        key=row[1],
        fingerprint=row[2],
        invocation_id=row[3],
        expires_at=row[4],
        created_at=row[5],
    )


# --- reading -------------------------------------------------------------------------------


class JournalReader:
    """Synchronous reads.  Opened on its own (``JournalReader.open``) it is read-only and needs
    no key unless results or payloads are read."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        key_file: str | os.PathLike[str] | None = None,
        readonly: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self._clock = clock
        self._key_file = Path(key_file) if key_file is not None else Path(f"{self.path}.key")
        self._key: BrokerKey | None = None
        if readonly:
            if not self.path.exists():
                raise JournalError(f"no journal at {self.path}")
            uri = f"file:{quote(str(self.path.resolve()))}?mode=ro"
            try:
                # connect() itself fails on a directory or an unopenable file ("disk I/O
                # error"): the same clear JournalError as a file that is not a journal.
                self._rconn = sqlite3.connect(
                    uri, uri=True, isolation_level=None, check_same_thread=False
                )
            except sqlite3.Error as exc:
                raise JournalError(f"{self.path} is not a readable journal: {exc}") from None
            try:
                self._rconn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
                self._rconn.execute("SELECT 1 FROM events LIMIT 1").fetchall()
            except sqlite3.Error as exc:
                self._rconn.close()
                raise JournalError(f"{self.path} is not a readable journal: {exc}") from None
        else:
            self._rconn = sqlite3.connect(
                str(self.path), isolation_level=None, check_same_thread=False
            )
            self._rconn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], *, key_file: str | os.PathLike[str] | None = None
    ) -> JournalReader:
        return cls(path, key_file=key_file, readonly=True)

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
        self._rconn.close()

    # -- keys ---------------------------------------------------------------------------------

    def _broker_key(self) -> BrokerKey:
        if self._key is None:
            key = BrokerKey.load(self._key_file)
            stored = self._meta("key_id")
            if stored is not None and stored != key.key_id:
                raise JournalError(f"broker key file {self._key_file} does not match this journal")
            self._key = key
        return self._key

    def _meta(self, name: str) -> str | None:
        row = self._rconn.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return None if row is None else str(row[0])

    # -- events and records -------------------------------------------------------------------

    def events(self, invocation_id: str) -> list[Event]:
        cur = self._rconn.execute(
            f"SELECT {_READ_COLUMNS} FROM events WHERE invocation_id = ? ORDER BY seq",
            (invocation_id,),
        )
        return [_event_from_row(r) for r in cur]

    def record(self, invocation_id: str, now: float | None = None) -> Record | None:
        events = self.events(invocation_id)
        if not events:
            return None
        return Projector(invocation_id).extend(events).record(now)

    def payload(self, seq: int) -> Mapping[str, Any] | None:
        """The broker copy of an event's sealed payload (None if the event has none)."""
        row = self._rconn.execute(
            "SELECT invocation_id, kind, payload FROM events WHERE seq = ?", (seq,)
        ).fetchone()
        if row is None or row[2] is None:
            return None
        data = self._broker_key().open(row[2], payload_aad(row[0], row[1]))
        value: Mapping[str, Any] = json.loads(data)
        return value

    def audit_copy(self, seq: int) -> tuple[str, str, bytes] | None:
        """``(invocation_id, kind, sealed)`` of an event's audit copy, for the auditor to open
        with ``open_audit_payload``; the broker cannot open it."""
        row = self._rconn.execute(
            "SELECT invocation_id, kind, audit FROM events WHERE seq = ?", (seq,)
        ).fetchone()
        if row is None or row[2] is None:
            return None
        return str(row[0]), str(row[1]), bytes(row[2])

    def head(self) -> tuple[int, str]:
        row = self._rconn.execute(
            "SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        return (0, GENESIS) if row is None else (int(row[0]), str(row[1]))

    # -- results ------------------------------------------------------------------------------

    def read_result(self, invocation_id: str) -> StoredResult | None:
        """The stored result, or None unless its completeness marker exists.  A read, never a
        re-execution (seed: "treat repeated requests as reads")."""
        conn = self._rconn
        conn.execute("BEGIN")
        try:
            marker = conn.execute(
                "SELECT seq, sha256, streams, summary FROM results WHERE invocation_id = ?",
                (invocation_id,),
            ).fetchone()
            if marker is None:
                return None
            seq, sha, streams_json, summary_blob = marker
            ev = conn.execute(
                "SELECT kind, invocation_id, attrs FROM events WHERE seq = ?", (seq,)
            ).fetchone()
            chunks = conn.execute(
                "SELECT stream, idx, data FROM result_chunks WHERE invocation_id = ? "
                "ORDER BY stream, idx",
                (invocation_id,),
            ).fetchall()
        finally:
            conn.execute("COMMIT")
        bad = f"stored result of invocation {invocation_id} (seq {seq}) fails verification"
        if ev is None or ev[0] != EventKind.RESULT_COMMITTED.value or ev[1] != invocation_id:
            raise JournalError(f"{bad}: no RESULT_COMMITTED event at its seq")
        chained = json.loads(ev[2])
        if chained.get("sha256") != sha:
            raise JournalError(f"{bad}: marker hash differs from the chained event")
        declared: dict[str, dict[str, Any]] = json.loads(streams_json)
        key = self._broker_key()
        parts: dict[str, list[bytes]] = {s: [] for s in declared}
        for stream, idx, data in chunks:
            if stream not in parts or idx != len(parts[stream]):
                continue  # chunks beyond the marker's count are not part of the result
            parts[stream].append(key.open(data, _aad("result", invocation_id, stream, idx)))
        streams: dict[str, bytes] = {}
        for stream, info in declared.items():
            got = parts[stream][: info["chunks"]]
            body = b"".join(got)
            if len(got) != info["chunks"] or hashlib.sha256(body).hexdigest() != info["sha256"]:
                raise JournalError(f"{bad}: stream {stream!r} is incomplete or altered")
            streams[stream] = body
        if _whole_sha256(declared) != sha:
            raise JournalError(f"{bad}: whole-result hash differs")
        summary_bytes = key.open(summary_blob, _aad("summary", invocation_id))
        want = chained.get("summary_sha256")
        if want is not None and hashlib.sha256(summary_bytes).hexdigest() != want:
            raise JournalError(f"{bad}: summary differs from the chained event")
        summary: Mapping[str, Any] = json.loads(summary_bytes)
        return StoredResult(invocation_id, summary, streams, sha, seq)

    # -- leases and idempotency ---------------------------------------------------------------

    def lease(self, invocation_id: str) -> Lease | None:
        row = self._rconn.execute(
            "SELECT holder, generation, expires_at, seq FROM leases WHERE invocation_id = ?",
            (invocation_id,),
        ).fetchone()
        return _lease_from_row(invocation_id, row)

    def find_idempotency(self, scope: str, key: str) -> IdempotencyRecord | None:
        row = self._rconn.execute(
            "SELECT scope, key, fingerprint, invocation_id, expires_at, created_at "
            "FROM idempotency WHERE scope = ? AND key = ?",
            (scope, key),
        ).fetchone()
        return _idem_from_row(row)

    # -- views --------------------------------------------------------------------------------

    def _fold(
        self, session: str | None, now: float | None
    ) -> list[tuple[Record, float | None, float | None]]:
        """(record, first_at, last_at) per invocation, in order of first appearance."""
        if session is None:
            cur = self._rconn.execute(f"SELECT {_READ_COLUMNS} FROM events ORDER BY seq")
        else:
            cur = self._rconn.execute(
                f"SELECT {_READ_COLUMNS} FROM events WHERE session_id = ? ORDER BY seq",
                (session,),
            )
        folds: dict[str, Projector] = {}
        first: dict[str, float] = {}
        last: dict[str, float] = {}
        get = folds.get
        apply = Projector.apply
        kinds, sources, loads = _KINDS, _SOURCES, _loads
        # As statemachine.project_all: the fold allocates many small acyclic objects, and
        # automatic cyclic-GC passes over them cost as much as the fold; refcounting frees all.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            for seq, at, iid, _session, kind, source, observer, observer_seq, attrs in cur:
                p = get(iid)
                if p is None:
                    p = folds[iid] = Projector(iid)
                    first[iid] = at
                apply(
                    p,
                    Event(
                        kinds[kind], iid, loads(attrs), sources[source], seq, at, observer,
                        observer_seq,
                    ),
                )  # fmt: skip
                last[iid] = at
            return [(p.record(now), first[iid], last[iid]) for iid, p in folds.items()]
        finally:
            if gc_was_enabled:
                gc.enable()

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
        accepted (a wall-clock label, inclusive)."""
        want_outcome = Outcome(outcome) if outcome is not None else None
        want_phase = Phase(phase) if phase is not None else None
        out: list[Record] = []
        for rec, first_at, _ in self._fold(session, now):
            if want_outcome is not None and rec.outcome is not want_outcome:
                continue
            if want_phase is not None and rec.phase is not want_phase:
                continue
            if since is not None and (first_at is None or first_at < since):
                continue
            if until is not None and (first_at is None or first_at > until):
                continue
            out.append(rec)
        return out

    def sessions(self) -> list[dict[str, Any]]:
        """One entry per session: its action count, counts by outcome, first and last seen."""
        by: dict[str | None, dict[str, Any]] = {}
        for rec, first_at, last_at in self._fold(None, None):
            s = by.setdefault(
                rec.session,
                {
                    "session": rec.session,
                    "actions": 0,
                    "outcomes": {},
                    "first_seen": first_at,
                    "last_seen": last_at,
                },
            )
            s["actions"] += 1
            s["outcomes"][rec.outcome.value] = s["outcomes"].get(rec.outcome.value, 0) + 1
            if first_at is not None and (s["first_seen"] is None or first_at < s["first_seen"]):
                s["first_seen"] = first_at
            if last_at is not None and (s["last_seen"] is None or last_at > s["last_seen"]):
                s["last_seen"] = last_at
        return list(by.values())

    def verify(self) -> VerifyReport:
        """Recompute the hash chain (no key needed); report the first bad seq."""
        self._rconn.execute("BEGIN")
        try:
            return verify_connection(self._rconn)
        finally:
            self._rconn.execute("COMMIT")


# --- writing -------------------------------------------------------------------------------


@dataclass(eq=False)
class _Fail:
    """An op's answer when it wrote something (LEASE_LOST) but must still raise to the caller."""

    error: BaseException


class _Req(Generic[T]):
    """One queued write: ``op`` runs in the writer's transaction, or, for a plain append
    (``op`` None), ``_Txn.insert(*args)`` does without a closure."""

    __slots__ = (
        "args",
        "barrier",
        "error",
        "finished",
        "op",
        "parked",
        "result",
        "result_store",
        "task",
    )

    def __init__(
        self,
        op: Callable[[_Txn], T | _Fail] | None,
        args: tuple[Any, ...] | None,
        barrier: bool,
        result_store: bool,
        task: trio.lowlevel.Task | None,
    ) -> None:
        self.op = op
        self.args = args
        self.barrier = barrier
        self.result_store = result_store
        self.task = task
        self.parked = False
        self.finished = False
        self.result: T | None = None
        self.error: BaseException | None = None


class Posted(Generic[T]):
    """A write queued by ``Journal.post`` whose commit its author did not wait for."""

    __slots__ = ("_req",)

    def __init__(self, req: _Req[T]) -> None:
        self._req = req

    @property
    def finished(self) -> bool:
        return self._req.finished

    async def wait(self) -> T:
        """The write's answer once its transaction ended (raising its error, if it failed).
        Not cancellable, like every journal write; one task at a time may wait."""
        req = self._req
        if not req.finished:
            assert not req.parked, "another task already waits for this write"
            req.task = trio.lowlevel.current_task()
            req.parked = True
            await trio.lowlevel.wait_task_rescheduled(_cannot_abort)
        if req.error is not None:
            raise req.error
        return req.result  # type: ignore[return-value]


_INSERT = f"INSERT INTO events ({EVENT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"


class _Txn:
    """State of one writer transaction: the chain head as this transaction extends it, and the
    rows computed but not yet handed to SQLite (one ``executemany`` per run of appends)."""

    __slots__ = ("conn", "digest", "hash", "journal", "rows", "seq")

    def __init__(self, journal: Journal, conn: sqlite3.Connection, seq: int, hash_: str) -> None:
        self.journal = journal
        self.conn = conn
        self.seq = seq
        self.hash = hash_
        self.digest = bytes.fromhex(hash_)
        self.rows: list[tuple[Any, ...]] = []

    def flush(self) -> None:
        """Insert the pending rows (the schema's trigger checks each extends the chain)."""
        if self.rows:
            self.conn.executemany(_INSERT, self.rows)
            self.rows.clear()

    def insert(
        self,
        event: Event,
        attrs_text: str,
        payload: bytes | None = None,
        audit: bytes | None = None,
        attrs: Mapping[str, Any] | None = None,
    ) -> Event:
        """Validate (projection), chain and queue one row; return the stored event.  ``attrs``
        is ``attrs_text`` decoded, so the writer's projection holds exactly what a reader of the
        file folds (see ``Journal.record``)."""
        j = self.journal
        iid = event.invocation_id
        proj = j._projectors.get(iid)
        if proj is None:
            proj = j._load_projector(self.conn, iid)
        kind = event.kind
        if kind is EventKind.ACTION_ACCEPTED:
            raw = event.attrs.get("session")
            session = None if raw is None else str(raw)
        else:
            session = j._sessions.get(iid)
        seq = self.seq + 1
        at = float(event.at) if event.at is not None else j._clock()
        observer = event.observer
        observer_seq = event.observer_seq
        stored = Event(
            kind,
            iid,
            event.attrs if attrs is None else attrs,
            event.source,
            seq,
            at,
            observer,
            observer_seq,
        )
        kind_v = kind._value_  # not .value: a Python-level property, twice per row
        source_v = event.source._value_
        # The digest first: once the projection has applied the event, nothing may fail before
        # its row is queued (``Journal.record`` serves that projection as the file's state).
        digest = row_digest(
            self.digest,
            seq,
            at,
            iid,
            session,
            kind_v,
            source_v,
            observer,
            observer_seq,
            attrs_text,
            payload,
            audit,
        )
        try:
            proj.apply(stored)  # ImpossibleEvent: nothing written, projector unchanged
        except ImpossibleEvent:
            raise
        except Exception:
            j._projectors.pop(iid, None)  # a fold that failed midway: reload it from the file
            raise
        j._sessions[iid] = session
        h = digest.hex()
        self.rows.append(
            (
                seq,
                at,
                iid,
                session,
                kind_v,
                source_v,
                observer,
                observer_seq,
                attrs_text,
                payload,
                audit,
                self.hash,
                h,
            )
        )
        self.seq, self.hash, self.digest = seq, h, digest
        return stored


class _Opener:
    """``async with Journal.open(...) as j``: open, start the writer, drain and close."""

    def __init__(self, args: dict[str, Any]) -> None:
        self._args = args
        self._journal: Journal | None = None

    async def __aenter__(self) -> Journal:
        j = await trio.to_thread.run_sync(lambda: Journal(**self._args))
        try:
            await j._start()
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
        await self._journal._stop()


class Journal(JournalReader):
    """The writing journal.  Use ``async with Journal.open(path) as j``."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        key_file: str | os.PathLike[str] | None = None,
        auditor_public_key: str | os.PathLike[str] | None = None,
        payload_copy: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(path, key_file=key_file, readonly=False, clock=clock)
        self._audit = AuditSealer.load(auditor_public_key) if auditor_public_key else None
        self._payload_copy = payload_copy or self._audit is None
        try:
            self._wconn = sqlite3.connect(
                str(self.path),
                isolation_level=None,
                check_same_thread=False,
                timeout=BUSY_TIMEOUT_MS / 1000,
            )
            self._wconn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            mode = self._wconn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise JournalError(f"{self.path}: cannot switch the journal to WAL mode")
            self._wconn.execute("PRAGMA synchronous=FULL")
            # Checkpoint less often (each checkpoint fsyncs the database file as well), and cap
            # the WAL file left behind after one.
            self._wconn.execute("PRAGMA wal_autocheckpoint=10000")
            self._wconn.execute("PRAGMA journal_size_limit=67108864")
            self._sync = "FULL"
            self._init_schema()
        except sqlite3.Error as exc:
            self.close()
            raise JournalError(f"cannot open journal {self.path}: {exc}") from None
        except BaseException:
            self.close()
            raise
        self._projectors: dict[str, Projector] = {}
        self._sessions: dict[str, str | None] = {}
        self._known_head: int | None = None
        """The seq this writer last committed (None: unknown; the caches are empty)."""
        self._busy = False
        """A batch is in the writer thread: the cached projectors may be mid-change."""
        self._loop_thread: int | None = None
        """The thread running the trio loop (the only one that may read the caches)."""
        self._send: trio.MemorySendChannel[_Req[Any]] | None = None
        self._recv: trio.MemoryReceiveChannel[_Req[Any]] | None = None
        self._nursery_mgr: contextlib.AbstractAsyncContextManager[trio.Nursery] | None = None
        self._nursery: trio.Nursery | None = None
        self._limiter = trio.CapacityLimiter(1)
        self._before_commit: Callable[[], None] | None = None
        """Test hook: runs in the writer thread inside the open transaction (crash tests)."""

    @classmethod
    def open(  # type: ignore[override]
        cls,
        path: str | os.PathLike[str],
        *,
        key_file: str | os.PathLike[str] | None = None,
        auditor_public_key: str | os.PathLike[str] | None = None,
        payload_copy: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> _Opener:
        """Open (creating if absent) and start the single writer task.  ``key_file`` defaults
        to ``<path>.key`` and is created 0600 for a new journal.  ``payload_copy=False`` with an
        auditor key makes payloads write-only: sealed to the auditor alone."""
        return _Opener(
            {
                "path": path,
                "key_file": key_file,
                "auditor_public_key": auditor_public_key,
                "payload_copy": payload_copy,
                "clock": clock,
            }
        )

    def _init_schema(self) -> None:
        c = self._wconn
        c.execute("BEGIN IMMEDIATE")
        try:
            # executescript() would COMMIT first; run the statements inside our transaction.
            for stmt in _split_sql(SCHEMA):
                c.execute(stmt)
            c.execute(
                "INSERT OR IGNORE INTO meta (name, value) VALUES ('schema', ?)",
                (str(SCHEMA_VERSION),),
            )
            row = c.execute("SELECT value FROM meta WHERE name = 'key_id'").fetchone()
            if row is None:
                key = (
                    BrokerKey.load(self._key_file)
                    if self._key_file.exists()
                    else BrokerKey.create(self._key_file)
                )
                c.execute("INSERT INTO meta (name, value) VALUES ('key_id', ?)", (key.key_id,))
            else:
                key = BrokerKey.load(self._key_file)
                if key.key_id != row[0]:
                    raise JournalError(
                        f"broker key file {self._key_file} does not match journal {self.path}"
                    )
            self._key = key
            c.execute("COMMIT")
        except BaseException:
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise

    # -- reads served from the writer's projections -------------------------------------------

    def record(self, invocation_id: str, now: float | None = None) -> Record | None:
        """As ``JournalReader.record``; for an invocation this writer has folded, answered from
        its projection without reading the events back -- but only when that projection is the
        file's state: called on the trio thread while no batch is in the writer thread, and the
        file's last seq is the one this writer committed (another process may append to the
        same file; then the events are read and folded as usual).  The writer's projection
        folds the same stored events a reader would (attrs decoded from their stored JSON)."""
        p = self._projectors.get(invocation_id)
        if (
            p is not None
            and not self._busy
            and self._known_head is not None
            and threading.get_ident() == self._loop_thread
            and self._last_seq() == self._known_head
        ):
            return p.record(now)
        return super().record(invocation_id, now)

    def _last_seq(self) -> int:
        row = self._rconn.execute("SELECT max(seq) FROM events").fetchone()
        return 0 if row is None or row[0] is None else int(row[0])

    def close(self) -> None:
        conn = getattr(self, "_wconn", None)
        if conn is not None:
            conn.close()
        super().close()

    # -- writer task --------------------------------------------------------------------------

    async def _start(self) -> None:
        self._loop_thread = threading.get_ident()
        self._send, self._recv = trio.open_memory_channel[_Req[Any]](MAX_BATCH * 4)
        mgr = trio.open_nursery()
        nursery = await mgr.__aenter__()
        self._nursery_mgr = mgr
        self._nursery = nursery
        nursery.start_soon(self._writer)

    async def _stop(self) -> None:
        assert self._send is not None
        self._send.close()
        try:
            # The writer drains what is queued even if our caller was cancelled: a queued
            # barrier's submitter is waiting (shielded) for its answer.
            assert self._nursery_mgr is not None and self._nursery is not None
            self._nursery.cancel_scope.shield = True
            await self._nursery_mgr.__aexit__(None, None, None)
        finally:
            self.close()

    async def _writer(self) -> None:
        assert self._recv is not None
        recv = self._recv
        with trio.CancelScope(shield=True):
            while True:
                try:
                    first = await recv.receive()
                except trio.EndOfChannel:
                    return
                # Let appenders woken by the previous commit queue up, so they share this fsync.
                await trio.sleep(0)
                batch = [first]
                while len(batch) < MAX_BATCH:
                    try:
                        batch.append(recv.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                self._busy = True
                try:
                    await trio.to_thread.run_sync(self._run_batch, batch, limiter=self._limiter)
                except Exception as exc:  # a bug, not a storage fault: fail the batch, go on
                    self._forget()
                    for r in batch:
                        r.error = JournalError(f"journal writer failed: {exc!r}")
                finally:
                    self._busy = False
                    for r in batch:
                        r.finished = True
                        if r.parked:
                            assert r.task is not None
                            trio.lowlevel.reschedule(r.task)

    def _forget(self) -> None:
        self._projectors.clear()
        self._sessions.clear()
        self._known_head = None

    def _run_batch(self, batch: list[_Req[Any]]) -> None:
        conn = self._wconn
        want = "FULL" if any(r.barrier for r in batch) else "NORMAL"
        try:
            if self._sync != want:
                conn.execute(f"PRAGMA synchronous={want}")
                self._sync = want
            conn.execute("BEGIN IMMEDIATE")
            try:
                row = conn.execute(
                    "SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1"
                ).fetchone()
                seq, h = (0, GENESIS) if row is None else (int(row[0]), str(row[1]))
                if seq != self._known_head or len(self._projectors) > _PROJECTOR_CACHE:
                    # Another process appended (or we lost track): reload projections lazily.
                    self._forget()
                txn = _Txn(self, conn, seq, h)
                insert = txn.insert
                for r in batch:
                    # Ops raise their refusals (ImpossibleEvent, JournalError...) before they
                    # write anything, so a refusal needs no savepoint; one that wrote first is a
                    # bug, and the whole batch is rolled back rather than half-kept.
                    op = r.op
                    if op is None:  # a plain append: its row joins the pending executemany
                        try:
                            r.result = insert(*r.args)  # type: ignore[misc]
                        except sqlite3.Error:
                            raise
                        except Exception as exc:  # refused before queueing a row
                            r.error = exc
                        continue
                    txn.flush()  # other ops may read or write rows (results, leases...)
                    mark = txn.seq
                    try:
                        out = op(txn)
                    except sqlite3.Error:
                        raise
                    except Exception as exc:
                        if txn.seq != mark:
                            raise
                        r.error = exc
                    else:
                        if isinstance(out, _Fail):
                            r.error = out.error
                        else:
                            r.result = out
                txn.flush()
                if self._before_commit is not None:
                    self._before_commit()
                conn.execute("COMMIT")
                self._known_head = txn.seq
            except BaseException:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            self._forget()
            for r in batch:
                r.result = None
                cls = ResultStoreFailed if r.result_store else JournalWriteError
                r.error = cls(f"journal {self.path}: write not committed: {exc}")

    def _load_projector(self, conn: sqlite3.Connection, iid: str) -> Projector:
        """Fold an invocation the writer has not cached (writer thread, inside its
        transaction)."""
        p = Projector(iid)
        session: str | None = None
        for row in conn.execute(
            f"SELECT {_READ_COLUMNS} FROM events WHERE invocation_id = ? ORDER BY seq", (iid,)
        ):
            p.apply(_event_from_row(row))
            if session is None and row[3] is not None:
                session = row[3]
        self._projectors[iid] = p
        self._sessions[iid] = session
        return p

    def _projector(self, conn: sqlite3.Connection, iid: str) -> Projector:
        p = self._projectors.get(iid)
        return self._load_projector(conn, iid) if p is None else p

    async def _enqueue(
        self,
        op: Callable[[_Txn], T | _Fail] | None,
        args: tuple[Any, ...] | None = None,
        *,
        barrier: bool,
        result_store: bool = False,
        task: trio.lowlevel.Task | None = None,
    ) -> _Req[T]:
        send = self._send
        if send is None:
            raise JournalError("journal is not open for writing (use `async with Journal.open`)")
        req: _Req[T] = _Req(op, args, barrier, result_store, task)
        try:
            try:
                send.send_nowait(req)  # no checkpoint between queueing and parking
            except trio.WouldBlock:
                await send.send(req)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise JournalError(f"journal {self.path} is closed") from None
        return req

    async def _submit(
        self,
        op: Callable[[_Txn], T | _Fail] | None,
        args: tuple[Any, ...] | None = None,
        *,
        barrier: bool,
        result_store: bool = False,
    ) -> T:
        task = trio.lowlevel.current_task()
        req = await self._enqueue(op, args, barrier=barrier, result_store=result_store, task=task)
        # Once queued, the write will happen: wait for its answer without being cancellable,
        # so a caller never loses track of a barrier that did commit (seed: classify by the
        # last proven boundary).  A pending cancellation is delivered at the next checkpoint.
        # (Posted.wait inlined: this runs once per append.)
        if not req.finished:
            req.parked = True
            await trio.lowlevel.wait_task_rescheduled(_cannot_abort)
        if req.error is not None:
            raise req.error
        return req.result  # type: ignore[return-value]

    # -- public writes --------------------------------------------------------------------------

    def _seal_payload(
        self, event: Event, payload: Mapping[str, Any] | None
    ) -> tuple[bytes | None, bytes | None]:
        if payload is None:
            return None, None
        data = canonical_json(payload).encode("utf-8")
        aad = payload_aad(event.invocation_id, event.kind.value)
        assert self._key is not None
        mine = self._key.seal(data, aad) if self._payload_copy else None
        audit = self._audit.seal(data, aad) if self._audit is not None else None
        return mine, audit

    async def append(
        self,
        event: Event,
        *,
        barrier: bool = False,
        payload: Mapping[str, Any] | None = None,
        lease: tuple[str, int] | None = None,
    ) -> Event:
        """Append one event; return it with ``seq`` and ``at`` assigned.

        Raises ``ImpossibleEvent`` (nothing written) if the lifecycle refuses it, ``LeaseLost``
        if ``lease=(holder, generation)`` is stale or expired (checked in the same transaction),
        ``JournalWriteError`` on a storage fault.  DISPATCH_STARTED and RESULT_COMMITTED are
        always barriers."""
        attrs_text = _attrs_json(event)
        # Encoded and decoded here, in the submitting task, not in the single writer.
        if payload is None:
            args: tuple[Any, ...] = (event, attrs_text, None, None, _loads(attrs_text))
        else:
            args = (event, attrs_text, *self._seal_payload(event, payload), _loads(attrs_text))
        barrier = barrier or event.kind._value_ in _BARRIER_VALUES
        if lease is None:
            return await self._submit(None, args, barrier=barrier)

        def op(txn: _Txn) -> Event | _Fail:
            lost = self._check_lease(txn, event.invocation_id, lease)
            if lost is not None:
                return lost
            return txn.insert(*args)

        return await self._submit(op, barrier=barrier)

    async def post(
        self, event: Event, *, payload: Mapping[str, Any] | None = None
    ) -> Posted[Event]:
        """Queue a diagnostic (non-barrier) event and return without waiting for its commit.

        DESIGN, "Durability barriers": diagnostic events between barriers may ride along with
        the next barrier's transaction; recovery never depends on them.  The single writer keeps
        queue order, so once any write queued later has returned, this event has been committed
        in that transaction or an earlier one -- or it failed, and ``Posted.wait()`` raises why
        (``ImpossibleEvent``, ``JournalWriteError``, as ``append`` would have).  Barrier kinds
        (DISPATCH_STARTED, RESULT_COMMITTED) cannot be posted."""
        if event.kind in BARRIER_KINDS:
            raise ValueError(f"{event.kind.value} is a durability barrier: use append()")
        attrs_text = _attrs_json(event)
        args = (event, attrs_text, *self._seal_payload(event, payload), _loads(attrs_text))
        return Posted(await self._enqueue(None, args, barrier=False))

    def _check_lease(self, txn: _Txn, iid: str, lease: tuple[str, int]) -> _Fail | None:
        holder, generation = lease
        row = txn.conn.execute(
            "SELECT holder, generation, expires_at, seq FROM leases WHERE invocation_id = ?",
            (iid,),
        ).fetchone()
        current = _lease_from_row(iid, row)
        if (
            current is not None
            and current.holder == holder
            and current.generation == generation
            and current.expires_at > self._clock()
        ):
            return None
        lost = Event(
            EventKind.LEASE_LOST,
            iid,
            attrs={"generation": generation, "holder": holder},
        )
        try:
            seq = txn.insert(*_row_args(lost)).seq
        except ImpossibleEvent:
            seq = None
        return _Fail(LeaseLost(iid, holder, generation, current, seq))

    async def acquire_lease(self, invocation_id: str, holder: str, ttl: float) -> Lease:
        """Take the invocation's retry lease: bump the generation, write the lease row and a
        RETRY_LEASE_ACQUIRED event in one barrier transaction.  ``LeaseBusy`` if another
        holder's lease is unexpired; ``ImpossibleEvent`` if the lifecycle refuses a retry."""
        if not (ttl > 0 and math.isfinite(ttl)):
            raise ValueError("ttl must be a positive number of seconds")

        def op(txn: _Txn) -> Lease | _Fail:
            row = txn.conn.execute(
                "SELECT holder, generation, expires_at, seq FROM leases WHERE invocation_id = ?",
                (invocation_id,),
            ).fetchone()
            current = _lease_from_row(invocation_id, row)
            now = self._clock()
            if current is not None and current.expires_at > now and current.holder != holder:
                return _Fail(LeaseBusy(current))
            proj = self._projector(txn.conn, invocation_id)
            recorded = proj.record(now).generation
            generation = max(recorded, current.generation if current else 0) + 1
            expires = now + ttl
            ev = Event(
                EventKind.RETRY_LEASE_ACQUIRED,
                invocation_id,
                attrs={"generation": generation, "holder": holder, "expires_at": expires},
                at=now,
            )
            stored = txn.insert(*_row_args(ev))
            txn.conn.execute(
                "INSERT OR REPLACE INTO leases (invocation_id, holder, generation, expires_at, "
                "seq) VALUES (?,?,?,?,?)",
                (invocation_id, holder, generation, expires, stored.seq),
            )
            return Lease(generation, expires, holder, invocation_id, stored.seq)

        return await self._submit(op, barrier=True)

    async def bind_idempotency(
        self,
        scope: str,
        key: str,
        fingerprint: str,
        invocation_id: str,
        expires_at: float | None,
    ) -> IdempotencyRecord:
        """Bind an idempotency key to a request fingerprint (durable).  The first binding wins;
        the same fingerprint returns it; another fingerprint raises ``IdempotencyMismatch``."""

        def op(txn: _Txn) -> IdempotencyRecord | _Fail:
            row = txn.conn.execute(
                "SELECT scope, key, fingerprint, invocation_id, expires_at, created_at "
                "FROM idempotency WHERE scope = ? AND key = ?",
                (scope, key),
            ).fetchone()
            existing = _idem_from_row(row)
            if existing is not None:
                if existing.fingerprint == fingerprint:
                    return existing
                return _Fail(IdempotencyMismatch(existing, fingerprint))
            rec = IdempotencyRecord(
                scope, key, fingerprint, invocation_id, expires_at, self._clock()
            )
            txn.conn.execute(
                "INSERT INTO idempotency (scope, key, fingerprint, invocation_id, expires_at, "
                "created_at) VALUES (?,?,?,?,?,?)",
                (scope, key, fingerprint, invocation_id, expires_at, rec.created_at),
            )
            return rec

        return await self._submit(op, barrier=True)

    async def put_result_chunk(
        self, invocation_id: str, stream: str, index: int, data: bytes
    ) -> None:
        """Store one sealed chunk of a result stream (not complete until ``commit_result``).
        Index 0 starts the stream over, dropping chunks of an earlier, uncommitted attempt."""
        op = self._chunk_op(invocation_id, stream, index, data)
        await self._submit(op, barrier=False, result_store=True)

    async def post_result_chunk(
        self, invocation_id: str, stream: str, index: int, data: bytes
    ) -> Posted[None]:
        """``put_result_chunk`` without waiting for its commit (see ``post``), so that the last
        chunk shares the transaction of the ``commit_result`` that follows.  Pass that call
        ``expect=`` the streams' hashes: a chunk lost with a failed batch then makes the commit
        fail instead of completing a result without it."""
        op = self._chunk_op(invocation_id, stream, index, data)
        return Posted(await self._enqueue(op, barrier=False, result_store=True))

    def _chunk_op(
        self, invocation_id: str, stream: str, index: int, data: bytes
    ) -> Callable[[_Txn], None]:
        if index < 0:
            raise ValueError("chunk index must be >= 0")
        assert self._key is not None
        sealed = self._key.seal(bytes(data), _aad("result", invocation_id, stream, index))

        def op(txn: _Txn) -> None:
            done = txn.conn.execute(
                "SELECT 1 FROM results WHERE invocation_id = ?", (invocation_id,)
            ).fetchone()
            if done is not None:
                raise JournalError(f"the result of invocation {invocation_id} is already stored")
            if index == 0:
                txn.conn.execute(
                    "DELETE FROM result_chunks WHERE invocation_id = ? AND stream = ?",
                    (invocation_id, stream),
                )
            txn.conn.execute(
                "INSERT OR REPLACE INTO result_chunks (invocation_id, stream, idx, data) "
                "VALUES (?,?,?,?)",
                (invocation_id, stream, index, sealed),
            )

        return op

    async def commit_result(
        self,
        event: Event,
        *,
        summary: Mapping[str, Any],
        expect: Mapping[str, str] | None = None,
    ) -> Event:
        """Write the completeness marker and RESULT_COMMITTED in one barrier transaction.

        The marker holds each stream's chunk count and SHA-256 and the whole result's SHA-256;
        the returned event's attrs carry ``sha256``, ``chunks`` and ``bytes`` (and so does the
        hash chain).  Any storage fault raises ``ResultStoreFailed``; nothing of it is kept.
        ``expect`` ({stream: hex SHA-256 of its bytes}): the stored streams must be exactly
        these, or ``ResultStoreFailed`` is raised and nothing is written."""
        if event.kind is not EventKind.RESULT_COMMITTED:
            raise ValueError("commit_result takes a RESULT_COMMITTED event")
        iid = event.invocation_id
        assert self._key is not None
        key = self._key
        summary_bytes = canonical_json(summary).encode("utf-8")
        # The summary's hash rides in the chained event, so the summary (status, headers, exit
        # status) is as tamper-evident as the streams — not only sealed.
        summary_sha = hashlib.sha256(summary_bytes).hexdigest()
        sealed_summary = key.seal(summary_bytes, _aad("summary", iid))

        def op(txn: _Txn) -> Event:
            per: dict[str, dict[str, Any]] = {}
            hashers: dict[str, Any] = {}
            for stream, idx, data in txn.conn.execute(
                "SELECT stream, idx, data FROM result_chunks WHERE invocation_id = ? "
                "ORDER BY stream, idx",
                (iid,),
            ):
                info = per.setdefault(stream, {"chunks": 0, "bytes": 0})
                if idx != info["chunks"]:
                    raise JournalError(
                        f"result of invocation {iid}: stream {stream!r} lacks chunk "
                        f"{info['chunks']}"
                    )
                plain = key.open(data, _aad("result", iid, stream, idx))
                hashers.setdefault(stream, hashlib.sha256()).update(plain)
                info["chunks"] += 1
                info["bytes"] += len(plain)
            for stream, info in per.items():
                info["sha256"] = hashers[stream].hexdigest()
            if expect is not None and {s: v["sha256"] for s, v in per.items()} != dict(expect):
                raise ResultStoreFailed(
                    f"result of invocation {iid}: stored streams differ from what was written"
                )
            whole = _whole_sha256(per)
            attrs = {
                **event.attrs,
                "sha256": whole,
                "chunks": {s: v["chunks"] for s, v in per.items()},
                "bytes": sum(v["bytes"] for v in per.values()),
                "summary_sha256": summary_sha,
            }
            ev = dataclasses.replace(event, attrs=attrs)
            stored = txn.insert(*_row_args(ev))
            txn.conn.execute(
                "INSERT INTO results (invocation_id, seq, sha256, streams, summary) "
                "VALUES (?,?,?,?,?)",
                (iid, stored.seq, whole, canonical_json(per), sealed_summary),
            )
            return stored

        return await self._submit(op, barrier=True, result_store=True)


def _cannot_abort(_: Any) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.FAILED


def _row_args(event: Event) -> tuple[Event, str, None, None, Any]:
    """``_Txn.insert`` arguments of an event without payload (attrs encoded and decoded)."""
    text = _attrs_json(event)
    return event, text, None, None, _loads(text)


def _attrs_json(event: Event) -> str:
    attrs = event.attrs
    try:
        return canonical_json(attrs if type(attrs) is dict else dict(attrs))
    except (TypeError, ValueError, RecursionError) as exc:
        raise JournalError(
            f"{event.kind.value} attrs of invocation {event.invocation_id} are not JSON: {exc}"
        ) from None


def _split_sql(script: str) -> Iterable[str]:
    """Split the schema into statements (``sqlite3.complete_statement`` respects triggers)."""
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            stmt = buf.strip()
            if stmt:
                yield stmt
            buf = ""
