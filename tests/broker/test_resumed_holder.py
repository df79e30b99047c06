"""A caller's resumed read (``fetch_result(from_chunk=N)``) shows the lease holder as its whole
fetch shows it -- the journal's keyed tag (``JournalReader.holder_tag``) -- never the recorded
``hostname:pid`` and never a different word for the same lease."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import trio

from affidavit.journal.reader_proofs import HOLDER_PREFIX
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import TOKEN_ENV, assert_ok, http_target, open_broker, write_config


@pytest.mark.trio
async def test_a_resumed_read_shows_the_holder_tag_of_the_whole_fetch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "tok-resumed-holder-" + "h" * 12)
    async with HostileServer.running(scripts.serve(Reply(200, body=b"x" * 300))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(30):
                env = await broker.call({"target": "api", "method": "GET", "path": "/"})
                assert_ok(broker, env)
                iid = str(env["invocation_id"])
                whole = await broker.fetch_result(iid)
                resumed = await broker.fetch_result(iid, from_chunk=0)
    shown = whole["evidence"]["lease"]["holder"]
    assert shown.startswith(HOLDER_PREFIX)
    assert resumed["evidence"]["lease"]["holder"] == shown
    assert socket.gethostname() not in repr(resumed)
    assert f":{os.getpid()}:" not in repr(resumed)
