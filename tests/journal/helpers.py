"""Shared builders for journal tests (a module, not a conftest, so child scripts import it too)."""

from __future__ import annotations

import shutil
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from affidavit.journal import Journal, JournalReader, JournalWriteError
from affidavit.statemachine import Event, EvidenceSource
from affidavit.statemachine import EventKind as E

if TYPE_CHECKING:
    from affidavit.journal.writer import Writer
    from tests.postgres import Cluster

CANARY = "canary-7f3a9c1e-SECRET-do-not-store"


FINGERPRINT = "sha256:8b1f"


def accepted(
    iid: str,
    session: str | None = "sess-1",
    budget: int = 3,
    idem: tuple[str, str] | None = None,
) -> Event:
    """``idem``: the (scope, key) the invocation was bound under (``bind_idempotency`` with
    ``FINGERPRINT``), named as the engine names it (``journal/bindings.py``)."""
    operation: dict[str, object] = {
        "target": "payments",
        "protocol": "http",
        "fingerprint": FINGERPRINT,
        "budget": budget,
    }
    if idem is not None:
        operation["idempotency"] = {"scope": idem[0], "key": idem[1]}
    attrs: dict[str, object] = {"operation": operation}
    if session is not None:
        attrs["session"] = session
    return Event(E.ACTION_ACCEPTED, iid, attrs)


def until_dispatch(iid: str, session: str | None = "sess-1") -> list[Event]:
    return [
        accepted(iid, session),
        Event(E.PREFLIGHT_VALIDATED, iid, {"config_hash": "sha256:c0ff"}),
        Event(E.CREDENTIAL_AUTHORIZED, iid, {"credential": "pay-token", "version": "7"}),
        Event(E.DISPATCH_STARTED, iid, {"attempt": 1}),
    ]


def happy(iid: str, session: str | None = "sess-1") -> list[Event]:
    """The seed's durable happy path up to (not including) RESULT_COMMITTED."""
    return [
        *until_dispatch(iid, session),
        Event(E.REQUEST_SENT, iid),
        Event(E.REMOTE_RESPONSE_STARTED, iid, {"status": 201}),
        Event(
            E.REMOTE_RESPONSE_COMPLETE,
            iid,
            {"outcome": "committed", "status": 201},
            source=EvidenceSource.REMOTE_RESPONSE,
        ),
    ]


def query_row(iid: str, query: str, **attrs: object) -> Event:
    """A RECONCILE_INCONCLUSIVE row of ``iid``'s record naming the reconciliation query ``query``
    (its ``query_invocation``), with ``attrs``."""
    return Event(
        E.RECONCILE_INCONCLUSIVE,
        iid,
        {"query_invocation": query, **attrs},
        source=EvidenceSource.REMOTE_QUERY,
        observer="obs",
        observer_seq=1,
    )


def query_claim(iid: str, query: str) -> Event:
    """The claim of a new query ``query`` on ``iid``'s record: open, no code."""
    return query_row(iid, query, code=None, reason="the query is being asked", open=True)


def interrupted(iid: str, session: str | None = "sess-1") -> list[Event]:
    """Dispatched, then the connection dropped: unknown, at rest, retryable with a lease."""
    return [
        *until_dispatch(iid, session),
        Event(E.ATTEMPT_INTERRUPTED, iid, {"code": "REMOTE_OUTCOME_UNKNOWN"}),
    ]


def db_files(path: object) -> list[str]:
    p = str(path)
    return [p, p + "-wal", p + "-shm"]


def sql(db: Path, *statements: str) -> list[tuple[Any, ...]]:
    """The rows of each statement, in order, run on a connection of their own (autocommit)."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        return [row for s in statements for row in conn.execute(s).fetchall()]
    finally:
        conn.close()


def copy_segments(db: Path, to_db: Path) -> None:
    """Copy a SQLite journal's segment directory (``<journal>.results``, long results' chunks)
    beside another copy of the journal, if it has one."""
    src = Path(f"{db}.results")
    if src.is_dir():
        shutil.copytree(src, Path(f"{to_db}.results"))


def stored_chunk(db: Path, iid: str, stream: str, idx: int, audit: bool = False) -> bytes:
    """A stored chunk's sealed bytes as they are on disk: its row's blob, or the bytes its
    segment reference names."""
    table = "result_audit" if audit else "result_chunks"
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        row = conn.execute(
            f"SELECT data FROM {table} WHERE invocation_id = ? AND stream = ? AND idx = ?",
            (iid, stream, idx),
        ).fetchone()
        if row is not None:
            return bytes(row[0])
        seg, pos, size = conn.execute(
            "SELECT segment, pos, size FROM result_segments WHERE invocation_id = ? AND "
            "audit = ? AND stream = ? AND idx = ?",
            (iid, int(audit), stream, idx),
        ).fetchone()
    finally:
        conn.close()
    with open(Path(f"{db}.results") / seg, "rb") as f:
        f.seek(pos)
        return f.read(size)


def flip_stored_byte(db: Path, iid: str, stream: str, idx: int, at: int = 200) -> None:
    """Corrupt one byte of a stored chunk where it lies on disk -- in its row, or in the
    segment file its reference names -- as bit rot or an edit would."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        row = conn.execute(
            "SELECT data FROM result_chunks WHERE invocation_id = ? AND stream = ? AND idx = ?",
            (iid, stream, idx),
        ).fetchone()
        if row is not None:
            data = bytes(row[0])
            flipped = data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]
            conn.execute(
                "UPDATE result_chunks SET data = ? WHERE invocation_id = ? AND stream = ? AND "
                "idx = ?",
                (flipped, iid, stream, idx),
            )
            return
        seg, pos = conn.execute(
            "SELECT segment, pos FROM result_segments WHERE invocation_id = ? AND audit = 0 "
            "AND stream = ? AND idx = ?",
            (iid, stream, idx),
        ).fetchone()
    finally:
        conn.close()
    with open(Path(f"{db}.results") / seg, "r+b") as f:
        f.seek(pos + at)
        byte = f.read(1)
        f.seek(pos + at)
        f.write(bytes([byte[0] ^ 0x01]))


LEASE_KINDS = (E.RETRY_LEASE_ACQUIRED, E.DISPATCH_LEASE_ACQUIRED)
"""Written by ``acquire_lease`` alone, with their lease row (``append`` refuses them)."""


async def append_interleaved(j: Any, runs: list[list[Event]]) -> None:
    """The runs' events interleaved, as concurrent calls write them; a lease event through
    ``acquire_lease`` (a lease of half a second: the next lease of the run finds it ended)."""
    for i in range(max(map(len, runs))):
        for run in runs:
            if i >= len(run):
                continue
            event = run[i]
            if event.kind in LEASE_KINDS:
                holder = str(event.attrs.get("holder", "test"))
                await j.acquire_lease(event.invocation_id, holder, 0.5, kind=event.kind)
            else:
                await j.append(event)


class Ticking:
    """A journal clock that moves one second per reading (distinct, ordered labels)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


async def fill_views(j: Any) -> None:
    """Four invocations in three sessions for the view tests: committed, unknown, refused in
    validation, and one without a session."""
    for ev in happy("ok-1", "alice"):
        await j.append(ev)
    for ev in interrupted("lost-1", "alice"):
        await j.append(ev)
    await j.append(accepted("bad-1", "bob"))
    await j.append(
        Event(E.PREFLIGHT_FAILED, "bad-1", {"code": "INVALID_TARGET", "field": "target"})
    )
    for ev in happy("ok-2", None):
        await j.append(ev)


async def fill_results(j: Any, body: bytes) -> int:
    """A committed invocation with ``body`` stored in 64 KiB chunks, an unknown one and a
    committed one without a result; returns the RESULT_COMMITTED seq."""
    chunk = 64 * 1024
    for ev in happy("inv-r"):
        await j.append(ev)
    for i in range(0, len(body), chunk):
        await j.put_result_chunk("inv-r", "body", i // chunk, body[i : i + chunk])
    stored = await j.commit_result(Event(E.RESULT_COMMITTED, "inv-r"), summary={"status": 201})
    for ev in interrupted("inv-u"):
        await j.append(ev)
    for ev in happy("inv-z"):
        await j.append(ev)
    assert stored.seq is not None
    return int(stored.seq)


def decline_record_once(monkeypatch: Any, iid: str) -> list[str]:
    """``Journal.record`` of ``iid`` is declined once by the database (``ReadFailed``: a
    statement timeout, a lock not granted), then reads as usual.  Returns the ids declined."""
    from affidavit.journal import ReadFailed
    from affidavit.journal.store import Journal

    real = Journal.record
    declined: list[str] = []

    def record(self: Journal, invocation_id: str, now: Any = None, **kw: Any) -> Any:
        if invocation_id == iid and not declined:
            declined.append(invocation_id)
            raise ReadFailed("canceling statement due to statement timeout")
        return real(self, invocation_id, now, **kw)

    monkeypatch.setattr(Journal, "record", record)
    return declined


def decline_every_record(monkeypatch: Any) -> None:
    """Every record read -- the writing journal's (``Journal.record``) and a view's own
    reader's (``JournalReader.record``: ``Broker.view``) -- is declined by the database, as a
    busy journal declines it (SQLITE_BUSY past the busy timeout; on PostgreSQL a statement
    timeout): inside the journal's own ``_read``, which words it -- ``journal <where>: the
    record of invocation <id> cannot be read: ...``, the location and the caller's id in one
    line."""
    import sqlite3

    from affidavit.journal import JournalReader
    from affidavit.journal.store import Journal

    def busy(_tables: Any) -> None:
        exc = sqlite3.OperationalError("database is locked")
        exc.sqlite_errorcode = 5  # type: ignore[attr-defined]  # SQLITE_BUSY
        raise exc

    def record(self: JournalReader, invocation_id: str, now: Any = None, **kw: Any) -> Any:
        return self._read(busy, f"the record of invocation {invocation_id}")

    monkeypatch.setattr(Journal, "record", record)
    monkeypatch.setattr(JournalReader, "record", record)


def alter_record(monkeypatch: Any, iid: str, words: str) -> None:
    """Every ``Journal.record`` of ``iid`` meets a row altered in place (``AlteredRow``), as
    ``tests/journal/test_altered_rows.py`` alters one: raised inside the journal's own
    ``_read``, which words it as every read does."""
    from affidavit.journal import AlteredRow
    from affidavit.journal.store import Journal

    real = Journal.record

    def altered(_tables: Any) -> Any:
        raise AlteredRow(words)

    def record(self: Journal, invocation_id: str, now: Any = None, **kw: Any) -> Any:
        if invocation_id == iid:
            return self._read(altered, f"the record of invocation {iid}")
        return real(self, invocation_id, now, **kw)

    monkeypatch.setattr(Journal, "record", record)


def unstick(writer: Writer) -> None:
    """Only when the writer left writes unanswered (the bug): answer them, so that the test
    fails on its assertions instead of hanging."""
    for r in list(writer._pending):
        r.error = JournalWriteError("left waiting by the test")
        r.finished = True
        if r.parked and r.task is not None:
            trio.lowlevel.reschedule(r.task)
    writer._pending.clear()


def unstick_handed(writer: Writer) -> None:
    """Only when a batch handed to a thread that stopped was left unanswered (the bug): answer
    it and wake the writer task, so that the test fails instead of hanging."""
    handoff = writer._inflight
    if handoff is None or handoff.batch[0].finished:
        return
    writer._inflight = None
    writer._pending.extend(handoff.batch)
    unstick(writer)
    writer._wake_runner()


def pg_keys(tmp: Path) -> dict[str, Path]:
    """The key files of a PostgreSQL journal's one writer ("a")."""
    return {"key_file": tmp / "shared.key", "signing_key": tmp / "a.signing.key"}


@asynccontextmanager
async def at_dispatch(
    url: str, tmp: Path, within: float, iid: str = "inv-1"
) -> AsyncIterator[tuple[Journal, list[Event]]]:
    """A PostgreSQL journal (writer "a", ``reconnect`` ``within``) holding an invocation's
    rows up to DISPATCH_STARTED; that row (``events[3]``) is the caller's to write."""
    events = until_dispatch(iid)
    async with Journal.open(url, reconnect_within=within, **pg_keys(tmp)) as j:
        for ev in events[:3]:
            await j.append(ev)
        yield j, events


async def lose_runs_then_commit(
    pg: Cluster, pg_url: str, tmp: Path, *, within: float, losses: int, limit: float = 30
) -> float:
    """DISPATCH_STARTED whose first ``losses`` runs lose their session (new connections
    succeeding), the next kept, within ``reconnect`` ``within``: committed once, every row
    verifiable.  How long the append took."""
    from tests.postgres import lost_runs, terminate_on_insert

    database = pg_url.rsplit("/", 1)[1]
    async with at_dispatch(pg_url, tmp, within) as (j, events):
        terminate_on_insert(pg, database, "DISPATCH_STARTED", times=losses)
        started = time.monotonic()
        with trio.fail_after(limit):
            stored = await j.append(events[3], barrier=True)
        elapsed = time.monotonic() - started
    assert stored.seq == 4 and lost_runs(pg, database) == losses + 1
    with JournalReader.open(pg_url) as r:
        assert [e.seq for e in r.events("inv-1")] == [1, 2, 3, 4] and r.verify().ok
    return elapsed
