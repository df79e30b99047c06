"""A poll's answer cut off by the stop of embedded ``affidavit mcp`` is recorded undelivered.

The poll's result is delivered by the answer line that carries it (``Exchange.deliver``: the
transport's word that the line was written whole).  A client that does not read its stdout
while a large answer is written holds that write; SIGTERM's grace runs out, the stopped calls
get their recording wait, then the connection is cut -- the write with it -- and the poll's
result must be recorded RESULT_DELIVERY_FAILED (stored, fetchable), never RESULT_DELIVERED, nor
left stored with no delivery row.  The daemon's: tests/daemon/test_linked_answer_stop.py.
A real process, its real pipes; every wait bounded; no timing asserted.  The process runs with
the stop's fixed phases shortened (test_stop_bounded's ``MCP`` through ``mcp()``'s ``command``:
``RECORD_WAIT`` 1.25 s, so the stopped poll's recording wait is ``max(GRACE, RECORD_WAIT)`` =
2 s, not 5); the answer's write is still held past the grace and cut.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import trio

from tests.broker.helpers import http_target, write_config
from tests.daemon.kit import wait_until
from tests.http.hostile import HostileServer, Peer, Reply

from .conftest import JOB, wait_for
from .kit import PYTHON, WAIT
from .test_linked_delivery import OPERATIONS, mcp, poll_deliveries, submitted
from .test_protocol import call
from .test_stop_bounded import MCP

PAD = "x" * 900_000
"""A status document far larger than the stdout pipe takes (64 KiB on Linux): the test reads
what reached the client once the process ended, and checks it is less."""
GRACE = 2.0
"""Long enough for the poll's answer to be under way before it ends (its write then waits on
the pipe for good); the stop after it takes the recording wait too -- ``max(GRACE,
RECORD_WAIT)``, 2 s with the fixed phases shortened (``MCP``: ``RECORD_WAIT`` 1.25 s), not 5."""


async def jobs(peer: Peer) -> None:
    """A job API: a POST is accepted (202, a status resource); a GET -- the poll -- sets
    ``polled`` and is answered done, with ``PAD``."""
    done = Reply(200, body=json.dumps({"state": "done", "pad": PAD}).encode())
    while (req := await peer.read_request()) is not None:
        if req.method == "GET":
            peer.server.event("polled").set()
            await peer.respond(done)
        else:
            await peer.respond(JOB)


async def test_a_poll_answer_cut_off_by_the_stop_is_recorded_undelivered(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(jobs) as srv:
        cfg = write_config(tmp_path, {"jobs": http_target(srv.url + "/v1", operations=OPERATIONS)})
        with cfg.open("a", encoding="utf-8") as out:
            out.write(f"[service]\nshutdown_grace = {GRACE}\n")
        async with mcp(tmp_path, cfg, token, (PYTHON, "-c", MCP)) as raw:
            submission, op = await submitted(raw)
            await raw.send(call(2, "poll_operation", {"operation_id": op}))  # never read
            await wait_for(srv.event("polled"))
            raw.proc.send_signal(signal.SIGTERM)
            await wait_until(lambda: "signal 15: stopping" in raw.stderr(), "the signal is taken")
            assert await raw.exits() == 0
            assert raw.proc.stdout is not None
            got = len(raw._buffer)
            with trio.fail_after(WAIT):
                while data := await raw.proc.stdout.receive_some(1 << 16):
                    got += len(data)
        assert got < len(PAD), got  # the answer's write was held, never all sent
        async with mcp(tmp_path, cfg, token) as raw:
            assert await poll_deliveries(raw, submission) == [("RESULT_DELIVERY_FAILED", "deliver")]
        assert [r.method for r in srv.requests] == ["POST", "GET"]  # polled once, never again
    log = (tmp_path / "mcp.log").read_text()
    assert "the grace ran out: 1 call(s) stopped" in log
    assert "failed: Undelivered" in log  # the engine's line: no result's bytes in it
