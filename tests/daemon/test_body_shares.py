"""The request-body budget is shared out by uid as the answer budget is (``held.Shares``): one
uid holds half of it at most, so another uid's large call is read while the first holds all it
may.  17 connections of one uid each declaring 16 MiB and dripping a byte every 7 s kept another
uid's 200 KiB call at 503 ``BODIES_IN_FLIGHT`` for as long as they liked (audit 53)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.daemon.http import FREE_BODY
from tests.http.hostile import Reply, scripts

from .kit import NOBODY, WAIT, as_user, client_env, in_process, run

MIB = 1024 * 1024

_VICTIM = """
import json, socket, sys
body = json.dumps({"pad": "v" * 200_000}).encode()
with socket.socket(socket.AF_UNIX) as s:
    s.settimeout(30)
    s.connect(sys.argv[1])
    s.sendall(b"POST /v1/calls HTTP/1.1\\r\\nhost: a\\r\\nconnection: close\\r\\n"
              b"content-length: %d\\r\\n\\r\\n%s" % (len(body), body))
    got = b""
    while data := s.recv(65536):
        got += data
head, _, rest = got.partition(b"\\r\\n\\r\\n")
print(json.dumps({"head": head.decode("latin-1"), "body": rest.decode("utf-8", "replace")}))
"""


def _servers(monkeypatch: pytest.MonkeyPatch, **knobs: Any) -> list[Any]:
    """The daemon's listeners (``admission.Server``) as it makes them, with ``knobs``."""
    from affidavit.daemon import server as daemon_server
    from affidavit.daemon.admission import Server

    made: list[Any] = []

    def make(*args: Any, **kwargs: Any) -> Server:
        made.append(Server(*args, **{**kwargs, **knobs}))
        return made[-1]

    monkeypatch.setattr(daemon_server, "Server", make)
    return made


async def _held_or_refused(stream: trio.SocketStream, server: Any, before: int, n: int) -> bool:
    """True once ``server`` holds ``n`` more body bytes than ``before``; False if the
    connection is answered (its 503) first."""
    with trio.fail_after(WAIT):
        while server.bodies < before + n:
            with trio.move_on_after(0.02):
                await stream.receive_some(65536)
                return False
    return True


async def test_one_uid_holds_half_the_body_budget_and_another_uid_is_read(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    shared_socket_dir: Path,
) -> None:
    caplog.set_level(logging.INFO, "affidavit.daemon")
    budget = 32 * MIB  # the least any daemon has (twice MAX_BODY): 8 bodies of 4 MiB fill it
    servers = _servers(monkeypatch, body_budget=budget)
    quarter = budget // 4
    service = {"allow_uids": [os.getuid(), NOBODY]}
    async with in_process(tmp_path, scripts.serve(Reply(200)), service=service) as (_, socket):
        # The other uid reaches the same socket through the shared directory (a hard link:
        # a unix socket is its inode), in the group it may use, as the socket-group deployment.
        reachable = shared_socket_dir / "s.sock"
        os.link(socket, reachable)
        os.chown(reachable, -1, NOBODY)
        server = servers[0]
        head = b"POST /v1/calls HTTP/1.1\r\nhost: a\r\ncontent-length: %d\r\n\r\n"
        held, streams = [], []
        try:
            for _ in range(4):  # this uid's four bodies, one byte short each: being read
                stream = await trio.open_unix_socket(str(socket))
                streams.append(stream)
                before = server.bodies
                try:
                    await stream.send_all(head % (quarter + FREE_BODY + 1))
                    await stream.send_all(b"a" * (quarter + FREE_BODY))
                except trio.BrokenResourceError:  # answered 503 and closed while it sent
                    held.append(False)
                    continue
                held.append(await _held_or_refused(stream, server, before, quarter))
            # Half the budget is this uid's: two are held, the rest refused.
            assert held == [True, True, False, False], held
            assert server.bodies == budget // 2
            victim = await run(as_user(NOBODY, "-c", _VICTIM, str(reachable)), env=client_env())
        finally:
            for stream in streams:
                await stream.aclose()
    assert victim.returncode == 0, victim
    answer = json.loads(victim.stdout)
    # Read whole, then refused as no action (it has no target): not 503 BODIES_IN_FLIGHT.
    assert '"code":"MISSING_FIELD"' in answer["body"], answer
    warnings = [r.getMessage() for r in caplog.records if "BODIES_IN_FLIGHT" in r.getMessage()]
    assert len(warnings) == 1 and f"uid {os.getuid()}" in warnings[0], warnings
