"""A journal that refuses writes mid-call (disk full, I/O error) gives an envelope rendered from
what the durable record proves -- never a traceback, never a claim the record cannot back.

Seed, "A result delivery error must not repeat execution": "Storing the result can fail after
remote execution.  If the complete response is in the broker's memory but cannot be committed,
the broker knows more than a plain unknown expresses, yet the evidence will not survive a crash.
Return phase=result_delivery, include outcome=committed only when the durability contract allows
this to be confirmed by the current record, and require immediate operator intervention."

The faults are the journal's own: a ``before_commit`` hook that fails a transaction's COMMIT
exactly as a full disk does (``sqlite3.OperationalError: database or disk is full``, code
SQLITE_FULL, rolled back), and the
segment files' writes or syncs failing as a full or failing disk's do.  The subprocess tests
(test_unusable_journal.py) fill a real file limit.
"""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.engine import CallNotRecorded
from affidavit.journal import Batch, Journal, JournalWriteError, segments
from affidavit.journal.sqlite_wal import SQLITE_FULL
from affidavit.statemachine import CODES, NOTHING_SENT_YET, Code, EventKind
from affidavit.views.records import shown_error
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import (
    FakeResolver,
    assert_error,
    assert_recovered_as_rendered,
    assert_unknown_after_dispatch,
    custom_resolver,
    http_target,
    open_broker,
    write_config,
)

LIMIT = 30
SQLITE_IOERR_FSYNC = 10 | (4 << 8)
BIG = b"x" * (300 * 1024)  # several result chunks
POST = {"target": "api", "method": "POST", "path": "/charge", "body": "{}"}


class DiskFull:
    """A ``before_commit`` hook: the first transaction that writes what ``refuse`` picks (new
    event kinds, new result chunks) fails as a full disk does; with ``stays_full`` so does every
    transaction after it.  It fails at its COMMIT, as a real full disk does in WAL mode (a small
    transaction's pages are written to the -wal only then): SQLITE_FULL, nothing of it in the
    -wal (tests/journal/test_commit_write_failure.py fills a real file size limit so).  ``first``
    SQLITE_IOERR_FSYNC: the first refused COMMIT fails its sync instead, whether it landed
    unknown (``CommitUnknown``), those after it full."""

    def __init__(
        self,
        journal: Journal,
        refuse: Callable[[list[str], int], bool],
        stays_full: bool,
        first: int = SQLITE_FULL,
    ) -> None:
        self.conn = journal.write_connection
        self.refuse = refuse
        self.stays_full = stays_full
        self.full = False
        self.failed = 0
        self.head = self._head()
        self.refusing = False
        backend = journal.backend
        commit = backend.commit

        def full_commit(conn: Any) -> None:
            if not self.refusing:
                commit(conn)
                return
            self.refusing = False
            code = first if self.failed == 1 else SQLITE_FULL
            words = "database or disk is full" if code == SQLITE_FULL else "disk I/O error"
            exc = sqlite3.OperationalError(words)
            exc.sqlite_errorcode = code  # type: ignore[attr-defined]
            raise exc

        backend.commit = full_commit  # type: ignore[method-assign]

    def _head(self) -> tuple[int, int]:
        seq = self.conn.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0]
        chunks = self.conn.execute("SELECT count(*) FROM result_chunks").fetchone()[0]
        return int(seq), int(chunks)

    def __call__(self, batch: Batch) -> None:
        seq, chunks = self._head()  # inside the transaction: its own rows count
        kinds = [
            str(k)
            for (k,) in self.conn.execute("SELECT kind FROM events WHERE seq > ?", (self.head[0],))
        ]
        if (self.full and self.stays_full) or self.refuse(kinds, chunks - self.head[1]):
            self.full = True
            self.failed += 1
            self.refusing = True  # its COMMIT fails
            return
        self.head = (seq, chunks)


def _store_failed_committed(broker: object, env: dict[str, Any]) -> Any:
    """The envelope of a complete response whose result could not be stored, the response on
    record: result_delivery, committed, retry never, RESULT_STORE_FAILED."""
    return assert_error(
        broker,
        env,
        phase="result_delivery",
        outcome="committed",
        retry="never",
        code="RESULT_STORE_FAILED",
    )


def _kinds(broker: object, iid: str) -> list[EventKind]:
    return [e.kind for e in broker.events(iid)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("fault", ["write", "sync"])
async def test_a_complete_response_whose_chunks_cannot_be_stored_is_result_store_failed(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """A long response's chunks fail as they are stored -- the segment file's disk is full, or
    its sync fails (journal/segments.py) -- and the small events fit: the record itself
    confirms the outcome, and nothing of the result is committed."""
    if fault == "write":

        def pwritev(fd: int, buffers: object, pos: int) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(segments.os, "pwritev", pwritev)
    else:

        def fdatasync(fd: int) -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(segments.os, "fdatasync", fdatasync)
    body = b"x" * (2 * 1024 * 1024)  # spills past the chunks held in memory
    async with HostileServer.running(scripts.serve(Reply(201, body=body))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                env = await broker.call(POST)
                rec = _store_failed_committed(broker, env)
                assert rec.state == "store_failed_committed" and rec.final
                kinds = _kinds(broker, env["invocation_id"])
                assert kinds[-2:] == [
                    EventKind.REMOTE_RESPONSE_COMPLETE,
                    EventKind.RESULT_STORE_FAILED,
                ]
                assert EventKind.RESULT_COMMITTED not in kinds
                assert broker.journal.read_result(env["invocation_id"]) is None
                # A read, never a second dispatch; the record says the same later.
                again = await broker.fetch_result(env["invocation_id"])
                assert again is not None and again["error"] == env["error"]
        assert len(srv.requests) == 1


@pytest.mark.parametrize("first", [SQLITE_FULL, SQLITE_IOERR_FSYNC], ids=["full", "sync"])
@pytest.mark.parametrize("size", [len(BIG), 2 * 1024 * 1024 + 5], ids=["inline", "by_reference"])
async def test_a_result_commit_whose_whole_batch_fails_records_the_complete_response_again(
    tmp_path: Path, token: str, size: int, first: int
) -> None:
    """The disk fills at the commit's own transaction: the batch is rolled back whole -- the
    tail chunk, RESULT_COMMITTED and the complete response posted with them -- and the next
    small writes fit.  The complete response is appended again, once: the record confirms the
    outcome (test_commit_refused.py: a commit refused while its batch committed).  A commit
    whose sync failed, whether it landed unknown, is settled so too: on SQLite the next commit
    is written over its frames."""
    async with HostileServer.running(scripts.serve(Reply(201, body=b"c" * size))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                full = DiskFull(
                    broker.journal,
                    lambda kinds, _: "RESULT_COMMITTED" in kinds,
                    stays_full=False,
                    first=first,
                )
                broker.journal.before_commit = full
                env = await broker.call(POST)
                rec = _store_failed_committed(broker, env)
                assert full.failed == 1
                assert rec.state == "store_failed_committed"
                kinds = _kinds(broker, env["invocation_id"])
                assert kinds.count(EventKind.REMOTE_RESPONSE_COMPLETE) == 1
                assert kinds[-2:] == [
                    EventKind.REMOTE_RESPONSE_COMPLETE,
                    EventKind.RESULT_STORE_FAILED,
                ]
                assert EventKind.RESULT_COMMITTED not in kinds
                assert broker.journal.read_result(env["invocation_id"]) is None
        assert len(srv.requests) == 1


async def test_a_result_commit_that_may_land_and_nothing_after_it_is_not_answered(
    tmp_path: Path, token: str
) -> None:
    """RESULT_COMMITTED's sync fails (whether it landed unknown: on SQLite an open after a crash
    before the next commit recovers it), and the disk is full for the writes after it: neither
    the complete response nor RESULT_STORE_FAILED lands to settle it.  A store failure rendered
    in memory is a claim the record may contradict: the call is not recorded (503
    JOURNAL_UNAVAILABLE through the daemon), naming the invocation whose record will tell."""
    async with HostileServer.running(scripts.serve(Reply(201, body=BIG))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                full = DiskFull(
                    broker.journal,
                    lambda kinds, _: "RESULT_COMMITTED" in kinds,
                    stays_full=True,
                    first=SQLITE_IOERR_FSYNC,
                )
                broker.journal.before_commit = full
                with pytest.raises(CallNotRecorded) as info:
                    await broker.call(POST)
                assert full.failed >= 2
                iid = info.value.invocation_id
                assert iid is not None and iid in str(info.value)
                assert EventKind.RESULT_STORE_FAILED not in _kinds(broker, iid)
        assert len(srv.requests) == 1


async def test_when_nothing_more_fits_the_envelope_is_what_recovery_writes(
    tmp_path: Path, token: str
) -> None:
    """The disk stays full from the first chunk on: neither the complete response nor
    RESULT_STORE_FAILED lands, so the record proves a dispatch and nothing after it.  The
    envelope is the event recovery closes that record with (ATTEMPT_INTERRUPTED: remote
    execution, outcome unknown, retry reconcile) -- a RESULT_STORE_FAILED, retry never, shown
    over it was contradicted by the record once recovery ran (audit 53b F1)."""
    async with HostileServer.running(scripts.serve(Reply(201, body=BIG))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                full = DiskFull(broker.journal, lambda kinds, chunks: chunks > 0, stays_full=True)
                broker.journal.before_commit = full
                env = await broker.call(POST)
                assert_unknown_after_dispatch(env)
                assert env["evidence"]["dispatch_started"] is True
                iid = env["invocation_id"]
                kinds = _kinds(broker, iid)
                assert EventKind.REMOTE_RESPONSE_COMPLETE not in kinds
                assert EventKind.ATTEMPT_INTERRUPTED not in kinds  # rendered, not durable
                # The next call meets the same full disk before anything of it is durable: the
                # journal is unusable, said as such (the CLI turns it into exit 2).
                with pytest.raises(JournalWriteError, match="full"):
                    await broker.call(POST)
            await assert_recovered_as_rendered(cfg, env)
        assert len(srv.requests) == 1


async def test_dispatch_that_cannot_be_recorded_is_not_sent_and_says_connection_setup(
    tmp_path: Path, token: str
) -> None:
    """The preamble is durable (a slow name lookup let the writer commit it), then the disk
    fills: DISPATCH_STARTED is refused, so the gate stops the write.  The durable record proves
    a credential step and no dispatch: connection_setup, not_attempted."""

    async def slow(name: str) -> None:
        await trio.sleep(0.2)

    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        port = srv.url.rsplit(":", 1)[1]
        cfg = write_config(
            tmp_path, {"api": http_target(f"http://api.test:{port}", trust_cleartext=True)}
        )
        with custom_resolver(FakeResolver({"api.test": "127.0.0.1"}, on_lookup=slow)):
            with trio.fail_after(LIMIT):
                async with open_broker(cfg) as broker:
                    broker.journal.before_commit = DiskFull(
                        broker.journal, lambda kinds, _: "DISPATCH_STARTED" in kinds, True
                    )
                    env = await broker.call(POST)
                    err = env["error"]
                    assert (err["phase"], err["outcome"], err["code"]) == (
                        "connection_setup",
                        "not_attempted",
                        "SETUP_FAILED",
                    )
                    assert env["evidence"]["dispatch_started"] is False
                    # The message names the journal as the cause, never a transport failure.
                    assert "transport" not in err["message"], err["message"]
                    assert err["message"].startswith("The journal could not record"), err
                    assert "nothing was sent" in err["message"], err
                    kinds = _kinds(broker, env["invocation_id"])
                    assert kinds[-1] is EventKind.CREDENTIAL_AUTHORIZED  # all that is durable
        assert srv.requests == []


async def test_a_dispatch_refused_once_names_the_journal_not_a_transport(
    tmp_path: Path, token: str
) -> None:
    """DISPATCH_STARTED refused once (the disk full for that one transaction): the gate stops
    the write and the attempt's own SETUP_FAILED is recorded -- naming the journal, not "another
    transport reason" (no connection failed); not_attempted, nothing sent."""

    async def slow(name: str) -> None:
        await trio.sleep(0.2)

    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        port = srv.url.rsplit(":", 1)[1]
        cfg = write_config(
            tmp_path, {"api": http_target(f"http://api.test:{port}", trust_cleartext=True)}
        )
        with custom_resolver(FakeResolver({"api.test": "127.0.0.1"}, on_lookup=slow)):
            with trio.fail_after(LIMIT):
                async with open_broker(cfg) as broker:
                    broker.journal.before_commit = DiskFull(
                        broker.journal, lambda kinds, _: "DISPATCH_STARTED" in kinds, False
                    )
                    env = await broker.call(POST)
                    err = env["error"]
                    assert (err["phase"], err["outcome"], err["code"]) == (
                        "connection_setup",
                        "not_attempted",
                        "SETUP_FAILED",
                    )
                    assert env["evidence"]["dispatch_started"] is False
                    assert "transport" not in err["message"], err["message"]
                    assert err["message"].startswith("The journal refused a write"), err
                    kinds = _kinds(broker, env["invocation_id"])
                    assert EventKind.DISPATCH_STARTED not in kinds, kinds
                    assert kinds[-1] is EventKind.SETUP_FAILED, kinds  # recorded, not guessed
        assert srv.requests == []


async def test_a_journal_that_refuses_the_first_write_is_unusable_and_nothing_is_sent(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                broker.journal.before_commit = DiskFull(
                    broker.journal, lambda kinds, _: bool(kinds), stays_full=True
                )
                with pytest.raises(JournalWriteError, match=r"journal\.db: .*full"):
                    await broker.call(POST)
        assert srv.requests == []


async def test_an_interrupted_attempt_the_journal_cannot_close_stays_unknown(
    tmp_path: Path, token: str
) -> None:
    """Dispatched, the body cut, and the disk full: the envelope says remote_execution/unknown
    from the durable DISPATCH_STARTED, as recovery will write it later."""
    async with HostileServer.running(scripts.cut_mid_body()) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                broker.journal.before_commit = DiskFull(
                    broker.journal, lambda kinds, _: "ATTEMPT_INTERRUPTED" in kinds, True
                )
                env = await broker.call(POST)
                err = env["error"]
                assert (err["phase"], err["outcome"], err["code"]) == (
                    "remote_execution",
                    "unknown",
                    "REMOTE_OUTCOME_UNKNOWN",
                )
                kinds = _kinds(broker, env["invocation_id"])
                assert EventKind.DISPATCH_STARTED in kinds
                assert EventKind.ATTEMPT_INTERRUPTED not in kinds
        assert len(srv.requests) == 1


async def test_a_refused_close_reads_in_progress_saying_what_the_record_proves(
    tmp_path: Path, token: str
) -> None:
    """DISPATCH_STARTED and the closing SETUP_FAILED are both refused: the call answered
    SETUP_FAILED / backoff, rendered; the record stays open until its lease runs out.  Read in
    that window (audit 53b F3), it says what it proves -- no dispatch on record: nothing sent so
    far, a new call safe once it ends not_attempted -- in the envelope and in the views, not
    "never send it again".  A record that shows a dispatch keeps IN_PROGRESS's own words."""

    async def slow(name: str) -> None:
        await trio.sleep(0.2)

    async with HostileServer.running(scripts.cut_mid_body()) as srv:
        port = srv.url.rsplit(":", 1)[1]
        cfg = write_config(
            tmp_path, {"api": http_target(f"http://api.test:{port}", trust_cleartext=True)}
        )
        with custom_resolver(FakeResolver({"api.test": "127.0.0.1"}, on_lookup=slow)):
            with trio.fail_after(LIMIT):
                async with open_broker(cfg) as broker:
                    for refused, sent in (
                        ("DISPATCH_STARTED", False),
                        ("ATTEMPT_INTERRUPTED", True),
                    ):
                        broker.journal.before_commit = DiskFull(
                            broker.journal, lambda kinds, _, k=refused: k in kinds, True
                        )
                        env = await broker.call(POST)
                        broker.journal.before_commit = None
                        iid = env["invocation_id"]
                        assert env["evidence"]["dispatch_started"] is sent
                        read = await broker.fetch_result(iid)
                        assert read is not None
                        err = read["error"]
                        assert (err["code"], err["retry"]) == ("IN_PROGRESS", "fetch_result")
                        rec = broker.record(iid)
                        assert not rec.final
                        if sent:
                            assert err["message"] == CODES[Code.IN_PROGRESS].meaning
                            assert shown_error(rec)[1] != NOTHING_SENT_YET
                        else:
                            assert env["error"]["retry"] == "backoff"
                            assert err["message"] == NOTHING_SENT_YET
                            assert shown_error(rec) == (None, NOTHING_SENT_YET, None)
        assert len(srv.requests) == 1
