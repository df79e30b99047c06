"""The MCP proxy passes on the ``field`` of the daemon's refusal, its ``Retry-After``, and
whether the request may have run.

The daemon's API-level refusals name the request's part to fix when there is one
(``{"api_error": {"code", "message", "field"}}``: a body at ``body.timeout``, a query
parameter); the proxy's tool answer is that ``api_error`` -- with its ``field``, or the agent
is told what is wrong and not where -- and the contract's ``outcome`` and ``retry``, which an
agent branches on (``affidavit.mcp.tools.CONTRACT``).  A stand-in daemon on a real Unix socket
answers every request alike (a 400 with a field, a 503 with Retry-After, or a hang-up before a
byte of answer); each of the proxy's ways to the daemon relays it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.wire import ApiError, NotSent
from affidavit.mcp.backends import Daemon, Exchange, _client_failure, _lost_call
from affidavit.mcp.tools import CONTRACT

from .kit import WAIT

REFUSAL = {"code": "BAD_JSON", "message": "the body's timeout is not a duration", "field": "x.y"}


REFUSED = (
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n",
    json.dumps({"api_error": REFUSAL}).encode(),
)
DECLINED = (  # a read the database declined this once: the same may succeed in 7 s
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 7\r\n",
    b'{"api_error":{"code":"JOURNAL_READ_DECLINED","message":"try again"}}',
)


async def refuse_every_request(
    listener: trio.SocketListener, seen: list[bytes], reply: tuple[bytes, bytes] | None = REFUSED
) -> None:
    """Answer each request (read whole: head, then its Content-Length body) with ``reply``
    (its head's first lines, its body), or none (None: a daemon killed mid-call), and close."""
    while True:
        stream = await listener.accept()
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    while len(body) < int(value):
                        body += await stream.receive_some(65536)
            seen.append(head.split(b"\r\n")[0])
            if reply is None:
                continue
            start, answer = reply
            await stream.send_all(
                start
                + f"content-length: {len(answer)}\r\nconnection: close\r\n\r\n".encode()
                + answer
            )


ASKS: dict[str, Callable[[Daemon], Awaitable[dict[str, Any]]]] = {
    "call": lambda d: d.call({"target": "api", "method": "GET", "session": "s-7"}, Exchange()),
    "list_actions": lambda d: d.actions(None, None, 10),
    "get_record": lambda d: d.record("act_1"),
    "fetch_result": lambda d: d.fetch_result("act_1", None, None, Exchange()),
    "poll_operation": lambda d: d.poll_operation("op_1"),
    "reconcile_query": lambda d: d.reconcile_query("act_1"),
}


async def ask(tmp_path: Path, tool: str, reply: tuple[bytes, bytes] | None) -> dict[str, Any]:
    path = tmp_path / "affidavit.sock"
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(str(path))
    sock.listen(8)
    seen: list[bytes] = []
    async with trio.SocketListener(sock) as listener, trio.open_nursery() as nursery:
        nursery.start_soon(refuse_every_request, listener, seen, reply)
        with trio.fail_after(WAIT):
            async with Daemon.open(str(path)) as backend:
                answer = await ASKS[tool](backend)
        nursery.cancel_scope.cancel()
    assert seen, "the daemon was not asked"
    return answer


@pytest.mark.parametrize("tool", sorted(ASKS))
async def test_a_daemon_refusal_s_field_reaches_the_agent(tmp_path: Path, tool: str) -> None:
    answer = await ask(tmp_path, tool, REFUSED)
    # Refused before anything was sent: fix the field, as the envelope's validation refusal.
    facts = {"outcome": "not_attempted", "retry": "after_correction"}
    assert answer == {"api_error": {**REFUSAL, **facts}}, answer


@pytest.mark.parametrize("tool", sorted(ASKS))
async def test_the_daemon_s_retry_after_reaches_the_agent(tmp_path: Path, tool: str) -> None:
    error = (await ask(tmp_path, tool, DECLINED))["api_error"]
    assert (error["code"], error["retry_after"]) == ("JOURNAL_READ_DECLINED", 7), error
    # One code, two outcomes (it can end a dispatched call): the outcome field decides.
    sent = tool in ("call", "poll_operation", "reconcile_query")
    assert error["outcome"] == ("unknown" if sent else "not_attempted"), error


def test_the_contract_says_an_api_error_s_outcome_decides_never_its_code() -> None:
    """SHUTTING_DOWN and JOURNAL_READ_DECLINED come before a call was sent and after it
    (``_stopped_before_answer``): the description once promised "nothing done" per code."""
    assert "nothing done" not in CONTRACT
    assert "read `outcome` and `retry`" in CONTRACT


LOST: dict[str, tuple[str, str, str]] = {
    # tool: (outcome, retry, words the message must hold)
    "call": ("unknown", "reconcile", "list_actions (session s-7) finds it"),
    "poll_operation": ("unknown", "backoff", "poll_operation with the same operation_id"),
    "reconcile_query": ("unknown", "backoff", "reconcile_query with the same invocation_id"),
    "list_actions": ("not_attempted", "backoff", ""),
    "get_record": ("not_attempted", "backoff", ""),
    "fetch_result": ("not_attempted", "backoff", ""),
}


@pytest.mark.parametrize("tool", sorted(ASKS))
async def test_an_answer_lost_says_whether_the_request_may_have_run(
    tmp_path: Path, tool: str
) -> None:
    """The daemon gone mid-request (killed): a call may have run -- ``unknown``, never resent
    blindly, found in the session the action named; a poll asks again; a read sent nothing."""
    error = (await ask(tmp_path, tool, None))["api_error"]
    outcome, retry, words = LOST[tool]
    assert (error["code"], error["outcome"], error["retry"]) == ("ANSWER_LOST", outcome, retry)
    assert error["message"].startswith("the daemon closed the connection before answering")
    assert words in error["message"], error
    if tool != "call":  # a key resumes a call, never a poll or a read
        assert "idempotency_key" not in error["message"], error


def failed(status: str, code: str) -> tuple[bytes, bytes]:
    head = f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n".encode()
    return head, json.dumps({"api_error": {"code": code, "message": "it failed"}}).encode()


@pytest.mark.parametrize(
    "reply",
    [
        failed("500 Internal Server Error", "INTERNAL"),
        failed("503 Service Unavailable", "JOURNAL_UNAVAILABLE"),
        failed("500 Internal Server Error", "RESULT_UNVERIFIED"),
    ],
)
@pytest.mark.parametrize("tool", ["poll_operation", "reconcile_query"])
async def test_a_linked_call_s_5xx_may_have_queried_never_not_attempted(
    tmp_path: Path, tool: str, reply: tuple[bytes, bytes]
) -> None:
    """A poll or a query the daemon answered 5xx: its linked invocation may have asked the
    remote -- ``unknown``, ask again later (as embedded answers it), never ``not_attempted``."""
    error = (await ask(tmp_path, tool, reply))["api_error"]
    assert (error["outcome"], error["retry"]) == ("unknown", "backoff"), error


def test_bodies_in_flight_is_a_body_the_daemon_did_not_read() -> None:
    """503 BODIES_IN_FLIGHT: the daemon refused the body unread -- nothing was sent."""
    error = _client_failure(ApiError(503, "BODIES_IN_FLIGHT", "later"), _lost_call("s"))
    assert (error["api_error"]["outcome"], error["api_error"]["retry"]) == (
        "not_attempted",
        "backoff",
    )


def test_only_the_client_s_own_refusal_is_not_sent() -> None:
    """``NotSent`` (refused before a byte went out) is not_attempted; any other ValueError met
    on a call's way may have come after it was sent -- never taken for a refusal."""
    lost = _lost_call("s")
    refused = _client_failure(NotSent("no timeout"), lost)["api_error"]
    assert (refused["outcome"], refused["retry"]) == ("not_attempted", "after_correction")
    other = _client_failure(ValueError("odd"), lost)["api_error"]
    assert (other["outcome"], other["retry"]) == ("unknown", "reconcile"), other


@pytest.mark.parametrize(
    ("status", "code", "outcome"),
    [
        (400, "BAD_JSON", None),
        (500, "X", "unknown"),
        # Neither the status alone (400) nor the code alone (BAD_JSON) says it.  (An api_error's
        # outcome follows its code: BAD_JSON is among those that sent nothing, NOT_SENT.)
        (400, "BAD_REQUEST", "not_attempted"),
        (413, "BODY_TOO_LARGE", "not_attempted"),
        (500, "BAD_JSON", "not_attempted"),
    ],
)
def test_an_action_code_counts_on_a_400_bad_json_only(
    status: int, code: str, outcome: str | None
) -> None:
    """None: the action refused with its own code (``PAYLOAD_LIMIT``), else the daemon's answer
    under its code, with what its status proves."""
    exc = ApiError(status, code, "words", "action", action_code="PAYLOAD_LIMIT")
    answer = _client_failure(exc, _lost_call("s"))
    if outcome is None:
        assert answer["error"]["code"] == "PAYLOAD_LIMIT", answer
    else:
        error = answer["api_error"]
        assert (error["code"], error["outcome"]) == (code, outcome), answer


@pytest.mark.parametrize("code", ["JOURNAL_UNREADABLE", "RESULT_UNVERIFIED"])
@pytest.mark.parametrize("tool", ["list_actions", "get_record", "fetch_result"])
async def test_a_read_the_journal_cannot_vouch_for_is_never_retried(
    tmp_path: Path, tool: str, code: str
) -> None:
    """Met again until an operator restores the journal (``call_failure``): ``never``."""
    error = (await ask(tmp_path, tool, failed("500 Internal Server Error", code)))["api_error"]
    assert (error["outcome"], error["retry"]) == ("not_attempted", "never"), error


BAD_LIMIT = (
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n",
    b'{"api_error":{"code":"BAD_REQUEST","message":"limit: expected a whole number","field":'
    b'"limit"}}',
)


@pytest.mark.parametrize("tool", ["list_actions", "fetch_result"])
async def test_a_read_parameter_the_daemon_refuses_is_the_tools_invalid_field(
    tmp_path: Path, tool: str
) -> None:
    """The socket API's 400 BAD_REQUEST for a read's parameter (deployment.md) reaches the agent
    as every read tool refuses an argument, embedded too: INVALID_FIELD at it, validation."""
    error = (await ask(tmp_path, tool, BAD_LIMIT))["error"]
    assert (error["code"], error["field"], error["phase"]) == (
        "INVALID_FIELD",
        "limit",
        "validation",
    )


async def test_an_overflowed_number_is_refused_by_the_client_never_sent_as_infinity(
    tmp_path: Path,
) -> None:
    """``1e400`` read as infinity: ``Client.call`` refuses to encode it (``Infinity`` is words
    its caller never sent, and not JSON) -- nothing reaches the daemon, and nothing ran."""
    path = tmp_path / "affidavit.sock"
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(str(path))
    sock.listen(8)
    seen: list[bytes] = []
    action = {"target": "api", "method": "POST", "path": "/", "body": float("inf")}
    async with trio.SocketListener(sock) as listener, trio.open_nursery() as nursery:
        nursery.start_soon(refuse_every_request, listener, seen)
        with trio.fail_after(WAIT):
            async with Daemon.open(str(path)) as backend:
                error = (await backend.call(action, Exchange()))["api_error"]
        nursery.cancel_scope.cancel()
    assert not seen, seen
    assert (error["code"], error["outcome"]) == ("CLIENT_ERROR", "not_attempted"), error
