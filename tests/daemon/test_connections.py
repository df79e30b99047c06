"""The agents' socket's connection cap against several local users (admission.py's ``Server``,
as ``server.py`` sets it up): the places kept for operators, and refused peers.

The daemon runs in this process (``Daemon.run``, as ``affidavit serve`` runs it) with a small
cap.  Which user a connection is comes from SO_PEERCRED; so that one test process can be
several users, a connection bound to an abstract name ``_Strangers`` gave out stands for
another uid (``peer_of`` is looked up by that name) -- any other is the kernel's answer.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.config import load_config
from affidavit.daemon import server as daemon_server
from affidavit.daemon.admission import Server
from affidavit.daemon.peer import Peer, peer_of
from tests.broker.helpers import TOKEN_ENV

from .kit import NOBODY, WAIT, api_target, wait_until, write_daemon_config

CAP = 4
PER_UID = 2
PROMPTLY = 2.0
"""How soon a connection refused at accept must have its answer and its end."""
AGENT, OTHER_AGENT, STRANGER = NOBODY, NOBODY - 1, NOBODY - 2
HALF_HEAD = b"GET /v1/health HTTP/1.1\r\n"
HEAD = b"GET /v1/health HTTP/1.1\r\nhost: affidavit\r\n\r\n"


class _Strangers:
    """Connections that stand for other local uids, told by the abstract name their client end
    is bound to; any other connection's peer is the kernel's."""

    _names = itertools.count()

    def __init__(self, path: Path) -> None:
        self.path = path
        self.uids: dict[bytes, int] = {}

    def peer_of(self, sock: Any) -> Peer:
        name = sock.getpeername()
        if isinstance(name, str):
            name = name.encode()
        uid = self.uids.get(name)
        if uid is None:
            return peer_of(sock)
        return Peer(pid=os.getpid(), uid=uid, gid=uid)

    async def connect(self, uid: int) -> trio.SocketStream:
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        name = b"\0affidavit-test-%d-%d" % (os.getpid(), next(self._names))
        await sock.bind(name)
        self.uids[name] = uid  # known before the daemon can ask
        await sock.connect(str(self.path))
        return trio.SocketStream(sock)


@contextlib.asynccontextmanager
async def daemon_with_strangers(
    tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    operators: list[int] | None,
    remote: str = "http://127.0.0.1:9",
    **knobs: Any,
) -> AsyncIterator[tuple[Server, _Strangers]]:
    """A daemon in this process whose socket serves at most ``CAP`` connections, ``PER_UID``
    of one uid: (its socket's ``Server``, the strangers).  This process's uid and the two
    agents are allowed; ``STRANGER`` is not.  ``operators``: its ``operator_uids``;
    ``remote``: its target ``api``'s URL; ``knobs``: the ``Server``'s besides."""
    monkeypatch.setenv(TOKEN_ENV, "canary-connections")
    servers: list[Server] = []

    def make(**kwargs: Any) -> Server:
        servers.append(Server(max_connections=CAP, max_per_uid=PER_UID, **kwargs, **knobs))
        return servers[-1]

    socket = tmp / "affidavit.sock"
    strangers = _Strangers(socket)
    monkeypatch.setattr(daemon_server, "Server", make)
    monkeypatch.setattr(daemon_server, "peer_of", strangers.peer_of)
    settings: dict[str, Any] = {"allow_uids": [os.getuid(), AGENT, OTHER_AGENT]}
    if operators:
        settings["operator_uids"] = operators
    config = load_config(
        write_daemon_config(tmp, api_target(remote), socket=socket, service=settings)
    )
    async with trio.open_nursery() as nursery:
        daemon = daemon_server.Daemon(config)
        await nursery.start(daemon.run)
        try:
            yield servers[0], strangers
        finally:
            daemon.shutdown.set()


async def to_the_end(stream: trio.SocketStream, within: float = PROMPTLY) -> bytes:
    """Everything the daemon sends until it closes the connection (at most ``within`` s)."""
    data = b""
    with trio.fail_after(within):
        with contextlib.suppress(trio.BrokenResourceError):
            while chunk := await stream.receive_some(1 << 16):
                data += chunk
    return data


async def answer_of(stream: trio.SocketStream) -> bytes:
    """The first bytes of the daemon's answer (at most ``WAIT`` s)."""
    with trio.fail_after(WAIT):
        return await stream.receive_some(64)


async def test_agents_holding_their_shares_leave_the_operators_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Two agents' uids, each keeping every connection it may busy (half a head each, which
    eviction never closes), once filled the socket together: every new connection, the
    operators' included, was 503 -- no approval, denial or attestation while it lasted.  Now
    the peers who are not operators hold at most half the places together.  (Each agent may
    hold that whole half here: the share of one uid is the next test's.)"""
    caplog.set_level(logging.INFO, logger="affidavit.daemon")
    async with daemon_with_strangers(
        tmp_path, monkeypatch, operators=[os.getuid()], max_per_other=PER_UID
    ) as (server, strangers):
        held = []
        for uid in (AGENT, AGENT, OTHER_AGENT, OTHER_AGENT):
            stream = await strangers.connect(uid)
            held.append(stream)
            await stream.send_all(HALF_HEAD)  # busy: never evicted
            if len(held) == 2:  # the first agent's first
                await wait_until(lambda: server.open == 2 and server.idle == 0, "the first's")
        for stream in held[2:]:  # the second agent's: within its share, past theirs together
            answer = await to_the_end(stream, WAIT)
            assert answer.startswith(b"HTTP/1.1 503 "), answer
            assert b"TOO_MANY_CONNECTIONS" in answer
        assert (server.open, server.others) == (2, 2)  # the agents hold their half
        mine = []
        for _ in range(2):  # the operator's: served, up to its own share
            stream = await trio.open_unix_socket(str(strangers.path))
            await stream.send_all(HEAD)
            assert (await answer_of(stream)).startswith(b"HTTP/1.1 200 ")
            mine.append(stream)
        assert (server.open, server.others) == (4, 2)
        for stream in held + mine:
            await stream.aclose()
        await wait_until(lambda: server.open == 0, "every connection is closed")
    said = [r.getMessage() for r in caplog.records]
    full = [m for m in said if "who are not operators hold 2 connections" in m]
    assert len(full) == 1, said


async def test_one_agent_uid_holding_all_it_may_leaves_the_other_agents_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Audit 48 #1: one agent's uid may hold ``max_per_uid`` connections -- half the cap, as
    many as all the agents together -- and holding them busy (half a head each) it had every
    other agent's connection answered 503 while the operators were still served.  Now one uid
    that is not an operator holds a quarter of the agents' share at most (``max_per_other``):
    its next is 503 naming its uid, and another agent's is served beside it."""
    caplog.set_level(logging.INFO, logger="affidavit.daemon")
    async with daemon_with_strangers(tmp_path, monkeypatch, operators=[os.getuid()]) as (
        server,
        strangers,
    ):
        assert (server.max_others, server.max_per_other) == (PER_UID, 1)
        held = await strangers.connect(AGENT)
        await held.send_all(HALF_HEAD)  # busy: never evicted
        await wait_until(lambda: server.open == 1 and server.idle == 0, "the agent's first")
        over = await strangers.connect(AGENT)
        await over.send_all(HALF_HEAD)
        refused = await to_the_end(over, WAIT)
        other = await strangers.connect(OTHER_AGENT)
        await other.send_all(HEAD)
        served = await answer_of(other)
        for stream in (held, over, other):
            await stream.aclose()
        await wait_until(lambda: server.open == 0, "every connection is closed")
    assert refused.startswith(b"HTTP/1.1 503 ") and b"TOO_MANY_CONNECTIONS" in refused, refused
    assert served.startswith(b"HTTP/1.1 200 "), served
    said = [r.getMessage() for r in caplog.records]
    assert any(f"1 connections are open for uid {AGENT}" in m for m in said), said


async def test_a_uid_turned_away_at_its_share_is_logged_once_per_spell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A uid turned away at its own share starts a spell of its own, logged once, which ends
    when that uid is back to half its share -- not when anyone is admitted with half the
    places free: an agent reconnecting as another agent's connections came and went made a
    WARNING per cycle (audit 48 review).  Fails with the spell the whole socket's."""
    caplog.set_level(logging.INFO, logger="affidavit.daemon")
    async with daemon_with_strangers(tmp_path, monkeypatch, operators=[os.getuid()]) as (
        server,
        strangers,
    ):
        held = await strangers.connect(AGENT)
        await held.send_all(HALF_HEAD)  # busy: never evicted
        await wait_until(lambda: server.open == 1 and server.idle == 0, "the agent's first")
        for _ in range(3):
            over = await strangers.connect(AGENT)
            await over.send_all(HALF_HEAD)
            assert (await to_the_end(over, WAIT)).startswith(b"HTTP/1.1 503 ")
            await over.aclose()
            other = await strangers.connect(OTHER_AGENT)  # admitted, half the places free
            await other.send_all(HEAD)
            assert (await answer_of(other)).startswith(b"HTTP/1.1 200 ")
            await other.aclose()
        await held.aclose()
        await wait_until(lambda: server.open == 0, "every connection is closed")
    said = [r.getMessage() for r in caplog.records]
    turned = [m for m in said if f"connections are open for uid {AGENT}" in m]
    assert len(turned) == 1, said
    assert any(f"uid {AGENT} has room again (0 connections); 3 were" in m for m in said), said


async def test_a_uids_evictions_at_its_share_are_logged_once_per_spell_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A uid whose new connections evict its own idle ones at its share logs that once per
    spell of its own (``UidSpells``), not once per reconnect cycle: another agent admitted
    with half the places free ended the socket-wide spell, and the next eviction logged again.
    Fails with the eviction's spell the whole socket's."""
    caplog.set_level(logging.INFO, logger="affidavit.daemon")
    async with daemon_with_strangers(tmp_path, monkeypatch, operators=[os.getuid()]) as (
        server,
        strangers,
    ):
        idle = await strangers.connect(AGENT)
        await wait_until(lambda: server.open == 1 and server.idle == 1, "the agent's idle one")
        for _ in range(3):
            new = await strangers.connect(AGENT)  # its idle one is evicted for it
            await new.send_all(HEAD)
            assert (await answer_of(new)).startswith(b"HTTP/1.1 200 ")
            await idle.aclose()
            idle = new
            await wait_until(lambda: server.open == 1 and server.idle == 1, "the new one idles")
            other = await strangers.connect(OTHER_AGENT)  # admitted, half the places free
            await other.send_all(HEAD)
            assert (await answer_of(other)).startswith(b"HTTP/1.1 200 ")
            await other.aclose()
            await wait_until(lambda: server.open == 1, "the other agent's is closed")
        await idle.aclose()
        await wait_until(lambda: server.open == 0, "every connection is closed")
    said = [r.getMessage() for r in caplog.records]
    evicting = [m for m in said if f"open for uid {AGENT}, the most: closing" in m]
    assert len(evicting) == 1, said


async def test_without_operators_no_places_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``operator_uids`` / ``operator_gids``: nobody could use kept places, so there are
    none -- two agents may fill the socket between them, as before."""
    async with daemon_with_strangers(tmp_path, monkeypatch, operators=None) as (
        server,
        strangers,
    ):
        assert server.reserved is None
        held = []
        for uid in (AGENT, AGENT, OTHER_AGENT, OTHER_AGENT):
            stream = await strangers.connect(uid)
            await stream.send_all(HALF_HEAD)
            held.append(stream)
        await wait_until(lambda: server.open == CAP and server.idle == 0, "all four served")
        assert server.others == 0
        for stream in held:
            await stream.aclose()
        await wait_until(lambda: server.open == 0, "every connection is closed")


async def test_a_refused_peer_is_answered_403_on_accept_holding_no_place_and_logged_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A peer the policy refuses was answered only once it had sent a whole head: until then
    (up to the head wait, again and again as it reconnected) it held a place, and each of its
    connections logged a warning.  Now its credentials -- known at accept -- decide at once:
    403 without a byte read, no place taken even from a full daemon, one line per spell."""
    caplog.set_level(logging.INFO, logger="affidavit.daemon")
    async with daemon_with_strangers(tmp_path, monkeypatch, operators=None) as (
        server,
        strangers,
    ):
        held = []
        for uid in (AGENT, AGENT, OTHER_AGENT, OTHER_AGENT):  # the daemon full, all busy
            stream = await strangers.connect(uid)
            await stream.send_all(HALF_HEAD)
            held.append(stream)
        await wait_until(lambda: server.open == CAP and server.idle == 0, "all four served")
        for _ in range(5):
            stream = await strangers.connect(STRANGER)  # sends nothing at all
            answer = await to_the_end(stream)
            await stream.aclose()
            assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n"), answer
            assert b"PEER_REFUSED" in answer
            assert f"uid {STRANGER} may not use this broker".encode() in answer
            assert (server.open, server.idle) == (CAP, 0)  # no place taken, none evicted
        for stream in held:
            await stream.aclose()
        await wait_until(lambda: server.open == 0, "every connection is closed")
    said = [r.getMessage() for r in caplog.records]
    refused = [m for m in said if m.startswith(f"refused peer uid={STRANGER} ")]
    assert len(refused) == 1, said
    # At shutdown the spell is over: its count.
    assert any("5 connections were answered 403" in m for m in said), said


@pytest.mark.parametrize(
    ("operators", "answers", "second", "words", "whole_half"),
    [
        (False, 2, AGENT, f"for uid {AGENT}", False),
        (True, 3, OTHER_AGENT, "for peers who are not operators", True),
        # Audit 48 #1, for answers: one agent's uid held the agents' whole half.
        (True, 8, AGENT, f"for uid {AGENT}", False),
    ],
    ids=["per_uid", "others_together", "per_agent_uid"],
)
async def test_one_uid_or_the_agents_together_hold_their_share_of_the_answer_budget(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    operators: bool,
    answers: int,
    second: int,
    words: str,
    whole_half: bool,
) -> None:
    """An answer holds its piece of the answer budget for as long as its reader takes: slow
    readers of one uid (~164 at 52 KB/s, within its connection share) held all of it, and
    every other fetch -- and ``/v1/actions`` -- was 503 ``ANSWERS_IN_FLIGHT`` for as long.
    Now one uid holds half the budget at most (``Server.answer_shares.per_uid``), and the peers who
    are not operators half together (``answer_others``), as they hold the connections: with
    an agent's answer stalled, the ``second``'s is refused naming the share it is past, while
    this process's uid (an operator's, when there are operators) has its answer written.  One
    agent's uid holds a quarter of the agents' half (``answer_per_other``) unless
    ``whole_half`` lets it hold all of it (to see the joint share alone)."""
    from affidavit.api.client import Client
    from affidavit.daemon import results
    from affidavit.engine import RESULT_CHUNK
    from tests.http.hostile import HostileServer, Reply, scripts

    from .kit import ask

    one = results.PIECE_HOLD + 64 * 1024  # an answer's hold, its envelope's text within it
    big = b"x" * (64 * RESULT_CHUNK)  # 4 MiB: more than the sockets' buffers take
    async with (
        HostileServer.running(scripts.serve(Reply(200, body=big))) as srv,
        daemon_with_strangers(
            tmp_path,
            monkeypatch,
            operators=[os.getuid()] if operators else None,
            remote=srv.url,
            answer_budget=answers * one,
            max_per_other=PER_UID,  # the answers' shares are this test's, not the places'
            **({"answer_per_other": answers * one // 2} if whole_half else {}),
        ) as (server, strangers),
    ):
        assert server.answer_shares.per_uid == server.answer_shares.others == answers * one // 2
        with trio.fail_after(WAIT):
            async with Client.open(strangers.path) as client:
                envelope = await client.call({"target": "api", "method": "GET", "path": "/r"})
            path = f"/v1/invocations/{envelope['invocation_id']}/result"
            get = f"GET {path} HTTP/1.1\r\nhost: x\r\n".encode()
            stalled = await strangers.connect(AGENT)
            await stalled.send_all(get + b"\r\n")  # and never read past its head
            assert (await answer_of(stalled)).startswith(b"HTTP/1.1 200 ")
            again = await strangers.connect(second)
            await again.send_all(get + b"connection: close\r\n\r\n")
            refused = await to_the_end(again, WAIT)
            await again.aclose()
            status, _h, payload = await ask(strangers.path, "GET", path)
            await stalled.aclose()
    assert refused.startswith(b"HTTP/1.1 503 "), refused[:200]
    assert b"ANSWERS_IN_FLIGHT" in refused and words.encode() in refused
    assert status == 200 and len(payload) > len(big)
