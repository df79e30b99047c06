"""The checked SDK style: raise with the envelope; auto-retry only backoff / same key."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.api.sdk import AffidavitError, call_checked
from affidavit.api.wire import ApiError
from affidavit.cli.tour import DemoServer, demo_config
from affidavit.config import load_config
from tests.broker.helpers import http_target, open_broker, write_config
from tests.http.hostile import HostileServer, Received, Reply, scripts


@pytest.fixture
async def demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Broker, DemoServer]]:
    monkeypatch.setenv("AFFIDAVIT_DEMO_TOKEN", "sdk-canary-token-1")
    server = DemoServer()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve)
        cfg = tmp_path / "affidavit.toml"
        cfg.write_text(demo_config(tmp_path, port), encoding="utf-8")
        async with Broker.open(config=load_config(cfg)) as broker:
            yield broker, server
        nursery.cancel_scope.cancel()


async def test_success_returns_the_envelope(demo: tuple[Broker, DemoServer]) -> None:
    broker, _ = demo
    with trio.fail_after(10):
        env = await call_checked(broker, {"target": "api", "method": "GET", "path": "/hello"})
    assert env["result"]["status"] == 200
    assert env["evidence"]["idempotent"] is True  # what a backoff's new call rests on


async def test_error_raises_with_the_whole_envelope(demo: tuple[Broker, DemoServer]) -> None:
    broker, server = demo
    with trio.fail_after(10), pytest.raises(AffidavitError) as info:
        await call_checked(
            broker, {"target": "api", "method": "GET", "path": "/forbidden"}, auto_retry=3
        )
    err = info.value
    assert (err.code, err.outcome, err.retry) == ("REMOTE_REJECTED", "rejected", "after_correction")
    assert err.envelope["error"]["code"] == "REMOTE_REJECTED"
    assert server.requests == 1  # after_correction is never retried automatically
    assert "sdk-canary-token-1" not in str(err)


async def test_reconcile_is_never_retried_automatically(demo: tuple[Broker, DemoServer]) -> None:
    broker, server = demo
    action = {"target": "api", "method": "POST", "path": "/charge", "body": "{}"}
    with trio.fail_after(10), pytest.raises(AffidavitError) as info:
        await call_checked(broker, action, auto_retry=5)
    assert (info.value.outcome, info.value.retry) == ("unknown", "reconcile")
    assert server.requests == 1


async def test_same_idempotency_key_is_retried_on_the_same_invocation(
    demo: tuple[Broker, DemoServer],
) -> None:
    broker, server = demo
    action = {"target": "payments", "method": "POST", "path": "/payments", "body": "{}"}
    with trio.fail_after(10):
        env = await call_checked(broker, action, auto_retry=1)
    assert env["result"]["status"] == 201
    assert env["evidence"]["budget"]["used"] == 2  # one invocation, two attempts
    assert len(server.applied) == 1  # the key the broker minted made the retry safe
    assert server.requests == 2


class _Scripted:
    """A caller answering from a script, to pin the retry schedule without a server."""

    def __init__(self, envelopes: list[dict[str, object] | ApiError]) -> None:
        self.envelopes = envelopes
        self.actions: list[dict[str, object]] = []
        self.times: list[float] = []

    async def call(self, action: object, *, timeout: float | None = None) -> dict[str, object]:
        self.actions.append(dict(action))  # type: ignore[call-overload]
        self.times.append(trio.current_time())
        answer = self.envelopes.pop(0)
        if isinstance(answer, ApiError):
            raise answer
        return answer


def _err(retry: str, outcome: str, **evidence: object) -> dict[str, object]:
    return {
        "invocation_id": "act_x",
        "error": {
            "code": "REMOTE_THROTTLED",
            "phase": "remote_execution",
            "outcome": outcome,
            "retry": retry,
            "message": "slow down",
        },
        "evidence": evidence,
    }


async def test_backoff_waits_at_least_retry_after(autojump_clock: object) -> None:
    ok = {"invocation_id": "act_y", "result": {"status": 200}, "evidence": {}}
    caller = _Scripted([_err("backoff", "rejected", retry_after=7.0), ok])
    env = await call_checked(caller, {"target": "t"}, auto_retry=2, backoff_base=0.1)
    assert env is ok
    assert caller.times[1] - caller.times[0] >= 7.0


KEYED = {"idempotency": {"key": "idem_recorded"}, "retry_after": 1.0, "idempotent": False}


async def test_backoff_on_a_keyed_rejection_is_not_resent_as_a_new_call(
    autojump_clock: object,
) -> None:
    """A complete 429 to a non-idempotent POST: its ``backoff`` rests on the recorded key, and
    the invocation is over (``rejected`` is final: a same-key call is answered from its record).
    A resend would be a new invocation under a new key and a fresh budget (audit 51e): raised."""
    caller = _Scripted([_err("backoff", "rejected", **KEYED)])
    with pytest.raises(AffidavitError) as info:
        await call_checked(caller, {"target": "pay", "method": "POST"}, auto_retry=3)
    assert (info.value.outcome, info.value.retry) == ("rejected", "backoff")
    assert len(caller.actions) == 1


async def test_backoff_on_an_idempotent_keyed_rejection_is_a_new_call(
    autojump_clock: object,
) -> None:
    """A complete 429 to a PUT the target calls idempotent, sent with the caller's own key: a
    new call is safe (contract rule 7) -- made without that key, whose record is final."""
    ok = {"invocation_id": "act_y", "result": {"status": 200}, "evidence": {}}
    keyed = {**KEYED, "idempotent": True}
    caller = _Scripted([_err("backoff", "rejected", **keyed), ok])
    action = {"target": "pay", "method": "PUT", "idempotency_key": "mine"}
    assert await call_checked(caller, action, auto_retry=1) is ok
    assert caller.actions == [action, {"target": "pay", "method": "PUT"}]


async def test_backoff_on_a_rejection_not_idempotent_without_a_key_is_raised(
    autojump_clock: object,
) -> None:
    """The evidence says the operation is not idempotent: never a new call, key or none."""
    caller = _Scripted([_err("backoff", "rejected", idempotent=False, retry_after=1.0)])
    with pytest.raises(AffidavitError):
        await call_checked(caller, {"target": "pay", "method": "POST"}, auto_retry=3)
    assert len(caller.actions) == 1


async def test_backoff_on_nothing_sent_resumes_the_invocation_under_its_key(
    autojump_clock: object,
) -> None:
    """``not_attempted`` / ``backoff`` (a refused connection): the same invocation again, under
    its recorded key, so the broker counts the retry in its recorded budget."""
    ok = {"invocation_id": "act_x", "result": {"status": 200}, "evidence": {}}
    caller = _Scripted([_err("backoff", "not_attempted", **KEYED), ok])
    assert await call_checked(caller, {"target": "pay"}, auto_retry=1) is ok
    assert caller.actions == [
        {"target": "pay"},
        {"target": "pay", "idempotency_key": "idem_recorded"},
    ]


async def test_an_overloaded_refusal_is_called_again_after_retry_after(
    autojump_clock: object,
) -> None:
    """503 ``OVERLOADED`` (``max_calls``): nothing was sent -- called again, the same action,
    after its ``Retry-After`` (a 429 through a real daemon: ``test_call_checked_refused``)."""
    ok = {"invocation_id": "act_y", "result": {"status": 200}, "evidence": {}}
    busy = ApiError(503, "OVERLOADED", "busy", retry_after=3)
    caller = _Scripted([busy, busy, ok])
    env = await call_checked(caller, {"target": "t"})
    assert env is ok
    assert caller.actions == [{"target": "t"}] * 3
    assert caller.times[2] - caller.times[1] >= 3.0


@pytest.mark.parametrize(
    "error",
    [
        ApiError(503, "SHUTTING_DOWN", "stopping", retry_after=1),
        ApiError(400, "BAD_JSON", "bad", field="action"),
        ApiError(503, "VIEWS_IN_FLIGHT", "busy", retry_after=1),
    ],
)
async def test_an_api_error_that_is_not_an_unsent_refusal_is_raised_at_once(
    autojump_clock: object, error: ApiError
) -> None:
    caller = _Scripted([error])
    with pytest.raises(ApiError) as raised:
        await call_checked(caller, {"target": "t"}, auto_retry=3)
    assert raised.value is error
    assert len(caller.actions) == 1


async def test_same_key_hint_without_a_recorded_key_raises(autojump_clock: object) -> None:
    caller = _Scripted([_err("same_idempotency_key", "unknown")])
    with pytest.raises(AffidavitError):
        await call_checked(caller, {"target": "t"}, auto_retry=2)
    assert len(caller.actions) == 1


@pytest.mark.parametrize("timeout", [float("nan"), -1.0])
async def test_a_nan_or_negative_timeout_is_refused_before_anything_is_journaled(
    demo: tuple[Broker, DemoServer], timeout: float
) -> None:
    # NaN reached the journal as a non-JSON lease expiry and -1 made trio.fail_after raise
    # mid-call; both are caller bugs, refused up front with nothing recorded or sent.
    broker, server = demo
    with trio.fail_after(10), pytest.raises(ValueError, match="timeout"):
        await broker.call({"target": "api", "method": "GET", "path": "/hello"}, timeout=timeout)
    assert broker.journal.list_actions() == []
    assert server.requests == 0


def test_import_affidavit_reaches_the_sdk_as_docs_deployment_writes_it() -> None:
    """docs/deployment.md calls ``affidavit.sdk.call_checked(...)`` after ``import affidavit``:
    in a fresh interpreter (where nothing imported ``affidavit.sdk`` yet) that must resolve."""
    code = "import affidavit; print(affidavit.sdk.call_checked.__name__)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b"call_checked\n"


async def test_a_throttled_idempotent_keyed_put_is_called_again_once(
    tmp_path: Path, token: str
) -> None:
    """A real broker: a 429 with Retry-After to an idempotent PUT that carries a key is
    ``backoff`` on a rejected request; ``call_checked(auto_retry=1)`` calls again once, as a new
    call (the operation is idempotent, ``evidence.idempotent``) -- exactly two requests reach
    the remote, the second answered 200."""
    answers = [Reply(429, headers=[("Retry-After", "1")], body=b"{}"), Reply(200, body=b"{}")]

    def reply(_: Received) -> Reply:
        return answers.pop(0) if answers else Reply(500, body=b"{}")

    idempotency = {"header": "Idempotency-Key", "scope": "items", "retention": "24h"}
    async with HostileServer.running(scripts.serve(reply)) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, idempotency=idempotency)})
        async with open_broker(cfg) as broker:
            action = {"target": "api", "method": "PUT", "path": "/items/1", "body": "{}"}
            action["idempotency_key"] = "k-put-1"
            with trio.fail_after(30):
                env = await call_checked(broker, action, auto_retry=1)
    assert env["result"]["status"] == 200
    assert env["evidence"]["idempotent"] is True
    assert [r.method for r in srv.requests] == ["PUT", "PUT"]
