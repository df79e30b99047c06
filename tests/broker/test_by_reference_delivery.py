"""A call answered by reference (a result over the inline limit) has transferred none of the
result, so its answer records no delivery (seed: "Mark RESULT_DELIVERED only after the protocol
has confirmed complete transfer"; ``engine.delivery.by_reference``): the record stays stored,
awaiting delivery, until a whole fetch records RESULT_DELIVERED channel ``fetch``.  A page
(``from_chunk``), its last included, records nothing (docs/journal.md).  Audit 53c: the
envelope's line was written and RESULT_DELIVERED recorded for a 2 MiB body it never carried."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api import Broker
from affidavit.config import load_config
from affidavit.engine import RESULT_CHUNK, EngineSettings
from affidavit.engine.delivery import by_reference
from affidavit.statemachine import EventKind as E
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import assert_ok, http_target, write_config

LIMIT = 10
GET = {"target": "api", "method": "GET", "path": "/thing"}
BODY = b"y" * (RESULT_CHUNK * 2 + 5)


def _delivered(broker: Broker, iid: str) -> list[str]:
    return [e.attrs["channel"] for e in broker.events(iid) if e.kind is E.RESULT_DELIVERED]


async def _written(envelope: dict[str, Any]) -> None:
    """A surface's ``deliver`` (the daemon's answer, MCP's line) that wrote the answer whole."""


async def _by_reference_then(
    tmp_path: Path, then: Any, deliver: Any = None
) -> tuple[dict[str, Any], list[str]]:
    settings = EngineSettings(inline_result_limit=RESULT_CHUNK)
    async with HostileServer.running(scripts.serve(Reply(200, body=BODY))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with Broker.open(config=load_config(cfg), settings=settings) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(GET, deliver=deliver)
                assert_ok(broker, env)
                iid = env["invocation_id"]
                assert "by_reference" in env["result"]
                await broker.settled()
                record = broker.record(iid)
                assert record is not None and record.state == "stored_committed"
                assert _delivered(broker, iid) == []
                await then(broker, iid)
                await broker.settled()
                return env, _delivered(broker, iid)


@pytest.mark.parametrize("deliver", [None, _written], ids=["returned", "written"])
async def test_an_answer_by_reference_records_no_delivery_until_a_whole_fetch(
    tmp_path: Path, token: str, deliver: Any
) -> None:
    async def fetch(broker: Broker, iid: str) -> None:
        fetched = await broker.fetch_result(iid)
        assert fetched is not None and fetched["result"]["body"].encode() == BODY

    _env, channels = await _by_reference_then(tmp_path, fetch, deliver)
    assert channels == ["fetch"]


async def test_every_page_of_a_result_by_reference_records_nothing(
    tmp_path: Path, token: str
) -> None:
    """Paged to the end, one chunk a page: each page (the last too) is a resumed read -- the
    journal keeps no tally of which chunks some page carried -- and records nothing."""
    pages = 0

    async def page_through(broker: Broker, iid: str) -> None:
        nonlocal pages
        at: int | None = 0
        got = b""
        while at is not None:
            page = await broker.fetch_result(iid, from_chunk=at, chunks=1)
            assert page is not None
            got += page["result"]["body"].encode()
            at = page["result"]["resume"]["next_chunk"]
            pages += 1
        assert got == BODY

    _env, channels = await _by_reference_then(tmp_path, page_through, _written)
    assert pages >= 3 and channels == []


def test_by_reference_names_only_the_referenced_invocation() -> None:
    ref = {"by_reference": {"fetch": {"invocation_id": "act_1", "from_chunk": 0}}}
    assert by_reference({"result": ref}, "act_1")
    assert by_reference({"operation": {}, "poll": {"result": ref}}, "act_1")  # nested: a poll's
    assert by_reference({"items": [{"result": ref}]}, "act_1")
    assert not by_reference({"result": ref}, "act_2")
    assert not by_reference({"result": ref}, None)
    assert not by_reference({"result": {"body": "by_reference"}}, "act_1")
    # The invocation's own envelope is judged by its result alone (no walk of its evidence).
    own = {"invocation_id": "act_1", "evidence": {}, "result": ref}
    assert by_reference(own, "act_1")
    assert not by_reference({**own, "result": {"body": "x"}}, "act_1")
    assert not by_reference({**own, "result": None, "error": {"code": "X"}}, "act_1")
    # Another invocation's envelope nesting act_1's answer (a poll's): walked.
    assert by_reference(
        {"invocation_id": "act_9", "evidence": {}, "result": {"linked": own}}, "act_1"
    )


@pytest.mark.parametrize("carried", ["by_reference", "inline"])
async def test_a_linked_answer_carrying_the_result_by_reference_records_no_delivery(
    tmp_path: Path, token: str, carried: str
) -> None:
    """``deliver_linked`` (a poll's or a reconciliation query's answer, which carries the
    linked call's envelope): written whole, it records channel ``deliver`` only when it
    carried the result itself; by reference (under ``poll``, as a poll's answer nests it) it
    transferred none of it and records nothing."""
    from affidavit.engine.delivery import deliver_linked

    async def answer_linked(broker: Broker, iid: str) -> None:
        env = await broker.fetch_result(iid, from_chunk=0, chunks=1)  # a page: nothing
        assert env is not None
        if carried == "by_reference":
            ref = {"fetch": {"invocation_id": iid, "from_chunk": 0}}
            env = {**env, "result": {"by_reference": ref}}
        answer = {"operation": {"id": "op_x"}, "poll": env}
        written = await deliver_linked(broker._engine, answer, iid, _written)
        assert written is answer

    _env, channels = await _by_reference_then(tmp_path, answer_linked)
    assert channels == ([] if carried == "by_reference" else ["deliver"])
