"""A caller's cancel during the wait for a TLS session ticket's rest (after the dispatch gate,
before the request's first byte: ``Connection.unread_bytes``) leaves a record that says nothing
was written -- the protocol summary's last step ``setup_failed`` at stage ``ticket_wait`` -- and
an outcome that stays ``unknown``: DISPATCH_STARTED is durable, and the seed's "An action that
ended after DISPATCH_STARTED but before an authoritative end marker remains unknown" (design
notes, "A cancel in the ticket wait").  Before, the summary ended at ``tls_established``: no
step said what happened to the request.

The peer is a record-by-record TLS 1.3 server (tests/http/test_tls_records_before_the_request.py)
that holds its last ticket record's last 10 bytes back for good; loopback only, every wait
bounded.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.adapters.http import connect
from affidavit.statemachine import EventKind
from tests.http.hostile import make_tls
from tests.http.test_tls_records_before_the_request import RecordPeer, Sent, server_context

from .helpers import http_target, open_broker, write_config
from .http_rows import GET, LIMIT, POST


def _ticket_cut_short(obj: ssl.SSLObject, si: ssl.MemoryBIO, so: ssl.MemoryBIO) -> Sent:
    return so.read()[:-10], None


@pytest.mark.parametrize(("action", "retry"), [(POST, "reconcile"), (GET, "backoff")])
async def test_a_cancel_in_the_ticket_wait_records_the_request_unwritten_and_stays_unknown(
    tmp_path: Path,
    token: str,
    monkeypatch: pytest.MonkeyPatch,
    action: dict[str, Any],
    retry: str,
) -> None:
    tls = make_tls(tmp_path)
    peer = RecordPeer(server_context(tls, ssl.TLSVersion.TLSv1_3), _ticket_cut_short)
    found: list[str] = []
    check = connect.Connection._tls_application_data

    def recorded(conn: connect.Connection, stream: Any) -> str:
        found.append(check(conn, stream))
        return found[-1]

    monkeypatch.setattr(connect.Connection, "_tls_application_data", recorded)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    url = f"https://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    cfg = write_config(tmp_path, {"api": http_target(url, ca_file=tls.ca_file)})
    call = trio.CancelScope()
    async with trio.open_nursery() as nursery, open_broker(cfg) as broker:
        nursery.start_soon(peer.serve, listeners[0])
        original = broker.journal.append

        async def append(event: Any, **kw: Any) -> Any:
            stored = await original(event, **kw)
            if event.kind is EventKind.DISPATCH_STARTED:
                await peer.sent.wait()
                await trio.sleep(0.2)  # the half ticket on the client's socket
                # The next checkpoint is the wait for the ticket's rest (``TICKET_PATIENCE``).
                call.deadline = trio.current_time() + connect.TICKET_PATIENCE / 5
            return stored

        monkeypatch.setattr(broker.journal, "append", append)
        with trio.fail_after(LIMIT):
            with call:
                await broker.call(action)
            assert call.cancelled_caught
            (rec,) = broker.journal.list_actions()
            env = await broker.fetch_result(rec.invocation_id)
            with trio.fail_after(LIMIT):  # the peer stops waiting at 3 s: never a pass by time
                await peer.client_closed.wait()  # the connection was closed, not left open
        await listeners[0].aclose()
    assert found == ["partial"]  # cancelled in the wait, not before or after it
    assert env is not None and "result" not in env
    err = env["error"]
    assert (err["code"], err["phase"], err["outcome"], err["retry"]) == (
        "CALLER_CANCELLED",
        "remote_execution",
        "unknown",
        retry,
    )
    evidence = env["evidence"]
    assert evidence["dispatch_started"] is True and evidence["request_complete"] is False
    http = evidence["http"]
    assert http["path"][-2:] == ["tls_established", "setup_failed"]
    assert (http["stage"], http["local_error"]) == ("ticket_wait", "Cancelled")
    assert peer.after_handshake == 0 and peer.request == b""  # not one byte written
