"""Reading a record or a view while a shared journal's database is away (beyond ``[journal]
reconnect``) is JOURNAL_UNAVAILABLE, naming what could not be read -- never a bare 500, a
traceback in a log, or a raw driver message; and a journal that is there but cannot be read
for another reason (altered: its events table renamed away) is never called "unavailable".

A call is stored (the remote answered, the call committed); PostgreSQL is stopped with
``pg_ctl``; the daemon (``GET /v1/invocations/{id}``, ``/v1/actions``, ``/v1/sessions``,
``/v1/metrics``) and the embedded MCP server (``get_record``, ``list_actions``) are asked.
Once the database is back, the same reads answer.  ``JournalReader`` itself: a connection
refused on open is ``JournalUnavailable``; a wrong password or a database without a journal is
a ``JournalError`` that is not; a read's message names what it read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import trio

from affidavit.api.client import Client
from affidavit.api.wire import ApiError
from affidavit.journal import JournalError, JournalReader, JournalUnavailable
from tests.daemon.kit import WAIT
from tests.external import require_module
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster

from .awaykit import clean, daemon_on, database_stopped, mcp_on
from .helpers import http_target
from .test_journal_away_mid_call import ACTION, journal_table

BODY = b'{"id":"ch_1"}'


def _away(code: str, message: str, names: str, pg: Cluster) -> None:
    assert code == "JOURNAL_UNAVAILABLE", (code, message)
    assert names in message, message
    assert "\n" not in message and "Traceback" not in message, message
    assert "a read cannot be read" not in message, message
    assert pg.password not in message, message


def _not_away(code: str, message: str, pg: Cluster) -> None:
    assert code != "JOURNAL_UNAVAILABLE", (code, message)
    assert "unavailable" not in message.lower(), message
    assert "\n" not in message and "Traceback" not in message, message
    assert pg.password not in message, message


@contextmanager
def events_renamed(pg: Cluster, url: str) -> Iterator[None]:
    """The journal there, its events table gone under another name: unreadable, not away."""
    database = urlsplit(url).path.lstrip("/")
    pg.sql("ALTER TABLE events RENAME TO events_elsewhere", database)
    try:
        yield
    finally:
        pg.sql("ALTER TABLE events_elsewhere RENAME TO events", database)


# -- JournalReader ---------------------------------------------------------------------------


async def _stored_call(tmp_path: Path, pg_url: str, srv: HostileServer) -> str:
    from affidavit.api.broker import Broker

    from .helpers import write_config

    cfg = write_config(
        tmp_path, {"api": http_target(srv.url)}, journal=journal_table(tmp_path, pg_url)
    )
    async with Broker.open(str(cfg)) as broker:
        env = await broker.call(ACTION)
    assert env["result"]["body"] == BODY.decode(), env
    iid: str = env["invocation_id"]
    return iid


async def test_reader_open_while_the_database_is_away_is_journal_unavailable(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(201, body=BODY))) as srv:
        await _stored_call(tmp_path, pg_url, srv)
    async with database_stopped(pg):
        with pytest.raises(JournalUnavailable) as info:
            await trio.to_thread.run_sync(JournalReader.open, pg_url)
    assert "cannot connect" in str(info.value), info.value
    assert pg.password not in str(info.value)
    with JournalReader.open(pg_url) as reader:
        assert len(reader.list_actions()) == 1


async def test_a_read_while_the_database_is_away_names_what_it_read(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(201, body=BODY))) as srv:
        iid = await _stored_call(tmp_path, pg_url, srv)
    with JournalReader.open(pg_url) as reader:
        async with database_stopped(pg):
            with pytest.raises(JournalUnavailable) as events:
                reader.events(iid)
            with pytest.raises(JournalUnavailable) as head:
                reader.head()
            with pytest.raises(JournalUnavailable) as listed:
                reader.list_actions()
        assert reader.record(iid) is not None
        async with database_stopped(pg):  # a stream's connection lost: away, not altered
            with pytest.raises(JournalUnavailable) as streamed:
                list(reader.iter_actions())
    for info in (events, head, listed, streamed):
        text = str(info.value)
        assert "a read cannot be read" not in text, text
        assert pg.password not in text
    assert iid in str(events.value), events.value
    assert "the actions view" in str(listed.value), listed.value
    assert "the actions view" in str(streamed.value), streamed.value


async def test_reader_open_refused_for_another_reason_is_not_unavailable(
    pg: Cluster, pg_url: str
) -> None:
    database = urlsplit(pg_url).path.lstrip("/")
    with pytest.raises(JournalError) as empty:
        JournalReader.open(pg_url)  # a database, but no journal in it
    assert not isinstance(empty.value, JournalUnavailable), empty.value
    assert "no journal" in str(empty.value), empty.value
    wrong = pg.url(database, password="not-the-password")
    with pytest.raises(JournalError) as refused:
        JournalReader.open(wrong)
    assert not isinstance(refused.value, JournalUnavailable), refused.value
    assert "not-the-password" not in str(refused.value)


# -- the daemon ------------------------------------------------------------------------------


async def _daemon_reads(client: Client, iid: str) -> dict[str, ApiError]:
    """Each read route's refusal (every one must refuse)."""
    asks: dict[str, Any] = {
        "record": lambda: client.invocation(iid),
        "actions": lambda: client.actions(),
        "sessions": lambda: client.sessions(),
        "metrics": lambda: client.metrics(),
    }
    refused: dict[str, ApiError] = {}
    for name, ask in asks.items():
        with pytest.raises(ApiError) as info:
            await ask()
        refused[name] = info.value
    return refused


async def test_the_daemon_answers_503_journal_unavailable_for_a_record_and_the_views(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(201, body=BODY))) as srv:
        async with daemon_on(tmp_path, srv.url, pg_url, token) as (socket, daemon):
            with trio.fail_after(WAIT * 2):
                async with Client.open(socket) as client:
                    env = await client.call(ACTION)
                    iid = env["invocation_id"]
                    async with database_stopped(pg):
                        refused = await _daemon_reads(client, iid)
                    for name, exc in refused.items():
                        assert exc.status == 503, (name, exc)
                        _away(exc.code, exc.message, iid if name == "record" else name, pg)
                    found = await client.invocation(iid)
                    assert found is not None and found["record"]["invocation_id"] == iid
                    (row,) = (await client.actions())["actions"]
                    assert row["invocation_id"] == iid
        clean(daemon.log_text(), pg.password)


async def test_the_daemon_never_calls_an_altered_journal_unavailable(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(201, body=BODY))) as srv:
        async with daemon_on(tmp_path, srv.url, pg_url, token) as (socket, daemon):
            with trio.fail_after(WAIT * 2):
                async with Client.open(socket) as client:
                    env = await client.call(ACTION)
                    iid = env["invocation_id"]
                    with events_renamed(pg, pg_url):
                        refused = await _daemon_reads(client, iid)
                    for name, exc in refused.items():
                        assert exc.status == 500, (name, exc)
                        assert exc.code == "JOURNAL_UNREADABLE", (name, exc)
                        _not_away(exc.code, exc.message, pg)
                        # Nor where the journal is: a socket caller has no business knowing.
                        assert "postgresql://" not in exc.message, (name, exc)
                    found = await client.invocation(iid)
                    assert found is not None and found["record"]["invocation_id"] == iid
        clean(daemon.log_text(), pg.password)


# -- MCP, embedded ---------------------------------------------------------------------------


@asynccontextmanager
async def _mcp(tmp_path: Path, token: str, pg_url: str) -> AsyncIterator[tuple[Any, str, Path]]:
    """An embedded ``affidavit mcp`` with one stored call: (connection, its id, its log)."""
    require_module("mcp", "dev")
    from tests.mcp.kit import structured

    async with HostileServer.running(scripts.serve(Reply(201, body=BODY))) as srv:
        log = tmp_path / "mcp.log"
        async with mcp_on(tmp_path, srv.url, pg_url, token) as mcp:
            called = structured(await mcp.call("http_request", dict(ACTION)))
            yield mcp, called["invocation_id"], log


async def _mcp_reads(mcp: Any, iid: str) -> dict[str, dict[str, str]]:
    require_module("mcp", "dev")
    from tests.mcp.kit import structured

    answers: dict[str, dict[str, str]] = {}
    for name, args in (("get_record", {"invocation_id": iid}), ("list_actions", {})):
        result = await mcp.call(name, args)
        answer = structured(result)
        assert result.is_error is True, (name, answer)
        answers[name] = answer["api_error"]
    return answers


async def test_mcp_embedded_answers_journal_unavailable_for_a_record_and_the_actions(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    require_module("mcp", "dev")
    from tests.mcp.kit import structured

    async with _mcp(tmp_path, token, pg_url) as (mcp, iid, log):
        async with database_stopped(pg):
            answers = await _mcp_reads(mcp, iid)
        _away(answers["get_record"]["code"], answers["get_record"]["message"], iid, pg)
        _away(answers["list_actions"]["code"], answers["list_actions"]["message"], "actions", pg)
        again = structured(await mcp.call("get_record", {"invocation_id": iid}))
        assert again["record"]["invocation_id"] == iid, again
        listed = structured(await mcp.call("list_actions", {}))
        assert [r["invocation_id"] for r in listed["actions"]] == [iid], listed
    clean(log.read_text(encoding="utf-8", errors="replace"), pg.password)


async def test_mcp_embedded_never_calls_an_altered_journal_unavailable(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    require_module("mcp", "dev")
    from tests.mcp.kit import structured

    async with _mcp(tmp_path, token, pg_url) as (mcp, iid, log):
        with events_renamed(pg, pg_url):
            answers = await _mcp_reads(mcp, iid)
        for answer in answers.values():
            assert answer["code"] == "JOURNAL_UNREADABLE", answer
            _not_away(answer["code"], answer["message"], pg)
        again = structured(await mcp.call("get_record", {"invocation_id": iid}))
        assert again["record"]["invocation_id"] == iid, again
    clean(log.read_text(encoding="utf-8", errors="replace"), pg.password)
