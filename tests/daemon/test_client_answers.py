"""What the clients make of a daemon's answer (audit 51e): a batch with items not committed is
no success, a 200 that is no envelope is no outcome, bytes past an answer are never the next
one's, a framing read two ways or larger than the daemon ever sends is refused, and a daemon
that stops answering is waited for within a bound -- each against a fake daemon on a Unix
socket (``rawdaemon``), bounded in connections and time."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api import client as client_module
from affidavit.api import wire
from affidavit.api.client import Client
from affidavit.api.sdk import AffidavitError, BatchItemsError, call_checked
from affidavit.api.wire import AnswerInvalid, AnswerLost, blocking_request
from affidavit.cli import main
from affidavit.schema.approval import MAX_TTL
from affidavit.schema.target import MAX_TOTAL

from .rawdaemon import answer, envelope, raw_daemon

ACTION = {"target": "api", "method": "GET", "path": "/ok"}
ITEMS = [
    {"id": 1, "outcome": "committed", "code": None, "retry": "never", "status": 200},
    {"id": 2, "outcome": "rejected", "code": "REMOTE_REJECTED", "retry": "after_correction"},
    {"id": 3, "outcome": "unknown", "code": "REMOTE_RESULT_INCOMPLETE", "retry": "reconcile"},
]
BATCH = envelope(items=ITEMS)


class _Stub:
    """A broker that answers every call with ``envelope``, counting the calls."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer, self.calls = answer, 0

    async def call(self, action: Any, *, timeout: float | None = None) -> dict[str, Any]:
        self.calls += 1
        return self.answer


def _cli(capsys: pytest.CaptureFixture[str], tmp_path: Path, path: str, *more: str) -> int:
    action = tmp_path / "action.json"
    action.write_text(json.dumps(ACTION), encoding="utf-8")
    capsys.readouterr()
    return main(["call", "--socket", path, *more, str(action)])


# -- a batch with items not committed -------------------------------------------------------


async def test_call_checked_raises_for_a_batch_with_an_item_not_committed() -> None:
    broker = _Stub(BATCH)
    with pytest.raises(BatchItemsError) as info:
        await call_checked(broker, ACTION, auto_retry=3)
    err = info.value
    assert isinstance(err, AffidavitError)
    assert [i["id"] for i in err.items] == [2, 3]
    assert (err.outcome, err.retry) == ("unknown", "reconcile")
    assert err.code == "REMOTE_RESULT_INCOMPLETE"
    assert err.envelope == BATCH and err.invocation_id == "act_FAKE"
    assert broker.calls == 1  # never re-sent: item 1 was applied


async def test_call_checked_returns_a_batch_whose_items_are_all_committed() -> None:
    settled = envelope(items=ITEMS[:1])
    assert await call_checked(_Stub(settled), ACTION) == settled


@pytest.mark.parametrize(("items", "status"), [(ITEMS, 1), (ITEMS[:1], 0)], ids=["mixed", "ok"])
def test_affidavit_call_exits_1_for_a_batch_with_an_item_not_committed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], items: list[Any], status: int
) -> None:
    sent = envelope(items=items)
    with raw_daemon(tmp_path, lambda conn, n: conn.sendall(answer(sent))) as path:
        assert _cli(capsys, tmp_path, path) == status
    assert json.loads(capsys.readouterr().out) == sent


# -- a 200 that is no envelope --------------------------------------------------------------

NOT_ENVELOPES = [{}, {"invocation_id": "act_x", "evidence": {}}, {"invocation_id": 1}, []]


@pytest.mark.parametrize("body", NOT_ENVELOPES, ids=["empty", "neither", "id", "list"])
async def test_a_200_that_is_no_envelope_is_no_outcome(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: Any
) -> None:
    with raw_daemon(tmp_path, lambda conn, n: conn.sendall(answer(json.dumps(body).encode()))) as p:
        async with Client.open(p) as client:
            with trio.fail_after(10), pytest.raises(AnswerInvalid):
                await call_checked(client, ACTION)
        assert issubclass(AnswerInvalid, AnswerLost)
        assert await trio.to_thread.run_sync(_cli, capsys, tmp_path, p) == 2
    assert "ANSWER_LOST" in capsys.readouterr().err


# -- bytes past an answer --------------------------------------------------------------------


async def test_a_connection_with_bytes_past_its_answer_is_not_pooled(tmp_path: Path) -> None:
    first = answer(envelope("act_FIRST"))
    stray = answer(envelope("act_STRAY", result={"status": 201}))

    def handle(conn: socket.socket, n: int) -> None:
        if n == 0:  # two answers to one request, the connection kept open
            conn.sendall(first + stray)
            conn.recv(65536)  # a second request on it, if the client pools it
            conn.sendall(answer(envelope("act_SAME_CONN")))
        else:
            conn.sendall(answer(envelope("act_FRESH")))

    with raw_daemon(tmp_path, handle) as path:
        async with Client.open(path) as client:
            with trio.fail_after(10):
                assert (await client.call(ACTION))["invocation_id"] == "act_FIRST"
                assert (await client.call(ACTION))["invocation_id"] == "act_FRESH"


# -- framing -------------------------------------------------------------------------------


def test_the_thin_client_refuses_a_content_length_given_twice(tmp_path: Path) -> None:
    body = json.dumps(envelope()).encode()
    twice = b"content-length: %d\r\n" % len(body)  # a second, equal one: still refused
    handle = lambda conn, n: conn.sendall(answer(body, extra=twice))  # noqa: E731
    with raw_daemon(tmp_path, handle) as path, pytest.raises(AnswerLost, match="length twice"):
        blocking_request(path, "POST", "/v1/calls", b"{}")


def _huge(conn: socket.socket, n: int) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (wire.ANSWER_MOST + 1))
    conn.sendall(b" " * 65536)


async def test_an_answer_longer_than_the_daemon_ever_sends_is_refused_unread(
    tmp_path: Path,
) -> None:
    with raw_daemon(tmp_path, _huge) as path:
        async with Client.open(path) as client:
            with trio.fail_after(10), pytest.raises(AnswerLost, match="more than the"):
                await client.call(ACTION)
        with pytest.raises(AnswerLost, match="more than the"):
            await trio.to_thread.run_sync(blocking_request, path, "POST", "/v1/calls", b"{}")


def test_the_answer_cap_is_the_daemons_answer_budget() -> None:
    from affidavit.daemon.admission import ANSWER_BUDGET
    from affidavit.daemon.h11server import WRITE_WAIT

    assert wire.ANSWER_MOST == ANSWER_BUDGET and wire.DELIVERY_WAIT == WRITE_WAIT
    # No call may take longer: a wait for the decision up to an approval's ttl, then a send
    # under the target's own total (the schema's bounds, the clients' wait: one number each).
    assert wire.CALL_WAIT == MAX_TTL + MAX_TOTAL
    assert wire.answer_wait(None) == MAX_TTL + MAX_TOTAL + 2 * wire.DELIVERY_WAIT


# -- a daemon that stops answering -----------------------------------------------------------

DELIVERY = 0.3


@pytest.fixture
def short_delivery(monkeypatch: pytest.MonkeyPatch) -> None:
    """The delivery budget at ``DELIVERY`` seconds, so a test waits that long, not 30 s."""
    monkeypatch.setattr(wire, "DELIVERY_WAIT", DELIVERY)
    monkeypatch.setattr(client_module, "DELIVERY_WAIT", DELIVERY)


def _silent(hung_up: list[bool]) -> Any:
    def handle(conn: socket.socket, n: int) -> None:  # never answers; sees the client go
        hung_up.append(conn.recv(1) == b"")

    return handle


@pytest.mark.usefixtures("short_delivery")
async def test_a_silent_daemon_is_waited_for_the_timeout_and_delivery_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hung_up: list[bool] = []
    bound = wire.answer_wait(0.2)
    assert bound == pytest.approx(0.2 + 2 * DELIVERY)
    with raw_daemon(tmp_path, _silent(hung_up)) as path:
        async with Client.open(path) as client:
            with trio.fail_after(10), pytest.raises(AnswerLost, match="no whole answer"):
                await client.call(ACTION, timeout=0.2)
        with pytest.raises(AnswerLost, match="no whole answer"):
            await trio.to_thread.run_sync(
                blocking_request, path, "POST", "/v1/calls?timeout=0.2", b"{}", None, bound
            )
        assert await trio.to_thread.run_sync(_cli, capsys, tmp_path, path, "--timeout", "0.2") == 2
    assert "ANSWER_LOST" in capsys.readouterr().err
    assert hung_up == [True, True, True]  # each closed its connection


@pytest.mark.usefixtures("short_delivery")
async def test_a_silent_daemon_is_waited_for_a_health_answer_the_delivery_budget(
    tmp_path: Path,
) -> None:
    """A daemon that takes the connection and never answers (stopped, wedged): the health read
    is given up after ``health_wait()`` -- the delivery budget twice over, all the daemon may
    take for an answer that reads no journal -- not waited for for ever."""
    hung_up: list[bool] = []
    assert wire.health_wait() == pytest.approx(2 * DELIVERY)
    with raw_daemon(tmp_path, _silent(hung_up)) as path:
        async with Client.open(path) as client:
            with trio.fail_after(10), pytest.raises(AnswerLost, match="no whole answer"):
                await client.health()
    assert hung_up == [True]  # it closed its connection


def _trickle(conn: socket.socket, n: int) -> None:
    for byte in b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n":  # a byte every 0.1 s, never whole
        conn.sendall(bytes([byte]))
        time.sleep(0.1)


@pytest.mark.usefixtures("short_delivery")
async def test_a_daemon_trickling_its_head_is_cut_off(tmp_path: Path) -> None:
    with raw_daemon(tmp_path, _trickle) as path:
        async with Client.open(path) as client:
            with trio.fail_after(10), pytest.raises(AnswerLost, match="no whole answer"):
                await client.health()  # no wait of its own: the head's bound alone
        with pytest.raises(AnswerLost, match="no whole answer"):
            await trio.to_thread.run_sync(blocking_request, path, "GET", "/v1/health")
