"""Issue 15: a large result's redacted bytes are hashed beside the event loop
(affidavit/engine/hashing.py), while the chunks cut from them are sealed -- and the result is
exactly the one hashed in line: the same chunks stored, the same hashes, the same envelope,
however the response was cut into reads (seed, "Store chunks with sequence numbers and a final
completeness marker")."""

from __future__ import annotations

import hashlib
import itertools
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest
import trio

from affidavit.engine import RESULT_CHUNK
from affidavit.engine.hashing import OFF_THREAD, OffThreadHash
from affidavit.engine.sink import StreamSink
from affidavit.secrets.redaction import Redactor
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import assert_ok, http_target, open_broker, write_config
from .test_sink_chunks import SECRET, _Journal

MIB = 1 << 20


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
        [0, size],  # one read: hashed off the loop
        [*range(0, size, MIB), size],  # the adapter's largest reads
        [*range(0, size, RESULT_CHUNK - 7), size],  # below OFF_THREAD: hashed in line
        [0, 5, OFF_THREAD - 1, OFF_THREAD + 3, 2 * MIB + 1, size],  # both, mixed
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


class _Recorded:
    """A real SHA-256 that notes the thread and size of each update."""

    seen: ClassVar[list[tuple[int, int]]] = []

    def __init__(self, data: bytes = b"") -> None:
        self._h = _REAL()
        if data:
            self.update(data)

    def update(self, data: Any) -> None:
        self.seen.append((threading.get_ident(), len(data)))
        self._h.update(data)

    def copy(self) -> Any:
        return self._h.copy()

    def digest(self) -> bytes:
        return self._h.digest()

    def hexdigest(self) -> str:
        return self._h.hexdigest()


_REAL = hashlib.sha256


def test_a_large_piece_is_hashed_off_the_event_loops_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 1 MiB read's redacted bytes are hashed by a worker thread, not by the thread that runs
    the event loop (and seals the chunks); a small one in line."""
    monkeypatch.setattr(hashlib, "sha256", _Recorded)
    monkeypatch.setattr(_Recorded, "seen", [])
    body = b"z" * (MIB + 4096)
    loop: list[int] = []

    async def run() -> dict[str, Any]:
        loop.append(threading.get_ident())
        sink = StreamSink(_Journal(), "act_1", (SECRET,), keep_limit=0)  # type: ignore[arg-type]
        await sink("body", body[:MIB])
        await sink("body", body[MIB:])
        return await sink.finish()

    summary = trio.run(run)
    assert summary["body"]["sha256"] == "sha256:" + _REAL(body).hexdigest()
    large = [t for t, n in _Recorded.seen if n >= OFF_THREAD]
    small = [t for t, n in _Recorded.seen if 0 < n < OFF_THREAD]
    assert large and all(t != loop[0] for t in large)
    assert small and all(t == loop[0] for t in small)


def test_a_failure_while_hashing_off_the_loop_is_raised_to_the_next_use() -> None:
    class Broken:
        def update(self, data: Any) -> None:
            raise MemoryError("no room")

    async def run() -> None:
        h = OffThreadHash()
        h._sha = Broken()  # type: ignore[assignment]
        h.update(b"x" * OFF_THREAD)
        await h.settled()
        with pytest.raises(MemoryError):
            h.hexdigest()

    trio.run(run)


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
