"""End to end on SQLite: a real call whose loopback server sends part of a long body, then
closes, leaves that part's bytes in a segment file (spilled, never committed: the record is
``unknown``); a second call's long body commits.  ``affidavit journal reclaim`` then gives the
cut body's bytes back -- the segment's allocated size drops -- and the committed body reads
back byte-identical; ``affidavit journal verify`` passes."""

from __future__ import annotations

import os
from pathlib import Path

import trio

from affidavit.config import load_config
from affidavit.journal import JournalReader
from tests.http.hostile import HostileServer, Peer
from tests.journal import segkit as kit

from .helpers import http_target, open_broker, write_config
from .test_reclaim_cli import _cli

LIMIT = 30
CUT = 48 * 65536
"""What the first answer sends of the 4x longer body it announces, then closes (3 MiB)."""
WHOLE = kit.body(20, 77)
"""The second answer's body, sent whole (20 full chunks and a tail: it spills)."""


async def test_a_body_cut_mid_way_returns_its_segment_bytes_at_reclaim(
    tmp_path: Path, token: str
) -> None:
    async def script(peer: Peer) -> None:
        request = await peer.read_request()
        if request is None:
            return
        if "/cut" in request.target:
            await peer.send_raw(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (4 * CUT))
            await peer.send_raw(b"c" * CUT)
        else:
            head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(WHOLE)
            await peer.send_raw(head + WHOLE)
        await peer.close()

    async with HostileServer.running(script) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        db = Path(load_config(cfg).journal.location)
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                await broker.call({"target": "api", "method": "GET", "path": "/cut"})
                await broker.call({"target": "api", "method": "GET", "path": "/whole"})
                cut, whole = broker.journal.list_actions()
                assert cut.outcome.value == "unknown" and whole.outcome.value == "committed"
    [segment] = kit.segments(db)
    before = os.stat(segment).st_blocks * 512
    assert before >= CUT + len(WHOLE) - 4 * 65536 * 2  # both spilled (less what is held)

    done = await _cli("journal", "reclaim", "--journal", str(db), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert b"Traceback" not in done.stderr
    after = os.stat(segment).st_blocks * 512
    assert before - after >= CUT * 0.9, (before, after)
    with JournalReader.open(db) as reader:
        assert reader.verify().ok
        res = reader.read_result(whole.invocation_id)
        assert res is not None and res.streams["body"] == WHOLE
        assert reader.read_result(cut.invocation_id) is None
    verify = await _cli("journal", "verify", "--journal", str(db), cwd=tmp_path)
    assert verify.returncode == 0, verify.stdout + verify.stderr
