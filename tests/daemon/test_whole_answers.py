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
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio
import trio.testing

from affidavit.api.client import Client
from affidavit.daemon.admission import Server
from affidavit.daemon.http import FREE_BODY, Request
from affidavit.daemon.link import Link
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import Peer, Reply, scripts

from .kit import WAIT, ask, in_process
from .test_http import Routes, serving

BODY = b"x" * 300_000
"""A remote answer the call envelope carries inline (the default limit is 1 MiB)."""
Links = Callable[[], tuple[Link, trio.socket.SocketType]]
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
    """A record or a sessions page that does not fit in the budget others fill is refused as
    an actions page is: 503 ``ANSWERS_IN_FLIGHT`` with ``Retry-After`` (a read: safe to
    repeat; one that could never fit is 413, test_record_pages.py)."""
    servers = _servers(monkeypatch)
    monkeypatch.setenv(TOKEN_ENV, token)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"ok"))) as (_srv, socket):
        with trio.fail_after(WAIT):
            status, _h, payload = await ask(socket, "POST", "/v1/calls", CALL)
            iid = json.loads(payload)["invocation_id"]
            await _settled(servers[0])
            _filled(servers[0], 16)  # other uids' answers hold all of it but a few bytes
            path = {"record": f"/v1/invocations/{iid}", "sessions": "/v1/sessions"}[route]
            status, headers, payload = await ask(socket, "GET", path)
    assert status == 503, payload
    assert json.loads(payload)["api_error"]["code"] == "ANSWERS_IN_FLIGHT"
    assert headers["retry-after"] == "5"


def _filled(server: Server, room: int) -> Callable[[], None]:
    """Hold all but ``room`` bytes of ``server``'s budget for two other uids (pages not read,
    each within its share): what drops them."""
    n = server.answer_shares.budget - room
    held = [(n // 2, OTHER_UID), (n - n // 2, OTHER_UID + 1)]
    for size, uid in held:
        assert server.hold_answer(size, uid, False) is None

    def drop() -> None:
        for size, uid in held:
            server.drop_answer(size, uid, False)

    return drop


OTHER_UID = 2**31 - 7
"""A uid no test runs as: the reader of the answers that fill the budget."""


async def test_an_envelope_past_the_budget_waits_then_is_not_written_and_its_delivery_failed(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A call that ran is never answered as if it had not: its envelope, within its uid's share
    but not in the room the budget has, waits for room (the write wait, short here), then is
    not written -- the connection closes unanswered (the client's ``AnswerLost``), the journal
    says RESULT_DELIVERY_FAILED, the result is fetched once there is room, the remote asked
    once -- and the budget holds nothing once it is over."""
    caplog.set_level(logging.INFO, logger="affidavit.daemon")
    servers = _servers(monkeypatch, write_wait=0.5)
    monkeypatch.setenv(TOKEN_ENV, token)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=BODY))) as (srv, socket):
        with trio.fail_after(WAIT):
            filler = _filled(servers[0], len(BODY) // 2)  # no envelope of this call fits
            said = await _all_of(socket, b"POST /v1/calls HTTP/1.1\r\nhost: x\r\n", CALL)
            filler()
            async with Client.open(socket) as client:
                listed = await client.actions(session="s")
                iid = str(listed["actions"][0]["invocation_id"])
                kinds = [e["kind"] for e in await client.events(iid)]
                fetched = await client.fetch_result(iid)
            await _settled(servers[0])
    assert said == b"", said[:200]
    assert kinds[-1] == "RESULT_DELIVERY_FAILED", kinds
    assert fetched is not None and fetched["result"]["body"] == BODY.decode()
    assert len(srv.requests) == 1
    said = [r.getMessage() for r in caplog.records]
    assert any("was not written (timed out;" in m for m in said), said
    assert servers[0].answers == 0


async def test_an_envelope_waiting_for_room_is_delivered_once_room_frees(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The budget full when a call's envelope is ready: it waits, and is written -- delivered,
    RESULT_DELIVERED -- as soon as the answer filling the budget is done; encoded once (it
    was encoded again once room came)."""
    from affidavit.daemon import answers

    encodings: list[int] = []
    real = answers.json_body

    def noting(value: Any) -> bytes:
        encodings.append(len(data := real(value)))
        return data

    monkeypatch.setattr(answers, "json_body", noting)
    servers = _servers(monkeypatch)
    monkeypatch.setenv(TOKEN_ENV, token)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=BODY))) as (_srv, socket):
        with trio.fail_after(WAIT):
            server = None
            answered: list[tuple[int, dict[str, str], bytes]] = []

            async def calling() -> None:
                answered.append(await ask(socket, "POST", "/v1/calls", CALL))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(calling)
                while not servers:
                    await trio.sleep(0.01)
                server = servers[0]
                filler = _filled(server, len(BODY) // 2)
                while not server._waiting:  # the envelope is waiting for room
                    await trio.sleep(0.01)
                assert answered == []
                filler()
            status, _h, payload = answered[0]
            assert status == 200, payload[:300]
            envelope = json.loads(payload)
            assert envelope["result"]["body"] == BODY.decode()
            async with Client.open(socket) as client:
                kinds = [e["kind"] for e in await client.events(envelope["invocation_id"])]
            await _settled(server)
    assert kinds[-1] == "RESULT_DELIVERED", kinds
    assert server.answers == 0
    assert encodings == [len(payload)]  # encoded once, kept while it waited


async def _delivery(socket: Path) -> str:
    """The delivery row of the session's one call, once one is on record (polled)."""
    async with Client.open(socket) as client:
        while True:
            listed = await client.actions(session="s")
            if listed["actions"]:
                iid = str(listed["actions"][0]["invocation_id"])
                kinds = [str(e["kind"]) for e in await client.events(iid)]
                if kinds[-1].startswith("RESULT_DELIVER"):
                    return kinds[-1]
            await trio.sleep(0.02)


async def test_an_envelope_whose_client_hangs_up_while_it_waits_fails_at_once(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call's envelope waiting for room whose client hangs up: its delivery is recorded
    failed at the hang-up, not when the write wait (a minute here) runs out -- the call's
    place and its connection were held that long -- and the budget holds nothing after."""
    servers = _servers(monkeypatch, write_wait=3 * WAIT)
    monkeypatch.setenv(TOKEN_ENV, token)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=BODY))) as (_srv, socket):
        with trio.fail_after(WAIT):
            await ask(socket, "GET", "/v1/catalog")
            filler = _filled(servers[0], 0)
            stream = await trio.open_unix_socket(str(socket))
            head = b"POST /v1/calls HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n"
            await stream.send_all(head % len(CALL) + CALL)
            while not servers[0]._waiting:  # the envelope waits for room
                await trio.sleep(0.01)
            await stream.aclose()
            while servers[0]._waiting:  # within WAIT, a third of the write wait
                await trio.sleep(0.01)
            filler()
            kind = await _delivery(socket)
            await _settled(servers[0])
    assert kind == "RESULT_DELIVERY_FAILED", kind
    assert servers[0].answers == 0


async def test_an_envelope_whose_client_half_closes_while_it_is_encoded_is_not_delivered(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that shuts its write side (``SHUT_WR``) while its call's envelope is encoded
    (off the event loop) has hung up (link.py): the envelope is not written and the delivery
    is recorded failed, though the budget has room and the write would succeed.  Before, it
    was written and recorded RESULT_DELIVERED: no look at the hang-up after the thread hop."""
    import socket as sockets

    from affidavit.daemon import answers

    encode, clients = answers.encoded, []

    async def hop(req: Request, value: Any) -> bytes:
        data = await encode(req, value)
        clients[0].socket.shutdown(sockets.SHUT_WR)  # the client half-closes meanwhile
        await req.link.hung_up.wait()  # and the connection's reader has seen it
        return data

    monkeypatch.setattr(answers, "encoded", hop)
    monkeypatch.setenv(TOKEN_ENV, token)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=BODY))) as (_srv, socket):
        with trio.fail_after(WAIT):
            clients.append(await trio.open_unix_socket(str(socket)))
            head = b"POST /v1/calls HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n"
            await clients[0].send_all(head % len(CALL) + CALL)
            answered = b""
            while chunk := await clients[0].receive_some():  # until the daemon closes it
                answered += chunk
            await clients[0].aclose()
            kind = await _delivery(socket)
    assert answered == b"", answered[:100]  # closed unanswered
    assert kind == "RESULT_DELIVERY_FAILED", kind


async def test_an_envelope_its_client_does_not_read_is_cut_off_and_leaves_the_budget(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A held envelope its client does not read: the write wait (short here) cuts it off, the
    delivery is recorded failed, and its bytes are no longer held."""
    body = b"x" * 900_000  # more than the socket's buffers take
    servers = _servers(monkeypatch, write_wait=0.5)
    monkeypatch.setenv(TOKEN_ENV, token)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=body))) as (_srv, socket):
        with trio.fail_after(WAIT):
            stream = await trio.open_unix_socket(str(socket))
            head = b"POST /v1/calls HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n"
            await stream.send_all(head % len(CALL) + CALL)
            while not servers or not servers[0].answers:  # held, being written
                await trio.sleep(0.01)
            kind = await _delivery(socket)
            await _settled(servers[0])  # given up, not read
            await stream.aclose()
    assert kind == "RESULT_DELIVERY_FAILED", kind
    assert servers[0].answers_peak > len(body) and servers[0].answers == 0


async def test_an_envelope_being_written_when_the_grace_ends_leaves_the_budget(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call's envelope held and being written to a client that does not read it when the
    stop's grace ends: the write is cut off (``Running.delivery``: ``ANSWER_WAIT`` after its
    hand-over), the delivery recorded failed, and its bytes are no longer held -- fails with
    the hold dropped only after a write that returns (``respond_delivered``'s ``finally``)."""
    body = b"x" * 900_000  # more than the socket's buffers take
    servers = _servers(monkeypatch, write_wait=3 * WAIT)  # only the grace's end cuts it off
    monkeypatch.setenv(TOKEN_ENV, token)
    service = {"shutdown_grace": 0.5}
    with trio.fail_after(WAIT):
        async with in_process(tmp_path, scripts.serve(Reply(200, body=body)), service=service) as (
            _srv,
            socket,
        ):
            stream = await trio.open_unix_socket(str(socket))
            head = b"POST /v1/calls HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n"
            await stream.send_all(head % len(CALL) + CALL)
            while not servers or not servers[0].answers:  # held, being written, not read
                await trio.sleep(0.01)
        await stream.aclose()
    assert _last_kind(tmp_path) == "RESULT_DELIVERY_FAILED"
    assert servers[0].answers_peak > len(body) and servers[0].answers == 0


def _last_kind(tmp_path: Path) -> str:
    """The last row's kind of the journal's one call (read once the daemon stopped)."""
    from affidavit.journal import JournalReader

    path = tmp_path / "journal.db"
    with JournalReader.open(path, key_file=Path(f"{path}.key")) as r:
        (record,) = r.list_actions(session="s")
        return str(r.events(record.invocation_id)[-1].kind.value)


@pytest.mark.parametrize("kind", ["small", "not attempted"])
async def test_a_small_envelope_or_one_of_nothing_run_is_written_though_the_budget_is_full(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A delivered answer up to 64 KiB is not counted (as a request body that small is not), so
    a few uids keeping large answers unread cannot cost another's small one its delivery -- nor
    a call refused before dispatch an answer saying it may have run: both are written with the
    whole budget held.  Before, each waited for room, then the connection closed unanswered."""
    from affidavit.daemon import answers

    servers = _servers(monkeypatch, write_wait=0.5)
    monkeypatch.setenv(TOKEN_ENV, token)
    if kind == "not attempted":
        # However large: written because nothing ran, not because it is small.
        monkeypatch.setattr(answers, "FREE_BODY", 0)
    action = {
        "small": CALL,
        "not attempted": json.dumps({"target": "api", "method": "DELETE", "path": "/"}).encode(),
    }[kind]
    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"ok"))) as (_srv, socket):
        with trio.fail_after(WAIT):
            await ask(socket, "GET", "/v1/catalog")
            filler = _filled(servers[0], 0)
            status, _h, payload = await ask(socket, "POST", "/v1/calls", action)
            filler()
    assert status == 200, payload[:300]
    envelope = json.loads(payload)
    if kind == "small":
        assert envelope["result"]["body"] == "ok"
    else:
        assert envelope["evidence"]["outcome"] == "not_attempted", envelope
    assert servers[0].answers == 0


async def test_a_poll_answer_is_held_in_the_answer_budget_while_it_is_written(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poll's answer carrying a large status document counts in the budget while it is
    written, as a call's envelope does (app.py's ``Answering``: written through
    ``respond_delivered``) -- fails with the poll answered by ``respond_json``."""
    from tests.mcp.conftest import JOB
    from tests.mcp.test_linked_delivery import OPERATIONS

    done = Reply(200, body=json.dumps({"state": "done", "pad": "x" * 200_000}).encode())

    async def jobs(peer: Peer) -> None:
        while (req := await peer.read_request()) is not None:
            await peer.respond(done if req.method == "GET" else JOB)

    servers = _servers(monkeypatch)
    monkeypatch.setenv(TOKEN_ENV, token)
    async with in_process(tmp_path, jobs, overrides={"operations": OPERATIONS}) as (_s, socket):
        with trio.fail_after(WAIT):
            async with Client.open(socket) as client:
                submitted = await client.call(
                    {"target": "api", "method": "POST", "path": "/jobs", "body": "{}"}
                )
                await _settled(servers[0])
                servers[0].answers_peak = 0
                polled = await client.poll_operation(submitted["operation"]["id"])
            await _settled(servers[0])
    assert polled["operation"]["state"] == "succeeded", polled
    assert servers[0].answers_peak >= 200_000, servers[0].answers_peak
    assert servers[0].answers == 0


async def test_a_poll_answer_waiting_for_room_when_the_daemon_stops_is_recorded_undelivered(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A poll's answer waiting for room when the daemon stops: its wait ends when the grace
    does (``Calls.drain``'s ``grace_over``: ``Server.give_up_waits``), so the poll's result is
    recorded RESULT_DELIVERY_FAILED (stored, fetchable) while the stop waits for the calls,
    and the log says it was given up for the stop.  Before, the wait outlived the grace; the
    connections' deadline cancelled it and the Cancelled escaped the engine's ``except
    Exception``: no row, the record "stored".  The calls' recording wait is longer than the
    test's bound here: a wait ended only at ``Server.close``, after it, fails the test (the
    poll's delivery scope, cancelled with the stopped calls, ends it in time too, but says
    nothing of why: without ``give_up_waits`` no line says "stopping")."""
    from affidavit.daemon import calls
    from affidavit.journal import JournalReader
    from tests.mcp.conftest import JOB
    from tests.mcp.test_linked_delivery import OPERATIONS

    done = Reply(200, body=json.dumps({"state": "done", "pad": "x" * 200_000}).encode())

    async def jobs(peer: Peer) -> None:
        while (req := await peer.read_request()) is not None:
            await peer.respond(done if req.method == "GET" else JOB)

    servers = _servers(monkeypatch)
    monkeypatch.setenv(TOKEN_ENV, token)
    monkeypatch.setattr(calls, "RECORD_WAIT", 2 * WAIT)
    caplog.set_level(logging.WARNING, logger="affidavit.daemon")
    service = {"shutdown_grace": 0.5}
    with trio.fail_after(WAIT):
        async with in_process(
            tmp_path, jobs, overrides={"operations": OPERATIONS}, service=service
        ) as (_s, socket):
            async with Client.open(socket) as client:
                submitted = await client.call(
                    {"target": "api", "method": "POST", "path": "/jobs", "body": "{}"}
                )
            await _settled(servers[0])
            _filled(servers[0], 0)
            stream = await trio.open_unix_socket(str(socket))
            op = submitted["operation"]["id"]
            await stream.send_all(
                f"POST /v1/operations/{op}/poll HTTP/1.1\r\nhost: x\r\n"
                "content-length: 0\r\n\r\n".encode()
            )
            while not servers[0]._waiting:  # the poll's answer waits for room
                await trio.sleep(0.01)
        await stream.aclose()
    path = tmp_path / "journal.db"
    with JournalReader.open(path, key_file=Path(f"{path}.key")) as r:
        sub = submitted["invocation_id"]
        poll = [e.attrs["poll_invocation"] for e in r.events(sub) if "poll_invocation" in e.attrs]
        kinds = [e.kind.value for e in r.events(poll[-1])]
    assert kinds[-1] == "RESULT_DELIVERY_FAILED", kinds
    assert any("not written (stopping;" in r.getMessage() for r in caplog.records)


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
    server's worker threads -- its own for answers: every thread large request bodies are
    parsed in is busy here (it shared them) -- and a small one stays on the loop (a thread
    hop costs more)."""
    from affidavit.daemon import answers

    servers = _servers(monkeypatch)

    threads: list[bool] = []
    real = answers.json_body

    def noting(value: Any) -> bytes:
        threads.append(threading.current_thread() is threading.main_thread())
        return real(value)

    monkeypatch.setattr(answers, "json_body", noting)
    monkeypatch.setenv(TOKEN_ENV, token)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=BODY))) as (_srv, socket):
        with trio.fail_after(WAIT):
            parsing = servers[0].parse_threads
            bodies = [object() for _ in range(int(parsing.total_tokens))]
            for body in bodies:  # each of them parsing a large body
                parsing.acquire_on_behalf_of_nowait(body)
            big = await ask(socket, "POST", "/v1/calls", CALL)
            for body in bodies:
                parsing.release_on_behalf_of(body)
            small = json.dumps({"target": "api", "method": "DELETE", "path": "/"}).encode()
            refused = await ask(socket, "POST", "/v1/calls", small)  # a small envelope
    assert big[0] == 200 and json.loads(big[2])["result"]["body"] == BODY.decode()
    assert refused[0] == 200 and "error" in json.loads(refused[2])
    assert threads == [False, True]  # the large one in a worker thread, the small one not


async def test_a_batch_envelope_of_many_items_is_encoded_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch's envelope carries its items, a few short values each and no inline result:
    one of many items is encoded in a worker thread as a large result is (``ITEM_GUESS`` a
    piece) -- its size was told by its results' text only, so it was encoded on the loop."""
    from affidavit.daemon import answers

    threads: list[bool] = []
    real = answers.json_body

    def noting(value: Any) -> bytes:
        threads.append(threading.current_thread() is threading.main_thread())
        return real(value)

    monkeypatch.setattr(answers, "json_body", noting)
    req = cast(Request, SimpleNamespace(server=Server(keep_alive=WAIT)))
    many = FREE_BODY // answers.ITEM_GUESS + 1
    item = {"index": 0, "status": 200, "retry": "never"}
    for items in ([item] * 3, [item] * many):
        await answers.encoded(req, {"invocation_id": "act_1", "items": items})
    assert threads == [True, False]  # the few on the loop, the many in a worker thread


async def test_a_sessions_page_is_encoded_once_the_kept_views_turn_is_released(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sessions page (3.75 MB at ``limit=10000``) was encoded in its view thread while it held
    the kept views' turn (``Api.summary_turn``): every other summarized view waited for the
    encoding too.  Now it is encoded after the turn is released, in the answers' threads
    (``answers.encoded_in_thread``)."""
    from affidavit.daemon import answers, app

    in_turn: list[bool] = []
    encoded_in_turn: list[tuple[bool, bool]] = []
    real_read, real_json = app.Api.read_summarized, answers.json_body

    async def reading(self: app.Api, view: Callable[..., Any], asker: Any) -> Any:
        in_turn.append(True)
        try:
            return await real_read(self, view, asker)
        finally:
            in_turn.pop()

    def encoding(value: Any) -> bytes:
        if isinstance(value, dict) and "sessions" in value:
            on_loop = threading.current_thread() is threading.main_thread()
            encoded_in_turn.append((bool(in_turn), on_loop))
        return real_json(value)

    monkeypatch.setattr(app.Api, "read_summarized", reading)
    monkeypatch.setattr(answers, "json_body", encoding)
    monkeypatch.setenv(TOKEN_ENV, token)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"ok"))) as (_srv, socket):
        with trio.fail_after(WAIT):
            await ask(socket, "POST", "/v1/calls", CALL)
            status, _h, payload = await ask(socket, "GET", "/v1/sessions")
    assert status == 200 and json.loads(payload)["sessions"], payload[:300]
    assert encoded_in_turn == [(False, False)]  # out of the turn, off the event loop


@pytest.fixture
async def links() -> AsyncIterator[Links]:
    """Makes a connection's ``Link`` and its client's end; both closed after the test."""
    made: list[trio.socket.SocketType] = []

    def link() -> tuple[Link, trio.socket.SocketType]:
        ours, theirs = trio.socket.socketpair()
        made.extend((ours, theirs))
        return Link(trio.SocketStream(ours)), theirs

    yield link
    for sock in made:
        sock.close()


async def test_an_envelope_waits_for_room_in_the_budget_then_is_held_or_given_up(
    links: Links,
) -> None:
    """``Server.wait_answer``, what a large envelope does when the budget is full: it is held as
    soon as another answer's bytes are dropped; not held when none are within its wait; and at
    once refused when it is larger than its uid's share could ever hold."""
    server = Server(keep_alive=WAIT, answer_budget=100, answer_per_uid=100)
    link, _client = links()
    assert server.hold_answer(80, 1, False) is None
    held: list[str | None] = []

    async def waiter() -> None:
        held.append(await server.wait_answer(50, 2, False, WAIT, link))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert held == []  # 80 + 50 > 100: it waits
        server.drop_answer(80, 1, False)
    assert held == [None] and server.answers == 50
    assert await server.wait_answer(60, 3, False, 0.05, link) == "timed out"  # no room came
    assert server.answers == 50
    with trio.fail_after(WAIT / 2):
        too_large = await server.wait_answer(server.answer_shares.per_uid + 1, 3, False, WAIT, link)
    assert too_large == "larger than its share"
    server.drop_answer(50, 2, False)
    assert server.answers == 0


@pytest.mark.parametrize("full", ["all", "uid", "others"])
async def test_a_waiting_envelope_gets_the_room_that_frees_before_new_pages(
    full: str, links: Links
) -> None:
    """While a delivered answer waits for room, a page or a fetch in the share it waits in is
    refused though it would fit (``hold_answer`` names that share), and one in another share is
    not: the bytes dropped are the envelope's first -- else a stream of small pages could keep
    a call's record from its client until it failed.  Fails without the priority."""
    sizes = {"all": (100, 100, 100), "uid": (1000, 100, 1000), "others": (1000, 1000, 100)}
    budget, per_uid, others = sizes[full]
    server = Server(
        keep_alive=WAIT, answer_budget=budget, answer_per_uid=per_uid, answer_others=others
    )
    server.reserved = lambda peer: False  # every uid here is an agent's (``other``)
    server.answer_shares.per_other = per_uid
    link, _client = links()
    filler = 1 if full != "uid" else 2  # the uid whose page fills the share
    assert server.hold_answer(80, filler, True) is None
    held: list[str | None] = []

    async def waiter() -> None:
        held.append(await server.wait_answer(50, 2, True, WAIT, link))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert server.hold_answer(10, 2, True) == full  # 90 would fit: the envelope is first
        if full == "uid":
            assert server.hold_answer(10, 3, True) is None  # another uid's share: not waited in
            server.drop_answer(10, 3, True)
        else:  # a share every uid's pages are in: another agent's waits its turn too
            assert server.hold_answer(10, 3, True) == full
        server.drop_answer(80, filler, True)
    assert held == [None]
    assert server.hold_answer(10, 2, True) is None  # no one waits: pages are held again
    server.drop_answer(10, 2, True)
    server.drop_answer(50, 2, True)
    assert server.answers == 0


async def test_a_waiting_envelope_is_not_held_once_its_client_half_closed(
    links: Links,
) -> None:
    """Room frees in the same instant a waiting envelope's client shuts its write side
    (``SHUT_WR``): the wait ends "hung up", not held -- the half-closed client would take the
    write, and an answer written after its hang-up was seen is not delivered (link.py).
    Before, the hold was tried first: held, written, recorded RESULT_DELIVERED."""
    import socket as sockets

    server = Server(keep_alive=WAIT, answer_budget=100, answer_per_uid=100)
    assert server.hold_answer(80, 1, False) is None
    link, client = links()
    why: list[str | None] = []

    async def waiter() -> None:
        why.append(await server.wait_answer(50, 2, False, WAIT, link))

    with trio.fail_after(WAIT / 2):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            client.shutdown(sockets.SHUT_WR)
            assert await link.receive_some() == b""  # the reader sees the end: hung up
            server.drop_answer(80, 1, False)  # and room frees before the waiter looks
    assert why == ["hung up"]
    assert server.answers == 0


async def test_an_envelope_held_back_by_its_own_share_keeps_only_its_uids_pages_waiting(
    links: Links,
) -> None:
    """A delivered answer that fits neither the budget nor its uid's share waits in its uid's
    share: another uid's page that fits the budget is held.  Before, the budget was named
    first, so it waited in "all" and every uid's pages were refused for an answer that could
    not use the room until its own uid's share freed."""
    server = Server(keep_alive=WAIT, answer_budget=100, answer_per_uid=60)
    assert server.hold_answer(50, 2, False) is None  # the waiter's uid: 10 left of its 60
    assert server.hold_answer(40, 1, False) is None  # the budget: 10 left of 100
    link, _client = links()
    held: list[str | None] = []

    async def waiter() -> None:
        held.append(await server.wait_answer(20, 2, False, WAIT, link))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert server.hold_answer(5, 3, False) is None  # another uid's page: it fits
        server.drop_answer(5, 3, False)
        assert server.hold_answer(5, 2, False) == "uid"  # its own uid's: the answer is first
        server.drop_answer(50, 2, False)
    assert held == [None]
    server.drop_answer(40, 1, False)
    server.drop_answer(20, 2, False)
    assert server.answers == 0


async def test_a_waiting_envelope_ends_its_wait_at_a_hang_up_a_stop_or_a_cancel(
    links: Links,
) -> None:
    """A delivered answer waiting for room stops waiting as soon as its client hangs up (it had
    held its call's place and connection for the whole write wait: the delivery failed 3.6 s
    late with a 4 s wait), or the stop's grace is over (the wait was cancelled with the
    connections instead, and no failure recorded); cancelled, it leaves nothing behind -- and
    the budget is back to 0 after each.  Fails without either end."""
    server = Server(keep_alive=WAIT, answer_budget=100, answer_per_uid=100)
    assert server.hold_answer(80, 1, False) is None
    link, client = links()
    why: list[str | None] = []

    async def waiter(on: Link) -> None:
        why.append(await server.wait_answer(50, 2, False, WAIT, on))

    with trio.fail_after(WAIT / 2):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter, link)
            await trio.testing.wait_all_tasks_blocked()
            client.close()
            assert await link.receive_some() == b""  # the connection's reader sees the end
        assert why == ["hung up"]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter, links()[0])
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        assert why == ["hung up"] and server._waiting == {} and not server._wakes
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter, links()[0])
            await trio.testing.wait_all_tasks_blocked()
            server.give_up_waits()  # the stop's grace is over
        assert why == ["hung up", "stopping"]
    assert server._waiting == {} and not server._wakes
    server.drop_answer(80, 1, False)
    assert server.answers == 0
