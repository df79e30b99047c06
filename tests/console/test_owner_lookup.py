"""Who owns a console connection is asked of the kernel once per connection, by netlink, never
by parsing /proc/net/tcp on the event loop (audit51b item 2, /tmp/audit-audit51b/
console_stall.py: with 8000 idle loopback connections an agent held, a console flood parsed
~26000 rows per connection and per request on the loop, and ``/v1/health`` took seconds).

``console.peer``: one ``SOCK_DIAG_BY_FAMILY`` query of the exact 4-tuple; /proc/net/tcp only
where netlink does not work, then in a worker thread.  ``admission.ConsoleCap`` looks the owner
up at admission and hands it to every request of the connection (``request.OWNER``)."""

from __future__ import annotations

import http.client
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.console import peer
from tests.broker.helpers import http_target, open_broker

from .kit import log_in_to, operator_config, served


def _pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    return listener, client, accepted


def test_netlink_names_the_owner_the_table_names() -> None:
    listener, client, accepted = _pair()
    with listener, client, accepted:
        local, remote = client.getsockname(), accepted.getsockname()
        assert peer._netlink_works()
        assert peer._netlink_owner(local, remote) == peer._proc_owner(local, remote)
        assert peer._netlink_owner(local, remote) == os.geteuid()
        # The server's end is no client's (it is bound to the console's address).
        assert peer._netlink_owner(remote, local) == os.geteuid()
        assert peer._netlink_owner(("127.0.0.1", 1), ("127.0.0.1", 2)) is None


def _spy(monkeypatch: pytest.MonkeyPatch, name: str, calls: list[int]) -> None:
    real: Callable[..., Any] = getattr(peer, name)

    def spy(*a: Any) -> Any:
        calls.append(threading.get_ident())
        return real(*a)

    monkeypatch.setattr(peer, name, spy)


def _three_requests(origin: str, cookie: str) -> list[int]:
    """Three GETs on one keep-alive connection: their statuses."""
    conn = http.client.HTTPConnection(origin.removeprefix("http://"), timeout=20)
    try:
        statuses = []
        for _ in range(3):
            conn.request("GET", "/approvals", headers={"Cookie": cookie})
            response = conn.getresponse()
            response.read()
            statuses.append(response.status)
        return statuses
    finally:
        conn.close()


@pytest.mark.parametrize("netlink", [True, False], ids=["netlink", "proc-fallback"])
async def test_an_admitted_connection_is_looked_up_once_and_never_on_the_loop_s_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, netlink: bool
) -> None:
    """Served as the daemon admits a connection (``capped``): one lookup for the connection's
    three requests; with netlink, no /proc read at all; without it, the table is read once, in
    a worker thread -- never on the event loop's."""
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path, capped=True) as (origin, console):
        cookie, _ = await log_in_to(console, origin)
        monkeypatch.setattr(peer, "_works", netlink)  # (False: as a kernel without sock_diag)
        asked: list[int] = []
        read: list[int] = []
        _spy(monkeypatch, "_netlink_owner", asked)
        _spy(monkeypatch, "_proc_owner", read)
        statuses = await trio.to_thread.run_sync(_three_requests, origin, cookie)
    assert statuses == [200, 200, 200]  # the owner was this uid, the operator: each served
    loop = threading.get_ident()
    if netlink:
        assert (len(asked), read) == (1, [])
    else:
        assert (asked, len(read)) == ([], 1)
        assert read[0] != loop


class _ShortError:
    """A netlink socket answering an NLMSG_ERROR whose body is two bytes, not an errno's four."""

    def __init__(self, *_: Any) -> None:
        pass

    def __enter__(self) -> _ShortError:
        return self

    def __exit__(self, *_: Any) -> None:
        pass

    def settimeout(self, _: float) -> None:
        pass

    def sendto(self, data: bytes, _: Any) -> int:
        return len(data)

    def recv(self, _: int) -> bytes:
        return peer._HEADER.pack(peer._HEADER.size + 2, peer._NLMSG_ERROR, 0, 1, 0) + b"\0\0"


def test_a_short_netlink_error_answer_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    """A short error answer is the kernel's not answering (the table is read), never a
    ``struct.error`` out of the console's admission (review confix51 item 3)."""
    listener, client, accepted = _pair()
    with listener, client, accepted:
        local, remote = client.getsockname(), accepted.getsockname()
        monkeypatch.setattr(peer, "_works", True)
        monkeypatch.setattr(socket, "socket", _ShortError)
        with pytest.raises(peer._Unavailable, match="short error"):
            peer._netlink_owner(local, remote)
        assert peer.socket_owner(local, remote) == os.geteuid()  # read from /proc/net/tcp


async def test_the_netlink_self_check_runs_off_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-time self-check (a listen, connect and accept) is made in a worker thread, not
    on the event loop the console's connections share (review confix51 item 5)."""
    monkeypatch.setattr(peer, "_works", None)
    checked: list[int] = []
    real = socket.create_server

    def create_server(*a: Any, **k: Any) -> socket.socket:
        checked.append(threading.get_ident())
        return real(*a, **k)

    monkeypatch.setattr(socket, "create_server", create_server)
    listener, client, accepted = _pair()
    with listener, client, accepted:
        got = await peer.owner_of(client.getsockname(), accepted.getsockname())
    assert got == os.geteuid() and peer._works is True
    assert len(checked) == 2 and checked[1] != threading.get_ident()  # ([0]: _pair's)


def test_the_netlink_self_check_does_not_wait_forever_for_its_accept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its connection made elsewhere (as a full backlog or a filter would leave it), the
    self-check's accept gives up after ``_WAIT``: netlink is taken not to work."""
    monkeypatch.setattr(peer, "_works", None)
    elsewhere = socket.create_server(("127.0.0.1", 0))
    real = socket.create_connection
    monkeypatch.setattr(
        socket, "create_connection", lambda _, **k: real(elsewhere.getsockname(), **k)
    )
    done: list[bool] = []
    thread = threading.Thread(target=lambda: done.append(peer._netlink_works()), daemon=True)
    with elsewhere:
        thread.start()
        thread.join(30)  # (a bound on a hang: without the accept's timeout it never returns)
    assert done == [False]
