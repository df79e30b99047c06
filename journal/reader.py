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

import json
import os
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from affidavit.statemachine import Event, ImpossibleEvent, Projector, Record

from . import audit, bindings, results
from .errors import IdempotencyRecord, JournalError, Lease
from .reader_proofs import ProvingReader, default_signing_key
from .reader_views import ViewingReader
from .rows import (
    AlteredRow,
    events_from_rows,
    idempotency_from_row,
    lease_from_row,
    unfoldable,
)
from .sealing import open_audit_payload
from .signing import Checkpoint
from .tables import Tables

__all__ = ["JournalReader", "default_signing_key"]


class JournalReader(ViewingReader, ProvingReader):
    """Synchronous reads.  Opened on its own (``JournalReader.open``) it is read-only and needs
    no key unless results or payloads are read.  ``path`` is a SQLite file or a
    ``postgresql://`` URL (``where`` names it in messages, without a password).  Built from
    ``reader_base.py`` (the connection, reads tried again, the clock), ``reader_proofs.py``
    (keys, checkpoints, ``verify``) and ``reader_views.py`` (the action and session views);
    here: events, records, payloads, results, leases and idempotency records."""

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        key_file: str | os.PathLike[str] | None = None,
        public_keys: Sequence[bytes] = (),
        lock_wait: float | None = None,
    ) -> JournalReader:
        """``public_keys``: the signing public keys (raw Ed25519, one per broker of a shared
        journal) every read checks checkpoints with -- an auditor's, kept apart from the
        journal.  Without them reads trust the keys the journal records itself
        (``key_source``), which whoever rewrites the journal can replace.  ``lock_wait``:
        seconds a read waits at most for a lock another session holds, then ``ReadFailed``
        (a daemon's views); by default the backend's own (SQLite's busy timeout; none)."""
        return cls(
            path, key_file=key_file, readonly=True, public_keys=public_keys, lock_wait=lock_wait
        )

    def __enter__(self) -> JournalReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- events and records -------------------------------------------------------------------

    def events(self, invocation_id: str, *, through: int | None = None) -> list[Event]:
        """The invocation's events by seq; ``through``: only those whose seq is at most it --
        what a record held when that seq was written, read without the rows after it (an
        operation's submission, ``accepted_seq``: not the polls that follow)."""
        return self._read(
            lambda t: events_from_rows(t.invocation_events(invocation_id, through)),
            f"the record of invocation {invocation_id}",
        )

    def events_page(self, invocation_id: str, from_seq: int, limit: int) -> list[Event]:
        """The invocation's events by seq from seq ``from_seq``, at most ``limit`` of them: the
        rows before it are never read (a page of a record grown long by an operation's polls)."""
        return self._read(
            lambda t: events_from_rows(t.invocation_events_page(invocation_id, from_seq, limit)),
            f"the record of invocation {invocation_id}",
        )

    def events_naming(self, invocation_id: str, call: str) -> list[Event]:
        """The invocation's events, by seq, whose attrs name the linked call ``call`` (a query
        or a poll: ``statemachine.LINKED_ATTRS``), found through ``linked_calls`` (SQLite
        schema 11, PostgreSQL schema 5: every writer's open adds it) -- one seek, whatever
        the record's length.  Derived, not chained: ``verify`` holds the table to the events
        (a row someone removed from it is not found here); a caller still checks each event's
        attrs for what it looks for."""
        return self._read(
            lambda t: events_from_rows(t.events_naming(invocation_id, call)),
            f"the record of invocation {invocation_id}",
        )

    def record(self, invocation_id: str, now: float | None = None) -> Record | None:
        """The invocation's record, its retry hint computed at ``now`` -- by default ``now()``
        as it is read (the database's clock on a shared journal, else this reader's), its
        key-bound hints judged by today's lease (``current``): a hint shown to anyone is the
        hint at the moment it is answered, never the one the record had at its last event
        (docs/contract.md, "When the hint is computed")."""
        events = self.events(invocation_id)
        if not events:
            return None
        at = self._now(now, f"the record of invocation {invocation_id}")
        try:
            return self.current(Projector(invocation_id).extend(events).record(at), at)
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
            data = key.open_payload(row[2], row[0], row[1], seq)
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

    def approvals_after(self, seq: int) -> tuple[int, dict[str, bool]]:
        """The head's seq and the invocations an approval was asked or granted for after
        ``seq`` through it, each with whether it was granted there: what a daemon's
        dispatcher learns at each sweep of what other brokers on a shared journal asked or
        decided (``engine.approval.refresh``).  The rows
        appended since ``seq``, read by the primary key: a sweep costs what was written since
        the last one, never a scan of the journal."""

        def run(t: Tables) -> tuple[int, dict[str, bool]]:
            head = t.head()[0]
            return head, t.approvals_between(seq, head)

        return self._read(run, "the open approvals")

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
