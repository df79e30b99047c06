"""A result is bounded by its target's ``max_result`` (docs/configuration.md): a remote that
answers without end -- whatever its framing -- fills no disk.  The broker stops reading at the
limit, closes the connection (never pools it), stores nothing past it, and ends the attempt as
the records prove: dispatched, no complete result, so ``unknown`` / ``RESULT_SIZE_LIMIT``, with
the limit and the bytes received in the evidence and nothing of the partial body returned (seed,
"never present a partial body as a complete remote result").

Loopback peers only (tests/http/hostile.py ``scripts.endless``); every wait is bounded.  The
server sends at most 32 MiB, so even a broker without the limit fills no disk here: it then
waits for the target's 5 s total timeout instead.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio

from affidavit.adapters.base import ResultTooLarge
from affidavit.engine import RESULT_CHUNK
from affidavit.engine.sink import StreamSink
from affidavit.statemachine import EventKind, envelope_schema
from tests.http.hostile import HostileServer, Peer, Reply, Script, scripts

from .helpers import TOKEN_ENV, assert_error, assert_ok, http_target, open_broker, write_config

LIMIT = 1 << 20
POST = {"target": "api", "method": "POST", "path": "/charge", "body": "{}"}
GET = {"target": "api", "method": "GET", "path": "/thing"}
WAIT = 15


@pytest.fixture(autouse=True)
def _token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "tok-result-size-limit")


def _footprint(tmp_path: Path) -> int:
    """Bytes of every file of the journal (database, WAL, keys, result segments)."""
    return sum(
        f.stat().st_size
        for p in tmp_path.iterdir()
        if p.name.startswith("journal")
        for f in ([p] if p.is_file() else p.rglob("*"))
        if f.is_file()
    )


async def _call_over_the_limit(
    tmp_path: Path,
    script: Script,
    action: dict[str, Any],
    retry: str | None = None,
    **target: Any,
) -> tuple[dict[str, Any], Any, HostileServer, float, int]:
    """One call of ``action`` against ``script`` with ``max_result`` = LIMIT: the envelope, its
    record's events, the server, the call's seconds and the journal's growth in bytes.
    ``retry``: the hint expected (default: a GET's ``after_correction`` -- sent again it meets
    the same limit --, a POST's ``reconcile``: the remote may have acted)."""
    async with HostileServer.running(script) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, max_result=LIMIT, **target)})
        async with open_broker(cfg) as broker:
            before = _footprint(tmp_path)
            start = time.monotonic()
            with trio.fail_after(WAIT):
                env = await broker.call(action)
            took = time.monotonic() - start
            if retry is None:
                retry = "after_correction" if action["method"] == "GET" else "reconcile"
            assert_error(broker, env, phase="remote_execution", outcome="unknown",
                         retry=retry, code="RESULT_SIZE_LIMIT")  # fmt: skip
            # Never a partial body as a result: none returned, none stored, none to fetch.
            assert "result" not in env
            assert broker.journal.read_result(env["invocation_id"]) is None
            fetched = await broker.fetch_result(env["invocation_id"])
            assert fetched is not None and "result" not in fetched
            assert fetched["error"]["code"] == "RESULT_SIZE_LIMIT"
            events = list(broker.events(env["invocation_id"]))
            grown = _footprint(tmp_path) - before
            # The connection was closed, not pooled: the server's next send failed.
            with trio.fail_after(WAIT):
                await srv.event("cut").wait()
    return env, events, srv, took, grown


def _assert_bounded(env: dict[str, Any], events: Any, srv: HostileServer, took: float, grown: int):
    jsonschema.Draft202012Validator(envelope_schema()).validate(env)
    evidence = env["evidence"]
    over = evidence["result_size_limit"]
    # Past the limit: the bytes received, or what a compressed body decoded to -- unless a
    # body not scanned whole is measured nowhere (test_size_limit_withheld.py).
    assert over["limit"] == LIMIT
    if "received_withheld" not in over:
        assert max(over["received_bytes"], over.get("decoded_bytes", 0)) > LIMIT
    assert evidence["dispatch_started"] is True and evidence["response_complete"] is False
    assert "stopped reading" in env["error"]["message"]
    kinds = [e.kind for e in events]
    assert EventKind.RESULT_COMMITTED not in kinds
    [ended] = [e for e in events if e.kind is EventKind.ATTEMPT_INTERRUPTED]
    assert ended.attrs["result_size_limit"] == over
    # The adapter ended the exchange at the limit (its table's result_size_limit step).
    assert evidence["http"]["path"][-1] == "closed_early"
    assert evidence["http"]["result_size_limit"] == over
    # Stopped at the limit, long before the 5 s total timeout and the server's 32 MiB.
    assert took < 3.0
    assert srv.body_sent < 32 << 20
    # The journal holds about the limit of this result (uncommitted), not what was sent.
    assert grown <= LIMIT + RESULT_CHUNK + (128 << 10), grown


@pytest.mark.parametrize("framing", ["length", "chunked", "close"])
async def test_a_body_past_max_result_is_cut_unknown_and_never_stored_past_it(
    tmp_path: Path, framing: str
) -> None:
    env, events, srv, took, grown = await _call_over_the_limit(
        tmp_path, scripts.endless(framing), POST
    )
    _assert_bounded(env, events, srv, took, grown)
    assert "decoded_bytes" not in env["evidence"]["result_size_limit"]


async def test_an_idempotent_request_cut_at_max_result_is_hinted_after_correction(
    tmp_path: Path,
) -> None:
    """A GET the target calls idempotent, cut at the limit: the records prove the remote was
    sending more than ``max_result``, so the same GET after a delay meets the same limit --
    ``after_correction`` (raise the limit or ask for less), never ``backoff``, which sent
    automation round until its budget was spent."""
    env, events, srv, took, grown = await _call_over_the_limit(
        tmp_path, scripts.endless("chunked"), GET
    )
    _assert_bounded(env, events, srv, took, grown)


async def test_a_same_key_call_after_an_idempotent_request_cut_at_max_result_sends_nothing(
    tmp_path: Path,
) -> None:
    """The hint says after_correction; a call with the same key -- the same request, the same
    limit -- answers the record instead of sending the GET again until the budget is spent."""
    idem = {"header": "Idempotency-Key", "scope": "things", "retention": "24h"}
    keyed = {**GET, "idempotency_key": "thing-1"}
    async with HostileServer.running(scripts.endless("chunked")) as srv:
        cfg = write_config(
            tmp_path, {"api": http_target(srv.url, max_result=LIMIT, idempotency=idem)}
        )
        async with open_broker(cfg) as broker:
            ids = set()
            for _ in range(3):
                with trio.fail_after(WAIT):
                    env = await broker.call(keyed)
                assert_error(broker, env, phase="remote_execution", outcome="unknown",
                             retry="after_correction", code="RESULT_SIZE_LIMIT")  # fmt: skip
                ids.add(env["invocation_id"])
            assert len(ids) == 1
            assert len(srv.requests) == 1, [r.method for r in srv.requests]


async def test_a_keyed_non_idempotent_request_cut_at_max_result_is_hinted_reconcile(
    tmp_path: Path,
) -> None:
    """A POST cut at the limit may have acted, and its idempotency key is no way out: the
    remote's deduplication contract answers a same-key resend with the first result it stored
    for the key -- the one past ``max_result`` -- so ``same_idempotency_key`` would only send
    automation round until the budget is spent.  ``reconcile``; and a call with the same key
    answers the record instead of sending the POST again."""
    idem = {"header": "Idempotency-Key", "scope": "charges", "retention": "24h"}
    env, events, srv, took, grown = await _call_over_the_limit(
        tmp_path, scripts.endless("chunked"), POST, "reconcile", idempotency=idem
    )
    _assert_bounded(env, events, srv, took, grown)
    assert env["evidence"]["idempotency"]["key"]


async def test_a_same_key_call_after_a_non_idempotent_request_cut_at_max_result_sends_nothing(
    tmp_path: Path,
) -> None:
    idem = {"header": "Idempotency-Key", "scope": "charges", "retention": "24h"}
    keyed = {**POST, "idempotency_key": "charge-1"}
    async with HostileServer.running(scripts.endless("chunked")) as srv:
        cfg = write_config(
            tmp_path, {"api": http_target(srv.url, max_result=LIMIT, idempotency=idem)}
        )
        async with open_broker(cfg) as broker:
            ids = set()
            for _ in range(3):
                with trio.fail_after(WAIT):
                    env = await broker.call(keyed)
                assert_error(broker, env, phase="remote_execution", outcome="unknown",
                             retry="reconcile", code="RESULT_SIZE_LIMIT")  # fmt: skip
                ids.add(env["invocation_id"])
            assert len(ids) == 1
            assert len(srv.requests) == 1, [r.method for r in srv.requests]


async def test_a_compressed_body_is_held_to_max_result_once_decoded(tmp_path: Path) -> None:
    # The body is decoded before it is stored (docs/redaction.md): the decoded bytes reach the
    # limit first.  The piece received last was not decoded to its end, so the body was not
    # scanned whole: neither count is told (a CRIME-style oracle), only the limit.
    env, events, srv, took, grown = await _call_over_the_limit(
        tmp_path, scripts.endless("chunked", encoding="gzip"), POST
    )
    _assert_bounded(env, events, srv, took, grown)
    assert env["evidence"]["result_size_limit"] == {
        "limit": LIMIT,
        "received_withheld": "unscanned",
    }


async def test_a_body_the_broker_withholds_is_still_not_read_past_max_result(
    tmp_path: Path,
) -> None:
    # A coding the broker cannot decode stores nothing of the body (body_withheld); the bytes
    # received are held to the limit all the same -- no reading without end -- and, the body
    # not scanned, not told.
    env, events, srv, took, grown = await _call_over_the_limit(
        tmp_path, scripts.endless("chunked", encoding="br"), POST
    )
    _assert_bounded(env, events, srv, took, grown)
    assert env["evidence"]["result_size_limit"] == {
        "limit": LIMIT,
        "received_withheld": "unscanned",
    }


async def test_a_followed_redirect_counts_only_the_final_response(tmp_path: Path) -> None:
    # 3/4 of the limit in the 307's body, 3/4 in the final one: neither is past it alone, and
    # only the final response is the result.
    body = b"r" * (LIMIT * 3 // 4)
    seen: list[str] = []

    async def script(peer: Peer) -> None:
        while True:
            rec = await peer.read_request()
            if rec is None:
                return
            seen.append(rec.target)
            if rec.target == "/final":
                await peer.respond(Reply(200, body=body))
            else:
                await peer.respond(Reply(307, headers=[("Location", "/final")], body=body))

    async with HostileServer.running(script) as srv:
        target = http_target(srv.url, max_result=LIMIT, follow_redirects=True)
        cfg = write_config(tmp_path, {"api": target})
        async with open_broker(cfg) as broker:
            with trio.fail_after(WAIT):
                env = await broker.call(GET)
            assert_ok(broker, env)
            assert env["result"]["status"] == 200
    assert seen == ["/thing", "/final"]


async def test_a_followed_redirect_to_an_endless_body_is_cut_at_max_result(
    tmp_path: Path,
) -> None:
    script = scripts.endless("chunked", moved="/final")
    env, events, srv, took, grown = await _call_over_the_limit(
        tmp_path, script, GET, follow_redirects=True
    )
    _assert_bounded(env, events, srv, took, grown)
    assert [r.target for r in srv.requests] == ["/thing", "/final"]


# -- the sink itself --------------------------------------------------------------------------


class _Writer:
    def __init__(self) -> None:
        self.stored = 0

    async def put(self, stream: str, index: int, data: bytes, *, last: bool = False) -> None:
        self.stored += len(data)

    async def drain(self) -> None:
        return None

    async def flush(self) -> None:
        return None


class _Journal:
    def __init__(self) -> None:
        self.writer = _Writer()

    def result_writer(self, iid: str, generation: int | None = None) -> _Writer:
        return self.writer


async def test_the_sink_stores_nothing_past_max_result_over_all_streams() -> None:
    journal = _Journal()
    sink = StreamSink(journal, "act_1", (), 1 << 20, max_result=5 * RESULT_CHUNK)  # type: ignore[arg-type]
    piece = b"o" * (RESULT_CHUNK // 2)
    for _ in range(4):  # 2 chunks of stdout, 2 of stderr: 4 of the 5 allowed
        await sink("stdout", piece)
        await sink("stderr", piece)
    await sink("stdout", piece)  # 4.5 chunks
    with pytest.raises(ResultTooLarge) as info:
        await sink("stderr", piece + b"!")  # one byte past the limit
    assert (info.value.limit, info.value.received) == (5 * RESULT_CHUNK, 5 * RESULT_CHUNK + 1)
    assert info.value.facts == {
        "result_size_limit": {"limit": 5 * RESULT_CHUNK, "received_bytes": 5 * RESULT_CHUNK + 1}
    }
    with pytest.raises(ResultTooLarge):  # and nothing after it either
        await sink("stdout", b"x")
    assert journal.writer.stored <= 5 * RESULT_CHUNK


async def test_an_endless_body_of_a_redirect_to_follow_is_not_read_past_max_result(
    tmp_path: Path,
) -> None:
    # A 3xx to follow is not the result and its body is not stored, but it is read: held to
    # the limit all the same, or a server could keep the broker reading until the timeout.
    script = scripts.endless("chunked", location="/final")
    env, events, srv, took, grown = await _call_over_the_limit(
        tmp_path, script, GET, follow_redirects=True
    )
    _assert_bounded(env, events, srv, took, grown)
    assert [r.target for r in srv.requests] == ["/thing"]
