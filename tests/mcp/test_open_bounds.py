"""The transport's open bounds through ``serve`` and the SDK's own server, with a backend whose
calls are held until released: a request past the bounds is answered OVERLOADED at once and the
reader reads on (``affidavit/mcp/transport.py``, the module docstring)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import pytest
import trio
import trio.testing
from mcp.shared.message import SessionMessage

from affidavit.mcp.backends import Exchange
from affidavit.mcp.server import McpSession, serve
from affidavit.mcp.transport import MIN_RATE, OPEN_MARGIN, WRITE_SLICE, StdioTransport

from .kit import WAIT
from .test_protocol import INIT, call, line, next_line, response, transport_on_memory
from .test_unread import overloaded

TOOL = {"name": "http_request", "kind": "http", "doc": "", "input_schema": {"type": "object"}}


class Held:
    """A backend whose calls run until the test releases them; ``gone`` counts the calls whose
    caller went away (``Exchange.abandon``: withdrawn)."""

    def __init__(self) -> None:
        self.started = 0
        self.gone = 0
        self.release = trio.Event()

    async def catalog(self) -> dict[str, Any]:
        return {"tools": [TOOL], "targets": [], "max_action_bytes": 1 << 20}

    async def call(self, args: dict[str, Any], exchange: Exchange) -> dict[str, Any]:
        self.started += 1
        exchange.on_gone(self._gone)
        await self.release.wait()
        return {"api_error": {"code": "INTERNAL", "message": "released"}}

    async def actions(self, session: str, outcome: Any, limit: int) -> dict[str, Any]:
        await self.release.wait()
        return {"actions": [], "next": None}

    def _gone(self) -> None:
        self.gone += 1

    def stop(self) -> None:
        self.release.set()


@asynccontextmanager
async def serving(
    backend: Held, max_calls: int
) -> AsyncIterator[tuple[Any, Any, StdioTransport, McpSession]]:
    """``serve`` on in-memory pipes, initialized: (client's sender, client's receiver, the
    transport, the session)."""
    to_server, server_in = trio.testing.memory_stream_one_way_pair()
    server_out, from_server = trio.testing.memory_stream_one_way_pair()
    transport = StdioTransport(server_in, server_out)
    sessions: list[McpSession] = []
    real = McpSession.__init__

    def kept(self: McpSession, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        sessions.append(self)

    async with trio.open_nursery() as nursery:
        McpSession.__init__ = kept  # type: ignore[method-assign]
        try:
            nursery.start_soon(serve, backend, transport, "mcp-s1", max_calls, 0.1)
            await trio.testing.wait_all_tasks_blocked()
        finally:
            McpSession.__init__ = real  # type: ignore[method-assign]
        await to_server.send_all(line(INIT))
        assert (await next_line(from_server))["id"] == 0
        await to_server.send_all(line({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        yield to_server, from_server, transport, sessions[0]
        await to_server.aclose()
        backend.release.set()


def cancel(request_id: Any) -> bytes:
    params = {"requestId": request_id, "reason": "test"}
    return line({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params})


def ping(request_id: Any) -> bytes:
    return line({"jsonrpc": "2.0", "id": request_id, "method": "ping"})


async def test_a_cancel_behind_a_request_past_the_bytes_bound_reaches_the_server() -> None:
    """The review's case: one call longer than ``max_open_bytes`` let in alone, then a ping
    (past the bound) and a cancel of the call.  The ping is answered OVERLOADED at once, and the
    cancel is read: the call is withdrawn.  Before, the reader waited for room at the ping and
    read nothing more -- the cancel never reached the server."""
    backend = Held()
    async with serving(backend, 4) as (client, replies, transport, session):
        transport.max_open_bytes = 1000
        with trio.fail_after(WAIT):
            await client.send_all(line(call(1, "http_request", {"pad": "x" * 2000})))
            while backend.started < 1:
                await trio.sleep(0.01)
            await client.send_all(ping(2))
            overloaded(await next_line(replies), 2)
            await client.send_all(cancel(1))
            while backend.gone < 1:  # the call's handler ended: its caller is gone
                await trio.sleep(0.01)
            while transport.open_requests:  # settled unanswered: its slot is back
                await trio.sleep(0.01)
            await client.send_all(ping(3))
            assert (await next_line(replies)) == {"jsonrpc": "2.0", "id": 3, "result": {}}
        assert session.running == 1  # (the call runs on past its request, as every call)


async def test_serve_lets_max_calls_plus_the_margin_be_open_and_refuses_one_more() -> None:
    """``serve`` with ``max_calls`` 20: 20 calls running and ``OPEN_MARGIN`` reads held open
    beside them -- 36 open, each reached the server -- and one more request is answered
    OVERLOADED by the transport.  (The transport's own default is ``OPEN_MARGIN`` alone: had
    ``serve`` not raised it, the 17th call would have been refused.)"""
    backend = Held()
    max_calls = 20
    async with serving(backend, max_calls) as (client, replies, transport, session):
        with trio.fail_after(WAIT):
            for n in range(max_calls):
                await client.send_all(line(call(n, "http_request", {})))
            while backend.started < max_calls:
                await trio.sleep(0.01)
            for n in range(max_calls, max_calls + OPEN_MARGIN):
                await client.send_all(line(call(n, "list_actions", {})))
            while transport.open_requests < max_calls + OPEN_MARGIN:
                await trio.sleep(0.01)
            await client.send_all(ping("over"))
            overloaded(await next_line(replies), "over")
        assert session.running == max_calls
        assert transport.open_requests == max_calls + OPEN_MARGIN


async def _drain(stream: trio.abc.ReceiveStream, size: int, pause: float) -> None:
    """A client reading ``size`` bytes per read, ``pause`` seconds apart, for good."""
    while await stream.receive_some(size):
        await trio.sleep(pause)


async def test_a_long_line_to_a_slow_but_steady_reader_is_written_whole(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A line taking 16 times ``write_wait`` to read, read steadily: written whole -- the limit
    bounds each slice (``WRITE_SLICE``), not the line.  Before, the whole line had
    ``write_wait``: the session ended."""
    server_out, from_server = trio.testing.lockstep_stream_one_way_pair()
    server_in, _ = trio.testing.memory_stream_one_way_pair()
    transport = StdioTransport(server_in, server_out)
    transport.write_wait = 1.0
    # Read 4 KiB per 10 ms: a 64 KiB slice in 0.16 s, the line in 16 s.
    data = b"x" * (100 * WRITE_SLICE) + b"\n"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_drain, from_server, 4096, 0.01)
        started = trio.current_time()
        assert await transport._send(data)
        assert trio.current_time() - started > 15 * transport.write_wait
        assert not transport.broken and not transport.hung_up.is_set()
        nursery.cancel_scope.cancel()


async def test_a_reader_that_stops_mid_line_breaks_the_output_within_write_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Read steadily, then not at all: the slice under way is not taken within ``write_wait``
    and the output is broken -- a client that stops reading is still cut."""
    server_out, from_server = trio.testing.lockstep_stream_one_way_pair()
    server_in, _ = trio.testing.memory_stream_one_way_pair()
    transport = StdioTransport(server_in, server_out)
    transport.write_wait = 1.0
    data = b"x" * (100 * WRITE_SLICE) + b"\n"
    async with trio.open_nursery() as nursery:

        async def stops() -> None:
            with trio.move_on_after(3.0):  # some slices taken, then nothing
                await _drain(from_server, 4096, 0.01)

        nursery.start_soon(stops)
        started = trio.current_time()
        assert not await transport._send(data)
        assert transport.broken and transport.hung_up.is_set()
        assert trio.current_time() - started < 3.0 + transport.write_wait + 0.5


async def test_requests_settled_unanswered_give_their_slots_back() -> None:
    """More requests than ``max_open``, each settled unanswered (the SDK's word when the client
    cancelled it): none stays open, and the next request still reaches the server -- not
    answered OVERLOADED by slots no request holds."""
    async with transport_on_memory() as (client, _, read, _write, transport):
        transport.max_open = 3
        with trio.fail_after(WAIT):
            for n in range(3 * transport.max_open):
                await client.send_all(ping(n))
                message = await read.receive()
                assert message.message.id == n
                await message.metadata.on_request_unanswered()
            assert (transport.open_requests, transport.open_bytes) == (0, 0)
            await client.send_all(ping("next"))
            assert (await read.receive()).message.id == "next"


async def test_an_answer_written_after_the_input_ended_is_recorded_written() -> None:
    """The client closes stdin and reads on: an answer handed over after the input's end is
    written, and its outcome says written -- before, the end of input settled it not written
    (RESULT_DELIVERY_FAILED) and the answer then went out all the same.  Once the streams
    close, an answer not yet given is settled not written."""
    to_server, server_in = trio.testing.memory_stream_one_way_pair()
    server_out, from_server = trio.testing.memory_stream_one_way_pair()
    transport = StdioTransport(server_in, server_out)
    with trio.fail_after(WAIT):
        async with transport.streams() as (read, write), read, write:
            for n in (1, 2, 3):
                await to_server.send_all(ping(n))
                assert (await read.receive()).message.id == n
            answered, unanswered = transport.expect(1), transport.expect(2)
            await to_server.aclose()
            await transport.hung_up.wait()
            assert not answered.settled
            await write.send(response(1))
            assert (await next_line(from_server))["id"] == 1
            assert await answered.wait()
        assert not await unanswered.wait()
        # Closed: nothing more can be written -- a request read and never answered (nor
        # expected before) is settled not written at once.
        late = transport.expect(3)
        assert late.settled and not late.written


async def test_a_cancel_behind_a_refusal_is_read_while_a_long_answer_is_written() -> None:
    """The review's case: ``max_open`` 1, one ping open, a 4 MiB answer being written to a
    client not reading now, a second ping refused, then a cancel: the cancel is read.  Before,
    the reader wrote the refusal itself and waited for the write lock the long answer held --
    the cancel was not read while the client did not read."""
    to_server, server_in = trio.testing.memory_stream_one_way_pair()
    server_out, from_server = trio.testing.lockstep_stream_one_way_pair()
    transport = StdioTransport(server_in, server_out)
    transport.max_open = 1
    big = types.JSONRPCResponse(jsonrpc="2.0", id=1, result={"pad": "x" * (4 << 20)})
    with trio.fail_after(WAIT):
        async with transport.streams() as (read, write), read, write:
            await to_server.send_all(ping(1))
            assert (await read.receive()).message.id == 1
            async with trio.open_nursery() as nursery:
                nursery.start_soon(write.send, SessionMessage(big))
                await trio.testing.wait_all_tasks_blocked()
                await to_server.send_all(ping(2) + cancel(1))
                with trio.move_on_after(3):
                    notice = (await read.receive()).message
                assert isinstance(notice, types.JSONRPCNotification), "the cancel was not read"
                assert notice.method == "notifications/cancelled"
                assert transport.refusal_bytes > 0  # the refusal waits for its writer
                # The client reads now: the long answer, then the refusal.
                assert (await next_line(from_server))["id"] == 1
                overloaded(await next_line(from_server), 2)


async def test_a_line_read_slower_than_min_rate_breaks_the_output_at_its_whole_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Each slice taken within ``write_wait``, yet the line at 40 KiB/s, under ``MIN_RATE``: cut
    at ``write_wait`` plus its length at ``MIN_RATE`` (102 s), not written whole in 160 s --
    one slow reader holds every other answer back that long at most.  Before, only the slices
    were bounded: a 100 MiB line at a slice every 29 s held the output about 13 hours."""
    server_out, from_server = trio.testing.lockstep_stream_one_way_pair()
    server_in, _ = trio.testing.memory_stream_one_way_pair()
    transport = StdioTransport(server_in, server_out)
    transport.write_wait = 2.0  # a slice takes 1.6 s
    data = b"x" * (100 * WRITE_SLICE - 1) + b"\n"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_drain, from_server, 4096, 0.1)  # 40 KiB/s
        started = trio.current_time()
        assert not await transport._send(data)
        took = trio.current_time() - started
        assert transport.broken and transport.hung_up.is_set()
        assert took == pytest.approx(transport.write_wait + len(data) / MIN_RATE, abs=0.5)
        nursery.cancel_scope.cancel()


async def test_a_refusal_queued_when_the_input_ends_is_written_before_the_session_ends() -> None:
    """The review's case: ``max_open`` 1, a 4 MiB answer to ping 1 being written to a slow
    reader, ping 2 refused OVERLOADED and queued, then stdin closes.  The refusal is written
    before the reader tells the server the input ended (after which the streams close).
    Before, the reader closed its stream at once: the session ended with the refusal queued
    and the client never got an answer for id 2."""
    to_server, server_in = trio.testing.memory_stream_one_way_pair()
    server_out, from_server = trio.testing.memory_stream_one_way_pair()
    transport = StdioTransport(server_in, server_out)
    transport.max_open = 1
    big = types.JSONRPCResponse(jsonrpc="2.0", id=1, result={"pad": "x" * (4 << 20)})
    got = bytearray()

    async def slow_reader() -> None:
        while data := await from_server.receive_some(65536):
            got.extend(data)
            await trio.sleep(0.001)

    with trio.fail_after(WAIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow_reader)
            async with transport.streams() as (read, write), read, write:
                await to_server.send_all(ping(1))
                assert (await read.receive()).message.id == 1
                await write.send(SessionMessage(big))  # handed over: under way
                await to_server.send_all(ping(2))  # refused OVERLOADED: queued
                await to_server.aclose()  # the input ends
                with pytest.raises(anyio.EndOfStream):
                    await read.receive()  # as Server.run hears it, and returns
                assert transport.refusal_bytes == 0
            await server_out.aclose()  # the reader takes what was written, then ends
    lines = [json.loads(chunk) for chunk in bytes(got).split(b"\n") if chunk]
    assert [message["id"] for message in lines] == [1, 2]
    overloaded(lines[1], 2)
