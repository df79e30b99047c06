"""A refusal read in the same scheduling round as the body write's end (trio's checkpoint after
the last send) does not cut a body ``send_all`` wrote whole: ``send_body`` fires and the answer
follows; an error answer whose head came before the body was written whole keeps the connection
out of the pool, ``Connection: close`` or not (the server may not have read the body)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import trio

from affidavit.adapters.http import HttpClient
from affidavit.adapters.http import exchange as exchange_module
from affidavit.statemachine import Code, Outcome

from .hostile import HostileServer, Reply
from .test_early_response import TOO_LARGE, answer_at_head, interrupted, perform, req


@pytest.mark.parametrize("close", [True, False], ids=["close", "keep-alive"])
async def test_refusal_read_as_the_write_returns_is_not_a_cut(
    client: HttpClient, monkeypatch: pytest.MonkeyPatch, close: bool
) -> None:
    watched = exchange_module._Hop._send_watched

    async def spy(hop: Any, tail: bytes, early: Any) -> Any:
        stream = hop.conn.stream

        async def send_all(data: bytes) -> None:
            # Returns normally once the watcher has read the whole 413 -- after it cancelled
            # the write's scope, as send_all's last (uncancellable) checkpoint lets it.
            with trio.CancelScope(shield=True):
                while not early.complete:
                    await trio.sleep(0.001)

        stream.send_all = send_all
        try:
            return await watched(hop, tail, early)
        finally:
            del stream.send_all

    monkeypatch.setattr(exchange_module._Hop, "_send_watched", spy)
    headers = [("Connection", "close")] if close else []
    reply = Reply(413, headers=headers, body=b"too large")
    async with HostileServer.running(answer_at_head(reply)) as srv:
        fe, res = await perform(client, req(srv.url + "/upload"))
    assert res.outcome is Outcome.REJECTED and res.code is Code.REMOTE_REJECTED
    assert fe.events[-5:] == ["send_headers", "send_body", "response_headers", "body", "end"]
    assert "request_body_cut" not in fe.facts_of("response_headers")[0]
    assert client.idle_connections() == 0


@pytest.mark.parametrize("answer", [True, False], ids=["413", "silent"])
async def test_short_body_write_timing_out_drains_the_complete_answer(
    client: HttpClient, monkeypatch: pytest.MonkeyPatch, answer: bool
) -> None:
    # A short body is written plainly under the hop's deadline; its write stalling (stubbed:
    # the second send_all, the body's, never returns) times out, and the complete 413 already
    # in the receive queue answers the hop, as after a failed write; with nothing waiting the
    # hop stays unknown, as before.
    exchange = exchange_module._Hop.transfer

    async def spy(hop: Any, headers: Any, body: bytes) -> None:
        stream, real, calls = hop.conn.stream, hop.conn.stream.send_all, []

        async def send_all(data: bytes) -> None:
            calls.append(len(data))
            if len(calls) > 1:
                await trio.sleep_forever()
            await real(data)

        stream.send_all = send_all
        try:
            await exchange(hop, headers, body)
        finally:
            del stream.send_all

    monkeypatch.setattr(exchange_module._Hop, "transfer", spy)
    async with HostileServer.running(answer_at_head(TOO_LARGE if answer else b"")) as srv:
        request = replace(req(srv.url + "/upload", write=0.3), body=b"y" * 1024)
        if not answer:
            fe, exc = await interrupted(client, request)
            assert exc.code is Code.REMOTE_OUTCOME_UNKNOWN and exc.facts["during"] == "write"
            assert fe.events[-2:] == ["send_headers", "timed_out"]
            return
        fe, res = await perform(client, request)
    assert res.outcome is Outcome.REJECTED and res.facts["status"] == 413
    assert fe.events[-4:] == ["send_headers", "response_headers", "body", "end"]
    assert fe.facts_of("response_headers")[0]["request_body_cut"] is True
    assert client.idle_connections() == 0
