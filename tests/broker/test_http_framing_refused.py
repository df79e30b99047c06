"""Responses from which no HTTP/1.1 result can be proven, through ``Broker.call`` against
scripted loopback peers, asserted on the envelope and the durable record (audit 48b #4, #5):

* a body framed by both Transfer-Encoding and Content-Length (RFC 9112 §6.3 item 3: "ought to
  be handled as an error") -- committed whole before, as h11 let chunked win;
* a 2xx to CONNECT: the connection became a tunnel, h11 paused, and the read loop spun on the
  closed socket until the deadline (2.4 s of CPU in 3 s).  Config validation now refuses
  CONNECT in a target's methods (tests/broker/test_config.py); the target here is built past
  it, as a config from before -- the exchange's own bound is what is checked, by its reads.

Either is dispatched and never complete: ``unknown`` / ``REMOTE_RESULT_INCOMPLETE``, the head's
status and field names recorded, no result stored, the connection never pooled.  The sans-IO
and driver rows are in tests/http/test_framing_left.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.adapters.http.connect import Connection
from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Peer

from .helpers import TOKEN_ENV, assert_error, event_kinds, http_target, write_config
from .http_rows import LIMIT, POST

E = EventKind
TE_CL = (
    b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"2\r\nok\r\n0\r\n\r\n"
)


def _never_complete(broker: Broker, env: Mapping[str, Any], status: int) -> Mapping[str, Any]:
    """The envelope and the record agree: dispatched, the head seen, no complete response, no
    result -- and the attempt's protocol summary ends ``closed_early`` at that head."""
    rec = assert_error(
        broker,
        env,
        phase="remote_execution",
        outcome="unknown",
        retry="reconcile",
        code="REMOTE_RESULT_INCOMPLETE",
    )
    iid = env["invocation_id"]
    kinds = event_kinds(broker, iid)
    assert E.REMOTE_RESPONSE_STARTED in kinds and E.ATTEMPT_INTERRUPTED in kinds
    assert E.REMOTE_RESPONSE_COMPLETE not in kinds and E.RESULT_COMMITTED not in kinds
    assert broker.journal.read_result(iid) is None and "result" not in env
    evidence = env["evidence"]
    assert evidence["response_headers_received"] is True
    assert evidence["response_complete"] is False
    [observed] = [e.attrs for e in broker.events(iid) if e.kind is E.PROTOCOL_OBSERVED]
    assert observed["state"] == "closed_early"
    facts = observed["facts"]
    assert facts["path"][-2:] == ["response_headers", "closed_early"]
    assert facts["status"] == status and facts["body_bytes"] == 0
    assert rec.evidence["http"]["path"] == facts["path"]
    return facts


async def test_a_body_framed_by_both_transfer_encoding_and_content_length_is_never_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "tok-framing-refused-0123456789")

    async def script(peer: Peer) -> None:
        while await peer.read_request() is not None:
            await peer.send_raw(TE_CL)

    async with HostileServer.running(script) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with Broker.open(config=load_config(cfg)) as broker:
            for call in range(2):
                with trio.fail_after(LIMIT):
                    env = await broker.call(POST)
                facts = _never_complete(broker, env, 200)
                assert {"content-length", "transfer-encoding"} <= set(facts["header_names"])
                # Its framing unknowable, the connection is closed, never pooled: the second
                # call dispatched on a fresh one.
                [dispatch] = [
                    e.attrs
                    for e in broker.events(env["invocation_id"])
                    if e.kind is E.DISPATCH_STARTED
                ]
                assert dispatch["reused_connection"] is False, call
    assert srv.connections == 2 and len(srv.requests) == 2


@pytest.mark.parametrize("then", ["close", "hold"])
async def test_a_2xx_to_connect_ends_the_call_at_its_head_without_reading_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    """Counted, not timed: before, ~1e5 reads of the closed socket a second until the
    deadline (peer closes), or reads until it (peer holds the tunnel)."""
    monkeypatch.setenv(TOKEN_ENV, "tok-framing-refused-0123456789")
    reads: list[int] = []
    receive_some = Connection.receive_some

    async def counted(self: Connection, size: int) -> bytes:
        data = await receive_some(self, size)
        reads.append(len(data))
        return data

    monkeypatch.setattr(Connection, "receive_some", counted)

    async def script(peer: Peer) -> None:
        await peer.read_request()
        await peer.send_raw(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        if then == "hold":
            await peer.send_raw(b"tunnel bytes")
            await trio.sleep(LIMIT)  # the broker closes first
        await peer.close()

    async with HostileServer.running(script) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, methods=["GET"])})
        config = load_config(cfg)
        target = dataclasses.replace(config.targets["api"], methods=frozenset({"CONNECT"}))  # type: ignore[type-var]
        config = dataclasses.replace(config, targets={"api": target})
        async with Broker.open(config=config) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call({"target": "api", "method": "CONNECT", "path": "/x"})
            _never_complete(broker, env, 200)
    assert len(reads) == 1, reads  # the head's read alone: not one more
    assert [r.method for r in srv.requests] == ["CONNECT"]
