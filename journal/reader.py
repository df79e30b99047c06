"""Reading the journal: events, projected records, sealed payloads, stored results, leases,
idempotency records, the action and session views, and ``verify``.

Reads are synchronous and use their own connection (WAL lets them run while the writer commits,
and from other processes).  ``JournalReader.open`` opens a journal read-only, without the broker
key, for views and ``verify``; the key is loaded only when a payload or a result is read.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from affidavit.statemachine import Event, Outcome, Phase, Projector, Record

from . import results, views
from .chain import GENESIS, verify_connection
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
from .sealing import BrokerKey, payload_aad

__all__ = ["JournalReader"]


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

    def read_result(self, invocation_id: str) -> results.StoredResult | None:
        """The stored result, or None unless its completeness marker exists.  A read, never a
        re-execution (seed: "treat repeated requests as reads")."""
        return results.read(self._rconn, self._broker_key, invocation_id)

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

    def verify(self) -> VerifyReport:
        """Recompute the hash chain (no key needed); report the first bad seq."""
        self._rconn.execute("BEGIN")
        try:
            return verify_connection(self._rconn)
        finally:
            self._rconn.execute("COMMIT")
