"""The result sink's chunking (affidavit/engine/sink.py): however a response arrives -- in reads
of any size, a secret cut across them -- the chunks handed to the journal are the redacted stream
cut at every ``RESULT_CHUNK`` bytes, in order; the hash the sink reports is of exactly those
bytes; and ``fed`` is the hash of the bytes it was given, before redaction (seed, "Store chunks
with sequence numbers and a final completeness marker"; resume offsets are chunk indexes times
``RESULT_CHUNK``)."""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

import trio
from hypothesis import example, given, settings
from hypothesis import strategies as st

from affidavit.engine import RESULT_CHUNK
from affidavit.engine.sink import StreamSink
from affidavit.secrets.redaction import Redactor

SECRET = b"s3cr3t-t0ken-Zq9"


class _Writer:
    """Records each chunk put: (stream, index, bytes), and which were marked ``last``."""

    def __init__(self) -> None:
        self.chunks: list[tuple[str, int, bytes]] = []
        self.last: list[int] = []

    async def put(self, stream: str, index: int, data: bytes, *, last: bool = False) -> None:
        assert type(data) is bytes  # sealed later, on a thread: never a view of a buffer
        if last:
            self.last.append(index)
        self.chunks.append((stream, index, data))

    async def drain(self) -> None:
        return None

    async def flush(self) -> None:
        return None


class _Journal:
    def __init__(self) -> None:
        self.writer = _Writer()
        self.chunks = self.writer.chunks

    def result_writer(self, iid: str, generation: int | None = None) -> _Writer:
        return self.writer


@settings(max_examples=60, deadline=None)
@example(parts=[b"a" * 1000, SECRET], repeat=300, cuts=[1, 1010, 65536, 70000, 262144])
@example(parts=[b"b" * 4096], repeat=64, cuts=[RESULT_CHUNK, 3 * RESULT_CHUNK - 1])
# Read whole, 64 bytes past a chunk: the redactor holds back its widest match less one byte
# until ``finish``, which stored buffer and tail as one chunk of RESULT_CHUNK + 64 bytes.
@example(parts=[b"a" * 64], repeat=RESULT_CHUNK // 64 + 1, cuts=[])
@given(
    parts=st.lists(
        st.sampled_from([b"a" * 1000, b"\\u0073" + SECRET[1:], SECRET, b"%73", b"x"])
        | st.binary(max_size=300),
        max_size=40,
    ),
    repeat=st.integers(1, 700),
    cuts=st.lists(st.integers(0, 1 << 20), max_size=12),
)
def test_chunks_are_the_redacted_stream_cut_every_result_chunk_bytes(
    parts: list[bytes], repeat: int, cuts: list[int]
) -> None:
    body = b"".join(parts) * repeat
    bounds = [0, *sorted(c for c in cuts if c < len(body)), len(body)]
    journal = _Journal()
    sink = StreamSink(journal, "act_1", (SECRET,), keep_limit=1 << 30)  # type: ignore[arg-type]

    async def run() -> dict[str, dict[str, Any]]:
        for a, b in itertools.pairwise(bounds):
            await sink("body", body[a:b])
            # What the adapter was given so far, hashed once (AttemptContext.fed).
            assert sink.fed("body") == (b, hashlib.sha256(body[:b]).hexdigest())
        return await sink.finish()

    summary = trio.run(run)
    redacted = Redactor([SECRET]).sub(body)
    want = [redacted[i : i + RESULT_CHUNK] for i in range(0, len(redacted), RESULT_CHUNK)]
    assert [c for _, _, c in journal.chunks] == want
    assert [i for _, i, _ in journal.chunks] == list(range(len(want)))
    # Only a short last chunk is marked so (it is stored with the commit, not waited for).
    assert journal.writer.last == [len(want) - 1 for c in want[-1:] if len(c) < RESULT_CHUNK]
    if want:
        assert summary["body"] == {
            "sha256": "sha256:" + hashlib.sha256(redacted).hexdigest(),
            "bytes": len(redacted),
            "chunks": len(want),
        }
        kept = sink.kept()
        assert kept == {"body": redacted}
    assert sink.fed("body") == (len(body), hashlib.sha256(body).hexdigest())


def test_fed_of_a_stream_not_started_is_the_empty_hash() -> None:
    """``fed`` of a stream nothing was passed to (the HTTP adapter asks before the body's first
    byte) is no bytes and the SHA-256 of none -- a constant now, not a hash made per call."""
    sink = StreamSink(_Journal(), "act_1", (SECRET,), keep_limit=1 << 30)  # type: ignore[arg-type]
    assert sink.fed("body") == (0, hashlib.sha256(b"").hexdigest())
    assert sink.fed("other") == (0, hashlib.sha256(b"").hexdigest())


def test_the_sinks_scrub_is_its_redactors_own() -> None:
    """Issue 15: ``sink.scrub`` (a dozen values per call, ``Attempt.scrub``) is the redactor's
    bound method, not a sink method calling it -- and it scrubs as the redactor does."""
    sink = StreamSink(_Journal(), "act_1", (SECRET,), keep_limit=1 << 30)  # type: ignore[arg-type]
    assert getattr(sink.scrub, "__func__", None) is Redactor.scrub
    value = {"h": [SECRET.decode(), "clean"], "n": 3}
    assert sink.scrub(value) == Redactor([SECRET]).scrub(value)
    assert SECRET.decode() not in str(sink.scrub(value))
