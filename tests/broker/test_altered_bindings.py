"""A same-key retry over an altered idempotency binding (journal/bindings.py).

Someone who can write the journal file points a key's binding at another invocation, or at one
with no event, or deletes it: a retry with that key must not be answered with the other
invocation's result as its own, nor sent again -- the call raises ``AlteredRow`` (a
``JournalError``: the daemon answers it as a journal failure), and the server sees no further
request.  A removed binding is found at the lookup's miss through the index of the chained
ACTION_ACCEPTED events by key (SQLite schema 5; docs/journal.md, "Idempotency bindings"), and by
``journal verify``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import trio

from affidavit.cli import main as cli_main
from affidavit.journal import JournalReader
from affidavit.journal.rows import AlteredRow
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import assert_ok, http_target, open_broker, write_config
from .http_rows import IDEM, LIMIT, POST


def _tamper(db: Path, statement: str, *params: object) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute(statement, params)
    finally:
        conn.close()


async def test_a_binding_pointed_at_another_invocation_is_altered_never_its_result(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(201, body=b'{"id":"x"}'))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, idempotency=IDEM)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                a = await broker.call({**POST, "idempotency_key": "key-a"})
                b = await broker.call({**POST, "idempotency_key": "key-b"})
            assert_ok(broker, a)
            assert_ok(broker, b)
            with trio.fail_after(LIMIT):  # a genuine retry: answered from A, not sent
                again = await broker.call({**POST, "idempotency_key": "key-a"})
            assert again["invocation_id"] == a["invocation_id"]
            assert len(srv.requests) == 2
        db = tmp_path / "journal.db"
        _tamper(
            db,
            "UPDATE idempotency SET invocation_id = ? WHERE key = 'key-a'",
            b["invocation_id"],
        )
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT), pytest.raises(AlteredRow, match="binding was altered"):
                await broker.call({**POST, "idempotency_key": "key-a"})
        assert len(srv.requests) == 2  # nothing sent again
        with JournalReader.open(db) as r:
            report = r.verify()
        assert not report.ok and "binding" in report.reason


async def test_a_binding_given_another_fingerprint_is_altered_not_a_mismatch(
    tmp_path: Path, token: str
) -> None:
    """The same request again, its binding row's fingerprint changed: not IDEMPOTENCY_MISMATCH
    (a refusal the chained event does not back), but an altered binding."""
    async with HostileServer.running(scripts.serve(Reply(201))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, idempotency=IDEM)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                a = await broker.call({**POST, "idempotency_key": "key-a"})
            assert_ok(broker, a)
        _tamper(
            tmp_path / "journal.db",
            "UPDATE idempotency SET fingerprint = 'sha256:0' WHERE key = 'key-a'",
        )
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT), pytest.raises(AlteredRow, match="binding was altered"):
                await broker.call({**POST, "idempotency_key": "key-a"})
        assert len(srv.requests) == 1


async def test_a_removed_binding_is_refused_at_the_retry_and_found_by_verify(
    tmp_path: Path, token: str
) -> None:
    """The double charge the journal exists to prevent: the binding row deleted with plain
    sqlite3, a same-key retry finds no binding -- and must not bind the key again and send."""
    async with HostileServer.running(scripts.serve(Reply(201))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, idempotency=IDEM)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                a = await broker.call({**POST, "idempotency_key": "key-a"})
            assert_ok(broker, a)
        db = tmp_path / "journal.db"
        with JournalReader.open(db) as r:
            intact = r.verify()
            accepted = r.events(a["invocation_id"])[0].seq
        assert intact.ok and intact.bindings == 1
        _tamper(db, "DELETE FROM idempotency WHERE key = 'key-a'")
        async with open_broker(cfg) as broker:
            for _ in range(2):  # refused each time: nothing bound by the first refusal
                with (
                    trio.fail_after(LIMIT),
                    pytest.raises(AlteredRow, match="binding was altered") as exc,
                ):
                    await broker.call({**POST, "idempotency_key": "key-a"})
                assert f"ACTION_ACCEPTED at seq {accepted} names it" in str(exc.value)
                assert "key-a" not in str(exc.value)
            with trio.fail_after(LIMIT):  # another key is bound and sent as ever
                b = await broker.call({**POST, "idempotency_key": "key-b"})
            assert_ok(broker, b)
        assert len(srv.requests) == 2  # A once, B once: A never sent again
        with JournalReader.open(db) as r:
            report = r.verify()
            assert r.find_idempotency(IDEM["scope"], "key-a") is None  # nothing bound anew
        assert (report.ok, report.first_bad_seq) == (False, accepted)
        assert "no binding row" in report.reason
        assert cli_main(["journal", "verify", "--journal", str(db)]) == 1


async def test_a_binding_pointed_at_an_invocation_with_no_event_is_not_taken_over(
    tmp_path: Path, token: str
) -> None:
    """A binding whose invocation has no event, created long ago, is one a binder left:
    the next same-key call takes it over and sends.  Pointed there by someone from an
    invocation whose chained ACTION_ACCEPTED names the key, it is altered, never sent again."""
    async with HostileServer.running(scripts.serve(Reply(201))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, idempotency=IDEM)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                a = await broker.call({**POST, "idempotency_key": "key-a"})
            assert_ok(broker, a)
        _tamper(
            tmp_path / "journal.db",
            "UPDATE idempotency SET invocation_id = 'act_nothing', created_at = 0 "
            "WHERE key = 'key-a'",
        )
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT), pytest.raises(AlteredRow, match="binding was altered"):
                await broker.call({**POST, "idempotency_key": "key-a"})
        assert len(srv.requests) == 1
