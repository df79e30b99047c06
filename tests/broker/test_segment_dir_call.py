"""A call whose result is long enough for a segment file, on a SQLite journal whose
``<path>.results`` is a regular file (the daemon refuses to start on one:
tests/daemon/test_segment_dir_refused.py; an embedded broker, or one that appears later, still
meets it): the result cannot be stored, and the call answers a clean envelope --
``RESULT_STORE_FAILED`` in ``result_delivery``, retry never -- whose outcome is the record's
(the response's completion is durable: ``committed`` from it, per docs/contract.md), never a
committed result that is not there, and no traceback in any log line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio

from affidavit.config import load_config
from affidavit.journal import JournalReader
from tests.http.hostile import HostileServer, Peer
from tests.journal import segkit as kit

from .helpers import http_target, open_broker, write_config

LONG = kit.body(20, 77)
"""20 full chunks and a tail: past what is held in memory, so it goes to a segment file."""


async def test_a_long_result_with_results_a_file_is_a_clean_store_failure(
    tmp_path: Path, token: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def script(peer: Peer) -> None:
        if await peer.read_request() is None:
            return
        await peer.send_raw(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(LONG) + LONG)
        await peer.close()

    caplog.set_level(logging.DEBUG)
    async with HostileServer.running(script) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        db = Path(load_config(cfg).journal.location)
        Path(f"{db}.results").write_bytes(b"not a directory")
        with trio.fail_after(30):
            async with open_broker(cfg) as broker:
                env = await broker.call({"target": "api", "method": "GET", "path": "/long"})
    error = env["error"]
    assert error["code"] == "RESULT_STORE_FAILED", env
    assert (error["phase"], error["retry"]) == ("result_delivery", "never"), env
    assert env["evidence"]["dispatch_started"] is True, env
    assert "result" not in env and "body" not in env, sorted(env)
    iid = env["invocation_id"]
    with JournalReader.open(db) as reader:
        record = reader.record(iid)
        types = [e.kind.value for e in reader.events(iid)]
        assert record is not None and record.outcome.value == error["outcome"], (record, error)
        assert "RESULT_COMMITTED" not in types, types
        # ``committed`` only from the durable completion of the response, as the record says.
        assert error["outcome"] != "committed" or "REMOTE_RESPONSE_COMPLETE" in types, types
        assert reader.read_result(iid) is None
        assert reader.verify().ok
    assert not any(r.exc_info for r in caplog.records)
    assert "Traceback" not in caplog.text
