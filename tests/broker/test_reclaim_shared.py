"""On a shared journal the engine stores a result's chunks as they arrive (``PostingWriter``), so
a call stopped mid-body -- here its caller cancels it while the body is still coming -- leaves
chunk rows that no RESULT_COMMITTED names; its record is closed ``unknown`` with or without them.
``Journal.reclaim_chunks`` drops exactly those rows; the journal still verifies, the record
reads as before."""

from __future__ import annotations

from pathlib import Path

import trio

from affidavit.journal import JournalReader
from tests.http.hostile import HostileServer, Peer
from tests.postgres import Cluster

from .helpers import http_target, open_broker, write_config

LIMIT = 30
POST = {"target": "api", "method": "POST", "path": "/export", "body": "{}"}
SENT = 5 * 65536  # five full chunks of a body that claims to be much longer


async def test_a_call_cancelled_mid_body_leaves_chunk_rows_that_reclaim_drops(
    pg: Cluster, pg_url: str, tmp_path: Path, token: str
) -> None:
    database = pg_url.rsplit("/", 1)[1]

    def rows() -> int:
        return int(pg.sql("SELECT count(*) FROM result_chunks", database)[0][0])

    async def script(peer: Peer) -> None:
        if await peer.read_request() is None:
            return
        head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (SENT * 4)
        await peer.send_raw(head + b"b" * SENT)
        await trio.sleep(LIMIT)  # the rest never comes

    journal = {
        "url": pg_url,
        "key_file": str(tmp_path / "shared.key"),
        "signing_key": str(tmp_path / "a.signing.key"),
    }
    async with HostileServer.running(script) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)}, journal=journal)
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                with trio.CancelScope() as caller:

                    async def cancel_once_stored() -> None:
                        while await trio.to_thread.run_sync(rows) < 2:
                            await trio.sleep(0.02)
                        caller.cancel()

                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(cancel_once_stored)
                        await broker.call(POST)
                assert caller.cancelled_caught
                (rec,) = broker.journal.list_actions()
                iid = rec.invocation_id
                assert rec.final and rec.outcome.value == "unknown", rec
                assert rec.code is not None and rec.code.value == "CALLER_CANCELLED"
                left = rows()
                assert left >= 2
                assert await broker.journal.reclaim_chunks() == [iid]
                assert rows() == 0
        assert len(srv.requests) == 1
    with JournalReader.open(pg_url, key_file=Path(journal["key_file"])) as reader:
        assert reader.verify().ok
        again = reader.record(iid)
        assert again is not None and again.state == rec.state and again.last_seq == rec.last_seq
        assert reader.read_result(iid) is None
