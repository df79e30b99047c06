"""The daemon's parts without a process: the wire format both clients share, the peer policy,
what the link counts as delivered, and the ``[service]`` settings."""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import h11
import pytest
import trio

from affidavit.api.client import Client, ResponseReader, encode_request
from affidavit.api.wire import (
    AnswerLost,
    ApiError,
    Response,
    blocking_request,
    invocation_path,
    parse_time,
    read_answer,
    target,
)
from affidavit.config import ConfigError, config_from_dict
from affidavit.daemon.h11server import TURNED_AWAY
from affidavit.daemon.link import Link
from affidavit.daemon.peer import Peer, PeerPolicy, peer_of


def _answer(status: int, body: bytes) -> bytes:
    server = h11.Connection(h11.SERVER)
    server.receive_data(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    server.next_event()
    server.next_event()
    headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
    out = server.send(h11.Response(status_code=status, headers=headers)) or b""
    return (
        out + (server.send(h11.Data(data=body)) or b"") + (server.send(h11.EndOfMessage()) or b"")
    )


def _reader() -> ResponseReader:
    conn = h11.Connection(h11.CLIENT)
    encode_request(conn, "GET", "/")
    return ResponseReader(conn)


def test_a_response_is_read_whole_however_it_is_split() -> None:
    data = _answer(200, b'{"ok": true}')
    for size in (1, 7, len(data)):
        reader = _reader()
        got = None
        for i in range(0, len(data), size):
            got = reader.feed(data[i : i + size]) or got
        assert got == Response(200, "application/json", b'{"ok": true}')
        assert got.json() == {"ok": True}
        assert reader.reusable()


def test_an_answer_cut_short_is_answer_lost_never_a_partial_body() -> None:
    data = _answer(200, b'{"ok": true}')
    reader = _reader()
    assert reader.feed(data[:-3]) is None
    with pytest.raises(AnswerLost):
        reader.feed(b"")


def _recv_from(data: bytes, size: int) -> Any:
    chunks = [data[i : i + size] for i in range(0, len(data), size)]
    return lambda n: chunks.pop(0) if chunks else b""


def test_the_command_lines_reader_reads_the_same_answer_however_it_is_split() -> None:
    data = _answer(200, b'{"ok": true}')
    for size in (1, 7, len(data)):
        got = read_answer(_recv_from(data, size))
        assert got == Response(200, "application/json", b'{"ok": true}')


@pytest.mark.parametrize(
    "data",
    [
        b"",  # closed before answering
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",  # cut body
        b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n",  # not HTTP/1.1
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",  # no length
        b"HTTP/1.1 200 OK\r\nbroken header\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 2000\r\ncontent-length: 0\r\n\r\n",
        # Digits ``str.isdigit`` takes and ``int`` refuses: a hostile daemon's, never a traceback
        "HTTP/1.1 20² OK\r\ncontent-length: 0\r\n\r\n".encode("latin-1"),
        "HTTP/1.1 200 OK\r\ncontent-length: ²\r\n\r\n".encode("latin-1"),
        # Past 4,300 digits ``int`` itself raises (ValueError, not AnswerLost) where a bare
        # ``isdigit`` let it through: ``parse_count`` refuses past 19 digits first.
        b"HTTP/1.1 200 OK\r\ncontent-length: " + b"9" * 5000 + b"\r\n\r\n",
    ],
)
def test_the_command_lines_reader_never_takes_a_short_or_odd_answer(data: bytes) -> None:
    with pytest.raises(AnswerLost):
        read_answer(_recv_from(data, 5))


def test_an_api_error_carries_its_code_and_message() -> None:
    refused = Response(
        403, "application/json", b'{"api_error": {"code": "PEER_REFUSED", "message": "no"}}'
    )
    with pytest.raises(ApiError) as info:
        refused.json()
    assert (info.value.status, info.value.code, info.value.message) == (403, "PEER_REFUSED", "no")
    odd = Response(502, "text/html", b"<html>")
    assert odd.error().code == "HTTP_ERROR"


def test_request_targets_quote_the_caller_text() -> None:
    assert invocation_path("act_1/../x?y", "/result") == "/v1/invocations/act_1%2F..%2Fx%3Fy/result"
    assert target("/v1/actions", {"session": "a b", "outcome": None}) == "/v1/actions?session=a+b"
    assert target("/v1/health", {}) == "/v1/health"


def test_times_are_epoch_seconds_or_iso_8601() -> None:
    assert parse_time("1700000000.5") == 1700000000.5
    assert parse_time("2023-11-14T22:13:20Z") == 1700000000.0
    assert parse_time("2023-11-14T22:13:20") == 1700000000.0  # naive means UTC
    with pytest.raises(ValueError, match="expected ISO 8601 or epoch seconds"):
        parse_time("yesterday")
    with pytest.raises(ValueError):
        parse_time("nan")


@pytest.mark.parametrize(
    ("peer", "allowed"),
    [
        (Peer(pid=1, uid=1001, gid=1001), True),  # listed uid
        (Peer(pid=1, uid=2000, gid=500), True),  # primary group
        (Peer(pid=1, uid=2000, gid=2000, groups=(7, 500)), True),  # supplementary group
        (Peer(pid=1, uid=2000, gid=2000, groups=(7,)), False),
    ],
)
def test_a_peer_is_allowed_by_its_uid_or_any_of_its_groups(peer: Peer, allowed: bool) -> None:
    policy = PeerPolicy(uids=frozenset({1001}), gids=frozenset({500}))
    assert policy.allows(peer) is allowed


def test_peer_credentials_come_from_the_kernel() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        peer = peer_of(a)
    assert (peer.pid, peer.uid, peer.gid) == (os.getpid(), os.geteuid(), os.getegid())


async def test_the_link_notes_a_hang_up_and_a_failed_write() -> None:
    a, b = trio.socket.socketpair()
    link = Link(trio.SocketStream(a))
    peer = trio.SocketStream(b)
    await peer.send_all(b"x")
    assert await link.receive_some(10) == b"x"
    assert not link.hung_up.is_set()
    await link.send_all(b"answer")  # accepted by the kernel: delivered
    assert not link.broken
    assert await peer.receive_some(10) == b"answer"
    await peer.aclose()
    assert await link.receive_some(10) == b""
    assert link.hung_up.is_set()
    with pytest.raises(trio.BrokenResourceError):
        for _ in range(64):  # a write to a closed Unix socket fails (EPIPE) at once
            await link.send_all(b"y" * 65536)
    assert link.broken
    await link.aclose()


def _service(**table: Any) -> Any:
    return config_from_dict({"service": table}, base_dir=Path("/etc/affidavit")).service


def test_service_defaults_resolve_beside_the_config() -> None:
    svc = _service()
    assert svc.socket == Path("/etc/affidavit/affidavit.sock")
    assert (svc.allow_uids, svc.allow_gids, svc.shutdown_grace, svc.max_calls) == (
        None,
        (),
        30.0,
        256,
    )
    assert _service(shutdown_grace="2m", allow_uids=[0, 1001]).shutdown_grace == 120.0


@pytest.mark.parametrize(
    ("table", "field", "message"),
    [
        ({"allow_uids": [True]}, "service.allow_uids[0]", "must be a numeric id"),
        ({"allow_uids": ["alice"]}, "service.allow_uids[0]", "must be a numeric id"),
        ({"allow_gids": 5}, "service.allow_gids", "must be an array of numeric ids"),
        ({"shutdown_grace": "soon"}, "service.shutdown_grace", "must be a duration"),
        ({"max_calls": 0}, "service.max_calls", "must be between 1 and 100000"),
        ({"call_rate": 0}, "service.call_rate", "calls a second from 0.01 to 100000"),
        ({"call_rate": True}, "service.call_rate", "calls a second from 0.01 to 100000"),
        ({"call_rate": "20/s"}, "service.call_rate", "calls a second from 0.01 to 100000"),
        ({"call_rate": float("inf")}, "service.call_rate", "calls a second from 0.01"),
        ({"call_rate": float("nan")}, "service.call_rate", "calls a second from 0.01"),
        ({"call_rate": -5}, "service.call_rate", "calls a second from 0.01 to 100000"),
        ({"call_rate": 100_001}, "service.call_rate", "calls a second from 0.01 to 100000"),
        ({"call_rate": 10**400}, "service.call_rate", "calls a second from 0.01 to 100000"),
        ({"call_burst": 0}, "service.call_burst", "must be between 1 and 1000000"),
        ({"call_burst": -1}, "service.call_burst", "must be between 1 and 1000000"),
        ({"call_burst": 1_000_001}, "service.call_burst", "must be between 1 and 1000000"),
        ({"call_burst": True}, "service.call_burst", "must be"),
        ({"call_burst": "200"}, "service.call_burst", "must be"),
        ({"call_burst": 2.5}, "service.call_burst", "must be"),
        ({"sockett": "x"}, "service.sockett", "unknown setting"),
    ],
)
def test_bad_service_settings_name_the_field(
    table: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _service(**table)
    assert info.value.field == field
    assert message in info.value.message


# -- a request the daemon stopped reading: its answer, if whole, is the answer --------------------

Script = Callable[[trio.socket.SocketType], Awaitable[None]]
BIG_BODY = b'{"pad": "' + b"x" * (8 << 20) + b'"}'  # far over a Unix socket's buffers


@contextlib.asynccontextmanager
async def _scripted_peer(script: Script) -> AsyncIterator[str]:
    """A Unix socket whose one connection runs ``script`` and is closed -- whatever is unread."""
    with tempfile.TemporaryDirectory(prefix="affidavit-peer-") as where:
        path = os.path.join(where, "s")
        listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with listener:
            await listener.bind(path)
            listener.listen()

            async def serve() -> None:
                conn, _ = await listener.accept()
                with conn:
                    await script(conn)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(serve)
                yield path


async def _read_some(conn: trio.socket.SocketType) -> None:
    """Until part of the request is in: the client is then surely mid-send."""
    got = 0
    while got < 64 * 1024:
        got += len(await conn.recv(65536))


async def _refuse_unread(conn: trio.socket.SocketType) -> None:
    await conn.send(TURNED_AWAY)  # the daemon's own 503 to a connection over the cap


async def _refuse_read_part(conn: trio.socket.SocketType) -> None:
    await _read_some(conn)
    await conn.send(TURNED_AWAY)


async def _close_unanswered(conn: trio.socket.SocketType) -> None:
    await _read_some(conn)


async def _close_mid_answer(conn: trio.socket.SocketType) -> None:
    await _read_some(conn)
    await conn.send(TURNED_AWAY[:-5])  # all but the end of its body


async def _close_on_malformed_answer(conn: trio.socket.SocketType) -> None:
    await conn.send(TURNED_AWAY.replace(b"\r\n", b"\r\nno colon here\r\n", 1))


@pytest.mark.parametrize("script", [_refuse_unread, _refuse_read_part], ids=["unread", "read-part"])
@pytest.mark.parametrize("which", ["async", "blocking"])
async def test_a_refusal_written_before_the_close_is_the_answer_not_answer_lost(
    script: Script, which: str
) -> None:
    """A connection over the daemon's cap is answered 503 and closed before a byte of it is
    read, so a client still sending meets EPIPE / ECONNRESET.  Before, both clients said
    ``AnswerLost`` ("the call may have run") although the call certainly did not: the 503 was
    waiting, whole, in the socket."""
    async with _scripted_peer(script) as path:
        if which == "async":
            async with Client.open(path) as client:
                with pytest.raises(ApiError) as info:
                    await client.call({"pad": BIG_BODY.decode()})
            error = info.value
        else:
            answer = await trio.to_thread.run_sync(
                blocking_request, path, "POST", "/v1/calls", BIG_BODY
            )
            error = answer.error()
    assert (error.status, error.code) == (503, "TOO_MANY_CONNECTIONS")


@pytest.mark.parametrize(
    "script",
    [_close_unanswered, _close_mid_answer, _close_on_malformed_answer],
    ids=["no-answer", "partial-answer", "malformed-answer"],
)
@pytest.mark.parametrize("which", ["async", "blocking"])
async def test_a_close_mid_send_without_a_whole_answer_is_still_answer_lost(
    script: Script, which: str
) -> None:
    """Only a complete answer, read strictly, is taken: anything less leaves the call's fate
    unknown, and the client must not say it did not run."""
    async with _scripted_peer(script) as path:
        with pytest.raises(AnswerLost):
            if which == "async":
                async with Client.open(path) as client:
                    await client.call({"pad": BIG_BODY.decode()})
            else:
                await trio.to_thread.run_sync(blocking_request, path, "POST", "/v1/calls", BIG_BODY)


def test_a_time_that_is_no_time_is_quoted_as_every_echo() -> None:
    """``parse_time`` quotes what it was given cut to ``ECHO`` characters and escaped (the
    daemon, the CLI and the console all say its words): a 15 KB value was quoted whole."""
    with pytest.raises(ValueError) as raised:
        parse_time("y" * 15_000)
    assert str(raised.value) == f"expected ISO 8601 or epoch seconds, got '{'y' * 61}...'"
    with pytest.raises(ValueError, match=r"got 'a\\nb'$"):
        parse_time("a\nb")
