"""A client that sends requests and does not read the answers cannot hold the server's memory
without bound (``affidavit/mcp/transport.py``, the module docstring):

* at most ``max_open`` requests are open at once; one more is answered OVERLOADED at once and
  nothing is kept of it -- once the client's stdout pipe is full, that answer waits (up to
  ``write_wait``) and the reader with it: the client's own pipe pushes back;
* an answer not taken within ``write_wait`` breaks the output: the call's answer is recorded
  RESULT_DELIVERY_FAILED and the session ends, so a client that reads nothing holds no slot for
  good.

Counts, not memory figures: ``tests/benchmarks/mcp_unread.py`` prints the resident sizes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import trio
import trio.testing

from affidavit.mcp import server
from affidavit.mcp.backends import Embedded
from affidavit.mcp.server import (
    READS_AT_ONCE,
    READS_OPEN,
    READS_RETRY,
    McpSession,
    serve,
)
from affidavit.mcp.transport import OPEN_BYTES, OPEN_MARGIN, OPEN_RETRY, REFUSALS, StdioTransport
from tests.broker.helpers import TOKEN_ENV, http_target, write_config
from tests.daemon.kit import running_daemon
from tests.http.hostile import HostileServer, Reply, scripts

from .conftest import Remotes
from .kit import WAIT
from .test_protocol import (
    FAST,
    INIT,
    Raw,
    call,
    line,
    next_line,
    raw_server,
    response,
    transport_on_memory,
)


class Counted(trio.abc.ReceiveStream):
    """A stdin that counts the bytes the transport took from it."""

    def __init__(self, inner: trio.abc.ReceiveStream) -> None:
        self.inner = inner
        self.taken = 0

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        data = await self.inner.receive_some(max_bytes)
        self.taken += len(data)
        return data

    async def aclose(self) -> None:
        await self.inner.aclose()


def listing(request_id: int) -> bytes:
    return line({"jsonrpc": "2.0", "id": request_id, "method": "tools/list"})


async def test_past_max_open_requests_one_more_is_answered_overloaded_at_once() -> None:
    to_server, server_in = trio.testing.memory_stream_one_way_pair()
    server_out, from_server = trio.testing.memory_stream_one_way_pair()
    stdin = Counted(server_in)
    transport = StdioTransport(stdin, server_out)
    transport.limit_open(2)
    cap = transport.max_open
    assert cap == 2 + OPEN_MARGIN
    async with transport.streams() as (read, write), read, write:
        with trio.fail_after(WAIT):
            for n in range(cap):  # each one handed to the server: all open
                await to_server.send_all(listing(n))
                assert (await read.receive()).message.id == n
            assert transport.open_requests == cap
            for n in (cap, cap + 1):  # read, answered here, nothing kept
                await to_server.send_all(listing(n))
                overloaded(await next_line(from_server), n)
            sent = b"".join(listing(n) for n in range(cap + 2))
            assert stdin.taken == len(sent)
            assert transport.open_requests == cap
            with pytest.raises(anyio.WouldBlock):
                read.receive_nowait()  # neither reached the server

            await write.send(response(0))  # one settled: room for one more
            assert (await next_line(from_server))["id"] == 0
            await to_server.send_all(listing(cap + 2))
            assert (await read.receive()).message.id == cap + 2
            assert transport.open_requests == cap


def overloaded(answer: dict[str, Any], request_id: Any) -> None:
    """``answer`` is the transport's refusal past its open bounds, under ``request_id``."""
    assert answer["id"] == request_id, answer
    assert answer["error"]["code"] == -32000, answer
    refusal = answer["error"]["data"]["api_error"]
    assert refusal["code"] == "OVERLOADED", answer
    assert refusal["outcome"] == "not_attempted" and refusal["retry_after"] == OPEN_RETRY


async def test_past_max_open_bytes_of_open_requests_one_more_is_answered_overloaded() -> None:
    """The count alone would let ``max_open`` requests of ``max_line`` bytes each be held: their
    lines' bytes are bounded too -- and a longer request than that bound is still let in alone
    (a message may be ``max_line`` long)."""
    to_server, server_in = trio.testing.memory_stream_one_way_pair()
    server_out, from_server = trio.testing.memory_stream_one_way_pair()
    transport = StdioTransport(server_in, server_out)
    size = len(listing(10)) - 1  # (its newline not counted)
    transport.max_open_bytes = 3 * size
    async with transport.streams() as (read, write), read, write:
        with trio.fail_after(WAIT):
            for n in range(10, 13):
                await to_server.send_all(listing(n))
                assert (await read.receive()).message.id == n
            await to_server.send_all(listing(13))
            overloaded(await next_line(from_server), 13)  # past the bytes, though 3 < max_open
            with pytest.raises(anyio.WouldBlock):
                read.receive_nowait()
            assert (transport.open_requests, transport.open_bytes) == (3, 3 * size)
            for n in range(10, 13):
                await write.send(response(n))
                await next_line(from_server)

            long = {"jsonrpc": "2.0", "id": 14, "method": "tools/list", "params": {}}
            long["params"] = {"_meta": {"pad": "x" * (4 * size)}}
            await to_server.send_all(line(long))  # none open: a longer one gets in alone
            assert (await read.receive()).message.id == 14
            assert transport.open_requests == 1


async def test_a_refused_duplicate_gives_its_slot_back() -> None:
    """A request refused here (its id in flight) is settled at once: the slot it waited for is
    free again, or a client repeating an id would fill the bound with nothing running."""
    to_server, server_in = trio.testing.memory_stream_one_way_pair()
    server_out, from_server = trio.testing.memory_stream_one_way_pair()
    transport = StdioTransport(server_in, server_out)
    async with transport.streams() as (read, write), read, write:
        with trio.fail_after(WAIT):
            await to_server.send_all(listing(1))
            await read.receive()
            for _ in range(3 * transport.max_open):
                await to_server.send_all(listing(1))
                assert (await next_line(from_server))["error"]["code"] == -32600
            assert transport.open_requests == 1


class Catalog:
    """A backend with no targets: ``list_targets`` answers from its catalog alone."""

    async def catalog(self) -> dict[str, Any]:
        return {"tools": [], "targets": [], "max_action_bytes": 1 << 20}


async def test_reads_whose_answers_are_not_taken_are_bounded_apart() -> None:
    """A read answered in the handler holds its answer until it is written: at most
    ``READS_OPEN`` at once, one more OVERLOADED with nothing read; a read whose answer was
    written frees its place."""
    async with transport_on_memory() as (client, _, read, write, transport):
        session = McpSession(Catalog(), transport, "mcp-s1")  # type: ignore[arg-type]
        transport.limit_open(READS_OPEN)  # (room for them all in the transport)
        async with trio.open_nursery() as nursery:
            session.nursery = nursery
            with trio.fail_after(WAIT):
                for n in range(READS_OPEN + 1):
                    await client.send_all(line(call(n, "list_targets", {})))
                    await read.receive()
                for n in range(READS_OPEN):  # answered, not yet written
                    assert "targets" in await session.answer(n, "list_targets", {})
                over = await session.answer(READS_OPEN, "list_targets", {})
                assert over["api_error"]["code"] == "OVERLOADED", over
                assert over["api_error"]["retry_after"] == READS_RETRY, over
                assert "not yet written" in over["api_error"]["message"]
                assert "nothing was read" in over["api_error"]["message"]

                await write.send(response(0))  # one written: its place is free
                await trio.testing.wait_all_tasks_blocked()
                assert "targets" in await session.answer(READS_OPEN, "list_targets", {})
            nursery.cancel_scope.cancel()


class SlowListing(Catalog):
    """A backend whose ``list_actions`` pages wait until released."""

    def __init__(self) -> None:
        self.release = trio.Event()
        self.asked = 0

    async def actions(self, session: str, outcome: Any, limit: int) -> dict[str, Any]:
        self.asked += 1
        await self.release.wait()
        return {"actions": [], "next": None}


async def test_reads_whose_answers_are_taken_at_once_are_never_refused() -> None:
    """40 reads at once, each answer taken as soon as it is given: none is refused, however
    many wait their turn (``READS_AT_ONCE`` worked on at once).  Before, a read counted while
    worked on: 40 parallel ``list_actions`` through the proxy had up to 17 answered OVERLOADED
    though the client read promptly."""
    backend = SlowListing()
    async with transport_on_memory() as (client, _, read, write, transport):
        session = McpSession(backend, transport, "mcp-s1")  # type: ignore[arg-type]
        transport.limit_open(40)
        answers: dict[int, dict[str, Any]] = {}

        async def ask(n: int) -> None:
            answers[n] = await session.answer(n, "list_actions", {})
            await write.send(response(n))  # taken at once

        async with trio.open_nursery() as nursery:
            session.nursery = nursery
            with trio.fail_after(WAIT):
                for n in range(40):
                    await client.send_all(line(call(n, "list_actions", {})))
                    await read.receive()
                async with trio.open_nursery() as asking:
                    for n in range(40):
                        asking.start_soon(ask, n)
                    await trio.testing.wait_all_tasks_blocked()
                    assert backend.asked == READS_AT_ONCE  # the rest wait their turn
                    backend.release.set()
            nursery.cancel_scope.cancel()
    refused = [a for a in answers.values() if "api_error" in a]
    assert not refused, refused[0]
    assert len(answers) == 40


@asynccontextmanager
async def embedded(tmp: Path, token: str) -> AsyncIterator[Embedded]:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp, {"ok": http_target(srv.url)})
        async with Embedded.open(str(cfg)) as backend:
            yield backend


async def test_an_answer_not_taken_within_write_wait_is_recorded_undelivered_and_ends_the_session(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client reads the initialize answer, sends a call, and reads nothing more: its answer
    cannot be written (a lockstep pipe takes nothing unread).  Within ``write_wait`` the output
    is broken, the call is recorded RESULT_DELIVERY_FAILED -- never delivered -- and ``serve``
    returns though stdin is still open."""
    monkeypatch.setenv(TOKEN_ENV, token)
    to_server, server_in = trio.testing.memory_stream_one_way_pair()
    server_out, from_server = trio.testing.lockstep_stream_one_way_pair()
    transport = StdioTransport(server_in, server_out)
    transport.write_wait = 0.5
    with trio.fail_after(WAIT):
        async with embedded(tmp_path, token) as backend, trio.open_nursery() as nursery:
            nursery.start_soon(serve, backend, transport, "mcp-s1", 4, 5.0)
            await to_server.send_all(line(INIT))
            assert (await next_line(from_server))["id"] == 0
            ready = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            await to_server.send_all(line(ready))
            await to_server.send_all(line(call(1, "http_request", FAST)))
            await transport.hung_up.wait()  # the write ran out of time
        # (the nursery waited for ``serve``: the session ended with stdin still open)
        assert transport.broken
        page = await _actions(tmp_path, token)
    [record] = page["actions"]
    assert record["code"] == "RESULT_DELIVERY_FAILED", record
    assert record["state"] == "delivery_failed_committed", record


async def _actions(tmp: Path, token: str) -> dict[str, Any]:
    async with embedded(tmp, token) as backend:
        return await backend.actions("mcp-s1", None, 10)


async def test_a_client_that_does_not_read_is_held_back_by_its_own_pipe(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    """The process itself (``max_calls = 1``: 17 requests open at most): the client fills the
    stdout pipe with ``tools/list`` answers, then writes 128 KiB requests and reads nothing.
    Past the bound the server answers OVERLOADED, answers the full pipe does not take: once
    ``REFUSALS`` of them wait for their writer the reader waits for room, and the client's
    writes stall after about the bound's worth of lines (held open, the refusals queued, the
    one refused, one in the reader's buffer, one in the stdin pipe) -- not after all 60, each
    of which the server would hold.  Once the client reads, every request is answered."""
    async with raw_server(tmp_path, remotes, token, service="max_calls = 1") as raw:
        sent = await _stalled(raw, 128 * 1024, 60)
    assert sent <= 1 + OPEN_MARGIN + REFUSALS + 4, sent


async def test_the_proxy_holds_back_a_client_that_does_not_read_by_the_bytes_open(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    """The proxy (``--socket``; its ``max_calls`` the default, 256: 272 requests open at
    most) is held to the same transport: 2 MiB requests stall at ``OPEN_BYTES`` of them (and
    the ``REFUSALS`` queued)."""
    async with (
        running_daemon(tmp_path, remotes.targets(), token=token) as daemon,
        raw_server(tmp_path, remotes, token, socket=daemon.socket) as raw,
    ):
        sent = await _stalled(raw, 2 << 20, 60)
    assert sent <= OPEN_BYTES // (2 << 20) + REFUSALS + 3, sent


async def _stalled(raw: Raw, size: int, padded: int) -> int:
    """Fill the stdout pipe, then write ``padded`` ``list_targets`` requests of ``size`` bytes
    reading nothing: how many were written whole once the writes stalled (or all went out).
    Then read every answer (none is lost) and let the writes end."""
    pad = "A" * size
    fill = [{"jsonrpc": "2.0", "id": f"fill{n}", "method": "tools/list"} for n in range(10)]
    sent = 0

    async def write() -> None:
        nonlocal sent
        for message in fill:
            await raw.send(message)
        for n in range(padded):
            await raw.send(call(n, "list_targets", {"pad": pad}))
            sent += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(write)
        with trio.fail_after(WAIT):  # until the writes stall (or all went out)
            seen, still = -1, 0
            while still < 10:
                await trio.sleep(0.1)
                seen, still = sent, (still + 1 if sent == seen else 0)
        stalled = sent
        answered = set()
        while len(answered) < len(fill) + padded:
            found = await raw.receive()
            answered.add(found["id"])
    assert sent == padded
    assert "OVERLOADED" in raw.stderr()  # past the bounds, refused: its answers fill the pipe
    return stalled


async def test_a_read_waits_for_its_turn_read_turn_wait_at_most(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two slow reads hold both turns: a third waits ``READ_TURN_WAIT``, then is answered
    OVERLOADED with ``retry_after``, nothing read -- the two still run.  Before, it waited for
    good, holding an open request of the transport's, and so did every later read."""
    monkeypatch.setattr(server, "READ_TURN_WAIT", 0.3)
    backend = SlowListing()
    async with transport_on_memory() as (client, _, read, _write, transport):
        session = McpSession(backend, transport, "mcp-s1")  # type: ignore[arg-type]
        async with trio.open_nursery() as nursery:
            session.nursery = nursery
            with trio.fail_after(WAIT):
                for n in range(READS_AT_ONCE + 1):
                    await client.send_all(line(call(n, "list_actions", {})))
                    await read.receive()
                for n in range(READS_AT_ONCE):
                    nursery.start_soon(session.answer, n, "list_actions", {})
                await trio.testing.wait_all_tasks_blocked()
                started = trio.current_time()
                over = await session.answer(READS_AT_ONCE, "list_actions", {})
                assert trio.current_time() - started >= 0.3
                assert over["api_error"]["code"] == "OVERLOADED", over
                assert over["api_error"]["retry_after"] == READS_RETRY, over
                assert "waited that long for its turn" in over["api_error"]["message"]
                assert backend.asked == READS_AT_ONCE  # the third read nothing
            nursery.cancel_scope.cancel()


async def test_reads_waiting_for_room_share_one_wake_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``READS_OPEN`` answers unwritten, and two reads holding both turns wait for room: two
    answers written at once let both in at once.  Before 9760a482 each waiter replaced the
    wake-up event, so the first slept on one nobody set for its whole ``READS_WAIT`` (then let
    in, or refused when others had taken the room meanwhile)."""
    async with transport_on_memory() as (client, _, read, write, transport):
        session = McpSession(Catalog(), transport, "mcp-s1")  # type: ignore[arg-type]
        transport.limit_open(READS_OPEN + 2)
        answers: list[dict[str, Any]] = []

        async def ask(n: int) -> None:
            answers.append(await session.answer(n, "list_targets", {}))

        async with trio.open_nursery() as nursery:
            session.nursery = nursery
            with trio.fail_after(WAIT):
                for n in range(READS_OPEN + 2):
                    await client.send_all(line(call(n, "list_targets", {})))
                    await read.receive()
                for n in range(READS_OPEN):  # answered, not yet written
                    assert "targets" in await session.answer(n, "list_targets", {})
                async with trio.open_nursery() as asking:
                    for n in (READS_OPEN, READS_OPEN + 1):
                        asking.start_soon(ask, n)
                        await trio.testing.wait_all_tasks_blocked()
                    written = trio.current_time()
                    await write.send(response(0))
                    await write.send(response(1))
                took = trio.current_time() - written
            nursery.cancel_scope.cancel()
    assert took == 0, took  # (the mock clock's: no wait at all, not READS_WAIT on a stale event)
    assert len(answers) == 2
    assert all("targets" in a for a in answers), answers
