"""The request head is made while DISPATCH_STARTED commits (issue 15: the loop, otherwise idle
during the barrier's fsync, does the work it would do right after it), and not one byte of it
reaches the remote before the barrier is durable -- nor ever, when the barrier fails.

A real loopback server counts every byte it receives; a ``before_commit`` hook holds (or fails)
the transaction that carries DISPATCH_STARTED, in the writer thread, just before its COMMIT.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.adapters.http.machine import HttpExchange
from affidavit.api.broker import Broker
from affidavit.journal import Batch, Journal

from .helpers import http_target, open_broker, write_config

LIMIT = 20
POST = {"target": "api", "method": "POST", "path": "/charge", "body": "{}"}
REPLY = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"


class RawServer:
    """Loopback HTTP/1.1: records the bytes of each connection, answers each request head."""

    def __init__(self) -> None:
        self.received: list[bytearray] = []
        self.port = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        got = bytearray()
        self.received.append(got)
        answered = 0
        async with stream:
            while True:
                try:
                    data = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    return
                if not data:
                    return
                got += data
                while got.count(b"\r\n\r\n") > answered:  # every request here has a tiny body
                    answered += 1
                    await trio.sleep(0.01)  # its body ("{}") arrives meanwhile
                    await stream.send_all(REPLY)

    def bytes_received(self) -> int:
        return sum(len(r) for r in self.received)


class AtDispatch:
    """A ``before_commit`` hook for the transaction holding DISPATCH_STARTED: ``hold`` it
    (bounded) until ``release`` is set, or ``fail`` it as a full disk does."""

    def __init__(self, journal: Journal, *, fail: bool = False) -> None:
        self.conn = journal.write_connection
        self.fail = fail
        self.head = self._seq()
        self.held = threading.Event()
        self.release = threading.Event()
        self.passed = threading.Event()
        """Set as the hook returns: only then may the COMMIT (the barrier's fsync) begin."""
        self.encoded = threading.Event()
        """Set by ``_spy_encoding``: a request head was made."""

    def _seq(self) -> int:
        return int(self.conn.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0])

    def __call__(self, batch: Batch) -> None:
        rows = self.conn.execute("SELECT kind FROM events WHERE seq > ?", (self.head,))
        kinds = [str(k) for (k,) in rows]
        self.head = self._seq()
        if "DISPATCH_STARTED" not in kinds or self.held.is_set():
            return
        self.held.set()
        try:
            if self.fail:
                # Fail the COMMIT once the head is made ahead (bounded: without the head start
                # it never is, and the test fails on ``during``).
                self.encoded.wait(5)
                raise sqlite3.OperationalError("database or disk is full")
            self.release.wait(LIMIT)
        finally:
            self.passed.set()


def _spy_encoding(monkeypatch: pytest.MonkeyPatch, hook: AtDispatch) -> list[bool]:
    """Each request head made: was the DISPATCH_STARTED transaction still before its COMMIT
    then (the hook not yet returned)?"""
    during: list[bool] = []
    real = HttpExchange.encode_request

    def spy(self: HttpExchange, *a: Any, **k: Any) -> Any:
        during.append(not hook.passed.is_set())
        hook.encoded.set()
        return real(self, *a, **k)

    monkeypatch.setattr(HttpExchange, "encode_request", spy)
    return during


@contextlib.asynccontextmanager
async def broker_on(srv: RawServer, tmp: Path) -> AsyncIterator[Broker]:
    """A broker whose target ``api`` is ``srv``, served on a loopback port until it closes."""
    async with trio.open_nursery() as servers:
        (listener,) = await servers.start(partial(trio.serve_tcp, srv.handle, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        cfg = write_config(tmp, {"api": http_target(f"http://127.0.0.1:{port}")})
        async with open_broker(cfg) as broker:
            yield broker
        servers.cancel_scope.cancel()


async def _wait_for(event: threading.Event) -> None:
    for _ in range(LIMIT * 100):  # bounded
        if event.is_set():
            return
        await trio.sleep(0.01)
    raise AssertionError("the DISPATCH_STARTED commit never came")


async def test_no_byte_reaches_the_server_before_dispatch_started_is_durable(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head (its credential injected) is made while the barrier's COMMIT is held, and the
    server sees nothing until the commit is let through; then the call completes as ever."""
    srv = RawServer()
    with trio.fail_after(LIMIT):
        async with broker_on(srv, tmp_path) as broker:
            hook = AtDispatch(broker.journal)
            during = _spy_encoding(monkeypatch, hook)
            broker.journal.before_commit = hook
            envs: list[dict[str, Any]] = []

            async def call() -> None:
                envs.append(await broker.call(POST))

            async with trio.open_nursery() as n:
                n.start_soon(call)
                try:
                    await _wait_for(hook.held)
                    await trio.sleep(0.2)  # room for any early write to arrive
                    assert len(srv.received) == 1  # connected: setup is not dispatch
                    assert srv.bytes_received() == 0
                    assert during == [True]  # made before the barrier's COMMIT
                finally:
                    hook.release.set()
            broker.journal.before_commit = None
            (env,) = envs
            assert "error" not in env, env
            assert env["evidence"]["dispatch_started"] is True
    (wire,) = srv.received
    assert wire.startswith(b"POST /charge HTTP/1.1\r\n")
    assert f"Bearer {token}".encode() in wire  # the credential went, once durable


async def test_a_dispatch_barrier_failing_at_commit_drops_the_head_made_ahead(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The head was made during DISPATCH_STARTED's COMMIT and the COMMIT failed: nothing was
    sent, ever -- the record says not_attempted -- the connection h11 had the head on is closed
    rather than pooled, no log line carries the credential, and the next call goes out whole
    on a new connection."""
    caplog.set_level(logging.DEBUG)
    srv = RawServer()
    with trio.fail_after(LIMIT):
        async with broker_on(srv, tmp_path) as broker:
            hook = AtDispatch(broker.journal, fail=True)
            during = _spy_encoding(monkeypatch, hook)
            broker.journal.before_commit = hook
            env = await broker.call(POST)
            err = env["error"]
            assert (err["phase"], err["outcome"]) == ("connection_setup", "not_attempted")
            assert env["evidence"]["dispatch_started"] is False
            assert during == [True]
            broker.journal.before_commit = None
            again = await broker.call(POST)
            assert "error" not in again, again
    first, second = srv.received
    assert first == b""  # the head made ahead never left
    assert second.startswith(b"POST /charge HTTP/1.1\r\n")
    assert token not in "\n".join(r.getMessage() for r in caplog.records)
