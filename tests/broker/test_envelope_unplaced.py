"""A call's envelope and its record view never carry where the journal or a key file lives.

``engine.unplaced`` takes the journal's location out of the API's own errors (``api_error``);
an envelope and a record view are rendered from the projected record and its events' attrs, not
from an exception -- so every event a failure path records must itself be free of location.
Each failure path here runs with the journal (and its broker key files) in a canary-named
directory (a PostgreSQL journal: a canary-named database) and, for the credential, a key file
in another; the fault raised carries the canary in its own words, as a driver's or the OS's
would.  Neither the envelope nor the record view the daemon and the MCP server answer with
(``views.record_view``) may name any of them -- the operator's sealed detail and log may."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.journal import segments
from affidavit.statemachine import EventKind
from affidavit.views import record_view
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster

from .helpers import FakeResolver, custom_resolver, http_target, open_broker, write_config
from .test_journal_faults import DiskFull

LIMIT = 30
JOURNAL_DIR = "canary-journal-dir-4e1b"
KEY_DIR = "canary-key-dir-9d2c"
POST = {"target": "api", "method": "POST", "path": "/charge", "body": "{}"}


def _home(tmp_path: Path) -> Path:
    home = tmp_path / JOURNAL_DIR
    home.mkdir()
    return home


def _shown(broker: Any, env: dict[str, Any]) -> str:
    """Everything a caller may be shown of the call: its envelope, its record view."""
    iid = env["invocation_id"]
    rec = broker.record(iid)
    assert rec is not None, env
    return json.dumps(env) + json.dumps(record_view(rec, broker.events(iid)))


def _assert_unplaced(shown: str, tmp_path: Path) -> None:
    for canary in (JOURNAL_DIR, KEY_DIR, str(tmp_path), "journal.db"):
        assert canary not in shown, (canary, shown)


async def _slow(name: str) -> None:
    await trio.sleep(0.2)  # the preamble is committed before the gate's write


@pytest.mark.parametrize("stays_full", [False, True], ids=["refused_once", "stays_refused"])
async def test_a_dispatch_the_journal_refuses_does_not_name_it(
    tmp_path: Path, token: str, stays_full: bool
) -> None:
    """DISPATCH_STARTED refused (SETUP_FAILED at stage ``journal``; the envelope from the
    record when nothing more can be written): the refusal's words name the journal's file."""
    home = _home(tmp_path)
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        port = srv.url.rsplit(":", 1)[1]
        cfg = write_config(
            home, {"api": http_target(f"http://api.test:{port}", trust_cleartext=True)}
        )
        with custom_resolver(FakeResolver({"api.test": "127.0.0.1"}, on_lookup=_slow)):
            with trio.fail_after(LIMIT):
                async with open_broker(cfg) as broker:
                    broker.journal.before_commit = DiskFull(
                        broker.journal, lambda kinds, _: "DISPATCH_STARTED" in kinds, stays_full
                    )
                    env = await broker.call(POST)
                    assert env["error"]["code"] == "SETUP_FAILED", env
                    broker.journal.before_commit = None
                    _assert_unplaced(_shown(broker, env), tmp_path)
        assert srv.requests == []


async def test_an_interrupted_attempt_the_journal_cannot_close_does_not_name_it(
    tmp_path: Path, token: str
) -> None:
    home = _home(tmp_path)
    async with HostileServer.running(scripts.cut_mid_body()) as srv:
        cfg = write_config(home, {"api": http_target(srv.url)})
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                broker.journal.before_commit = DiskFull(
                    broker.journal, lambda kinds, _: "ATTEMPT_INTERRUPTED" in kinds, True
                )
                env = await broker.call(POST)
                assert env["error"]["code"] == "REMOTE_OUTCOME_UNKNOWN", env
                broker.journal.before_commit = None
                _assert_unplaced(_shown(broker, env), tmp_path)


async def test_a_result_the_journal_cannot_store_does_not_name_it(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RESULT_STORE_FAILED: the segment file's write fails with its path in the OS's words."""
    home = _home(tmp_path)

    def pwritev(fd: int, buffers: object, pos: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device", str(home / "journal.db.results"))

    monkeypatch.setattr(segments.os, "pwritev", pwritev)
    body = b"x" * (2 * 1024 * 1024)
    async with HostileServer.running(scripts.serve(Reply(201, body=body))) as srv:
        cfg = write_config(home, {"api": http_target(srv.url)})
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                env = await broker.call(POST)
                assert env["error"]["code"] == "RESULT_STORE_FAILED", env
                kinds = [e.kind for e in broker.events(env["invocation_id"])]
                assert EventKind.RESULT_STORE_FAILED in kinds, kinds
                _assert_unplaced(_shown(broker, env), tmp_path)


async def test_a_result_that_cannot_be_delivered_does_not_name_the_journal(
    tmp_path: Path, token: str
) -> None:
    """RESULT_DELIVERY_FAILED: the transfer's error names a path (a socket's, say)."""
    home = _home(tmp_path)

    async def broken(envelope: dict[str, Any]) -> None:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe", str(home / "journal.db"))

    async with HostileServer.running(scripts.serve(Reply(201, body=b"paid"))) as srv:
        cfg = write_config(home, {"api": http_target(srv.url)})
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                env = await broker.call(POST, deliver=broken)
                assert env["error"]["code"] == "RESULT_DELIVERY_FAILED", env
                _assert_unplaced(_shown(broker, env), tmp_path)


@pytest.mark.parametrize("present", [False, True], ids=["missing", "unreadable"])
async def test_a_key_file_that_fails_is_not_named(tmp_path: Path, present: bool) -> None:
    """CREDENTIAL_FAILED: the reference and the path it was read as are the operator's (sealed
    with the event), never the envelope's or the record view's."""
    home = _home(tmp_path)
    keys = tmp_path / KEY_DIR
    keys.mkdir()
    key = keys / "api.token"
    if present:
        key.mkdir()  # a directory where the file should be: refused, not missing
    async with HostileServer.running(scripts.serve(Reply(201, body=b"paid"))) as srv:
        target = http_target(srv.url, credential=f"file:{key}")
        cfg = write_config(home, {"api": target})
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                env = await broker.call(POST)
                assert env["error"]["field"] == "targets.api.credential", env
                kinds = [e.kind for e in broker.events(env["invocation_id"])]
                assert kinds[-1] is EventKind.CREDENTIAL_FAILED, kinds
                _assert_unplaced(_shown(broker, env), tmp_path)
        assert srv.requests == []


async def test_a_gate_read_a_canary_database_declines_does_not_name_it(
    tmp_path: Path, token: str, pg: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: the dispatch gate's read of the database's clock declined in words that name
    the database, its host and user (as libpq's do): SETUP_FAILED at ``journal_read``."""
    from affidavit.journal import ReadFailed
    from affidavit.journal.reader import JournalReader

    from .test_gate_read_declined import _decline_gate_clock
    from .test_journal_away_approved_dispatch import _approved

    database = "canary_db_3c8d"
    pg.sql(f'CREATE DATABASE "{database}"')
    url = pg.url(database)
    where = f"connection to server at 127.0.0.1:{pg.port}, user {pg.user}, database {database}"
    declined = _decline_gate_clock(monkeypatch)
    declining = JournalReader.database_now

    def database_now(self: JournalReader, purpose: str | None = None) -> float | None:
        try:
            return declining(self, purpose)
        except ReadFailed:
            raise ReadFailed(f"journal {url}: {where}: canceling statement") from None

    monkeypatch.setattr(JournalReader, "database_now", database_now)
    async with HostileServer.running(scripts.serve(Reply(201, body=b"{}"))) as srv:
        with trio.fail_after(LIMIT):
            async with _approved(tmp_path, srv.url, url) as (broker, iid):
                env = await broker.dispatch_approved(iid)
                assert declined == ["gate"] and env is not None, env
                assert env["error"]["code"] == "SETUP_FAILED", env
                shown = _shown(broker, env)
        assert srv.requests == []
    for canary in (database, pg.password, f"127.0.0.1:{pg.port}", "postgresql://"):
        assert canary not in shown, (canary, shown)


@pytest.mark.parametrize("key", ["drop", "boom"], ids=["query-fails", "answer-matches-neither"])
async def test_an_inconclusive_reconciliation_does_not_name_the_journal(
    tmp_path: Path, token: str, key: str
) -> None:
    """RECONCILE_INCONCLUSIVE: its reason and the query's code, on the original's record."""
    from .test_reconcile import _unknown, payments

    async with payments(_home(tmp_path)) as (_srv, b):
        iid = await _unknown(b, key)
        answer = await b.reconcile(iid, query=True)
        assert answer["reconciled"] is False, answer
        kinds = [e.kind for e in b.events(iid)]
        assert kinds[-1] is EventKind.RECONCILE_INCONCLUSIVE, kinds
        shown = json.dumps(answer) + _shown(b, answer["envelope"]) + _shown(b, answer["query"])
        _assert_unplaced(shown, tmp_path)
