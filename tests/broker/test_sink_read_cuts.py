"""A large result is the same however the response was cut into reads: the same chunks stored,
the same hashes, the same envelope (seed, "Store chunks with sequence numbers and a final
completeness marker").  Kept from an off-thread hashing change that was reverted (issue 15: it
cost wall time on a 2-core machine); the sink's in-line hashing must meet the same bar."""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path
from typing import Any

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.engine import RESULT_CHUNK
from affidavit.engine.sink import StreamSink
from affidavit.secrets.redaction import Redactor
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import assert_ok, http_target, open_broker, write_config
from .test_sink_chunks import SECRET, _Journal

MIB = 1 << 20
BIG = 256 * 1024
"""A piece this long or longer (the size the reverted change hashed apart)."""


def _body(secret: bytes) -> bytes:
    """3 MiB and a bit of text with ``secret`` echoed near the start, across the 1 MiB mark
    (where a large read ends) and at the very end."""
    line = b"%07d a line of a large response, nothing secret in it......\n"
    text = b"".join(line % i for i in range(3 * MIB // len(line % 0) + 1))
    cut = MIB - len(secret) // 2
    return text[:100] + secret + text[100:cut] + secret + text[cut:] + secret


def _sink_run(body: bytes, bounds: list[int]) -> tuple[list[bytes], dict[str, Any], tuple]:
    journal = _Journal()
    sink = StreamSink(journal, "act_1", (SECRET,), keep_limit=0)  # type: ignore[arg-type]

    async def run() -> tuple[dict[str, Any], tuple]:
        for a, b in itertools.pairwise(bounds):
            await sink("body", body[a:b])
        summary = await sink.finish()
        return summary, (sink.fed("body"), sink.expected(), sink.digest())

    summary, rest = trio.run(run)
    return [c for _, _, c in journal.chunks], summary, rest


def test_the_stored_chunks_and_hashes_do_not_depend_on_how_the_reads_were_cut() -> None:
    body = _body(SECRET)
    redacted = Redactor([SECRET]).sub(body)
    assert redacted != body
    size = len(body)
    cuttings = [
        [0, size],  # one read
        [*range(0, size, MIB), size],  # the adapter's largest reads
        [*range(0, size, RESULT_CHUNK - 7), size],  # below BIG
        [0, 5, BIG - 1, BIG + 3, 2 * MIB + 1, size],  # mixed
    ]
    runs = [_sink_run(body, b) for b in cuttings]
    want = [redacted[i : i + RESULT_CHUNK] for i in range(0, len(redacted), RESULT_CHUNK)]
    digest = hashlib.sha256(redacted).hexdigest()
    for chunks, summary, (fed, expected, _) in runs:
        assert chunks == want
        assert summary["body"] == {
            "sha256": "sha256:" + digest,
            "bytes": len(redacted),
            "chunks": len(want),
        }
        assert expected == {"body": digest}
        assert fed == (size, hashlib.sha256(body).hexdigest())
    assert len({r[2][2] for r in runs}) == 1  # the result's whole hash too


async def test_a_large_echoing_response_is_stored_and_delivered_as_hashed_in_line(
    tmp_path: Path, token: str
) -> None:
    """End to end, reads of up to 1 MiB: the delivered body is the redacted response, its hash
    the hash of exactly those bytes, and what ``fetch_result`` reads back is the same result."""
    body = _body(f"Bearer {token}".encode())
    async with HostileServer.running(scripts.serve(Reply(200, body=body))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(30):
                env = await broker.call({"target": "api", "method": "GET", "path": "/big"})
                assert_ok(broker, env)
                fetched = await broker.fetch_result(env["invocation_id"])
    assert fetched is not None
    stored = fetched["result"]["body"].encode()
    assert token.encode() not in stored and stored.count(b"[REDACTED]") == 3
    assert stored == Redactor([token.encode(), f"Bearer {token}".encode()]).sub(body)
    digest = "sha256:" + hashlib.sha256(stored).hexdigest()
    streams = env["result"]["by_reference"]["streams"]
    assert streams["body"]["sha256"] == digest and streams["body"]["bytes"] == len(stored)
    assert env["result"]["sha256"] == fetched["result"]["sha256"]
    assert env["result"]["sha256"] == env["evidence"]["result"]["sha256"]


def _sink_run_arrays(body: bytes, bounds: list[int]) -> tuple[list[bytes], dict[str, Any], tuple]:
    """``_sink_run`` with every read a bytearray, as h11 hands a body read over uncopied
    (adapters/http/receive_buffer.py), each emptied out after the sink took it: the sink must
    keep nothing that aliases a read."""
    journal = _Journal()
    sink = StreamSink(journal, "act_1", (SECRET,), keep_limit=1 << 30)  # type: ignore[arg-type]

    async def run() -> tuple[dict[str, Any], tuple]:
        for a, b in itertools.pairwise(bounds):
            read = bytearray(body[a:b])
            await sink("body", read)  # type: ignore[arg-type]
            read[:] = b"\0" * len(read)
        summary = await sink.finish()
        return summary, (sink.fed("body"), sink.expected(), sink.digest(), sink.kept())

    summary, rest = trio.run(run)
    return [c for _, _, c in journal.chunks], summary, rest


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 3 * MIB + 200), max_size=8),
    st.lists(st.integers(0, 3 * MIB), max_size=3),
)
def test_bytearray_reads_store_what_bytes_reads_store(cuts: list[int], echoes: list[int]) -> None:
    body = _body(SECRET)
    for at in echoes:  # more echoes, anywhere: across read and chunk boundaries
        body = body[:at] + SECRET + body[at:]
    bounds = sorted({0, len(body), *(c % (len(body) + 1) for c in cuts)})
    as_bytes = _sink_run(body, bounds)
    chunks, summary, (fed, expected, digest, kept) = _sink_run_arrays(body, bounds)
    assert chunks == as_bytes[0] and all(type(c) is bytes for c in chunks)
    assert summary == as_bytes[1]
    assert (fed, expected, digest) == as_bytes[2]
    assert kept == {"body": b"".join(chunks)}
