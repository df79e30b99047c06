"""Rows as Python values: an event's attrs to and from the journal's canonical JSON, and the
SQLite rows of ``events``, ``leases`` and ``idempotency`` to ``Event``, ``Lease`` and
``IdempotencyRecord``.

Column order is the schema's (``chain.SCHEMA``); every query that feeds these functions selects
exactly the columns named here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from affidavit.statemachine import (
    BARRIER_KINDS,
    LINKED_ATTRS,
    Event,
    EventKind,
    EvidenceSource,
    ImpossibleEvent,
    stored_event,
)
from affidavit.statemachine.events import unfrozen_twin

from .chain import canonical_json, compact_json
from .errors import IdempotencyRecord, JournalError, Lease

__all__ = [
    "EVENT_READ_COLUMNS",
    "FOLD_COLUMNS",
    "IDEMPOTENCY_COLUMNS",
    "LEASE_COLUMNS",
    "LINKED_REFUSED",
    "LINKED_TAIL",
    "NAMES_NONE",
    "AlteredRow",
    "attrs_json",
    "call_key",
    "close_rows",
    "decode_attrs",
    "event_from_row",
    "events_from_rows",
    "fold_events",
    "idempotency_from_row",
    "index_keys",
    "json_copy",
    "lease_from_row",
    "linked_call_rows",
    "linked_calls",
    "noting_firsts",
    "unfoldable",
]

EVENT_READ_COLUMNS = (
    "seq, at, invocation_id, session_id, kind, source, observer, observer_seq, attrs"
)
"""What a reader needs of an event row (no sealed blobs, no hashes)."""
FOLD_COLUMNS = "seq, at, invocation_id, kind, source, observer, observer_seq, attrs"
"""What a view's fold needs (``views.fold_each``): ``EVENT_READ_COLUMNS`` without the session,
which the fold takes from ACTION_ACCEPTED's attrs -- one Python object fewer per row read."""
LEASE_COLUMNS = "holder, generation, expires_at, seq"
IDEMPOTENCY_COLUMNS = (
    "scope, key, fingerprint, invocation_id, expires_at, created_at, send_by, target"
)

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


def _common_tail(names: tuple[str, ...]) -> str:
    tail = min(names, key=len)
    while not all(name.endswith(tail) for name in names):
        tail = tail[1:]
    return tail


LINKED_TAIL = _common_tail(LINKED_ATTRS) + '"'
"""How every linked attribute's key ends as a row's text holds it unescaped (``_invocation"``):
one scan and a backslash's tell most rows apart (``linked_calls``: ~0.2 us a row of 281
characters, against ~0.55 us scanning for each key).  The schema's insert trigger tests the
same text (no quote ``'`` in it: it is spelt in SQL as is)."""
LINKED_REFUSED = (
    "journal row may name a linked call and linked_calls holds no row of it: is a broker of "
    "the schema before the upgrade still writing this journal? stop it (docs/journal.md)"
)
"""Why the events' insert trigger refuses a row (``sqlite_schema.LINKED_INDEXED``, the chain
function of ``postgres.SCHEMA``): no quote ``'`` or ``%``, which SQL and PL/pgSQL would read."""

NAMES_NONE = b""
"""``linked_calls``' key for a row whose text holds ``LINKED_TAIL`` but names no linked call
(``index_keys``): never a ``call_key`` (32 bytes), so no check finds it."""
_NONE: frozenset[bytes] = frozenset()
_NAMES_NONE = frozenset((NAMES_NONE,))


def call_key(call: str) -> bytes:
    """``linked_calls``' key for a call: its SHA-256, of the text as Python holds it (a lone
    surrogate too: ``surrogatepass``), so a key has one size and no NUL on every backend --
    a row naming a call of any length or content is indexed, never refused (a PostgreSQL
    B-tree entry holds ~2.7 kB; its text no NUL)."""
    return hashlib.sha256(call.encode("utf-8", "surrogatepass")).digest()


def linked_calls(text: str) -> frozenset[bytes] | set[bytes]:
    """The ``call_key`` of every call a row's attrs (as stored) name under a linked attribute
    (``statemachine.LINKED_ATTRS``) as a string: what Python's decoding of the row reads, as
    the claim's check (``refuse_reclaiming``) reads it -- any spelling, escapes and key
    order included.  A text holding neither the unescaped end of a linked key nor a backslash
    names none (a key without escapes is spelled verbatim), so most rows are not decoded.
    Attrs that are not a JSON object -- only someone writing the file makes them -- name
    none (the record's fold refuses them: ``AlteredRow``)."""
    if type(text) is not str:  # a column someone altered
        return _NONE
    if "\\" not in text and LINKED_TAIL not in text:
        return _NONE
    try:
        attrs = decode_attrs(text)
    except (TypeError, ValueError, RecursionError):
        return _NONE
    if type(attrs) is not dict:
        return _NONE
    return {call_key(v) for name in LINKED_ATTRS if type(v := attrs.get(name)) is str}


def index_keys(text: str) -> frozenset[bytes] | set[bytes]:
    """The keys ``linked_calls`` holds for a row: ``linked_calls(text)``, or, for a row whose
    text holds ``LINKED_TAIL`` and names none, ``NAMES_NONE`` -- the events' insert trigger
    refuses a row holding ``LINKED_TAIL`` that ``linked_calls`` has no row for, so a writer
    that does not fill the table (a broker of the schema before, which opened the journal
    before the upgrade) fails its claims loudly instead of leaving them unindexed."""
    keys = linked_calls(text)
    if keys or type(text) is not str or LINKED_TAIL not in text:
        return keys
    return _NAMES_NONE


def linked_call_rows(
    rows: Iterable[Sequence[Any]], seq: int = 0, iid: int = 1, text: int = 2
) -> list[tuple[str, bytes, int]]:
    """The ``linked_calls`` rows (invocation_id, call_sha256, seq) of event rows holding their
    seq, invocation_id and attrs at the positions given: ``index_keys`` of each.  A text
    holding neither ``LINKED_TAIL`` nor a backslash has none (``linked_calls``' own first
    test), so most rows are passed over here, with no call and no tuple of their own (issue
    15: the writer's ``Tables.insert_events`` hands every row of a transaction, as
    ``chain.EVENT_COLUMNS``; ~0.26 -> ~0.05 us a row)."""
    out: list[tuple[str, bytes, int]] = []
    for row in rows:
        attrs = row[text]
        if type(attrs) is str and LINKED_TAIL not in attrs and "\\" not in attrs:
            continue
        out.extend((row[iid], key, row[seq]) for key in index_keys(attrs))
    return out


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
    the two calls per row were ~5% of the fold (issue 15).  A row someone altered (a kind or
    source the broker never writes, attrs that are not a JSON object, a column of another
    type -- ``seq`` included: SQLite's INTEGER PRIMARY KEY holds only integers, but a
    PostgreSQL column someone altered may hand back anything, and the fold orders by it) is an
    ``AlteredRow`` naming its seq and column, as ``event_from_row`` raises."""
    kinds, sources, scan, decode, new, twin = KINDS, SOURCES, _scan, decode_attrs, _new, _Twin
    for seq, at, iid, kind, source, observer, observer_seq, attrs in rows:
        e: Any = new(twin)
        try:
            e.kind = kinds[kind]
            try:
                value, end = scan(attrs, 0)
            except StopIteration:
                end = -1
            if end != len(attrs):
                value = decode(attrs)
            e.attrs = value
            e.source = sources[source]
        except (KeyError, TypeError, ValueError, RecursionError):
            value = None
        if (
            type(value) is not dict
            or type(seq) is not int
            or type(at) is not float
            or type(iid) is not str
            or (observer is not None and type(observer) is not str)
            or (observer_seq is not None and type(observer_seq) is not int)
        ):
            raise _altered(seq, at, iid, None, kind, source, observer, observer_seq, attrs)
        e.invocation_id = iid
        e.seq = seq
        e.at = at
        e.observer = observer
        e.observer_seq = observer_seq
        e.__class__ = Event
        yield e


_Twin = unfrozen_twin(Event)
_new = object.__new__


def noting_firsts(rows: Iterable[Any], firsts: list[int]) -> Iterator[Any]:
    """``rows`` (``FOLD_COLUMNS``, grouped by invocation) as they are, the seq of each run's
    first row appended to ``firsts`` as the run begins: what ``fold_runs``' n-th run began
    at is ``firsts[n]`` (an invocation's place in the view: ``SessionSummary``)."""
    iid = None
    for row in rows:
        if row[2] != iid:
            iid = row[2]
            firsts.append(row[0])
        yield row


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
    """An ``EVENT_READ_COLUMNS`` row as the stored event; ``AlteredRow`` if it is not one the
    broker wrote (see ``fold_events``)."""
    seq, at, iid, session, kind, source, observer, observer_seq, attrs = row
    try:
        event = stored_event(
            KINDS[kind], iid, decode_attrs(attrs), SOURCES[source], seq, at, observer, observer_seq
        )
    except (KeyError, TypeError, ValueError, RecursionError):
        event = None
    if (
        event is None
        or type(event.attrs) is not dict
        or type(seq) is not int
        or type(at) is not float
        or type(iid) is not str
        or (session is not None and type(session) is not str)
        or (observer is not None and type(observer) is not str)
        or (observer_seq is not None and type(observer_seq) is not int)
    ):
        raise _altered(seq, at, iid, session, kind, source, observer, observer_seq, attrs)
    return event


def events_from_rows(rows: Iterable[tuple[Any, ...]]) -> list[Event]:
    """A ``Tables`` read of event rows as the stored events (``event_from_row``), the row
    iterator closed whether or not every row could be read (``close_rows``)."""
    try:
        return [event_from_row(r) for r in rows]
    finally:
        close_rows(rows)


class AlteredRow(JournalError):
    """A stored row that is not one the broker writes: someone altered it (``affidavit journal
    verify`` says where the chain breaks).  The message names the row and the column, never a
    value (a column may hold anything, a payload's bytes included)."""


def _seq_label(seq: Any) -> str:
    return f"seq {seq}" if type(seq) is int else "a seq that is not a number"


def _altered(
    seq: Any,
    at: Any,
    iid: Any,
    session: Any,
    kind: Any,
    source: Any,
    observer: Any,
    observer_seq: Any,
    attrs: Any,
) -> AlteredRow:
    """Why an event row cannot be read, naming its first unreadable column."""
    if type(seq) is not int:
        column = "seq is not a number"
    elif type(iid) is not str:
        column = "invocation_id is not text"
    elif session is not None and type(session) is not str:
        column = "session_id is not text"
    elif type(at) is not float:
        column = "at is not a time"
    elif kind not in KINDS:
        column = "kind is not an event kind"
    elif source not in SOURCES:
        column = "source is not an evidence source"
    elif observer is not None and type(observer) is not str:
        column = "observer is not text"
    elif observer_seq is not None and type(observer_seq) is not int:
        column = "observer_seq is not a number"
    else:
        column = "attrs are not a JSON object"
    return AlteredRow(f"the event row at {_seq_label(seq)} was altered: its {column}")


def close_rows(rows: Iterable[Any]) -> None:
    """Close a ``Tables`` row iterator now (a read that failed part-way), while its connection
    is open -- not whenever the collector finds it, after the connection closed."""
    close = getattr(rows, "close", None)
    if close is not None:
        close()


def unfoldable(exc: ImpossibleEvent) -> AlteredRow:
    """A stored event the lifecycle refuses (``ImpossibleEvent`` from a fold of stored events,
    never of a new one): the broker only writes events it accepted, so its row, or one before
    it, was altered."""
    event = exc.event
    return AlteredRow(
        f"the event row at {_seq_label(event.seq)} ({event.kind.value}) does not follow the "
        f"record of invocation {event.invocation_id} in state {exc.state!r}: {exc.reason} -- "
        "a row was altered"
    )


def lease_from_row(invocation_id: str, row: tuple[Any, ...] | None) -> Lease | None:
    """A ``LEASE_COLUMNS`` row (or None) as a ``Lease``; ``AlteredRow`` if a column is not of
    its type."""
    if row is None:
        return None
    holder, generation, expires_at, seq = row
    if (
        type(holder) is not str
        or type(generation) is not int
        or type(expires_at) is not float
        or type(seq) is not int
    ):
        raise AlteredRow(
            f"the lease row of invocation {invocation_id} was altered: a column is not of its type"
        )
    return Lease(
        generation=generation,
        expires_at=expires_at,
        holder=holder,
        invocation_id=invocation_id,
        seq=seq,
    )


def idempotency_from_row(row: tuple[Any, ...] | None) -> IdempotencyRecord | None:
    """An ``IDEMPOTENCY_COLUMNS`` row (or None) as an ``IdempotencyRecord``; ``AlteredRow`` if
    a column is not of its type."""
    if row is None:
        return None
    scope, key, fingerprint, invocation_id, expires_at, created_at, send_by, target = row
    if (
        type(scope) is not str
        or type(key) is not str
        or type(fingerprint) is not str
        or type(invocation_id) is not str
        or (expires_at is not None and type(expires_at) is not float)
        or type(created_at) is not float
        or (send_by is not None and type(send_by) is not float)
        or (target is not None and type(target) is not str)
    ):
        raise AlteredRow("an idempotency row was altered: a column is not of its type")
    return IdempotencyRecord(
        scope=scope,
        key=key,
        fingerprint=fingerprint,
        invocation_id=invocation_id,
        expires_at=expires_at,
        created_at=created_at,
        send_by=send_by,
        target=target,
    )
