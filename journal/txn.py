"""One writer transaction: validate each event against its invocation's projection, chain it
and queue its row.

Seed, "The projection must reject impossible state reversals": an event is inserted only after
the invocation's projection accepted it (``ImpossibleEvent`` otherwise, and nothing is
written).  ``seq`` and ``prev_hash`` come from the chain head read after the backend's
``begin`` took it (SQLite's ``BEGIN IMMEDIATE``, PostgreSQL's advisory lock), so another writer
-- a second process on the file, another broker on the database -- extends the same chain
instead of forking it; the schema's trigger checks every row extends it by exactly one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Generator, Mapping
from contextlib import closing
from typing import TYPE_CHECKING, Any, TypeGuard

from affidavit.statemachine import (
    Event,
    EventKind,
    EvidenceSource,
    ImpossibleEvent,
    Projector,
    claimed_call,
    refuse_reclaiming,
    stored_event,
)

from .chain import json_string as _string
from .chain import row_digest
from .errors import JournalError
from .rows import (
    attrs_json,
    call_key,
    close_rows,
    decode_attrs,
    event_from_row,
    linked_calls,
    unfoldable,
)
from .sealing import UnsealedPayload
from .tables import Tables

if TYPE_CHECKING:
    from .writer import Writer

__all__ = ["Txn", "row_args"]


def _is_time(value: object) -> TypeGuard[float]:
    """A deadline the writer may move: a number (bool is no time)."""
    return type(value) is float or type(value) is int


_sha256 = hashlib.sha256
_INT64 = 2**63
_NAN = float("nan")
_ACCEPTED = EventKind.ACTION_ACCEPTED  # a module global: the class attribute is an enum lookup
_REQUESTED = EventKind.APPROVAL_REQUESTED
_EXPIRING = frozenset(
    {_REQUESTED, EventKind.RECONCILE_INCONCLUSIVE, EventKind.OPERATION_POLL_FAILED}
)
"""Rows whose ``expires_at`` is moved into the clock leases are judged by (``_expiry``)."""
_KIND_JSON = {k._value_: _string(k._value_) for k in EventKind}
_SOURCE_JSON = {s._value_: _string(s._value_) for s in EvidenceSource}
"""Each kind's and source's value as ``chain.compact_json`` writes it (``Txn.insert``)."""


def _with_attrs(event: Event, attrs: dict[str, Any]) -> tuple[Event, str, Mapping[str, Any] | None]:
    """``event`` with ``attrs`` instead of its own, encoded and decoded as ``Txn.insert`` takes
    it (a deadline moved into the lease clock)."""
    moved = Event(
        event.kind,
        event.invocation_id,
        attrs,
        event.source,
        event.seq,
        event.at,
        event.observer,
        event.observer_seq,
    )
    text = attrs_json(moved)
    return moved, text, decode_attrs(text)


class Txn:
    """State of one writer transaction: the chain head as this transaction extends it, and the
    rows computed but not yet handed to the database (one ``executemany`` per run of
    appends)."""

    __slots__ = ("clocked", "digest", "hash", "null", "offset", "rows", "seq", "tables", "writer")

    def __init__(self, writer: Writer, tables: Tables, seq: int, hash_: str) -> None:
        self.writer = writer
        self.tables = tables
        self.seq = seq
        self.hash = hash_
        self.digest = bytes.fromhex(hash_)
        self.rows: list[tuple[Any, ...]] = []
        self.null = tables.NULL  # SQL NULL as the backend binds it fastest (``Tables.NULL``)
        self.offset: float | None = None
        """The lease clock less the writer's (``lease_offset``), once ``clocked``."""
        self.clocked = False

    def flush(self) -> None:
        """Insert the pending rows (the schema's trigger checks each extends the chain)."""
        if self.rows:
            self.tables.insert_events(self.rows)
            self.rows = []

    def projector(self, iid: str) -> Projector:
        """The invocation's projection as of this transaction (folded from the file if the
        writer has not cached it)."""
        p = self.writer.projectors.get(iid)
        return self.load_projector(iid) if p is None else p

    def preload(self, iids: set[str]) -> None:
        """Fold the invocations the writer has not cached, of a whole batch, in one read."""
        w = self.writer
        missing = [iid for iid in iids if iid not in w.projectors]
        if not missing:
            return
        folds = {iid: Projector(iid) for iid in missing}
        sessions: dict[str, str | None] = dict.fromkeys(missing)
        for start in range(0, len(missing), 500):
            rows = self.tables.events_of(missing[start : start + 500])
            try:
                for row in rows:
                    event = event_from_row(row)  # AlteredRow for a row the broker did not write
                    iid = event.invocation_id
                    folds[iid].apply(event)
                    if sessions[iid] is None and row[3] is not None:
                        sessions[iid] = row[3]
            except ImpossibleEvent as exc:  # stored events the broker could not have written
                raise unfoldable(exc) from None
            finally:
                close_rows(rows)
        w.projectors.update(folds)
        w.sessions.update(sessions)

    def load_projector(self, iid: str, *, cache: bool = True) -> Projector:
        """Fold an invocation the writer has not cached (writer thread, inside this
        transaction); ``cache=False``: a look that leaves the cache as it was -- an empty fold
        cached for a call no row names yet would be served as that call's record (a claim's
        check looks at the call it names, which has none: ``Journal.record`` then answered a
        record for it, and a claim whose query had no record was taken as asked)."""
        w = self.writer
        p = Projector(iid)
        session: str | None = None
        rows = self.tables.invocation_events(iid)
        try:
            for row in rows:
                p.apply(event_from_row(row))  # AlteredRow for a row the broker did not write
                if session is None and row[3] is not None:
                    session = row[3]
        except ImpossibleEvent as exc:  # stored events the broker could not have written
            raise unfoldable(exc) from None
        finally:
            close_rows(rows)
        if cache:
            w.projectors[iid] = p
            w.sessions[iid] = session
        return p

    def _attrs_naming(self, iid: str, call: str) -> Generator[Any]:
        """The attrs of the rows of ``iid``'s record, as this transaction holds it, that name
        ``call`` under a linked attribute: those stored (``Tables.attrs_naming``: a seek of
        ``linked_calls``, flat in the record's length, under the write lock), then those queued
        and not yet inserted (``flush`` is not called: a joined request drops its queued rows
        when one is refused), judged by the same function that indexed the stored ones
        (``rows.linked_calls``).  A claim's check alone reads them (``refuse_reclaiming``),
        which decodes and checks each: a row is named however its JSON spells the call."""
        rows = self.tables.attrs_naming(iid, call)
        try:
            for (text,) in rows:
                yield decode_attrs(text)
        finally:
            close_rows(rows)
        key = call_key(call)
        for row in self.rows:
            if row[2] == iid and key in linked_calls(row[8]):
                yield decode_attrs(row[8])

    def lease_offset(self) -> float | None:
        """How far the clock leases are judged by (``Tables.lease_now``: the database's, on a
        shared PostgreSQL) is ahead of this writer's, read once per transaction; None where
        the writer's clock is that clock (SQLite).  The writer's clock is read first: a round
        trip's delay can only make the offset larger, a deadline it moves later, never
        earlier than the instant its broker meant."""
        if not self.clocked:
            mine = self.writer.clock()
            now = self.tables.lease_now()
            self.offset = None if now is None else now - mine
            self.clocked = True
        return self.offset

    def _accepted_deadline(
        self, event: Event, attrs_text: str, attrs: Mapping[str, Any] | None
    ) -> tuple[Event, str, Mapping[str, Any] | None]:
        """ACTION_ACCEPTED's deadlines, written by its broker's clock, moved to the clock leases
        are judged by: the same instants, recorded as every broker compares them.
        ``lease_expires_at`` is generation 0's (recovery's ``leases.check_lapsed``: a broker
        whose clock runs behind otherwise recorded a deadline already past in database time,
        and another broker's recovery closed its live attempt); ``operation.idempotency.
        expires_at`` is when the remote forgets the key (a same-key retry is judged by it in
        ``leases.acquire_op``: recorded by a clock running ahead, another broker resent with
        a key the remote had already dropped).  An imported event is kept as imported."""
        attrs_in = event.attrs
        deadline = attrs_in.get("lease_expires_at")
        operation = attrs_in.get("operation")
        idem = operation.get("idempotency") if isinstance(operation, Mapping) else None
        key_expiry = idem.get("expires_at") if isinstance(idem, Mapping) else None
        if event.observer is not None or not (_is_time(deadline) or _is_time(key_expiry)):
            return event, attrs_text, attrs
        offset = self.lease_offset()
        if offset is None:
            return event, attrs_text, attrs
        moved_attrs = dict(attrs_in)
        if _is_time(deadline):
            moved_attrs["lease_expires_at"] = float(deadline) + offset
        if _is_time(key_expiry):
            assert isinstance(operation, Mapping) and isinstance(idem, Mapping)
            moved_idem = {**idem, "expires_at": float(key_expiry) + offset}
            moved_attrs["operation"] = {**operation, "idempotency": moved_idem}
        return _with_attrs(event, moved_attrs)

    def _expiry(
        self, event: Event, attrs_text: str, attrs: Mapping[str, Any] | None
    ) -> tuple[Event, str, Mapping[str, Any] | None]:
        """APPROVAL_REQUESTED's ``expires_at`` -- and a linked call's claim's, the row naming
        a query or poll before it is asked (``engine/takeup.py``) --, written by its broker's
        clock, moved to the clock leases are judged by, as ``_accepted_deadline`` moves
        ACTION_ACCEPTED's: every broker judges it by that clock (``approval.approval_now``).
        Kept in the requester's clock, a broker running ahead requested an approval every
        other broker saw expire an hour late, and one running behind had its live claim
        closed by another broker.  An imported event is kept as imported."""
        expires = event.attrs.get("expires_at")
        if event.observer is not None or not _is_time(expires):
            return event, attrs_text, attrs
        offset = self.lease_offset()
        if offset is None:
            return event, attrs_text, attrs
        return _with_attrs(event, {**event.attrs, "expires_at": float(expires) + offset})

    def insert(
        self,
        event: Event,
        attrs_text: str,
        payload: bytes | UnsealedPayload | None = None,
        audit: bytes | None = None,
        attrs: Mapping[str, Any] | None = None,
    ) -> Event:
        """Validate (projection), chain and queue one row; return the stored event.  ``attrs``
        is ``attrs_text`` decoded, so the writer's projection holds exactly what a reader of the
        file folds (see ``Journal.record``).  An ``UnsealedPayload`` is sealed here, bound to
        the seq this row is given."""
        w = self.writer
        iid = event.invocation_id
        proj = w.projectors.get(iid)
        if proj is None:
            proj = self.load_projector(iid)
        kind = event.kind
        if kind is _ACCEPTED:
            event, attrs_text, attrs = self._accepted_deadline(event, attrs_text, attrs)
            raw = event.attrs.get("session")
            session = None if raw is None else str(raw)
        else:
            if kind in _EXPIRING:
                event, attrs_text, attrs = self._expiry(event, attrs_text, attrs)
            session = w.sessions.get(iid)
        observer = event.observer
        if (
            "\x00" in iid
            or (session is not None and "\x00" in session)
            or (observer is not None and "\x00" in observer)
        ):
            # PostgreSQL's text cannot hold NUL: refused alike on every backend, before a row
            # is queued, so it fails this write alone and not the batch it rides in.
            raise JournalError(f"{kind.value} of an invocation: an id or session holds NUL")
        observer_seq = event.observer_seq
        if observer_seq is not None and not (
            type(observer_seq) is int and 0 <= observer_seq < _INT64
        ):
            # Past a signed 64-bit integer neither SQLite nor PostgreSQL (BIGINT) can store
            # it, and the whole batch's insert would fail with it: refused here, alone.
            raise JournalError(
                f"{kind.value} of an invocation: observer_seq is not an integer from 0 to 2**63-1"
            )
        try:
            at = float(event.at) if event.at is not None else w.clock()
        except (OverflowError, TypeError, ValueError):
            at = _NAN
        if not at - at == 0.0:  # NaN or infinite: SQLite stores NaN as NULL (NOT NULL fails)
            raise JournalError(f"{kind.value} of an invocation: at is not a finite time")
        seq = self.seq + 1
        # Built as the readers build theirs (``stored_event``: no frozen ``__init__``, one per
        # row in the single writer thread).
        stored = stored_event(
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
        if payload is not None and isinstance(payload, UnsealedPayload):
            payload = payload.seal(iid, kind_v, seq)
        # The digest first: once the projection has applied the event, nothing may fail before
        # its row is queued (``Journal.record`` serves that projection as the file's state).
        if (
            type(seq) is int
            and type(at) is float
            and at - at == 0.0  # finite: the encoder writes NaN and Infinity by name
            and type(iid) is str
            and type(attrs_text) is str
            and payload is None
            and audit is None
            and (session is None or type(session) is str)
            and (observer is None or type(observer) is str)
            and (observer_seq is None or type(observer_seq) is int)
        ):
            # ``row_digest``'s direct path, inline (issue 15: ~1 us less per row in the single
            # writer): ``seq`` is this transaction's own int, kind and source are enum values
            # whose JSON is computed once; tests/journal/test_chain.py holds the bytes equal.
            canonical = (
                f"[{seq},{at!r},{_string(iid)},"
                f"{'null' if session is None else _string(session)},"
                f"{_KIND_JSON[kind_v]},{_SOURCE_JSON[source_v]},"
                f"{'null' if observer is None else _string(observer)},"
                f"{'null' if observer_seq is None else observer_seq},{_string(attrs_text)},"
                "null,null]"
            )
            digest = _sha256(self.digest + canonical.encode("utf-8")).digest()
        else:
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
            called = claimed_call(stored)
            if called is not None:  # a claim: the call it names is new to the journal
                with closing(self._attrs_naming(iid, called)) as earlier:
                    named = w.projectors.get(called)
                    if named is None:  # (not cached: an empty fold would be served)
                        named = self.load_projector(called, cache=False)
                    refuse_reclaiming(proj, stored, named, earlier)
            # Written: a stale row naming a closed call open is refused, by the rules at the
            # point where the fold of a stored one no-ops (``Projector.apply``'s ``writing``).
            proj.apply(stored, writing=True)  # ImpossibleEvent: nothing written, unchanged
        except ImpossibleEvent:
            raise
        except Exception:
            w.projectors.pop(iid, None)  # a fold that failed midway: reload it from the file
            raise
        w.sessions[iid] = session
        h = digest.hex()
        null = self.null
        self.rows.append(
            (
                seq,
                at,
                iid,
                null if session is None else session,
                kind_v,
                source_v,
                null if observer is None else observer,
                null if observer_seq is None else observer_seq,
                attrs_text,
                null if payload is None else payload,
                null if audit is None else audit,
                self.hash,
                h,
            )
        )
        self.seq, self.hash, self.digest = seq, h, digest
        return stored


def row_args(event: Event) -> tuple[Event, str, None, None, Any]:
    """``Txn.insert`` arguments of an event without payload (attrs encoded and decoded)."""
    text = attrs_json(event)
    return event, text, None, None, decode_attrs(text)
