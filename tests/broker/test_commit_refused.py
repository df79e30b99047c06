"""A result commit the journal *refuses* -- the stored chunks are not the ones this call wrote --
is RESULT_STORE_FAILED with the outcome the record proves, never a traceback.

The commit op (``journal/results_write.py``, ``commit_op``) reads the stored chunks inside the
committing transaction and refuses to write the completeness marker unless they are exactly the
chunks this call sealed.  A refusal is not a storage fault: only that one request fails, and
every other write of the batch commits -- the attempt's milestones and REMOTE_RESPONSE_COMPLETE,
posted just before the commit, included.  The engine must learn from the record which of its
posted rows are durable, not assume that they failed with the commit.

Where stored chunks can change under a commit: on a shared journal (PostgreSQL), where a result's
chunks are posted to the tables as they arrive (``results.PostingWriter``) and the commit checks
the stored rows against the ``ChunkLog`` of what this call sealed (``_logged_streams``).  The
tests there change the chunks between the transaction that stored them and the commit's, through
a second connection to the database, as anyone with write access to it would (a broker's role may
change ``result_chunks`` and ``result_audit``): ``around_transaction`` is entered in the writer
thread before each transaction begins, so the change lands at exactly that point.

On a SQLite journal the path does not exist: no chunk of a result is a row before its commit
(``journal/segments.py``: the first chunks are held in memory, longer streams go to segment
files), and the commit op writes every row of the result itself, dropping whatever rows another
writer left for the invocation.  The last test pins that: the same tampering there is harmless.
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.engine.sink import RESULT_CHUNK
from affidavit.journal import Batch, Journal, generate_auditor_keypair
from affidavit.journal.sealing import BrokerKey, chunk_aad
from affidavit.statemachine import Event, EventKind
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import (
    assert_error,
    assert_ok,
    assert_same_result,
    event_kinds,
    http_target,
    open_broker,
    raw_kinds,
    write_config,
)

E = EventKind
LIMIT = 60
POST = {"target": "api", "method": "POST", "path": "/charge", "body": "{}"}
SIZES = {
    # Both are several result chunks (64 KiB), so some are stored before the commit's batch.
    "inline": 300 * 1024,
    "by_reference": 2 * 1024 * 1024 + 5,  # past the 1 MiB inline limit
}

Tamper = Callable[["psycopg.Connection[Any]", str], None]

BOUNDED: dict[str, Any] = {
    "connect_timeout": 5,
    "options": "-c lock_timeout=5s -c statement_timeout=10s",
}
"""The second connection's limits: it runs in the writer thread, which a wait there would hold
past the test's own deadline (``trio.fail_after`` cannot cancel a thread)."""


def shared_journal(url: str, tmp: Path, **more: str) -> dict[str, str]:
    """The ``[journal]`` table of a broker on the database ``url``."""
    return {
        "url": url,
        "key_file": str(tmp / "shared.key"),
        "signing_key": str(tmp / "a.signing.key"),
        **more,
    }


class BetweenTransactions:
    """An ``around_transaction`` hook: before the first barrier transaction that finds result
    chunks stored -- the one carrying the stream's tail chunk, the complete response and
    RESULT_COMMITTED -- ``tamper(conn, invocation_id)`` runs on a second connection to the
    database and commits.  Once only."""

    def __init__(self, url: str, tamper: Tamper) -> None:
        self.url = url
        self.tamper = tamper
        self.done: str | None = None

    @contextlib.contextmanager
    def __call__(self, batch: Batch) -> Iterator[None]:
        if batch.barrier and self.done is None:
            with psycopg.connect(self.url, **BOUNDED) as conn:
                row = conn.execute("SELECT invocation_id FROM result_chunks LIMIT 1").fetchone()
                if row is not None:
                    self.tamper(conn, str(row[0]))
                    conn.commit()
                    self.done = str(row[0])
        yield


def restart_stream(key_file: Path) -> Tamper:
    """What a stale writer of the same invocation does when it starts the stream over
    (``chunk_op`` at index 0): drop the stream's chunks and store its own sealing of chunk 0 --
    here of the very same bytes, so only the sealing differs from what this call wrote."""

    def tamper(conn: psycopg.Connection[Any], iid: str) -> None:
        key = BrokerKey.load(key_file)
        aad = chunk_aad(iid, "body", 0)
        row = conn.execute(
            "SELECT data FROM result_chunks WHERE invocation_id = %s AND stream = 'body' "
            "AND idx = 0",
            (iid,),
        ).fetchone()
        assert row is not None
        resealed = key.seal(key.open(bytes(row[0]), aad), aad)
        conn.execute(
            "DELETE FROM result_chunks WHERE invocation_id = %s AND stream = 'body'", (iid,)
        )
        conn.execute(
            "INSERT INTO result_chunks (invocation_id, stream, idx, data) VALUES (%s, %s, 0, %s)",
            (iid, "body", resealed),
        )

    return tamper


def _assert_store_failed(
    broker: Broker, env: dict[str, Any], url: str, outcome: str = "committed"
) -> str:
    """The envelope and the record: result_delivery / ``outcome`` (the complete response's: it
    is on record) / never / RESULT_STORE_FAILED, the complete response on record exactly once,
    and no stored result."""
    rec = assert_error(
        broker,
        env,
        phase="result_delivery",
        outcome=outcome,
        retry="never",
        code="RESULT_STORE_FAILED",
    )
    assert rec.state == f"store_failed_{outcome}" and rec.final
    iid = str(env["invocation_id"])
    kinds = event_kinds(broker, iid)
    assert kinds.count(E.REMOTE_RESPONSE_COMPLETE) == 1
    assert kinds.count(E.RESULT_STORE_FAILED) == 1
    assert kinds[-1] is E.RESULT_STORE_FAILED
    assert E.RESULT_COMMITTED not in kinds
    assert env["evidence"]["response_complete"] is True
    assert "result" not in env
    assert broker.journal.read_result(iid) is None
    with psycopg.connect(url, **BOUNDED) as conn:
        row = conn.execute("SELECT count(*) FROM results WHERE invocation_id = %s", (iid,))
        assert row.fetchone() == (0,)
    assert broker.journal.verify().ok
    return iid


@pytest.mark.parametrize(
    ("size", "status", "outcome"),
    [
        ("inline", 201, "committed"),
        ("by_reference", 201, "committed"),
        ("inline", 422, "rejected"),
    ],
)
async def test_a_commit_refused_over_a_restarted_stream_is_result_store_failed(
    pg_url: str, tmp_path: Path, token: str, size: str, status: int, outcome: str
) -> None:
    """Another writer restarts the stream at index 0 between the chunks' transaction and the
    commit's: the commit refuses ("stored chunk 0 ... differs from what was written") while the
    complete response posted with it commits.  The envelope is rendered from that record: the
    outcome is the complete response's, committed or rejected."""
    body = b"r" * SIZES[size]
    async with HostileServer.running(scripts.serve(Reply(status, body=body))) as srv:
        journal = shared_journal(pg_url, tmp_path)
        cfg = write_config(tmp_path, {"api": http_target(srv.url)}, journal=journal)
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                hook = BetweenTransactions(pg_url, restart_stream(Path(journal["key_file"])))
                broker.journal.around_transaction = hook
                env = await broker.call(POST)
                broker.journal.around_transaction = None
                assert hook.done == env["invocation_id"]
                iid = _assert_store_failed(broker, env, pg_url, outcome)
                # A read, never a second dispatch; the record says the same later.
                again = await broker.fetch_result(iid)
                assert again is not None and again["error"] == env["error"]
        assert len(srv.requests) == 1


def delete_chunk(table: str, idx: int) -> Tamper:
    """Another connection deletes one stored chunk of the stream (``table``: ``result_chunks``,
    or ``result_audit`` for its auditor copy): the commit op refuses with a plain
    ``JournalError`` ("lacks chunk N", "lacks auditor copies"), not ``ResultStoreFailed``."""

    def tamper(conn: psycopg.Connection[Any], iid: str) -> None:
        gone = conn.execute(
            f"DELETE FROM {table} WHERE invocation_id = %s AND stream = 'body' AND idx = %s",
            (iid, idx),
        ).rowcount
        assert gone == 1

    return tamper


@pytest.mark.parametrize(
    ("table", "size"),
    [
        ("result_chunks", "inline"),
        ("result_chunks", "by_reference"),
        ("result_audit", "inline"),
    ],
)
async def test_a_commit_refused_over_a_missing_chunk_is_result_store_failed_not_a_crash(
    pg_url: str, tmp_path: Path, token: str, table: str, size: str
) -> None:
    """A stored chunk (or its auditor copy) deleted between the chunks' transaction and the
    commit's: the commit op refuses as it does for a chunk that differs, and the call ends the
    same way -- RESULT_STORE_FAILED with the outcome the record proves."""
    priv, pub = tmp_path / "auditor.pem", tmp_path / "auditor.pub"
    generate_auditor_keypair(priv, pub)
    body = b"m" * SIZES[size]
    async with HostileServer.running(scripts.serve(Reply(201, body=body))) as srv:
        journal = shared_journal(pg_url, tmp_path, auditor_public_key=str(pub))
        cfg = write_config(tmp_path, {"api": http_target(srv.url)}, journal=journal)
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                hook = BetweenTransactions(pg_url, delete_chunk(table, 1))
                broker.journal.around_transaction = hook
                env = await broker.call(POST)
                broker.journal.around_transaction = None
                assert hook.done == env["invocation_id"]
                iid = _assert_store_failed(broker, env, pg_url)
                again = await broker.fetch_result(iid)
                assert again is not None and again["error"] == env["error"]
        assert len(srv.requests) == 1


def alter_middle(table: str) -> Tamper:
    """Another connection changes one byte in the middle of the stream's chunk 1 (``table``:
    ``result_chunks``, or ``result_audit`` for its auditor copy) -- its header, tag and length
    kept, which is all the commit compared before it hashed the stored bytes."""

    def tamper(conn: psycopg.Connection[Any], iid: str) -> None:
        changed = conn.execute(
            f"UPDATE {table} SET data = set_byte(data, length(data) / 2, "
            "(get_byte(data, length(data) / 2) + 1) %% 256) "
            "WHERE invocation_id = %s AND stream = 'body' AND idx = 1",
            (iid,),
        ).rowcount
        assert changed == 1

    return tamper


@pytest.mark.parametrize("table", ["result_chunks", "result_audit"])
async def test_a_chunk_changed_in_the_middle_before_the_commit_is_refused(
    pg_url: str, tmp_path: Path, token: str, table: str
) -> None:
    """The marker records the SHA-256 of every sealed chunk: the commit hashes what is stored,
    so a chunk altered anywhere between its transaction and the commit's is refused -- not
    recorded under the hash of what the writer meant to store."""
    priv, pub = tmp_path / "auditor.pem", tmp_path / "auditor.pub"
    generate_auditor_keypair(priv, pub)
    async with HostileServer.running(scripts.serve(Reply(201, body=b"c" * SIZES["inline"]))) as srv:
        journal = shared_journal(pg_url, tmp_path, auditor_public_key=str(pub))
        cfg = write_config(tmp_path, {"api": http_target(srv.url)}, journal=journal)
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                hook = BetweenTransactions(pg_url, alter_middle(table))
                broker.journal.around_transaction = hook
                env = await broker.call(POST)
                broker.journal.around_transaction = None
                assert hook.done == env["invocation_id"]
                _assert_store_failed(broker, env, pg_url)
        assert len(srv.requests) == 1


# -- SQLite: nothing of a result is a row before its commit --------------------------------------

SqliteTamper = Callable[[sqlite3.Connection, str], None]


class BeforeTheCommit:
    """``commit_result`` and ``around_transaction`` together, on a SQLite journal: once the
    engine calls ``commit_result`` -- every chunk of the result put, and flushed by the sink --
    ``tamper(conn, invocation_id)`` runs before the next barrier transaction, the commit's, on
    a second connection to the journal file, and commits.  Once only.  ``committed_next``: the
    transaction that followed was the one that wrote RESULT_COMMITTED."""

    def __init__(self, journal: Journal, db: Path, tamper: SqliteTamper) -> None:
        self._commit_result = journal.commit_result
        self.db = db
        self.tamper = tamper
        self.armed: str | None = None
        self.done: str | None = None
        self.committed_next = False

    async def commit_result(self, event: Event, **kwargs: Any) -> Event:
        if self.armed is None:
            self.armed = event.invocation_id
        return await self._commit_result(event, **kwargs)

    @contextlib.contextmanager
    def around(self, batch: Batch) -> Iterator[None]:
        iid = self.armed
        if batch.barrier and iid is not None and self.done is None:
            conn = sqlite3.connect(self.db, isolation_level=None, timeout=5)
            try:
                conn.execute("BEGIN IMMEDIATE")
                self.tamper(conn, iid)
                conn.execute("COMMIT")
            finally:
                conn.close()
            self.done = iid
            yield
            self.committed_next = bool(raw_kinds(self.db, iid).count(E.RESULT_COMMITTED.value))
            return
        yield


def sqlite_tamper(kind: str, key_file: Path, body: bytes) -> SqliteTamper:
    """What another writer of the journal file can do to the invocation's result rows:

    * ``restart``: a stale writer's ``chunk_op`` at index 0 -- the stream's rows dropped and its
      own sealing of chunk 0 (of the very same bytes) stored;
    * ``stray``: rows no writer of this call stored -- a chunk past the stream's end, a chunk
      of a stream the result does not have, an auditor copy, a reference to a segment that
      does not exist;
    * ``delete``: every row of the result deleted -- there is none to delete."""

    def tamper(conn: sqlite3.Connection, iid: str) -> None:
        if kind == "restart":
            aad = chunk_aad(iid, "body", 0)
            sealed = BrokerKey.load(key_file).seal(body[:RESULT_CHUNK], aad)
            for table in ("result_chunks", "result_segments"):
                conn.execute(
                    f"DELETE FROM {table} WHERE invocation_id = ? AND stream = 'body'", (iid,)
                )
            conn.execute(
                "INSERT INTO result_chunks (invocation_id, stream, idx, data) "
                "VALUES (?, 'body', 0, ?)",
                (iid, sealed),
            )
        elif kind == "stray":
            junk = b"\x00" * 64
            end = math.ceil(len(body) / RESULT_CHUNK)
            for table, stream, idx in (
                ("result_chunks", "body", end),
                ("result_chunks", "stderr", 0),
                ("result_audit", "body", 0),
            ):
                conn.execute(
                    f"INSERT INTO {table} (invocation_id, stream, idx, data) VALUES (?, ?, ?, ?)",
                    (iid, stream, idx, junk),
                )
            conn.execute(
                "INSERT INTO result_segments (invocation_id, audit, stream, idx, segment, pos, "
                "size) VALUES (?, 0, 'body', 1, ?, 0, 16)",
                (iid, "0" * 32 + ".seg"),
            )
        else:
            gone = sum(
                conn.execute(f"DELETE FROM {table} WHERE invocation_id = ?", (iid,)).rowcount
                for table in ("result_chunks", "result_audit", "result_segments")
            )
            assert gone == 0

    return tamper


def _result_rows(db: Path, iid: str, audit: bool) -> tuple[list[tuple[str, int]], int]:
    """The invocation's chunk rows in ``result_chunks`` (``result_audit``) and its references
    in ``result_segments``, as (stream, idx) in order; and how many are references."""
    table = "result_audit" if audit else "result_chunks"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            f"SELECT stream, idx, 0 FROM {table} WHERE invocation_id = ? UNION ALL "
            "SELECT stream, idx, 1 FROM result_segments WHERE invocation_id = ? AND audit = ? "
            "ORDER BY 1, 2",
            (iid, iid, int(audit)),
        ).fetchall()
    finally:
        conn.close()
    return [(str(s), int(i)) for s, i, _ in rows], sum(int(r) for _, _, r in rows)


@pytest.mark.parametrize("tamper", ["restart", "stray", "delete"])
@pytest.mark.parametrize(
    ("size", "spills"),
    [(256 * 1024, False), (2 * 1024 * 1024 + 5, True)],
    ids=["held", "spilled"],
)
async def test_on_a_sqlite_journal_the_commit_writes_its_own_rows_and_the_result_is_intact(
    tmp_path: Path,
    token: str,
    monkeypatch: pytest.MonkeyPatch,
    tamper: str,
    size: int,
    spills: bool,
) -> None:
    """The tampering above, on a SQLite journal, between the result's last chunk and its
    commit: nothing of the result is a row yet (``delete`` finds none), and the commit drops
    what another writer put there and writes its own rows -- held chunks inline, spilled ones
    as segment references.  The result is committed and delivered, reads back byte for byte,
    and the journal verifies."""
    priv, pub = tmp_path / "auditor.pem", tmp_path / "auditor.pub"
    generate_auditor_keypair(priv, pub)
    db = tmp_path / "journal.db"
    body = b"s" * size
    chunks = [("body", i) for i in range(math.ceil(size / RESULT_CHUNK))]
    async with HostileServer.running(scripts.serve(Reply(201, body=body))) as srv:
        cfg = write_config(
            tmp_path,
            {"api": http_target(srv.url)},
            journal={"path": str(db), "auditor_public_key": str(pub)},
        )
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                hook = BeforeTheCommit(
                    broker.journal, db, sqlite_tamper(tamper, Path(f"{db}.key"), body)
                )
                monkeypatch.setattr(broker.journal, "commit_result", hook.commit_result)
                broker.journal.around_transaction = hook.around
                env = await broker.call(POST)
                broker.journal.around_transaction = None
                assert hook.done == env["invocation_id"] and hook.committed_next
                await broker.settled()  # its delivery, queued (for the sync reads)
                rec = assert_ok(broker, env)
                # An answer by reference transferred none of the result: no delivery recorded.
                by_ref = "by_reference" in env["result"]
                assert rec.state == ("stored_committed" if by_ref else "delivered_committed")
                iid = env["invocation_id"]
                kinds = event_kinds(broker, iid)
                assert kinds.count(E.REMOTE_RESPONSE_COMPLETE) == 1
                assert kinds.count(E.RESULT_COMMITTED) == 1
                assert E.RESULT_STORE_FAILED not in kinds
                stored = broker.journal.read_result(iid)
                assert stored is not None and stored.streams == {"body": body}
                assert env["result"]["sha256"] == stored.sha256
                fetched = await broker.fetch_result(iid)
                assert fetched is not None and "error" not in fetched
                assert_same_result(env["result"], fetched["result"])
                assert broker.journal.verify().ok
        # Exactly the result's own rows: the stray ones dropped, none missing.
        sealed, refs = _result_rows(db, iid, audit=False)
        assert sealed == chunks and (refs > 0) is spills
        copies, _ = _result_rows(db, iid, audit=True)
        assert copies == [("", 0), *chunks]  # and the summary's auditor copy
        assert len(srv.requests) == 1
