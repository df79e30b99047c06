"""What a delivered answer holds while it is written, and what the answer budget counts of it
(audit 50, item 3): 100 clients not reading a 0.9 MB answer each took the daemon from 58 to
392 MB while the budget counted 0.9 MB each -- the sink's copies of the result kept for the
envelope, the segment writer's last chunks and the envelope's decoded text stayed referenced
beside the encoding for as long as the write waited.  Now the copies are dropped once the
envelope is rendered, and the decoded text the engine keeps is counted beside the encoding.
Seen with ``tracemalloc`` at the moment the answer is handed to the socket; RSS is measured by
tests/benchmarks/slow_readers.py, never here."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.client import Client
from affidavit.daemon import h11server
from affidavit.engine import RESULT_CHUNK
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import Reply, scripts

from .kit import WAIT, in_process
from .test_answer_budget import _servers

BIG = b"x" * 900_000
COPIES = ("affidavit/engine/sink.py", "journal/segments.py")
"""Where the engine's own copies of a result's bytes are made (kept chunks, sealed chunks)."""


async def test_a_delivered_answer_holds_its_encoding_and_decoded_text_and_no_engine_copies(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    servers = _servers(monkeypatch)
    seen: dict[str, Any] = {}
    write = h11server.Connection.answer

    async def answer(
        self: h11server.Connection,
        status: int,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        *,
        close: bool,
    ) -> None:
        if len(body) > len(BIG) and not seen:  # the envelope's answer, about to be written
            gc.collect()
            seen["snapshot"] = tracemalloc.take_snapshot()
            seen["held"], seen["encoded"] = self.server.answers, len(body)
        await write(self, status, headers, body, close=close)

    monkeypatch.setattr(h11server.Connection, "answer", answer)
    monkeypatch.setenv(TOKEN_ENV, token)
    tracemalloc.start(12)
    try:
        async with in_process(tmp_path, scripts.serve(Reply(200, body=BIG))) as (_srv, socket):
            with trio.fail_after(WAIT):
                async with Client.open(socket) as client:
                    envelope = await client.call({"target": "api", "method": "GET", "path": "/"})
    finally:
        tracemalloc.stop()
    assert envelope["result"]["body"] == BIG.decode()
    copies = sum(
        trace.size
        for trace in seen["snapshot"].traces
        if any(f.filename.endswith(COPIES) for f in trace.traceback)
    )
    assert copies < RESULT_CHUNK, copies  # before: ~1.7 MB, kept and sealed chunks
    # Its encoding and, beside it, the decoded text the engine keeps until it is written.
    assert seen["held"] >= seen["encoded"] + len(BIG), seen
    assert {s.answers for s in servers} == {0}  # let go once written
