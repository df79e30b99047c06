"""Whole answers within the daemon's answer budget (affidavit/daemon/answers.py), audit 48 #2.

A sessions page, a record and a call's envelope were written whole and counted nowhere: 100
connections of one agent that did not read a 3.75 MB ``/v1/sessions`` page grew the daemon by
1.1 GB.  Now each is held in the budget (``Server.answers``) while it is written; a view that
does not fit is 503 ``ANSWERS_IN_FLIGHT``, and an envelope -- the record of a call that ran --
waits for room, then fails its delivery (fetched later, never run again).  And the budget
counts what is held: a large answer is no longer copied whole beside its framing.  Bytes are
measured (the budget's counts, ``tracemalloc``), never time.
"""

from __future__ import annotations

import json
import logging
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from affidavit.api.client import Client
from affidavit.daemon.admission import Server
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import Reply, scripts

from .kit import WAIT, ask, in_process
from .test_http import Routes, serving

BODY = b"x" * 300_000
"""A remote answer the call envelope carries inline (the default limit is 1 MiB)."""
CALL = json.dumps({"target": "api", "method": "GET", "path": "/r", "session": "s"}).encode()


def _servers(monkeypatch: pytest.MonkeyPatch, **knobs: Any) -> list[Server]:
    """The daemon's listeners as it makes them, with ``knobs``."""
    from affidavit.daemon import server as daemon_server

    made: list[Server] = []

    def make(*args: Any, **kwargs: Any) -> Server:
        made.append(Server(*args, **{**kwargs, **knobs}))
        return made[-1]

    monkeypatch.setattr(daemon_server, "Server", make)
    return made


@pytest.mark.parametrize("route", ["call", "record", "sessions"])
async def test_a_whole_answer_is_held_in_the_answer_budget_while_it_is_written(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    """Each answer's bytes count in ``Server.answers`` while it is written (the peak is at
    least the answer), and nothing is held once it was: before, none of these counted."""
    servers = _servers(monkeypatch)
    monkeypatch.setenv(TOKEN_ENV, token)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=BODY))) as (_srv, socket):
        with trio.fail_after(WAIT):
            status, _h, payload = await ask(socket, "POST", "/v1/calls", CALL)
            assert status == 200, payload[:300]
            iid = json.loads(payload)["invocation_id"]
            server = servers[0]
            await _settled(server)
            if route != "call":
                server.answers_peak = 0
                path = {"record": f"/v1/invocations/{iid}", "sessions": "/v1/sessions"}[route]
                status, _h, payload = await ask(socket, "GET", path)
                assert status == 200, payload[:300]
            await _settled(server)
    assert server.answers_peak >= len(payload), (server.answers_peak, len(payload))
    assert server.answers == 0


async def _settled(server: Server) -> None:
    """Until the last answer's hold is dropped (its handler returns after the client read)."""
    while server.answers:
        await trio.sleep(0.01)


@pytest.mark.parametrize("route", ["record", "sessions"])
async def test_a_view_past_the_budget_is_answers_in_flight(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    """A record or a sessions page that does not fit in the budget is refused as an actions
    page is: 503 ``ANSWERS_IN_FLIGHT`` with ``Retry-After`` (a read: safe to repeat)."""
    servers = _servers(monkeypatch)
    monkeypatch.setenv(TOKEN_ENV, token)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"ok"))) as (_srv, socket):
        with trio.fail_after(WAIT):
            status, _h, payload = await ask(socket, "POST", "/v1/calls", CALL)
            iid = json.loads(payload)["invocation_id"]
            await _settled(servers[0])
            servers[0].answer_budget = 16  # nothing but a few bytes fits
            path = {"record": f"/v1/invocations/{iid}", "sessions": "/v1/sessions"}[route]
            status, headers, payload = await ask(socket, "GET", path)
    assert status == 503, payload
    assert json.loads(payload)["api_error"]["code"] == "ANSWERS_IN_FLIGHT"
    assert headers["retry-after"] == "5"


async def test_an_envelope_past_the_budget_is_not_written_and_its_delivery_failed(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A call that ran is never answered as if it had not: its envelope waits for room (the
    write wait, short here), then is not written -- the connection closes unanswered (the
    client's ``AnswerLost``), the journal says RESULT_DELIVERY_FAILED, and the result is
    fetched once there is room, the remote asked once."""
    caplog.set_level(logging.INFO, logger="affidavit.daemon")
    servers = _servers(monkeypatch, write_wait=0.5)
    monkeypatch.setenv(TOKEN_ENV, token)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=BODY))) as (srv, socket):
        with trio.fail_after(WAIT):
            servers[0].answer_budget = len(BODY) // 2  # no envelope of this call fits
            said = await _all_of(socket, b"POST /v1/calls HTTP/1.1\r\nhost: x\r\n", CALL)
            servers[0].answer_budget = 256 * 1024 * 1024
            async with Client.open(socket) as client:
                listed = await client.actions(session="s")
                iid = str(listed["actions"][0]["invocation_id"])
                kinds = [e["kind"] for e in await client.events(iid)]
                fetched = await client.fetch_result(iid)
    assert said == b"", said[:200]
    assert kinds[-1] == "RESULT_DELIVERY_FAILED", kinds
    assert fetched is not None and fetched["result"]["body"] == BODY.decode()
    assert len(srv.requests) == 1
    said = [r.getMessage() for r in caplog.records]
    assert any("did not fit in the answer budget" in m for m in said), said


async def _all_of(socket: Path, head: bytes, body: bytes) -> bytes:
    """Everything the daemon says to one request until it closes the connection."""
    stream = await trio.open_unix_socket(str(socket))
    async with stream:
        await stream.send_all(head + b"content-length: %d\r\n\r\n%s" % (len(body), body))
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


async def test_a_large_answer_is_written_without_a_copy_beside_its_framing() -> None:
    """The driver joined head and body into one buffer before writing: an 8 MiB answer held 16
    MiB while written (the budget counting 8).  Now a body over ``JOINED`` is written after its
    head, as is: what the write allocates beyond the body is small."""
    routes = Routes()
    server = Server(keep_alive=WAIT, head_wait=WAIT)
    async with serving(routes, server) as client:
        tracemalloc.start()
        try:
            await client.send(b"GET /big HTTP/1.1\r\nhost: a\r\n\r\n")
            got = 0
            with trio.fail_after(WAIT):
                while got < Routes.BIG:
                    got += len(await client.stream.receive_some(65536))
            _now, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert routes.broken == [False]
    # The body itself (BIG) is the route's; a copy of it would be BIG more.
    assert peak < Routes.BIG * 1.5, (peak, Routes.BIG)


async def test_an_envelope_with_a_large_inline_result_is_encoded_off_the_event_loop(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call's envelope carrying a large inline result (up to 1 MiB, ~6 MiB of JSON) was
    encoded on the event loop, every other connection stalled meanwhile; now in one of the
    server's worker threads -- a small one stays on the loop (a thread hop costs more)."""
    from affidavit.daemon import answers

    threads: list[bool] = []
    real = answers.json_body

    def noting(value: Any) -> bytes:
        threads.append(threading.current_thread() is threading.main_thread())
        return real(value)

    monkeypatch.setattr(answers, "json_body", noting)
    monkeypatch.setenv(TOKEN_ENV, token)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=BODY))) as (_srv, socket):
        with trio.fail_after(WAIT):
            big = await ask(socket, "POST", "/v1/calls", CALL)
            small = json.dumps({"target": "api", "method": "DELETE", "path": "/"}).encode()
            refused = await ask(socket, "POST", "/v1/calls", small)  # a small envelope
    assert big[0] == 200 and json.loads(big[2])["result"]["body"] == BODY.decode()
    assert refused[0] == 200 and "error" in json.loads(refused[2])
    assert threads == [False, True]  # the large one in a worker thread, the small one not


async def test_an_envelope_waits_for_room_in_the_budget_then_is_held_or_given_up() -> None:
    """``Server.wait_answer``, what an envelope does when the budget is full: it is held as soon
    as another answer's bytes are dropped; not held when none are within its wait; and at once
    refused when it is larger than its uid's share could ever hold."""
    server = Server(keep_alive=WAIT, answer_budget=100, answer_per_uid=100)
    assert server.hold_answer(80, 1, False) is None
    held: list[bool] = []

    async def waiter() -> None:
        held.append(await server.wait_answer(50, 2, False, WAIT))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert held == []  # 80 + 50 > 100: it waits
        server.drop_answer(80, 1, False)
    assert held == [True] and server.answers == 50
    assert await server.wait_answer(60, 3, False, 0.05) is False  # no room came
    assert server.answers == 50
    with trio.fail_after(WAIT / 2):
        assert await server.wait_answer(server.answer_per_uid + 1, 3, False, WAIT) is False
