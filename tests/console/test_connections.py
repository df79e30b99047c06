"""The console listener's own limits (``admission.ConsoleCap``, ``server.CONSOLE_HEAD_WAIT``).

Its loopback port is open to every local uid, not only the socket's allowed peers: without a
cap one of them could open connections until the daemon has no descriptor left for its journal
or its agents' socket.  Over the cap a new connection is answered 503 unread and closed at once;
one that has not sent a whole request head within the head wait is closed.  The daemon runs in
this process (``Daemon.run``, as ``affidavit serve`` runs it) so that the cap and the wait can
be made small; every connection here is a real TCP one on loopback.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.client import Client
from affidavit.config import load_config
from affidavit.console import request as console_request
from affidavit.daemon import server as daemon_server
from affidavit.daemon.admission import ConsoleCap, _console_owner
from affidavit.daemon.server import Daemon
from tests.broker.helpers import TOKEN_ENV
from tests.daemon.kit import (
    WAIT,
    api_target,
    as_user,
    client_env,
    run,
    wait_until,
    write_daemon_config,
)
from tests.external import on_free_port_async, require_root

from .kit import get, post, refusal

CAP = 4
EXTRA = 3
NOBODY = 65534
PROMPTLY = 2.0
"""How soon a connection over the cap must have its 503 and its end."""
FULL = "turning new ones away"
ROOM = "the console has room again"


@contextlib.asynccontextmanager
async def daemon_with_console(
    tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    head_wait: float = 60.0,
    per_uid: int = CAP,
    operators: list[int] | None = None,
    owner: Callable[[trio.SocketStream], Awaitable[int | None]] | None = None,
    service: dict[str, Any] | None = None,
) -> AsyncIterator[tuple[Daemon, ConsoleCap, int]]:
    """A daemon in this process whose console (on a free loopback port) serves at most ``CAP``
    connections, ``per_uid`` of one local uid, and waits ``head_wait`` for a head: (it, its
    console's cap, the port).  ``operators``: its ``operator_uids``; ``owner``: who the cap
    takes a connection's uid to be (the kernel's socket table by default)."""
    limits: dict[str, Any] = {"max_connections": CAP, "max_per_uid": per_uid}
    if owner is not None:
        limits["owner"] = owner
    monkeypatch.setattr(daemon_server, "ConsoleCap", functools.partial(ConsoleCap, **limits))
    monkeypatch.setattr(daemon_server, "CONSOLE_HEAD_WAIT", head_wait)
    socket = tmp / "affidavit.sock"
    # No remote is ever called: the target only makes the config whole.
    settings = dict(service or {})
    if operators:
        settings["operator_uids"] = operators
    config = load_config(
        write_daemon_config(tmp, api_target("http://127.0.0.1:9"), socket=socket, service=settings)
    )
    async with trio.open_nursery() as nursery:

        async def daemon_on(port: int) -> Daemon:
            daemon = Daemon(config, console=("127.0.0.1", port))
            await nursery.start(daemon.run)
            return daemon

        daemon, port = await on_free_port_async(daemon_on)  # a free port is only free when asked
        assert daemon.console_cap is not None
        try:
            yield daemon, daemon.console_cap, port
        finally:
            daemon.shutdown.set()


async def to_the_end(stream: trio.SocketStream, within: float = PROMPTLY) -> bytes:
    """Everything the daemon sends until it closes the connection (at most ``within`` s)."""
    data = b""
    with trio.fail_after(within):
        while chunk := await stream.receive_some(1 << 16):
            data += chunk
    return data


async def health(daemon: Daemon) -> dict[str, object]:
    """``GET /v1/health`` through the agents' Unix socket."""
    with trio.fail_after(WAIT):
        async with Client.open(daemon.socket_path) as client:
            return await client.health()


async def test_console_connections_over_the_cap_are_turned_away_and_the_socket_still_answers(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``CAP`` idle connections fill the console; ``EXTRA`` more are each answered 503 and
    closed at once, never counted; the agents' socket answers meanwhile; one warning for the
    spell; once one idle connection goes a real console request is served again."""
    monkeypatch.setenv(TOKEN_ENV, token)
    caplog.set_level(logging.INFO, logger="affidavit.daemon")
    async with daemon_with_console(tmp_path, monkeypatch) as (daemon, cap, port):
        status, _, page = await get(f"http://127.0.0.1:{port}/login")
        assert status == 200 and page.rstrip().endswith(b"</html>")  # under the cap: served
        await wait_until(lambda: cap.open == 0, "that connection is closed")
        held = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(CAP)]
        await wait_until(lambda: cap.open == CAP, "the idle connections are being served")

        for _ in range(EXTRA):
            extra = await trio.open_tcp_stream("127.0.0.1", port)
            answer = await to_the_end(extra)
            await extra.aclose()
            assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
            assert b"connection: close" in answer and b"too many open connections" in answer
        assert (cap.open, cap.turned_away) == (CAP, EXTRA)
        assert (await health(daemon))["ok"] is True  # the agents' socket: not affected
        status, _, _ = await get(f"http://127.0.0.1:{port}/login")
        assert status == 503  # a browser, too, while the console is full

        await held.pop().aclose()
        await wait_until(lambda: cap.open == CAP - 1, "a place is free")
        status, _, page = await get(f"http://127.0.0.1:{port}/login")
        assert status == 200 and page.rstrip().endswith(b"</html>")
        for stream in held:  # idle all along: still open, nothing sent to them
            with trio.move_on_after(0.05):
                assert await stream.receive_some(1) != b""
            await stream.aclose()
        await wait_until(lambda: cap.open == 0, "every connection is closed")
        assert (await health(daemon))["ok"] is True
    warnings = [r.getMessage() for r in caplog.records if FULL in r.getMessage()]
    assert len(warnings) == 1, warnings  # once per spell, not per connection
    room = [r.getMessage() for r in caplog.records if ROOM in r.getMessage()]
    assert len(room) == 1 and f"{EXTRA + 1} were turned away" in room[0], room


_OTHER_UID_GETS = r"""
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
s.sendall(b"GET /login HTTP/1.1\r\nHost: 127.0.0.1:" + sys.argv[1].encode() + b"\r\n\r\n")
print(s.recv(64).split(b"\r\n")[0].decode())
"""


async def test_one_local_uid_holds_at_most_its_share_of_the_console(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Any local uid can reach the console's port.  One reopening connections as fast as the
    head wait closes them kept every place, and the operators out; now it holds at most its
    share (its uid read from the kernel's socket table), and another uid is still served."""
    require_root()
    monkeypatch.setenv(TOKEN_ENV, token)
    caplog.set_level(logging.INFO, logger="affidavit.daemon")
    async with daemon_with_console(tmp_path, monkeypatch, per_uid=2) as (_, cap, port):
        held = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]
        await wait_until(lambda: cap.open == 2, "this uid's two are being served")
        extra = await trio.open_tcp_stream("127.0.0.1", port)
        answer = await to_the_end(extra)
        await extra.aclose()
        assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
        assert cap.open == 2 < CAP  # refused with places free: its share is full
        other = await run(as_user(NOBODY, "-c", _OTHER_UID_GETS, str(port)), env=client_env())
        assert other.returncode == 0, other.stderr
        assert other.stdout.decode().startswith("HTTP/1.1 200"), other.stdout
        for stream in held:
            await stream.aclose()
        await wait_until(lambda: cap.open == 0, "every connection is closed")
        status, _, _ = await get(f"http://127.0.0.1:{port}/login")
        assert status == 200  # its share is free again
    said = [r.getMessage() for r in caplog.records]
    assert sum(f"uid {os.getuid()} holds 2 console connections" in m for m in said) == 1, said
    assert any(f"uid {os.getuid()} has room again" in m for m in said), said
    assert not any(f"uid {NOBODY}" in m for m in said), said


async def test_a_console_connection_without_a_whole_head_within_the_head_wait_is_closed(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Silent, half a head, the first line of the HTTP/2 preface (``_H11Only`` sees no request
    to refuse yet), or idle after an answer: each is closed once ``CONSOLE_HEAD_WAIT`` passes,
    and its place is free again; a whole request is still answered."""
    monkeypatch.setenv(TOKEN_ENV, token)
    head_wait = 0.5
    async with daemon_with_console(tmp_path, monkeypatch, head_wait=head_wait) as (_, cap, port):
        silent = await trio.open_tcp_stream("127.0.0.1", port)
        half = await trio.open_tcp_stream("127.0.0.1", port)
        await half.send_all(b"GET /login HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % port)
        preface = await trio.open_tcp_stream("127.0.0.1", port)
        await preface.send_all(b"PRI * HTTP/2.0\r\n")
        served = await trio.open_tcp_stream("127.0.0.1", port)
        await served.send_all(b"GET /login HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % port)
        await wait_until(lambda: cap.open == 4, "the four are being served")
        start = trio.current_time()
        assert await to_the_end(silent, head_wait + PROMPTLY) == b""
        assert await to_the_end(half, head_wait + PROMPTLY) == b""
        assert await to_the_end(preface, head_wait + PROMPTLY) == b""
        answer = await to_the_end(served, head_wait + PROMPTLY)  # answered, then idle: closed
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
        assert trio.current_time() - start >= head_wait * 0.8
        for stream in (silent, half, preface, served):
            await stream.aclose()
        await wait_until(lambda: cap.open == 0, "their places are free")


async def test_a_console_form_whose_body_does_not_arrive_within_form_wait_is_408_and_closed(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head of a POST, then part of its body and nothing more (a login form, which needs
    no session): answered 408 once ``FORM_WAIT`` passes, and closed -- its place is not held
    until the daemon stops."""
    monkeypatch.setenv(TOKEN_ENV, token)
    form_wait = 0.5
    monkeypatch.setattr(console_request, "FORM_WAIT", form_wait)
    async with daemon_with_console(tmp_path, monkeypatch) as (_, cap, port):
        stalled = await trio.open_tcp_stream("127.0.0.1", port)
        origin = b"http://127.0.0.1:%d" % port
        await stalled.send_all(
            b"POST /login HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nOrigin: %s\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\n"
            b"token=abc" % (port, origin)
        )
        await wait_until(lambda: cap.open == 1, "the connection is being served")
        start = trio.current_time()
        answer = await to_the_end(stalled, form_wait + PROMPTLY)
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert b"did not arrive within 0.5 s" in answer
        assert refusal(answer) == ("FORM_TIMEOUT", None)
        assert trio.current_time() - start >= form_wait * 0.8
        await stalled.aclose()
        await wait_until(lambda: cap.open == 0, "its place is free")


async def test_a_console_form_cut_off_mid_body_is_refused_and_not_acted_on(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head of a login POST, a valid token as part of its body, then the client's end of
    the connection: answered 400 (hypercorn's own, bare: the body broke HTTP/1.1 framing, so
    the console's BAD_REQUEST page never goes out), no session, and the token is not used up --
    the part that came is never read as the form."""
    from affidavit.approvals import Operator

    monkeypatch.setenv(TOKEN_ENV, token)
    operators = [os.geteuid()]
    async with daemon_with_console(tmp_path, monkeypatch, operators=operators) as (d, cap, port):
        assert d.console is not None
        login, _ = d.console.tokens.mint(Operator.current())
        origin = f"http://127.0.0.1:{port}"
        cut = await trio.open_tcp_stream("127.0.0.1", port)
        await cut.send_all(
            b"POST /login HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nOrigin: %s\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 200\r\n\r\n"
            b"token=%s" % (port, origin.encode(), login.encode())
        )
        await trio.sleep(0.3)  # (the console may be reading the form by now, or not: either way)
        await cut.send_eof()  # no more of it will come
        answer = await to_the_end(cut)
        await cut.aclose()
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
        assert b"set-cookie" not in answer.lower()
        await wait_until(lambda: cap.open == 0, "its place is free")
        status, headers, _ = await post(f"{origin}/login", {"token": login}, {"Origin": origin})
        assert status == 200 and "set-cookie" in headers  # the link still works, once


class _Strangers:
    """Connections that stand for other local uids, told by their local port (so that one
    test process can be several users); any other connection's owner is the kernel's."""

    def __init__(self) -> None:
        self.uids: dict[int, int] = {}

    async def owner(self, stream: trio.SocketStream) -> int | None:
        port = stream.socket.getpeername()[1]
        return self.uids[port] if port in self.uids else await _console_owner(stream)

    async def connect(self, port: int, uid: int) -> trio.SocketStream:
        sock = trio.socket.socket()
        await sock.bind(("127.0.0.1", 0))
        self.uids[sock.getsockname()[1]] = uid  # known before the console can ask
        await sock.connect(("127.0.0.1", port))
        return trio.SocketStream(sock)


async def test_users_who_are_not_operators_hold_at_most_half_the_console_together(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each local uid holds at most its share; two users who are not operators, each within
    theirs, once filled the console together and kept its operators out.  Now they hold at
    most half the places together; an operator's connection is still served past them.  (Which
    uid owns a connection is told by its local port here, so that one test process can be two
    other users; the kernel's answer is ``test_one_local_uid_holds...``'s.)"""
    monkeypatch.setenv(TOKEN_ENV, token)
    caplog.set_level(logging.INFO, logger="affidavit.daemon")
    strangers = _Strangers()
    operators = [os.getuid()]
    async with daemon_with_console(
        tmp_path, monkeypatch, per_uid=2, operators=operators, owner=strangers.owner
    ) as (_, cap, port):
        as_stranger = functools.partial(strangers.connect, port)
        assert cap.max_others == CAP // 2
        held = [await as_stranger(NOBODY), await as_stranger(NOBODY - 1)]
        await wait_until(lambda: cap.open == 2, "one connection of each stranger is served")
        extra = await as_stranger(NOBODY - 1)  # within its own share, past theirs together
        answer = await to_the_end(extra)
        await extra.aclose()
        assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
        assert (cap.open, cap.others) == (2, 2)
        mine = await trio.open_tcp_stream("127.0.0.1", port)  # an operator's: served
        await mine.send_all(b"GET /login HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % port)
        with trio.fail_after(PROMPTLY):
            first = await mine.receive_some(64)
        assert first.startswith(b"HTTP/1.1 200 "), first
        assert (cap.open, cap.others) == (3, 2)
        for stream in (*held, mine):
            await stream.aclose()
        await wait_until(lambda: cap.open == 0, "every connection is closed")
        again = await as_stranger(NOBODY - 1)
        await wait_until(lambda: cap.others == 1, "a stranger is served again")
        await again.aclose()
        await wait_until(lambda: cap.open == 0, "closed")
    said = [r.getMessage() for r in caplog.records]
    full = [m for m in said if "who are not operators hold 2 console connections" in m]
    assert len(full) == 1, said
    assert any("who are not operators have room again" in m for m in said), said


async def test_without_operators_the_console_keeps_no_places_for_them(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``operator_uids`` / ``operator_gids``: nobody can log in, and every uid is held to
    its own share alone (CAP connections of this one uid are served)."""
    monkeypatch.setenv(TOKEN_ENV, token)
    async with daemon_with_console(tmp_path, monkeypatch) as (_, cap, port):
        held = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(CAP)]
        await wait_until(lambda: cap.open == CAP, "all of them are served")
        assert cap.others == 0
        for stream in held:
            await stream.aclose()
        await wait_until(lambda: cap.open == 0, "every connection is closed")


async def test_the_declared_console_proxy_is_not_held_to_the_strangers_share(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind a declared proxy the operators' requests come as the proxy's uid: strangers
    holding their joint share must not shut it out."""
    monkeypatch.setenv(TOKEN_ENV, token)
    strangers = _Strangers()
    behind = {"console_public_origin": "https://console.example", "console_proxy_user": NOBODY}
    async with daemon_with_console(
        tmp_path,
        monkeypatch,
        per_uid=2,
        operators=[os.getuid()],
        owner=strangers.owner,
        service=behind,
    ) as (_, cap, port):
        held = [await strangers.connect(port, NOBODY - 1), await strangers.connect(port, 4242)]
        await wait_until(lambda: cap.others == 2, "the strangers hold their joint share")
        proxied = [await strangers.connect(port, NOBODY) for _ in range(2)]
        await wait_until(lambda: cap.open == 4, "the proxy's connections are served")
        assert cap.others == 2
        for stream in (*held, *proxied):
            await stream.aclose()
        await wait_until(lambda: cap.open == 0, "every connection is closed")
