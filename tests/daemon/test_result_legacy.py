"""A stored result from before per-chunk hashes (``StreamInfo.sealed`` None) answered by the
daemon (``affidavit/daemon/results.py``): such a stream can only be verified whole, and each
``ResultStream.chunks`` call of it decrypts it whole -- read a few chunks a trip, an answer of
N chunks decrypted the stream about N/4 + N/64 times, each trip holding all of it.  Now it is
read once per answer, that read's size held of the answer budget first.

The stream here is a real ``ResultStream`` over chunks sealed with a real broker key; only the
views' thread trips (``Api.read``) and the reader holding the result are stand-ins.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from affidavit.daemon import results
from affidavit.engine import RESULT_CHUNK, Deferred
from journal.results_read import ResultStream, StreamInfo
from journal.sealing import BrokerKey, chunk_aad

BODY = ("x" * (RESULT_CHUNK - 1) + "\u00e9" + "y" * (8 * RESULT_CHUNK)).encode()
CHUNKS = -(-len(BODY) // RESULT_CHUNK)  # ten: three pieces, one scan trip


ASKER = object()
"""The asker whose fetch reads (the daemon's ``shares.Asker``)."""


class _Views:
    """``Api.read`` run at once, on a reader whose stored result is ``stream``."""

    def __init__(self, stream: ResultStream) -> None:
        self.stream = stream

    def result_stream(self, invocation_id: str) -> ResultStream:
        return self.stream

    async def read(self, fn: Any, asker: Any) -> Any:
        assert asker == ASKER  # the fetch's asker reads in its share (``Api.read``)
        return fn(self)


def _legacy(tmp_path: Path) -> tuple[_Views, list[int]]:
    """A stream from before per-chunk hashes, and the chunk reads its fetches make."""
    key = BrokerKey.create(tmp_path / "broker.key")
    sealed = [
        key.seal(BODY[i * RESULT_CHUNK : (i + 1) * RESULT_CHUNK], chunk_aad("inv", "body", i))
        for i in range(CHUNKS)
    ]
    reads: list[int] = []

    def fetch(stream: str, idx: int) -> bytes:
        reads.append(idx)
        return sealed[idx]

    info = StreamInfo(CHUNKS, len(BODY), hashlib.sha256(BODY).hexdigest(), None, None)
    return _Views(ResultStream("inv", 7, "whole", {}, {"body": info}, fetch, key)), reads


async def test_a_stream_from_before_per_chunk_hashes_is_read_once_per_answer(
    tmp_path: Path,
) -> None:
    views, reads = _legacy(tmp_path)
    held: list[int] = []
    plan = await results._scan(
        views, ASKER, Deferred("inv", "body", 0, CHUNKS, "whole"), held.append
    )  # type: ignore[arg-type]
    written = [piece async for piece in results._pieces(views, ASKER, plan)]  # type: ignore[arg-type]
    assert b"".join(written) == json.dumps(BODY.decode())[1:-1].encode()
    assert sorted(reads) == list(range(CHUNKS))  # each chunk decrypted once, not per trip
    assert held == [2 * len(BODY)]


async def test_its_read_is_refused_before_a_chunk_when_the_budget_has_no_room(
    tmp_path: Path,
) -> None:
    views, reads = _legacy(tmp_path)

    def full(n: int) -> None:
        raise results.AnswersInFlight(503, "ANSWERS_IN_FLIGHT", "full")

    with pytest.raises(results.AnswersInFlight):
        await results._scan(views, ASKER, Deferred("inv", "body", 2, CHUNKS, "whole"), full)  # type: ignore[arg-type]
    assert reads == []
