"""What a real TLS stack sends after the handshake and before the request, end to end against
``openssl s_server`` driven through its standard input (its ``k``, ``K`` and ``r`` commands):

* TLS 1.3 KeyUpdate (``k``; ``K`` asks for the client's own in return): a whole record that
  gives no application data -- it waits at the check (``Connection.unread_bytes``), is
  consumed there, and the request is written and answered;
* TLS 1.2 HelloRequest (``r``: the server asks to renegotiate): a record of type 22, which
  OpenSSL would take without giving a byte -- refused by its type alone, nothing written.

The server sends no session tickets under TLS 1.3 (``-num_tickets 0``), so the bytes queued at
the check are the KeyUpdate's alone.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.adapters.base import SetupError
from affidavit.adapters.http import HttpClient, connect
from affidavit.statemachine import Outcome
from tests.external import OPENSSL, Listening, listening

from .fakes import FakeEngine
from .hostile import TlsFixture
from .test_tls_proxy_timeouts import req

ANSWER = b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok"  # -crlf: each LF sent as CRLF


@pytest.fixture
def s_server(tls: TlsFixture, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A started ``openssl s_server`` for one connection, at ``request.param``'s TLS version
    ("tls1_3" or "tls1_2"), its stdin a pipe and its output in a log."""
    program = OPENSSL.require()  # skipped (or failed in CI) here, with its reason
    pem = tmp_path / "server.pem"
    tls.good.private_key_and_cert_chain_pem.write_to_path(str(pem))
    version = request.param
    tickets = ["-num_tickets", "0"] if version == "tls1_3" else []

    def argv(port: int) -> list[str]:
        return [program, "s_server", "-accept", f"127.0.0.1:{port}", "-cert", str(pem),
                f"-{version}", *tickets, "-crlf", "-naccept", "1"]  # fmt: skip

    log = tmp_path / "s_server.log"
    with listening(argv, log, stdin=subprocess.PIPE) as server:
        yield server, log


def _command(server: Listening, text: bytes) -> None:
    assert server.proc.stdin is not None
    server.proc.stdin.write(text)
    server.proc.stdin.flush()


async def _answer_once_asked(server: Listening, log: Path) -> None:
    """The answer, written once the request shows in the server's log (at most 5 s)."""
    with trio.move_on_after(5):
        while b"POST /pay" not in log.read_bytes():
            await trio.sleep(0.02)
        _command(server, ANSWER)


async def _call(
    client: HttpClient, tls: TlsFixture, served: Any, command: bytes, monkeypatch: Any
) -> tuple[list[int], Any, Any]:
    """One POST; during the gate the server is told ``command``.  Returns the bytes queued at
    the check, the result (or None) and the error (or None)."""
    server, log = served
    queued: list[int] = []
    check = connect.Connection._tls_application_data

    def recorded(conn: connect.Connection, stream: Any) -> str:
        queued.append(conn._queued())
        return check(conn, stream)

    monkeypatch.setattr(connect.Connection, "_tls_application_data", recorded)

    async def during_gate(facts: Mapping[str, Any]) -> None:
        await trio.sleep(0.2)  # the server's side of the handshake done
        _command(server, command + b"\n")
        await trio.sleep(0.3)  # its record on the client's socket

    fe = FakeEngine(on_gate=during_gate)
    res = err = None
    url = f"https://127.0.0.1:{server.port}/pay"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_answer_once_asked, server, log)
        with trio.fail_after(10):
            try:
                res = await client.perform(req(url, "POST", b"x", ca_file=tls.ca_file), fe.ctx)
            except SetupError as e:
                err = e
        nursery.cancel_scope.cancel()
        await client.aclose()
    return queued, res, err


@pytest.mark.parametrize("s_server", ["tls1_3"], indirect=True)
@pytest.mark.parametrize("command", [b"k", b"K"], ids=["key_update", "key_update_requested"])
async def test_a_tls13_key_update_before_the_request_refuses_nothing(
    client: HttpClient, tls: TlsFixture, s_server: Any, command: bytes, monkeypatch: Any
) -> None:
    queued, res, err = await _call(client, tls, s_server, command, monkeypatch)
    assert len(queued) == 1 and queued[0] > 0  # the KeyUpdate really waited at the check
    assert err is None and res is not None, err
    assert res.outcome is Outcome.COMMITTED and res.facts["status"] == 200


@pytest.mark.parametrize("s_server", ["tls1_2"], indirect=True)
async def test_a_tls12_hello_request_before_the_request_refuses_it_unwritten(
    client: HttpClient, tls: TlsFixture, s_server: Any, monkeypatch: Any
) -> None:
    queued, res, err = await _call(client, tls, s_server, b"r", monkeypatch)
    assert len(queued) == 1 and queued[0] > 0  # the HelloRequest really waited at the check
    assert res is None and isinstance(err, SetupError) and err.stage == "peer_spoke_first"
    time.sleep(0.2)  # anything written would have reached the server's log by now
    assert b"POST" not in s_server[1].read_bytes()
