"""Reading the journal: events, projected records, sealed payloads, stored results (whole or
chunk by chunk), auditor copies, leases, idempotency records, the action and session views,
checkpoints, anchors and ``verify``.

Reads are synchronous and use their own connection (WAL lets them run while the writer commits,
and from other processes).  ``JournalReader.open`` opens a journal read-only, without the broker
key, for views and ``verify``; the key is loaded only when a payload or a result is read.  No
read needs the signing key: checkpoints are checked with its public half.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from affidavit.statemachine import Event, Outcome, Phase, Projector, Record

from . import audit, checkpoints, results, views
from .chain import EVENT_COLUMNS, GENESIS
from .connect import connect_reader
from .errors import IdempotencyRecord, JournalError, Lease, VerifyReport
from .rows import (
    EVENT_READ_COLUMNS,
    IDEMPOTENCY_COLUMNS,
    LEASE_COLUMNS,
    event_from_row,
    idempotency_from_row,
    lease_from_row,
)
from .sealing import BrokerKey, open_audit_payload, payload_aad
from .signing import Anchor, Checkpoint
from .verify import Trust, verify_journal

__all__ = ["JournalReader", "default_signing_key"]


def default_signing_key(path: Path) -> Path:
    """Where the signing key lives unless configured: ``<journal>.signing.key``."""
    return Path(f"{path}.signing.key")


def _lenient_text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


class _SqliteSource:
    """``verify.Source`` over one read transaction of the SQLite file."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def event_rows(self) -> Iterator[tuple[Any, ...]]:
        cur = self.conn.execute(f"SELECT {EVENT_COLUMNS} FROM events ORDER BY seq")
        try:
            yield from cur
        finally:
            cur.close()

    def checkpoints(self) -> Iterator[Checkpoint]:
        return checkpoints.iter_checkpoints(self.conn)

    def markers(self) -> Iterator[tuple[str, int, str, str, bytes]]:
        cur = self.conn.execute(
            "SELECT invocation_id, seq, sha256, streams, CAST(summary AS BLOB) FROM results "
            "ORDER BY seq"
        )
        try:
            yield from cur
        finally:
            cur.close()

    def digests(self, invocation_id: str, audit: bool) -> Iterator[tuple[str, int, str]]:
        table = "result_audit" if audit else "result_chunks"
        try:
            cur = self.conn.execute(
                f"SELECT stream, idx, CAST(data AS BLOB) FROM {table} WHERE invocation_id = ? "
                "ORDER BY stream, idx",
                (invocation_id,),
            )
        except sqlite3.OperationalError:  # a journal from before auditor copies of results
            return
        try:
            for stream, idx, data in cur:
                yield stream, idx, hashlib.sha256(data).hexdigest()
        finally:
            cur.close()


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
        self._known_checkpoints: dict[int, bytes] = {}
        """Checkpoints found valid (or signed by this process): seq -> signature."""
        self._rconn = connect_reader(self.path, readonly=readonly)

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

    def recorded_public_key(self) -> bytes | None:
        """The signing public key the journal records (None before signing).  The file holds
        it, so whoever rewrites the file can replace it: pass a key kept elsewhere to ``verify``
        for an independent check."""
        text = self._meta("signing_public_key")
        if text is None:
            return None
        try:
            raw = base64.b64decode(text, validate=True)
        except (ValueError, binascii.Error):
            return None
        return raw if len(raw) == 32 else None

    def _trusted_public_key(self) -> bytes | None:
        """The key a read checks checkpoints with (the writing journal uses its own)."""
        return self.recorded_public_key()

    def _covered(self, seq: int) -> None:
        """Raise unless the row at ``seq`` is covered by a checkpoint signed with the trusted
        key (the rows from it to that checkpoint are re-hashed)."""
        why = checkpoints.covering_problem(
            self._rconn, seq, self._trusted_public_key(), self._known_checkpoints
        )
        if why is not None:
            raise JournalError(f"journal {self.path}: {why}")

    # -- events and records -------------------------------------------------------------------

    def events(self, invocation_id: str) -> list[Event]:
        cur = self._rconn.execute(
            f"SELECT {EVENT_READ_COLUMNS} FROM events WHERE invocation_id = ? ORDER BY seq",
            (invocation_id,),
        )
        return [event_from_row(r) for r in cur]

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
        with self._reading(f"the stored result of invocation {invocation_id}"):
            return results.open_result(
                self._rconn, self._broker_key, invocation_id, covered=self._covered
            )

    def audit_result(
        self, invocation_id: str, private_key_file: str | os.PathLike[str]
    ) -> results.StoredResult | None:
        """The auditor's side: the result's auditor copy opened with the auditor's private key
        and checked against the chained hashes (None if the invocation has no stored result).
        The broker holds no key that opens it."""
        with self._reading(f"the auditor copy of invocation {invocation_id}"):
            return audit.read_result(
                self._rconn, invocation_id, private_key_file, covered=self._covered
            )

    @contextlib.contextmanager
    def _reading(self, what: str) -> Iterator[None]:
        """A stored row SQLite cannot hand back (a text column that is not UTF-8...) is a
        ``JournalError`` naming ``what``, like any other altered row."""
        try:
            yield
        except sqlite3.Error as exc:
            if self._rconn.in_transaction:
                self._rconn.execute("ROLLBACK")
            raise JournalError(
                f"journal {self.path}: {what} cannot be read: {results.sql_error(exc)}"
            ) from None

    def audit_payload(
        self, seq: int, private_key_file: str | os.PathLike[str]
    ) -> Mapping[str, Any] | None:
        """The auditor's side: an event's sealed payload opened with the auditor's private key
        (None if the event has no auditor copy)."""
        copy = self.audit_copy(seq)
        if copy is None:
            return None
        return open_audit_payload(copy[2], private_key_file, copy[0], copy[1])

    def lease(self, invocation_id: str) -> Lease | None:
        row = self._rconn.execute(
            f"SELECT {LEASE_COLUMNS} FROM leases WHERE invocation_id = ?",
            (invocation_id,),
        ).fetchone()
        return lease_from_row(invocation_id, row)

    def find_idempotency(self, scope: str, key: str) -> IdempotencyRecord | None:
        row = self._rconn.execute(
            f"SELECT {IDEMPOTENCY_COLUMNS} FROM idempotency WHERE scope = ? AND key = ?",
            (scope, key),
        ).fetchone()
        return idempotency_from_row(row)

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
        accepted (a wall-clock label, inclusive)."""
        want_outcome = Outcome(outcome) if outcome is not None else None
        want_phase = Phase(phase) if phase is not None else None
        out: list[Record] = []
        for rec, first_at, _ in views.fold(self._rconn, session, now):
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
        for rec, first_at, last_at in views.fold(self._rconn, None, None):
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

    # -- checkpoints, anchors and verify -------------------------------------------------------

    def latest_checkpoint(self) -> Checkpoint | None:
        return checkpoints.latest(self._rconn)

    def anchor(self, public_key: bytes | None = None) -> tuple[VerifyReport, Anchor | None]:
        """Verify the journal with ``public_key`` (default: the recorded one) and, in the same
        read, take its last checkpoint as an anchor to keep elsewhere.  The anchor is None when
        the journal does not verify (an anchor must vouch only for a journal that does) or has
        no signed checkpoint.  Rows from before signing are accepted here: the anchor covers
        them as they are now."""
        key = public_key if public_key is not None else self.recorded_public_key()
        trust = Trust(key, "public-key" if public_key is not None else "journal", None, True)
        with self._verifying() as source:
            report = verify_journal(source, trust)
            cp = checkpoints.latest(self._rconn)
        if not report.ok or cp is None or key is None:
            return report, None
        return report, Anchor(cp, key)

    @contextlib.contextmanager
    def _verifying(self) -> Iterator[_SqliteSource]:
        """One read transaction for a verify (a consistent snapshot).  Text columns someone
        filled with bytes that are not UTF-8 must read as "altered", not stop verify: decoded
        leniently, they no longer hash to what was chained."""
        conn = self._rconn
        conn.text_factory = _lenient_text
        conn.execute("BEGIN")
        try:
            yield _SqliteSource(conn)
        finally:
            conn.execute("COMMIT")
            conn.text_factory = str

    def verify(
        self,
        *,
        public_key: bytes | None = None,
        anchor: Anchor | None = None,
        accept_unsigned: bool = False,
    ) -> VerifyReport:
        """Check the hash chain, the signed checkpoints, every stored result against its
        chained hashes and, given one, an anchor -- with public keys only; report the first bad
        seq (``verify.py`` says what each key proves).  The checkpoints are checked with
        ``public_key`` (raw Ed25519 bytes), else the anchor's key, else the key the journal
        records itself."""
        if public_key is not None:
            trust = Trust(public_key, "public-key", anchor, accept_unsigned)
        elif anchor is not None:
            trust = Trust(anchor.public_raw, "anchor", anchor, accept_unsigned)
        else:
            recorded = self.recorded_public_key()
            origin = "journal" if recorded is not None else "none"
            trust = Trust(recorded, origin, None, accept_unsigned)
        with self._verifying() as source:
            return verify_journal(source, trust)
