"""The socket's HTTP/1.1 (affidavit/daemon/h11server.py) against odd and hostile clients.

Raw bytes over a real Unix socket pair; the driver runs in this process with a two-route stand-in
for the API (``_routes``), so each rule is seen on the wire without a broker behind it.  The
refused peer is seen through a real daemon.  Every wait is bounded (``WAIT``); none is timed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import trio
import trio.testing

from affidavit.api import client as api_client
from affidavit.api.wire import ApiError, blocking_request
from affidavit.daemon import h11server
from affidavit.daemon.admission import Server
from affidavit.daemon.h11server import MAX_HEAD
from affidavit.daemon.http import FREE_BODY, MAX_BODY, ApiProblem, Request
from affidavit.daemon.link import Link
from affidavit.daemon.peer import Peer

from .kit import PYTHON, WAIT, api_target, client_env, run, running_daemon

HEAD = b"GET /v1/health HTTP/1.1\r\nhost: affidavit\r\n\r\n"


class Routes:
    """``POST /echo`` answers its body; ``GET /hold`` answers once ``release`` is set (noting a
    hang-up seen meanwhile); ``GET /big`` answers ``BIG`` bytes (noting whether the write broke);
    anything else answers its path.  ``paths``: every request a route saw."""

    BIG = 8 * 1024 * 1024  # far over what a socket pair's buffers hold

    def __init__(self) -> None:
        self.holding = trio.Event()
        self.release = trio.Event()
        self.hang_ups: list[str] = []
        self.paths: list[str] = []
        self.broken: list[bool] = []

    async def __call__(self, req: Request) -> None:
        self.paths.append(req.path)
        try:
            if req.method == "POST":
                await req.respond(200, await req.body())
            elif req.path == "/big":
                await req.respond(200, b"b" * self.BIG)
                self.broken.append(req.link.broken)
            elif req.path == "/hold":
                req.link.on_hang_up.add(lambda: self.hang_ups.append(req.path))
                self.holding.set()
                await self.release.wait()
                await req.respond(200, b"/hold")
            else:
                await req.respond(200, req.path.encode())
        except ApiProblem as problem:
            await req.respond_problem(problem)


class Client:
    """The client's end: raw bytes out, answers parsed back."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def _more(self) -> bool:
        data = await self.stream.receive_some(65536)
        self.buffer += data
        return bool(data)

    async def answer(self, *, head_only: bool = False) -> tuple[int, dict[str, str], bytes]:
        """The next answer: (status, headers, body); AssertionError if the connection ends.
        ``head_only``: an answer to HEAD, a head alone whatever its content-length says."""
        with trio.fail_after(WAIT):
            while b"\r\n\r\n" not in self.buffer:
                assert await self._more(), f"closed before an answer: {bytes(self.buffer)!r}"
            head, _, rest = bytes(self.buffer).partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ")[1])
            headers = {
                k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])
            }
            length = 0 if head_only else int(headers.get("content-length", "0"))
            while len(rest) < length:
                assert await self._more(), "closed in the middle of an answer"
                rest = bytes(self.buffer).partition(b"\r\n\r\n")[2]
            self.buffer = bytearray(rest[length:])
            return status, headers, rest[:length]

    async def closed(self) -> bool:
        """True once the server closes the connection (after what it still sends)."""
        with trio.fail_after(WAIT):
            with contextlib.suppress(trio.BrokenResourceError):
                while await self._more():
                    pass
        return True


@contextlib.asynccontextmanager
async def serving(
    routes: Routes | None = None, server: Server | None = None, uid: int | None = None
) -> AsyncIterator[Client]:
    """A connection to ``server`` (its peer this process, or ``uid`` as the kernel would have
    named another account)."""
    server = server or Server(keep_alive=WAIT, head_wait=0.2)
    a, b = trio.socket.socketpair()
    peer = Peer(pid=os.getpid(), uid=os.getuid() if uid is None else uid, gid=os.getgid())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve, Link(trio.SocketStream(a)), peer, routes or Routes())
        client = trio.SocketStream(b)
        try:
            yield Client(client)
        finally:
            await client.aclose()
            nursery.cancel_scope.deadline = trio.current_time() + WAIT


async def _until(condition: Callable[[], bool]) -> None:
    with trio.fail_after(WAIT):
        while not condition():
            await trio.sleep(0.01)


def _api_error(body: bytes) -> str:
    return str(json.loads(body)["api_error"]["code"])


BIG_HEAD = b"GET /x HTTP/1.1\r\nhost: a\r\nx-pad: " + b"p" * MAX_HEAD + b"\r\n\r\n"
TE_HEAD = b"POST /v1/calls HTTP/1.1\r\nhost: a\r\ntransfer-encoding: %s\r\n\r\n0\r\n\r\n"
CL_TE_HEAD = (
    b"POST /echo HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n"
    b"0\r\n\r\nGET /second HTTP/1.1\r\nhost: a\r\n\r\n"
)

HTTP10_TE_HEAD = b"POST /echo HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"


@pytest.mark.parametrize("piece", [1 << 20, 1000], ids=["whole", "in-pieces"])
@pytest.mark.parametrize(
    ("data", "status", "code"),
    [
        (b"NOT HTTP AT ALL\r\n\r\n", 400, "BAD_REQUEST"),
        (b"GET /x HTTP/1.1\r\nhost: a\r\nno colon here\r\n\r\n", 400, "BAD_REQUEST"),
        (b"GET /x HTTP/1.1\r\n\r\n", 400, "BAD_REQUEST"),  # HTTP/1.1 without host
        (b"GET /\xff HTTP/1.1\r\nhost: a\r\n\r\n", 400, "BAD_REQUEST"),
        (BIG_HEAD, 431, "HEAD_TOO_LARGE"),
        # A transfer coding h11 does not implement: 501 (RFC 9112 section 6.1) with a code that
        # says so -- it was 501 BAD_REQUEST, a status and a code that disagreed.
        (TE_HEAD % b"gzip, chunked", 501, "TRANSFER_ENCODING_REFUSED"),
        (TE_HEAD % b"gzip", 501, "TRANSFER_ENCODING_REFUSED"),
        (TE_HEAD % b"chunked\r\ntransfer-encoding: chunked", 501, "TRANSFER_ENCODING_REFUSED"),
        # Both framings (RFC 9112 section 6.1: the server MUST close after answering such a
        # request): it was served by the chunked coding and the connection kept for the next.
        (TE_HEAD % b"chunked\r\ncontent-length: 2", 400, "AMBIGUOUS_FRAMING"),
        (CL_TE_HEAD, 400, "AMBIGUOUS_FRAMING"),
        # Transfer-Encoding in HTTP/1.0 (section 6.1: faulty framing), a version not 1.0/1.1:
        # h11 read the first chunked and took the second as 1.1, and the call ran (audit 53).
        (HTTP10_TE_HEAD, 400, "AMBIGUOUS_FRAMING"),
        (b"GET /v1/health HTTP/2.0\r\nhost: a\r\n\r\n", 505, "HTTP_VERSION_UNSUPPORTED"),
    ],
    ids=[
        "request-line",
        "header",
        "no-host",
        "raw-byte-target",
        "head-over-bound",
        "gzip-chunked",
        "gzip",
        "transfer-encoding-twice",
        "chunked-and-length",
        "length-then-chunked",
        "http10-chunked",
        "http20",
    ],
)
async def test_a_malformed_or_oversized_head_is_refused_then_closed_without_a_traceback(
    data: bytes, status: int, code: str, piece: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with serving() as client:
        with contextlib.suppress(trio.BrokenResourceError):  # refused before the end
            for i in range(0, len(data), piece):
                await client.send(data[i : i + piece])
        got, headers, body = await client.answer()
        assert await client.closed()
    assert (got, _api_error(body), headers["connection"]) == (status, code, "close")
    assert client.buffer == b"", "answered past the refusal"
    assert not [r for r in caplog.records if r.exc_info], "a traceback in the log"


async def test_a_body_framed_by_both_length_and_chunked_runs_no_route_and_names_the_field() -> None:
    """RFC 9112 section 6.1 (reject it, or read by the chunked coding alone, and close after
    answering either way): refused 400 ``AMBIGUOUS_FRAMING`` at ``headers.content-length``
    before any route reads a byte of it -- the pipelined request behind it never served."""
    routes = Routes()
    async with serving(routes) as client:
        await client.send(CL_TE_HEAD)
        status, headers, body = await client.answer()
        assert await client.closed()
    error = json.loads(body)["api_error"]
    assert (status, error["code"], error["field"]) == (
        400,
        "AMBIGUOUS_FRAMING",
        "headers.content-length",
    )
    assert headers["connection"] == "close" and routes.paths == []


@pytest.mark.parametrize(
    ("data", "status", "code", "field"),
    [
        (HTTP10_TE_HEAD, 400, "AMBIGUOUS_FRAMING", "headers.transfer-encoding"),
        (
            b"POST /echo HTTP/1.0\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n{}",
            400,
            "AMBIGUOUS_FRAMING",
            "headers.transfer-encoding",
        ),
        (
            b"POST /echo HTTP/2.0\r\nhost: a\r\ncontent-length: 2\r\n\r\n{}",
            505,
            "HTTP_VERSION_UNSUPPORTED",
            None,
        ),
        (b"GET /echo HTTP/9.9\r\nhost: a\r\n\r\n", 505, "HTTP_VERSION_UNSUPPORTED", None),
        (b"GET /echo HTTP/0.9\r\nhost: a\r\n\r\n", 505, "HTTP_VERSION_UNSUPPORTED", None),
    ],
    ids=["http10-chunked", "http10-chunked-and-length", "http20", "http99", "http09"],
)
async def test_http10_with_a_transfer_coding_or_another_version_runs_no_route(
    data: bytes, status: int, code: str, field: str | None
) -> None:
    """RFC 9112 section 6.1: ``Transfer-Encoding`` in an HTTP/1.0 message is faulty framing,
    closed after answering; a version this server does not speak is 505.  Both before any route
    runs -- h11 read the chunked body of a 1.0 request and took ``HTTP/2.0`` and ``HTTP/9.9``
    request lines as 1.1, and the call was dispatched (audit 53).  The request behind is never
    served."""
    routes = Routes()
    async with serving(routes) as client:
        with contextlib.suppress(trio.BrokenResourceError):
            await client.send(data + b"GET /second HTTP/1.1\r\nhost: a\r\n\r\n")
        got, headers, body = await client.answer()
        assert await client.closed()
    error = json.loads(body)["api_error"]
    assert (got, error["code"], error.get("field")) == (status, code, field)
    assert headers["connection"] == "close" and routes.paths == []
    assert client.buffer == b"", "answered past the refusal"


BIG_HEAD_OF_HEAD = b"HEAD /x HTTP/1.1\r\nhost: a\r\nx-pad: " + b"p" * MAX_HEAD + b"\r\n\r\n"


HEAD_HEAD = HEAD.replace(b"GET", b"HEAD")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        # refused before its method was noted: the 431 carried a body h11 refused to send
        (BIG_HEAD_OF_HEAD, [("head", 431)]),
        # the next request's refusal was sent as if it answered the HEAD before it
        (HEAD_HEAD + b"NOT HTTP AT ALL\r\n\r\n", [("head", 200), ("body", 400)]),
        (HEAD_HEAD + BIG_HEAD, [("head", 200), ("body", 431)]),
    ],
    ids=["oversized-HEAD", "HEAD-then-garbage", "HEAD-then-oversized-GET"],
)
async def test_a_head_request_never_leaves_its_answer_shape_to_the_next(
    data: bytes, expected: list[tuple[str, int]], caplog: pytest.LogCaptureFixture
) -> None:
    """An answer to HEAD has no body, and h11 refuses one that has: the driver must know which
    request it answers, refusals included.  Before, each of these raised out of the connection
    and ended the whole daemon (an exception out of ``Server.serve`` fails the test here)."""
    caplog.set_level(logging.DEBUG)
    async with serving() as client:
        with contextlib.suppress(trio.BrokenResourceError):
            await client.send(data)
        got = []
        for shape, _ in expected:
            got.append((shape, (await client.answer(head_only=shape == "head"))[0]))
        assert await client.closed()
    assert got == expected
    assert not [r for r in caplog.records if r.exc_info], "a traceback in the log"


async def test_a_fault_of_the_driver_closes_its_connection_not_the_server(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever fails in the driver outside a route (a route's own fault is a 500) closes that
    connection with one log line: ``Server.serve`` returns instead of raising into the
    daemon's nursery, where it would end every other connection and call."""

    async def fault(self: object, exc: object) -> None:
        raise RuntimeError("a fault of the driver")

    monkeypatch.setattr(h11server.Connection, "_refuse", fault)
    peer = Peer(pid=os.getpid(), uid=os.getuid(), gid=os.getgid())
    async with serving() as client:
        await client.send(b"NOT HTTP AT ALL\r\n\r\n")
        assert await client.closed()
        assert client.buffer == b""
    assert [r.getMessage() for r in caplog.records if r.exc_info] == [
        f"the connection of {peer.describe()} failed; it is closed"
    ]


async def test_a_body_over_max_body_is_413_then_closed() -> None:
    head = b"POST /echo HTTP/1.1\r\nhost: a\r\ncontent-length: %d\r\n\r\n" % (2 * MAX_BODY)
    async with serving() as client, trio.open_nursery() as nursery:

        async def send() -> None:  # the rest of the declared body never comes: no need
            with contextlib.suppress(trio.BrokenResourceError):
                await client.send(head + b"x" * (MAX_BODY + 256 * 1024))

        nursery.start_soon(send)
        status, headers, body = await client.answer()
        assert await client.closed()
    assert (status, _api_error(body), headers["connection"]) == (413, "BODY_TOO_LARGE", "close")


async def test_a_body_declared_over_max_body_is_413_before_it_is_read() -> None:
    head = (
        b"POST /echo HTTP/1.1\r\nhost: a\r\nexpect: 100-continue\r\n"
        b"content-length: %d\r\n\r\n" % (MAX_BODY + 1)
    )
    async with serving() as client:
        await client.send(head)  # no byte of the body: none is needed to refuse it
        status, headers, body = await client.answer()  # not a 100 first
        assert await client.closed()
    assert (status, _api_error(body), headers["connection"]) == (413, "BODY_TOO_LARGE", "close")


async def test_the_bodies_held_at_once_are_bounded_and_a_small_one_always_passes() -> None:
    """Each connection may send a body of ``max_body`` bytes, but not all of them at once: the
    bytes every connection's body holds past ``FREE_BODY`` count against ``body_budget`` as
    they arrive, until the request is answered.  One more that would not fit is 503
    ``BODIES_IN_FLIGHT``, its rest unread, closed; a small body passes all the same; once the
    large one is answered, its bytes are free again."""
    budget = 256 * 1024
    server = Server(keep_alive=WAIT, head_wait=WAIT, body_budget=budget)
    post = b"POST /echo HTTP/1.1\r\nhost: a\r\ncontent-length: %d\r\n\r\n"
    first = 300 * 1024
    held = first - FREE_BODY  # 236 KiB: 20 KiB of the budget left
    async with (
        serving(server=server) as a,
        serving(server=server) as b,
        serving(server=server) as c,
    ):
        await a.send(post % (first + 1) + b"a" * first)  # one byte short: a is still reading
        await _until(lambda: server.bodies == held)
        await b.send(post % (200 * 1024) + b"b" * (200 * 1024))
        status, headers, body = await b.answer()
        assert (status, _api_error(body), headers["connection"]) == (
            503,
            "BODIES_IN_FLIGHT",
            "close",
        )
        assert f"{budget} bytes" in json.loads(body)["api_error"]["message"]
        assert headers["retry-after"] == "5"  # as ANSWERS_IN_FLIGHT's (audit 53: none)
        assert await b.closed()
        assert server.bodies == held  # b's bytes were let go at its answer
        await c.send(post % FREE_BODY + b"c" * FREE_BODY)
        status, _, body = await c.answer()
        assert (status, body) == (200, b"c" * FREE_BODY)
        await a.send(b"a")
        status, _, body = await a.answer()
        assert (status, len(body)) == (200, first + 1)
        await _until(lambda: server.bodies == 0)
    async with serving(server=server) as b:  # the budget free again: the same body passes
        await b.send(post % (200 * 1024) + b"b" * (200 * 1024))
        status, _, body = await b.answer()
        assert (status, len(body)) == (200, 200 * 1024)
    assert server.bodies == 0


async def test_a_body_dripped_under_head_wait_is_408_once_body_wait_has_passed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each byte comes before a stall would be noticed (``head_wait``), so only the whole body's
    deadline (``body_wait``, from the end of the head) ends it.  Before, it held the connection
    and its handler for as long as the client liked (MAX_BODY x HEAD_WAIT)."""
    caplog.set_level(logging.DEBUG)
    routes = Routes()
    server = Server(keep_alive=WAIT, head_wait=0.5, body_wait=0.3)
    async with serving(routes, server) as client, trio.open_nursery() as nursery:
        drops = int(2 * WAIT / 0.05)  # beyond the test's own bound on the answer, never all

        async def drip() -> None:
            with contextlib.suppress(trio.BrokenResourceError):
                for _ in range(drops):
                    await client.send(b"x")
                    await trio.sleep(0.05)

        await client.send(
            b"POST /echo HTTP/1.1\r\nhost: a\r\ncontent-length: %d\r\n\r\n" % (2 * drops)
        )
        nursery.start_soon(drip)
        status, headers, body = await client.answer()
        assert await client.closed()
        nursery.cancel_scope.cancel()
    assert (status, _api_error(body), headers["connection"]) == (408, "REQUEST_TIMEOUT", "close")
    assert b"0.3 s after its head" in body
    assert not [r for r in caplog.records if r.exc_info], "a traceback in the log"
    assert [r.levelname for r in caplog.records if "408" in r.getMessage()] == ["INFO"]


async def test_a_body_that_stalls_is_still_408_before_body_wait() -> None:
    server = Server(keep_alive=WAIT, head_wait=0.2, body_wait=WAIT * 3)
    async with serving(server=server) as client:
        await client.send(b"POST /echo HTTP/1.1\r\nhost: a\r\ncontent-length: 10\r\n\r\nabc")
        status, headers, body = await client.answer()
        assert await client.closed()
    assert (status, _api_error(body), headers["connection"]) == (408, "REQUEST_TIMEOUT", "close")
    assert b"stalled" in body


async def test_an_answer_the_client_does_not_read_is_given_up_after_write_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The write is bounded: the link notes it broken (so a call's answer is never recorded
    delivered: link.py) and the connection closes.  Before, ``send_all`` waited for the reader
    forever, holding the connection's tasks (and, for a call, its task in the daemon)."""
    caplog.set_level(logging.DEBUG)
    routes = Routes()
    async with serving(routes, Server(keep_alive=WAIT, write_wait=0.3)) as client:
        await client.send(b"GET /big HTTP/1.1\r\nhost: a\r\n\r\n" + HEAD)  # never served
        with trio.fail_after(WAIT):
            while not routes.broken:
                await trio.sleep(0.02)
        assert await client.closed()  # what the kernel held of it, then the end
    assert routes.broken == [True]
    assert routes.paths == ["/big"]
    assert 0 < len(client.buffer) < Routes.BIG
    assert not [r for r in caplog.records if r.exc_info], "a traceback in the log"
    assert [r.levelname for r in caplog.records if "did not take its answer" in r.getMessage()] == [
        "INFO"
    ]


UPGRADE_BODY = b"POST /echo HTTP/1.1\r\nhost: a\r\nupgrade: websocket\r\nconnection: upgrade\r\n"


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\n\r\n", "CONNECT_REFUSED"),
        (
            b"CONNECT /v1/health HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\n\r\n{}",
            "CONNECT_REFUSED",
        ),
        (
            b"GET /v1/health HTTP/1.1\r\nhost: a\r\nconnection: upgrade\r\n"
            b"upgrade: websocket\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"sec-websocket-version: 13\r\n\r\n",
            "UPGRADE_REFUSED",
        ),
        (
            b"GET /v1/health HTTP/1.1\r\nhost: a\r\nconnection: Upgrade, HTTP2-Settings\r\n"
            b"upgrade: h2c\r\nhttp2-settings: AAMAAABkAAQAAP__\r\n\r\n",
            "UPGRADE_REFUSED",
        ),
        # no interim 100 and no byte of the body waited for: the refusal comes first
        (UPGRADE_BODY + b"expect: 100-continue\r\ncontent-length: 10\r\n\r\n", "UPGRADE_REFUSED"),
    ],
    ids=["CONNECT", "CONNECT-to-a-route", "websocket", "h2c", "upgrade-with-body-unsent"],
)
async def test_connect_and_upgrade_are_refused_before_any_route_then_closed(
    data: bytes, code: str, caplog: pytest.LogCaptureFixture
) -> None:
    """h11 switches protocols once the server accepts (a 2xx to CONNECT, a 101).  Before, a
    CONNECT a route answered 200 left h11 in SWITCHED_PROTOCOL, refusing the answer's body: no
    answer, a traceback; an Upgrade was served as if it were not there."""
    caplog.set_level(logging.DEBUG)
    routes = Routes()
    async with serving(routes) as client:
        await client.send(data + HEAD)  # the request behind it is never served
        status, headers, body = await client.answer()
        assert await client.closed()
    assert (status, _api_error(body), headers["connection"]) == (501, code, "close")
    assert routes.paths == []
    assert client.buffer == b""
    assert not [r for r in caplog.records if r.exc_info], "a traceback in the log"


async def test_connections_over_max_connections_are_503_unread_and_not_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before, every connection was served: a client could open them until the daemon ran out
    of file descriptors (and the calls of every other client with it)."""
    caplog.set_level(logging.DEBUG)
    server = Server(keep_alive=WAIT, head_wait=WAIT, max_connections=2, max_per_uid=2)
    routes = Routes()
    async with serving(routes, server) as one, serving(routes, server) as two:
        # Each busy (an idle one would be evicted to make room instead): served, so counted.
        await one.send(b"GET /one HTTP/1.1\r\n")  # mid-head
        await two.send(b"GET /hold HTTP/1.1\r\nhost: a\r\n\r\n")  # a route running
        await _until(lambda: server.open == 2 and server.idle == 0 and routes.holding.is_set())
        for i in range(3):  # turned away, each closed: none takes a place
            async with serving(routes, server) as over:
                if i != 1:  # answered whether or not it asks anything: nothing is read
                    await over.send(b"GET /over HTTP/1.1\r\nhost: a\r\n\r\n")
                status, headers, body = await over.answer()
                assert await over.closed()
                assert over.buffer == b""
            assert (status, headers["connection"]) == (503, "close")
            assert _api_error(body) == "TOO_MANY_CONNECTIONS"
        assert "/over" not in routes.paths
        assert server.open == 2
        routes.release.set()
        assert (await two.answer())[::2] == (200, b"/hold")
        await one.stream.aclose()  # a place frees up when a served connection closes
        with trio.fail_after(WAIT):
            while server.open > 1:
                await trio.sleep(0.01)
        async with serving(routes, server) as three:
            await three.send(b"GET /three HTTP/1.1\r\nhost: a\r\n\r\n")
            assert (await three.answer())[::2] == (200, b"/three")
    assert "/over" not in routes.paths
    assert not [r for r in caplog.records if r.exc_info], "a traceback in the log"
    turned = [r.levelname for r in caplog.records if "turning new ones away" in r.getMessage()]
    assert turned == ["WARNING"]  # once while the daemon is full, not once per connection


@pytest.mark.parametrize("idle", ["between-requests", "before-its-first"])
async def test_at_max_connections_a_new_one_evicts_the_longest_idle_with_a_clean_close(
    idle: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, idle connections held their places for up to ``keep_alive``: a client holding
    ``max_connections`` silent ones shut everyone else out (operators approving requests too).
    The connection idle the longest now makes room -- closed between requests, so it sees the
    end of the stream, never part of an answer (before its first, a whole 503 first) -- and
    the others are untouched."""
    caplog.set_level(logging.DEBUG)
    server = Server(keep_alive=WAIT, head_wait=WAIT, max_connections=3, max_per_uid=3)
    routes = Routes()
    async with contextlib.AsyncExitStack() as stack:
        idles = []
        for i in range(3):
            client = await stack.enter_async_context(serving(routes, server))
            if idle == "between-requests":
                await client.send(HEAD)
                assert (await client.answer())[::2] == (200, b"/v1/health")
            await _until(lambda n=i + 1: server.idle == n)  # in order: the first idles longest
            idles.append(client)
        new = await stack.enter_async_context(serving(routes, server))
        await new.send(b"GET /new HTTP/1.1\r\nhost: a\r\n\r\n")
        assert (await new.answer())[::2] == (200, b"/new")
        if idle == "before-its-first":  # told it was turned away, as a request crossing reads
            status, headers, body = await idles[0].answer()
            assert (status, headers["connection"]) == (503, "close")
            assert _api_error(body) == "TOO_MANY_CONNECTIONS"
        assert await idles[0].closed()
        assert idles[0].buffer == b""  # nothing else: never part of an answer
        assert server.open == 3
        for client in idles[1:]:  # still served
            await client.send(HEAD)
            assert (await client.answer())[::2] == (200, b"/v1/health")
        # Now ``new`` has idled longest (the others were busy after it): the next evicts it.
        await _until(lambda: server.idle == 3)
        newer = await stack.enter_async_context(serving(routes, server))
        await newer.send(HEAD)
        assert (await newer.answer())[0] == 200
        assert await new.closed()
        assert new.buffer == b""
        assert server.open == 3
    assert not [r for r in caplog.records if r.exc_info], "a traceback in the log"
    evictions = [r.levelname for r in caplog.records if "longest-idle" in r.getMessage()]
    assert evictions == ["INFO"]  # once while the daemon is full, not once per connection
    assert not [r for r in caplog.records if "turning new ones away" in r.getMessage()]


async def test_at_max_connections_busy_ones_are_never_evicted_and_the_next_is_503(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Mid-head, mid-body, a route (a call) running, an answer being written: none is closed to
    make room -- each is already bounded (``HEAD_WAIT``, ``BODY_WAIT``, ``WRITE_WAIT``, the call),
    and a call's hang-up would withdraw it.  With no idle one, a new connection is refused."""
    caplog.set_level(logging.DEBUG)
    server = Server(
        keep_alive=WAIT, head_wait=WAIT, body_wait=WAIT, max_connections=5, max_per_uid=5
    )
    routes = Routes()
    async with contextlib.AsyncExitStack() as stack:
        head, body, hold, big, idle = [
            await stack.enter_async_context(serving(routes, server)) for _ in range(5)
        ]
        await head.send(b"GET /head HTTP/1.1\r\n")
        await body.send(b"POST /echo HTTP/1.1\r\nhost: a\r\ncontent-length: 6\r\n\r\nabc")
        await hold.send(b"GET /hold HTTP/1.1\r\nhost: a\r\n\r\n")
        await big.send(b"GET /big HTTP/1.1\r\nhost: a\r\n\r\n")  # not read for now
        await _until(lambda: server.open == 5 and server.idle == 1 and routes.holding.is_set())
        # The one idle connection makes room once ...
        new = await stack.enter_async_context(serving(routes, server))
        await _until(lambda: server.idle == 1)  # ``new`` idles in its place
        assert await idle.closed()
        # ... then a request sent, even one the daemon has not read yet, makes ``new`` busy too.
        await new.send(b"GET /new HTTP/1.1\r\n")
        for _ in range(2):
            async with serving(routes, server) as over:
                status, headers, answer = await over.answer()
                assert await over.closed()
            assert (status, headers["connection"]) == (503, "close")
            assert _api_error(answer) == "TOO_MANY_CONNECTIONS"
        assert server.open == 5
        await head.send(b"host: a\r\n\r\n")
        assert (await head.answer())[::2] == (200, b"/head")
        await body.send(b"def")
        assert (await body.answer())[::2] == (200, b"abcdef")
        assert routes.hang_ups == []  # the running route never saw a hang-up
        routes.release.set()
        assert (await hold.answer())[::2] == (200, b"/hold")
        status, _, answer = await big.answer()
        assert (status, len(answer)) == (200, Routes.BIG)
        await new.send(b"host: a\r\n\r\n")
        assert (await new.answer())[::2] == (200, b"/new")
    assert routes.broken == [False]
    assert not [r for r in caplog.records if r.exc_info], "a traceback in the log"


async def test_a_spell_at_the_cap_logs_once_until_half_the_places_are_free(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client reconnecting as fast as its connections close keeps the daemon at its cap: the
    warning is logged once for the spell, not again each time a place frees and is taken."""
    caplog.set_level(logging.DEBUG)
    server = Server(keep_alive=WAIT, head_wait=WAIT, max_connections=4, max_per_uid=4)
    routes = Routes()

    async def refused() -> None:
        async with serving(routes, server) as over:
            assert (await over.answer())[0] == 503
            assert await over.closed()

    def warnings() -> int:
        return sum("turning new ones away" in r.getMessage() for r in caplog.records)

    async with contextlib.AsyncExitStack() as stack:
        busy = []
        for _ in range(4):
            client = await stack.enter_async_context(serving(routes, server))
            await client.send(b"GET /busy HTTP/1.1\r\n")  # half a head: busy
            busy.append(client)
        await _until(lambda: server.open == 4 and server.idle == 0)
        await refused()
        for _ in range(3):  # a place frees, is taken at once, and the next is refused again
            await busy.pop(0).send(b"host: a\r\nconnection: close\r\n\r\n")
            await _until(lambda: server.open == 3)
            client = await stack.enter_async_context(serving(routes, server))
            await client.send(b"GET /busy HTTP/1.1\r\n")
            busy.append(client)
            await _until(lambda: server.open == 4 and server.idle == 0)
            await refused()
        assert warnings() == 1
        for client in busy[:3]:  # half the places free: the spell is over
            await client.send(b"host: a\r\nconnection: close\r\n\r\n")
        await _until(lambda: server.open == 1)
        for _ in range(3):
            client = await stack.enter_async_context(serving(routes, server))
            await client.send(b"GET /busy HTTP/1.1\r\n")
        await _until(lambda: server.open == 4 and server.idle == 0)
        await refused()
        assert warnings() == 2
    assert not [r for r in caplog.records if r.exc_info], "a traceback in the log"


async def test_one_uid_holds_at_most_its_share_and_the_others_keep_theirs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An agent's uid that keeps every connection it may busy (half a head each) -- which
    eviction never closes -- could otherwise fill the daemon and shut out the operators
    approving its requests.  Past ``max_per_uid`` its new connections replace its own idle
    ones or are refused; another uid's connections are neither refused nor evicted for it."""
    caplog.set_level(logging.DEBUG)
    agent, operator = os.getuid() + 1000, os.getuid() + 2000
    server = Server(keep_alive=WAIT, head_wait=WAIT, max_connections=4, max_per_uid=2)
    routes = Routes()
    async with contextlib.AsyncExitStack() as stack:
        ops = [await stack.enter_async_context(serving(routes, server, operator))]
        await _until(lambda: server.idle == 1)  # the operator's idles the longest
        busy = await stack.enter_async_context(serving(routes, server, agent))
        await busy.send(b"GET /busy HTTP/1.1\r\n")  # half a head: never evicted
        idle = await stack.enter_async_context(serving(routes, server, agent))
        await _until(lambda: server.open == 3 and server.idle == 2)
        # The agent's third: at its share, it takes the place of the agent's own idle one --
        # not of the operator's, idle longer.
        third = await stack.enter_async_context(serving(routes, server, agent))
        await third.send(b"GET /third HTTP/1.1\r\nhost: a\r\n\r\n")
        assert (await third.answer())[::2] == (200, b"/third")
        assert await idle.closed()
        await third.send(b"GET /again HTTP/1.1\r\n")  # busy too now
        # Another: both of the agent's busy, it is refused -- though the daemon has room.
        async with serving(routes, server, agent) as over:
            status, _, answer = await over.answer()
            assert await over.closed()
        assert (status, _api_error(answer)) == (503, "TOO_MANY_CONNECTIONS")
        assert server.open == 3
        # The operator's first is still served, and a second one gets the last place.
        ops.append(await stack.enter_async_context(serving(routes, server, operator)))
        for client in ops:
            await client.send(HEAD)
            assert (await client.answer())[::2] == (200, b"/v1/health")
        assert server.open == 4
        await busy.send(b"host: a\r\n\r\n")
        assert (await busy.answer())[::2] == (200, b"/busy")
    assert not [r for r in caplog.records if r.exc_info], "a traceback in the log"
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"for uid {agent}" in m and "turning new ones away" in m for m in messages)
    assert not any(f"for uid {operator}" in m for m in messages)


async def test_peers_not_reserved_hold_half_and_an_operator_evicts_their_idle_ones_first(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two agents' uids each within their share once filled the socket between them, busy,
    and every operator's connection was 503.  With a reserve the peers not ``reserved`` hold
    at most ``max_others`` together -- past that, theirs replace their own longest-idle or are
    refused, never an operator's -- and an operator's connection at the cap takes the place of
    an idle one of theirs before an operator's idle longer; a busy one is never closed."""
    caplog.set_level(logging.DEBUG)
    agent, other_agent, operator = (os.getuid() + n for n in (1000, 1001, 2000))
    server = Server(
        keep_alive=WAIT,
        head_wait=WAIT,
        max_connections=4,
        max_per_uid=3,
        reserved=lambda peer: peer.uid == operator,
        max_per_other=2,  # one agent may hold the agents' whole share: their joint one is seen
    )
    assert server.max_others == 2
    routes = Routes()
    async with contextlib.AsyncExitStack() as stack:
        op_idle = await stack.enter_async_context(serving(routes, server, operator))
        await _until(lambda: server.idle == 1)  # the operator's idles the longest
        agent_idle = await stack.enter_async_context(serving(routes, server, agent))
        await _until(lambda: server.idle == 2)
        agent_busy = await stack.enter_async_context(serving(routes, server, agent))
        await agent_busy.send(b"GET /busy HTTP/1.1\r\n")  # half a head: never evicted
        await _until(lambda: (server.open, server.others, server.idle) == (3, 2, 2))
        # The other agent, within its own share but past theirs together: it takes the place
        # of the agents' idle one (not of the operator's, idle longer) ...
        other = await stack.enter_async_context(serving(routes, server, other_agent))
        await other.send(b"GET /other HTTP/1.1\r\n")
        assert await agent_idle.closed()
        await _until(lambda: (server.open, server.others, server.idle) == (3, 2, 1))
        # ... and, theirs all busy, the next of theirs is refused though the daemon has room.
        async with serving(routes, server, other_agent) as over:
            status, _, answer = await over.answer()
            assert await over.closed()
        assert (status, _api_error(answer)) == (503, "TOO_MANY_CONNECTIONS")
        assert (server.open, server.others) == (3, 2)
        # An operator's is served in the place left; at the cap, the next operator's takes the
        # place of the operator's idle one, the agents' being busy.
        ops = [await stack.enter_async_context(serving(routes, server, operator))]
        await _until(lambda: server.open == 4)
        await other.send(b"host: a\r\n\r\n")
        assert (await other.answer())[::2] == (200, b"/other")
        await _until(lambda: server.idle == 3)  # op_idle, ops[0], then other: in that order
        # Now an agent's is idle too, but the operator's idle longer: an operator's new one
        # takes the agent's place first.
        ops.append(await stack.enter_async_context(serving(routes, server, operator)))
        await ops[-1].send(HEAD)
        assert (await ops[-1].answer())[::2] == (200, b"/v1/health")
        assert await other.closed()
        assert (server.open, server.others) == (4, 1)
        for client in (op_idle, *ops):  # every operator's still served
            await client.send(HEAD)
            assert (await client.answer())[::2] == (200, b"/v1/health")
        await agent_busy.send(b"host: a\r\n\r\n")
        assert (await agent_busy.answer())[::2] == (200, b"/busy")
    assert not [r for r in caplog.records if r.exc_info], "a traceback in the log"
    messages = [r.getMessage() for r in caplog.records]
    assert (
        sum("who are not operators hold 2 connections" in m and "503" in m for m in messages) == 1
    )
    assert server.open == 0 and server.others == 0


async def test_a_refused_peer_is_answered_at_once_and_logged_once_per_spell(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``Server.refuse``: the answer before a byte is read, no place taken (the daemon full
    and busy here), and one warning for a spell of refusals however many there are -- then,
    once ``refused_quiet`` has passed without one, their count, and a new spell's warning."""
    caplog.set_level(logging.DEBUG)
    # One spell's refusals must come within refused_quiet of each other: 1 s, which a loaded
    # machine's three refusals in a row keep to (0.2 s, they need not).
    server = Server(keep_alive=WAIT, head_wait=WAIT, max_connections=1, refused_quiet=1.0)
    routes = Routes()
    stranger = Peer(pid=os.getpid(), uid=os.getuid() + 3000, gid=os.getgid())

    async def refused() -> bytes:
        a, b = trio.socket.socketpair()
        client = Client(trio.SocketStream(b))
        async with trio.open_nursery() as nursery:
            link = Link(trio.SocketStream(a))
            nursery.start_soon(server.refuse, link, stranger, b"HTTP/1.1 403 x\r\n\r\n")
            assert await client.closed()  # the daemon's side is shut after its answer ...
            assert (server.open, server.idle) == (1, 0)
            await client.stream.aclose()  # ... and it lingers until the client closes
        return bytes(client.buffer)

    def said(text: str) -> list[str]:
        return [r.levelname for r in caplog.records if text in r.getMessage()]

    async with serving(routes, server) as busy:
        await busy.send(b"GET /busy HTTP/1.1\r\n")
        await _until(lambda: server.open == 1 and server.idle == 0)
        for _ in range(3):
            assert await refused() == b"HTTP/1.1 403 x\r\n\r\n"
        assert said(f"refused peer uid={stranger.uid} ") == ["WARNING"]
        await trio.sleep(1.1)  # the spell is over
        await refused()
        assert said("3 connections were answered 403") == ["INFO"]
        assert said(f"refused peer uid={stranger.uid} ") == ["WARNING", "WARNING"]
        server.close()  # a spell of one: nothing to count
        assert not said("1 connections were answered")
        await busy.send(b"host: a\r\n\r\n")
        assert (await busy.answer())[::2] == (200, b"/busy")


async def test_lingering_after_a_refusal_is_bounded_like_the_refusals() -> None:
    """A refused client that never closes holds its lingering close, but no more of them than
    refusals may be written at once (``max_connections``): the next refused connection is
    answered and closed at once -- a peer cannot keep descriptors open by opening more."""
    server = Server(keep_alive=WAIT, head_wait=WAIT, max_connections=1, refused_quiet=0.2)
    stranger = Peer(pid=os.getpid(), uid=os.getuid() + 3000, gid=os.getgid())
    answer = b"HTTP/1.1 403 x\r\n\r\n"
    async with trio.open_nursery() as nursery:
        a1, b1 = trio.socket.socketpair()
        first = Client(trio.SocketStream(b1))
        nursery.start_soon(server.refuse, Link(trio.SocketStream(a1)), stranger, answer)
        assert await first.closed()  # answered, and lingering: it never closes its end
        a2, b2 = trio.socket.socketpair()
        second = Client(trio.SocketStream(b2))
        with trio.fail_after(WAIT):
            await server.refuse(Link(trio.SocketStream(a2)), stranger, answer)
        assert await second.closed()
        assert bytes(second.buffer) == answer
        with pytest.raises(trio.BrokenResourceError):  # closed at once: nothing reads it
            await second.stream.send_all(b"x")
        await first.stream.send_all(b"the rest of a request")  # still read, and discarded
        await first.stream.aclose()
        await second.stream.aclose()


async def test_a_client_refused_at_max_connections_reads_its_503_never_answer_lost() -> None:
    """The daemon answers a connection over the cap before reading a byte and closes it, so a
    client sending a large body meets a broken pipe mid-send.  Before, the async ``Client``, the
    one-shot ``blocking_request`` and ``affidavit call --socket`` (which uses it) each said
    ``AnswerLost`` -- "the call may have run" -- of a call that never did."""
    server = Server(keep_alive=WAIT, head_wait=WAIT, max_connections=1, max_per_uid=1)
    routes = Routes()
    action = {"target": "api", "pad": "x" * (8 << 20)}  # far over a Unix socket's buffers
    body = json.dumps(action).encode()
    peer = Peer(pid=os.getpid(), uid=os.getuid(), gid=os.getgid())
    with tempfile.TemporaryDirectory(prefix="affidavit-cap-") as where:
        path = os.path.join(where, "s")
        listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await listener.bind(path)
        listener.listen()
        async with serving(routes, server) as busy, trio.open_nursery() as nursery:

            async def accept() -> None:
                while True:
                    sock, _ = await listener.accept()
                    nursery.start_soon(server.serve, Link(trio.SocketStream(sock)), peer, routes)

            await busy.send(b"GET /busy HTTP/1.1\r\n")  # mid-head: never evicted
            await _until(lambda: server.open == 1 and server.idle == 0)
            nursery.start_soon(accept)
            async with api_client.Client.open(path) as client:
                with pytest.raises(ApiError) as info:
                    await client.call(action)
            answer = await trio.to_thread.run_sync(
                blocking_request, path, "POST", "/v1/calls", body
            )
            done = await run(
                [PYTHON, "-m", "affidavit", "call", "-", "--socket", path],
                stdin=body,
                env=client_env(),
            )
            nursery.cancel_scope.cancel()
        listener.close()
    assert (info.value.status, info.value.code) == (503, "TOO_MANY_CONNECTIONS")
    assert (answer.error().status, answer.error().code) == (503, "TOO_MANY_CONNECTIONS")
    assert done.returncode == 2, done.stderr
    assert b"too many open connections" in done.stderr
    assert routes.paths == []


async def test_a_chunked_body_is_read_whole() -> None:
    async with serving() as client:
        await client.send(b"POST /echo HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n")
        await client.send(b"5\r\nhello\r\n")
        await client.send(b"6\r\n world\r\n0\r\n\r\n")
        assert (await client.answer())[::2] == (200, b"hello world")
        await client.send(HEAD)  # and the connection is ready for the next request
        assert (await client.answer())[::2] == (200, b"/v1/health")


async def test_expect_100_continue_is_answered_before_the_body_is_read() -> None:
    async with serving() as client:
        await client.send(
            b"POST /echo HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\nexpect: 100-continue\r\n\r\n"
        )
        assert (await client.answer())[0] == 100  # the body is not sent before it
        await client.send(b"{}")
        assert (await client.answer())[::2] == (200, b"{}")


async def test_an_idle_keep_alive_connection_is_closed_after_keep_alive() -> None:
    async with serving(server=Server(keep_alive=0.2)) as client:
        await client.send(HEAD)
        assert (await client.answer())[::2] == (200, b"/v1/health")
        assert await client.closed()
        assert client.buffer == b""


async def test_a_client_that_stalls_mid_head_is_closed() -> None:
    async with serving() as client:
        await client.send(b"GET /v1/health HTTP/1.1\r\nhost: aff")
        assert await client.closed()
        assert client.buffer == b""


async def test_a_next_head_begun_behind_an_answered_request_gets_head_wait_not_keep_alive() -> None:
    """The first bytes of a next request that came in one read with the last one are in h11's
    buffer, not the inbox: the connection is not idle, and a stall there is closed after
    head_wait.  Before, it waited keep_alive (300 s in the daemon) -- and counted as idle at
    shutdown."""
    async with serving(server=Server(keep_alive=WAIT * 3, head_wait=0.2)) as client:
        await client.send(HEAD + b"GET /v1/health HTTP/1.1\r\nhost: aff")
        assert (await client.answer())[::2] == (200, b"/v1/health")
        assert await client.closed()  # within WAIT: keep_alive would have been 3 x WAIT
        assert client.buffer == b""


@pytest.mark.parametrize(
    "data",
    [
        b"GET /a HTTP/1.0\r\n\r\n",
        b"GET /a HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
    ],
    ids=["http-1.0", "connection-close"],
)
async def test_http_1_0_and_connection_close_end_the_connection_after_the_answer(
    data: bytes,
) -> None:
    async with serving() as client:
        await client.send(data + HEAD)  # the second request is never served
        status, headers, body = await client.answer()
        assert await client.closed()
    assert (status, body, headers["connection"].lower()) == (200, b"/a", "close")
    assert client.buffer == b""


async def test_a_request_pipelined_behind_a_running_one_is_served_after_its_answer() -> None:
    routes = Routes()
    async with serving(routes) as client:
        await client.send(b"GET /hold HTTP/1.1\r\nhost: a\r\n\r\n")
        with trio.fail_after(WAIT):
            await routes.holding.wait()
        await client.send(b"GET /next HTTP/1.1\r\nhost: a\r\n\r\n")  # read while /hold runs
        await trio.testing.wait_all_tasks_blocked()
        routes.release.set()
        assert (await client.answer())[::2] == (200, b"/hold")
        assert (await client.answer())[::2] == (200, b"/next")
        assert routes.hang_ups == []


async def test_a_hang_up_is_seen_while_a_request_is_handled() -> None:
    """What withdraws a call not yet at its dispatch gate (``Link.on_hang_up``, app.py)."""
    routes = Routes()
    async with serving(routes) as client:
        await client.send(b"GET /hold HTTP/1.1\r\nhost: a\r\n\r\n")
        with trio.fail_after(WAIT):
            await routes.holding.wait()
        await client.stream.aclose()
        with trio.fail_after(WAIT):
            while not routes.hang_ups:
                await trio.sleep(0.01)
        routes.release.set()
    assert routes.hang_ups == ["/hold"]


async def test_shutdown_closes_idle_connections_at_once_and_busy_ones_after_their_answer() -> None:
    server = Server(keep_alive=WAIT, head_wait=WAIT)
    routes = Routes()
    async with serving(routes, server) as idle, serving(routes, server) as busy:
        await idle.send(HEAD)
        assert (await idle.answer())[0] == 200
        await busy.send(b"GET /hold HTTP/1.1\r\nhost: a\r\n\r\n")
        with trio.fail_after(WAIT):
            await routes.holding.wait()
        server.close()
        assert await idle.closed()
        routes.release.set()
        status, headers, body = await busy.answer()
        assert await busy.closed()
    assert (status, body, headers["connection"]) == (200, b"/hold", "close")


async def test_a_refused_peer_gets_403_and_its_connection_closes(
    tmp_path: Path, token: str
) -> None:
    others = {"allow_uids": [os.geteuid() + 12345]}
    async with running_daemon(
        tmp_path, api_target("http://127.0.0.1:9"), token=token, service=others
    ) as daemon:
        stream = await trio.open_unix_socket(str(daemon.socket))
        try:
            client = Client(stream)
            # The refusal is written on accept, before a byte is read: the daemon may have
            # closed its end before these bytes go (EPIPE), and its answer is still there.
            with contextlib.suppress(trio.BrokenResourceError):
                await client.send(HEAD + HEAD)  # neither is answered
            status, headers, body = await client.answer()
            assert await client.closed()
        finally:
            await stream.aclose()
    assert (status, _api_error(body), headers["connection"]) == (403, "PEER_REFUSED", "close")
    assert client.buffer == b""


@pytest.mark.parametrize("encoding", [b"gzip", b"deflate, gzip", b"br", b" GZIP "])
async def test_an_encoded_request_body_is_refused_before_any_route_then_closed(
    encoding: bytes,
) -> None:
    """A body under ``Content-Encoding`` was handed to the route as the plain bytes it is not
    (an action read from compressed bytes).  Now: 415, no route, closed; ``identity`` (no
    encoding at all) is served."""
    routes = Routes()
    body = b'{"x": 1}'
    async with serving(routes) as client:
        await client.send(
            b"POST /echo HTTP/1.1\r\nhost: a\r\ncontent-encoding: %s\r\n"
            b"content-length: %d\r\n\r\n%s" % (encoding, len(body), body)
        )
        status, headers, answer = await client.answer()
        assert await client.closed()
    assert (status, _api_error(answer), headers["connection"]) == (
        415,
        "CONTENT_ENCODING_REFUSED",
        "close",
    )
    assert routes.paths == []
    async with serving(routes) as client:
        await client.send(
            b"POST /echo HTTP/1.1\r\nhost: a\r\ncontent-encoding: identity\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        status, _, _ = await client.answer()
    assert status == 200 and routes.paths == ["/echo"]
