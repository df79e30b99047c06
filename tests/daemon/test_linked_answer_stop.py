"""A poll's or a reconciliation query's answer at the end of the stop's grace (``Calls.linked``,
``Running.stop``; docs/deployment.md, "Stopping").

Its handler runs the linked call itself and writes the answer inside it (``Answering``), in the
call's delivery scope.  A write under way at the grace's end is cut off ``ANSWER_WAIT`` after
its hand-over, never later (``Running.stop``), and the linked result recorded
RESULT_DELIVERY_FAILED (stored, fetchable); before, the write ran in a scope of its own and was
cut off with the connections later, the record left RESULT_COMMITTED with no delivery row.  A
held one is stopped first (BROKER_SHUTDOWN) and its answer handed over with the bounded chance
a stopped call's answer has (``ANSWER_WAIT`` from then): the client reads its BROKER_SHUTDOWN
-- cancelling the scope with the stop (e9b84223, reverted) left it none.  Real daemon in this
process, real socket, every wait bounded; no timing asserted.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.client import Client
from affidavit.journal import JournalReader
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import Peer, Reply
from tests.mcp.conftest import JOB
from tests.mcp.test_linked_delivery import OPERATIONS

from .kit import WAIT, in_process
from .test_whole_answers import _servers, _settled

PAD = "x" * 900_000
"""A status document or a query's answer more than the socket's buffers take: the test reads
what reached the client once the daemon stopped, and checks it is less (``_received``; about
220 KB here)."""
GRACE = {"shutdown_grace": 0.5}
QUERIED = {
    "idempotency": {"header": "Idempotency-Key", "scope": "charges", "retention": "24h"},
    "reconcile": {"path": "/v1/charges?k={idempotency_key}", "committed_if": "status:200"},
}
SEND = {"target": "api", "method": "POST", "path": "/v1/charges", "body": "{}"}


def _remote(held: bool) -> Any:
    """A job API and a payments API in one: ``POST /jobs`` a job (202, its status resource);
    ``POST /v1/charges`` applied and closed unanswered (an unknown outcome); a GET -- a poll
    or the reconciliation query -- sets ``asked``, then is held for good (``held``) or answered
    200 with ``PAD`` (done, committed)."""

    async def script(peer: Peer) -> None:
        while (req := await peer.read_request()) is not None:
            if req.method == "POST" and req.target == "/jobs":
                await peer.respond(JOB)
                continue
            if req.method == "POST":
                await peer.close()
                return
            peer.server.event("asked").set()
            if held:
                await trio.sleep_forever()
            await peer.respond(Reply(200, body=json.dumps({"state": "done", "pad": PAD}).encode()))

    return script


async def _asked(client: Client, what: str) -> tuple[str, str, bytes]:
    """The submission's invocation, what is asked of it (its operation to ``poll``, itself to
    ``query``) and the raw request that asks it."""
    if what == "poll":
        submitted = await client.call({**SEND, "path": "/jobs"})
        op = submitted["operation"]["id"]
        head = f"POST /v1/operations/{op}/poll HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n"
        return submitted["invocation_id"], op, head.encode()
    sent = await client.call({**SEND, "idempotency_key": "k1"})
    assert sent["error"]["outcome"] == "unknown", sent
    iid, body = sent["invocation_id"], b'{"query": true}'
    head = f"POST /v1/invocations/{iid}/reconcile HTTP/1.1\r\nhost: x\r\n"
    head += f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    return iid, iid, head.encode() + body


async def _received(stream: trio.SocketStream) -> int:
    """The bytes that reached the client, read once its connection closed."""
    got = 0
    with contextlib.suppress(trio.BrokenResourceError):  # closed with bytes unread: a reset
        while data := await stream.receive_some(1 << 16):
            got += len(data)
    return got


def _linked_rows(tmp_path: Path, submission: str) -> list[tuple[str, Any]]:
    """The kind and code of each of the linked call's rows (the poll's, the query's), read
    once stopped."""
    path = tmp_path / "journal.db"
    with JournalReader.open(path, key_file=Path(f"{path}.key")) as r:
        linked = [
            e.attrs[name]
            for e in r.events(submission)
            for name in ("poll_invocation", "query_invocation")
            if name in e.attrs
        ]
        assert linked, [e.kind.value for e in r.events(submission)]
        return [(e.kind.value, e.attrs.get("code")) for e in r.events(linked[-1])]


@pytest.mark.parametrize("what", ["poll", "query"])
async def test_a_linked_answer_being_written_when_the_grace_ends_is_recorded_undelivered(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    """A 900 KB poll or query answer held and being written to a client that does not read it
    when the grace (0.5 s) ends: the write is cut off (``ANSWER_WAIT`` after its hand-over),
    the client got less than the answer, the linked result is recorded RESULT_DELIVERY_FAILED
    -- never RESULT_DELIVERED -- and the budget holds nothing after.  Fails before: the write
    outlived the grace and the record stayed RESULT_COMMITTED."""
    servers = _servers(monkeypatch, write_wait=3 * WAIT)  # only the grace's end cuts it off
    monkeypatch.setenv(TOKEN_ENV, token)
    overrides = {"operations": OPERATIONS, **QUERIED}
    with trio.fail_after(WAIT):
        async with in_process(tmp_path, _remote(False), overrides=overrides, service=GRACE) as (
            _srv,
            socket,
        ):
            async with Client.open(socket) as client:
                submission, _asked_id, request = await _asked(client, what)
            await _settled(servers[0])
            stream = await trio.open_unix_socket(str(socket))
            await stream.send_all(request)
            while not servers[0].answers:  # held, being written, not read
                await trio.sleep(0.01)
            answer = servers[0].answers  # the encoded answer's bytes, held while written
        got = await _received(stream)
        await stream.aclose()
    assert answer > len(PAD) > got, (answer, got)  # the write blocked: never all sent
    kinds = [kind for kind, _code in _linked_rows(tmp_path, submission)]
    assert kinds[-1] == "RESULT_DELIVERY_FAILED", kinds
    assert "RESULT_DELIVERED" not in kinds, kinds
    assert servers[0].answers == 0


@pytest.mark.parametrize("what", ["poll", "query"])
async def test_a_linked_call_held_at_the_grace_is_answered_broker_shutdown(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    """A poll or a query held by the remote when the grace ends is stopped first
    (BROKER_SHUTDOWN, unknown) and its client reads that answer -- not a connection closed
    unanswered (the client's ``AnswerLost``), as when the stop cancelled the answer's write
    with the call."""
    monkeypatch.setenv(TOKEN_ENV, token)
    overrides = {"operations": OPERATIONS, **QUERIED}
    answers: list[dict[str, Any]] = []
    with trio.fail_after(WAIT):
        async with (
            trio.open_nursery() as nursery,
            in_process(tmp_path, _remote(True), overrides=overrides, service=GRACE) as (
                srv,
                socket,
            ),
        ):
            async with Client.open(socket) as client:
                submission, asked, _request = await _asked(client, what)

            async def ask() -> None:
                async with Client.open(socket) as client:
                    if what == "poll":
                        answers.append(await client.poll_operation(asked))
                    else:
                        answers.append(await client.reconcile(asked, query=True))

            nursery.start_soon(ask)
            await srv.event("asked").wait()
            # (The daemon stops on leaving: the grace, then the held call is stopped.)
    envelope = answers[0]["poll"] if what == "poll" else answers[0]["query"]
    error = envelope["error"]
    assert (error["code"], error["outcome"]) == ("BROKER_SHUTDOWN", "unknown"), answers
    last = _linked_rows(tmp_path, submission)[-1]
    assert last == ("ATTEMPT_INTERRUPTED", "BROKER_SHUTDOWN"), last
