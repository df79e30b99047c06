"""Rows as Python values: an event's attrs to and from the journal's canonical JSON, and the
SQLite rows of ``events``, ``leases`` and ``idempotency`` to ``Event``, ``Lease`` and
``IdempotencyRecord``.

Column order is the schema's (``chain.SCHEMA``); every query that feeds these functions selects
exactly the columns named here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from affidavit.statemachine import BARRIER_KINDS, Event, EventKind, EvidenceSource, stored_event
from affidavit.statemachine.events import unfrozen_twin

from .chain import canonical_json, compact_json
from .errors import IdempotencyRecord, JournalError, Lease

__all__ = [
    "EVENT_READ_COLUMNS",
    "FOLD_COLUMNS",
    "IDEMPOTENCY_COLUMNS",
    "LEASE_COLUMNS",
    "attrs_json",
    "decode_attrs",
    "event_from_row",
    "fold_events",
    "idempotency_from_row",
    "json_copy",
    "lease_from_row",
]

EVENT_READ_COLUMNS = (
    "seq, at, invocation_id, session_id, kind, source, observer, observer_seq, attrs"
)
"""What a reader needs of an event row (no sealed blobs, no hashes)."""
FOLD_COLUMNS = "seq, at, invocation_id, kind, source, observer, observer_seq, attrs"
"""What a view's fold needs (``views.fold_each``): ``EVENT_READ_COLUMNS`` without the session,
which the fold takes from ACTION_ACCEPTED's attrs -- one Python object fewer per row read."""
LEASE_COLUMNS = "holder, generation, expires_at, seq"
IDEMPOTENCY_COLUMNS = "scope, key, fingerprint, invocation_id, expires_at, created_at"

KINDS = {k.value: k for k in EventKind}
SOURCES = {s.value: s for s in EvidenceSource}
BARRIER_VALUES = frozenset(k.value for k in BARRIER_KINDS)
"""By value: ``kind in BARRIER_KINDS`` hashes the enum in Python (``Enum.__hash__``)."""

_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def decode_attrs(text: str) -> Any:
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


def json_copy(value: Any) -> Any:
    """``json.loads(json.dumps(value))`` -- ``value`` as it reads back from JSON (tuples as
    lists, keys as strings, a fresh copy) -- through the C encoder and scanner made once,
    instead of a ``JSONEncoder`` and the argument checks of ``loads`` per call (issue 15: the
    engine copies each call's result summary so)."""
    return decode_attrs(compact_json(value))


def fold_events(rows: Iterable[Any]) -> Iterator[Event]:
    """``FOLD_COLUMNS`` rows as the stored events (``views.fold_each``: a row per event of the
    journal).  ``stored_event`` and ``decode_attrs`` are inlined -- the twin filled here, the
    scanner called here, anything but canonical JSON handed to ``decode_attrs`` itself -- as
    the two calls per row were ~5% of the fold (issue 15).  Each row's kind is looked up, then
    its attrs decoded, then its source, as ``stored_event(KINDS[...], ...)`` did, so a row
    someone edited fails with the same error."""
    kinds, sources, scan, decode, new, twin = KINDS, SOURCES, _scan, decode_attrs, _new, _Twin
    for seq, at, iid, kind, source, observer, observer_seq, attrs in rows:
        e: Any = new(twin)
        e.kind = kinds[kind]
        try:
            value, end = scan(attrs, 0)
        except StopIteration:
            end = -1
        e.attrs = value if end == len(attrs) else decode(attrs)
        e.source = sources[source]
        e.invocation_id = iid
        e.seq = seq
        e.at = at
        e.observer = observer
        e.observer_seq = observer_seq
        e.__class__ = Event
        yield e


_Twin = unfrozen_twin(Event)
_new = object.__new__


def attrs_json(event: Event) -> str:
    """An event's attrs as canonical JSON; ``JournalError`` (naming kind and invocation, never
    the value) if they are not JSON."""
    attrs = event.attrs
    try:
        return canonical_json(attrs if type(attrs) is dict else dict(attrs))
    except (TypeError, ValueError, RecursionError) as exc:
        raise JournalError(
            f"{event.kind.value} attrs of invocation {event.invocation_id} are not JSON: {exc}"
        ) from None


def event_from_row(row: tuple[Any, ...]) -> Event:
    """An ``EVENT_READ_COLUMNS`` row as the stored event."""
    return stored_event(
        KINDS[row[4]], row[2], decode_attrs(row[8]), SOURCES[row[5]], row[0], row[1], row[6], row[7]
    )


def lease_from_row(invocation_id: str, row: tuple[Any, ...] | None) -> Lease | None:
    """A ``LEASE_COLUMNS`` row (or None) as a ``Lease``."""
    if row is None:
        return None
    return Lease(
        generation=row[1], expires_at=row[2], holder=row[0], invocation_id=invocation_id, seq=row[3]
    )


def idempotency_from_row(row: tuple[Any, ...] | None) -> IdempotencyRecord | None:
    """An ``IDEMPOTENCY_COLUMNS`` row (or None) as an ``IdempotencyRecord``."""
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
