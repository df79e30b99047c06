"""A record larger than the daemon ever holds for one answer (audit 50, item 2): an operation's,
grown by its polls past its uid's share of the answer budget, was 503 ``ANSWERS_IN_FLIGHT``
with ``Retry-After`` on every read -- "try again later", for ever.  It is now 413
``ANSWER_TOO_LARGE`` (no ``Retry-After``), its message naming how to read it in parts, and
``?from_seq=N&limit=M`` pages its events, so any record is readable; ``Client.invocation``
reads such a record a page at a time.  The share is shrunk under a record's size on a running
daemon (``Server``'s knobs), so a record of one call is enough."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.client import Client
from affidavit.api.pages import read_record_pages
from affidavit.journal.tables import Tables
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import Reply, scripts

from .kit import WAIT, ask, in_process
from .test_answer_budget import _servers


def _shrink(servers: list[Any], most: int) -> None:
    for server in servers:
        server.answer_shares.budget = server.answer_shares.per_uid = most


async def test_a_record_over_the_share_is_413_and_is_read_in_pages(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    servers = _servers(monkeypatch)
    monkeypatch.setenv(TOKEN_ENV, token)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"ok"))) as (_srv, socket):
        with trio.fail_after(WAIT):
            async with Client.open(socket) as client:
                iid = (await client.call({"target": "api", "method": "GET", "path": "/x"}))[
                    "invocation_id"
                ]
                path = f"/v1/invocations/{iid}"
                status, _, whole = await ask(socket, "GET", path)
                assert status == 200
                everything = json.loads(whole)
                seqs = [e["seq"] for e in everything["events"]]
                assert len(seqs) >= 4
                _shrink(servers, len(whole) - 1)  # the whole record can never be held now

                status, headers, body = await ask(socket, "GET", path)
                error = json.loads(body)["api_error"]
                assert (status, error["code"], "retry-after" in headers) == (
                    413,
                    "ANSWER_TOO_LARGE",
                    False,
                )
                assert "from_seq=0" in error["message"]
                assert "try again later" not in error["message"]

                pages, at = [], 0
                while at is not None:
                    status, _, body = await ask(socket, "GET", f"{path}?from_seq={at}&limit=1")
                    assert status == 200, body
                    page = json.loads(body)
                    pages.append([e["seq"] for e in page["events"]])
                    at = page["next_seq"]
                    assert len(pages) <= len(seqs)
                assert pages == [[s] for s in seqs]
                status, _, body = await ask(socket, "GET", f"{path}?from_seq={seqs[-1] + 1}")
                assert (status, json.loads(body)["events"], json.loads(body)["next_seq"]) == (
                    200,
                    [],
                    None,
                )

                # The thin client reads it in pages, whole: the record, every event.
                _shrink(servers, (len(whole) + 1) // 2)
                read = await client.invocation(iid)
                assert read is not None
                assert read["events"] == everything["events"]
                assert read["record"]["state"] == everything["record"]["state"]
                assert (await client.record(iid) or {}).get("state") == read["record"]["state"]


async def test_a_page_limit_is_1_to_10000(tmp_path: Path, token: str) -> None:
    """``limit=0`` answered a page of no events with ``next_seq`` its own ``from_seq``: a
    reader following it asked the same page for ever.  Refused, as past the most."""
    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"ok"))) as (_srv, socket):
        with trio.fail_after(WAIT):
            async with Client.open(socket) as client:
                call = {"target": "api", "method": "GET", "path": "/x"}
                iid = (await client.call(call))["invocation_id"]
            for limit in ("0", "10001", ""):
                status, _, body = await ask(
                    socket, "GET", f"/v1/invocations/{iid}?from_seq=0&limit={limit}"
                )
                error = json.loads(body)["api_error"]
                assert (status, error["code"], error["field"]) == (400, "BAD_REQUEST", "limit")
                assert "from 1 to 10000" in error["message"]
            status, _, body = await ask(socket, "GET", f"/v1/invocations/{iid}?limit=1")
            assert (status, len(json.loads(body)["events"])) == (200, 1)


async def test_a_page_reads_its_events_from_its_seq_and_the_client_s_record_none(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page used to read every event of the record, then filter (a second whole read beside
    the record's own fold); ``Client.record`` read every page of a record to keep its
    ``record``.  Now a page reads the record's rows once (its fold) and the page's from its
    seq; the client asks the record alone, past the last seq there can be."""
    reads: dict[str, int] = {}
    for name in ("invocation_events", "invocation_events_page"):
        real = getattr(Tables, name)

        def counted(tables: Tables, iid: str, *args: Any, _n: str = name, _r: Any = real) -> Any:
            reads[_n] = reads.get(_n, 0) + 1
            return _r(tables, iid, *args)

        monkeypatch.setattr(Tables, name, counted)
    asked: list[str] = []
    real_get = Client._get_or_none

    async def get(client: Client, path: str) -> Any:
        asked.append(path)
        return await real_get(client, path)

    monkeypatch.setattr(Client, "_get_or_none", get)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"ok"))) as (_srv, socket):
        with trio.fail_after(WAIT):
            async with Client.open(socket) as client:
                call = {"target": "api", "method": "GET", "path": "/x"}
                iid = (await client.call(call))["invocation_id"]
                whole = await client.invocation(iid)
                assert whole is not None
                reads.clear()
                status, _, body = await ask(socket, "GET", f"/v1/invocations/{iid}?from_seq=2")
                assert status == 200
                assert json.loads(body)["events"] == [e for e in whole["events"] if e["seq"] >= 2]
                assert reads == {"invocation_events": 1, "invocation_events_page": 1}
                asked.clear()
                assert await client.record(iid) == whole["record"]
                assert asked == [f"/v1/invocations/{iid}?from_seq={2**63 - 1}&limit=1"]


async def test_a_page_whose_events_are_not_a_list_ends_the_read() -> None:
    """``events`` a string or a mapping would be taken apart for events: refused."""
    for events in ("abc", {"seq": 1}, [1, 2], None):

        async def odd(at: int, limit: int, events: Any = events) -> dict[str, Any]:
            return {"record": {}, "events": events, "next_seq": None}

        with pytest.raises(ValueError, match="no list of events"):
            await read_record_pages(odd, 10)


async def test_a_page_that_makes_no_progress_ends_the_read() -> None:
    """``read_record_pages`` trusts no daemon to page honestly: a page naming its own seq (or
    none past its events) as the next is refused, never asked again for ever."""
    asked: list[int] = []

    async def stuck(at: int, limit: int) -> dict[str, Any]:
        asked.append(at)
        return {"record": {}, "events": [{"seq": 3}], "next_seq": 3}

    with pytest.raises(ValueError, match="no next seq past its events"):
        await read_record_pages(stuck, 10)
    assert asked == [0]
