"""Results: sequenced sealed chunks, a completeness marker, fetch as a read (issue 3: results)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from affidavit.journal import ChunkLog, Journal, JournalError, ResultStoreFailed
from affidavit.statemachine import Event, EvidenceSource, ImpossibleEvent, Outcome, Retry
from affidavit.statemachine import EventKind as E

from ..helpers import happy, interrupted
from .conftest import Place


async def _completed(j: Journal, iid: str) -> None:
    for ev in happy(iid):
        await j.append(ev)


async def test_chunks_plus_marker_make_a_complete_result(place: Place) -> None:
    async with place.open() as j:
        await _completed(j, "inv-1")
        for i, part in enumerate([b"hello ", b"wor", b"ld"]):
            await j.put_result_chunk("inv-1", "stdout", i, part)
        await j.put_result_chunk("inv-1", "stderr", 0, b"warn")
        ev = await j.commit_result(Event(E.RESULT_COMMITTED, "inv-1"), summary={"exit_status": 0})
        assert ev.seq == 8
        assert ev.attrs["chunks"] == {"stdout": 3, "stderr": 1}
        assert ev.attrs["bytes"] == 15
        res = j.read_result("inv-1")
        assert res is not None
        assert res.streams == {"stdout": b"hello world", "stderr": b"warn"}
        assert res.summary == {"exit_status": 0}
        assert res.sha256 == ev.attrs["sha256"] and res.seq == ev.seq
        rec = j.record("inv-1")
        assert rec is not None and rec.evidence["result"]["sha256"] == res.sha256
    # Fetching again — from a fresh reader after a restart — is a read of the same bytes.
    with place.reader() as r:
        again = r.read_result("inv-1")
        assert again == res
        assert r.verify().ok


async def test_chunks_without_the_marker_are_never_a_complete_result(place: Place) -> None:
    async with place.open() as j:
        await _completed(j, "inv-1")
        await j.put_result_chunk("inv-1", "body", 0, b'{"partial":')
        assert j.read_result("inv-1") is None
        assert j.read_result("no-such-invocation") is None


async def test_a_gap_in_the_chunks_refuses_the_commit_and_writes_nothing(place: Place) -> None:
    async with place.open() as j:
        await _completed(j, "inv-1")
        await j.put_result_chunk("inv-1", "body", 0, b"a")
        await j.put_result_chunk("inv-1", "body", 2, b"c")
        with pytest.raises(JournalError, match="lacks chunk 1"):
            await j.commit_result(Event(E.RESULT_COMMITTED, "inv-1"), summary={})
        assert j.read_result("inv-1") is None
        assert j.events("inv-1")[-1].kind is E.REMOTE_RESPONSE_COMPLETE
        # Completing the stream lets the commit through.
        await j.put_result_chunk("inv-1", "body", 1, b"b")
        await j.commit_result(Event(E.RESULT_COMMITTED, "inv-1"), summary={})
        res = j.read_result("inv-1")
        assert res is not None and res.streams["body"] == b"abc"


async def test_a_logged_commit_takes_only_the_chunks_that_were_sealed(place: Place) -> None:
    """With the writer's ``ChunkLog`` the commit does not open and re-hash what is stored: it
    reads the stored chunks and refuses any that is not one the log recorded (another sealing
    of the same bytes, a chunk more); the marker carries the hashes
    taken as the chunks were written, which verify then checks against the stored blobs."""
    expect = {"body": hashlib.sha256(b"hello world").hexdigest()}
    commit = Event(E.RESULT_COMMITTED, "inv-1")
    async with place.open() as j:
        await _completed(j, "inv-1")
        log = ChunkLog()
        for i, part in enumerate([b"hello ", b"world"]):
            await (await j.post_result_chunk("inv-1", "body", i, part, log=log)).wait()
        await j.put_result_chunk("inv-1", "body", 1, b"world")  # same bytes, another nonce
        with pytest.raises(ResultStoreFailed, match="chunk 1 of stream 'body' differs"):
            await j.commit_result(commit, summary={}, expect=expect, log=log)
        await (await j.post_result_chunk("inv-1", "body", 1, b"world", log=log)).wait()
        await j.put_result_chunk("inv-1", "body", 2, b"!")  # a chunk the writer never wrote
        with pytest.raises(ResultStoreFailed, match="chunk 2 of stream 'body' differs"):
            await j.commit_result(commit, summary={}, expect=expect, log=log)
        await (await j.post_result_chunk("inv-1", "body", 2, b"!", log=log)).wait()
        await (await j.post_result_chunk("inv-1", "body", 0, b"hello ", log=log)).wait()
        await (await j.post_result_chunk("inv-1", "body", 1, b"world", log=log)).wait()
        with pytest.raises(ResultStoreFailed, match="stored streams differ"):  # lacks chunk 2
            await j.commit_result(commit, summary={}, expect=expect, log=log)
        assert j.read_result("inv-1") is None
        log = ChunkLog()
        await (await j.post_result_chunk("inv-1", "body", 0, b"hello ", log=log)).wait()
        await (await j.post_result_chunk("inv-1", "body", 1, b"world", log=log)).wait()
        ev = await j.commit_result(commit, summary={}, expect=expect, log=log)
        assert ev.attrs["chunks"] == {"body": 2} and ev.attrs["bytes"] == 11
        res = j.read_result("inv-1")
        assert res is not None and res.streams == {"body": b"hello world"}
    with place.reader() as r:
        assert r.read_result("inv-1") == res
        assert r.verify().ok


async def test_index_zero_starts_a_stream_over(place: Place) -> None:
    async with place.open() as j:
        await _completed(j, "inv-1")
        for i, part in enumerate([b"old-0", b"old-1", b"old-2"]):
            await j.put_result_chunk("inv-1", "body", i, part)
        await j.put_result_chunk("inv-1", "body", 0, b"new")
        ev = await j.commit_result(Event(E.RESULT_COMMITTED, "inv-1"), summary={})
        assert ev.attrs["chunks"] == {"body": 1}
        res = j.read_result("inv-1")
        assert res is not None and res.streams == {"body": b"new"}
        assert ev.attrs["bytes"] == 3


async def test_a_chunk_of_a_stale_generation_neither_drops_nor_adds_to_the_current_ones(
    place: Place,
) -> None:
    # Generation 0 dispatched and was closed unknown; generation 1 took the invocation over.
    async with place.open() as j:
        for ev in interrupted("inv-1"):
            await j.append(ev)
        lease = await j.acquire_lease("inv-1", "w2", ttl=60)
        assert lease.generation == 1
        await j.append(Event(E.DISPATCH_STARTED, "inv-1", {"generation": 1}), lease=("w2", 1))
        await j.put_result_chunk("inv-1", "body", 0, b"new-0", generation=1)
        for index in (0, 1):  # chunk 0 would start the stream over; chunk 1 would extend it
            with pytest.raises(ResultStoreFailed, match="stale generation 0"):
                await j.put_result_chunk("inv-1", "body", index, b"old", generation=0)
        posted = await j.post_result_chunk("inv-1", "body", 0, b"old", generation=0)
        with pytest.raises(ResultStoreFailed, match="stale generation 0"):
            await posted.wait()
        await j.put_result_chunk("inv-1", "body", 1, b"new-1", generation=1)
        await j.append(
            Event(
                E.REMOTE_RESPONSE_COMPLETE,
                "inv-1",
                {"outcome": "committed", "generation": 1},
                source=EvidenceSource.REMOTE_RESPONSE,
            )
        )
        with pytest.raises(ImpossibleEvent, match="stale generation 0"):
            await j.commit_result(Event(E.RESULT_COMMITTED, "inv-1", {"generation": 0}), summary={})
        ev = await j.commit_result(
            Event(E.RESULT_COMMITTED, "inv-1", {"generation": 1}), summary={}
        )
        assert ev.attrs["chunks"] == {"body": 2}
        res = j.read_result("inv-1")
        assert res is not None and res.streams == {"body": b"new-0new-1"}


async def test_a_chunk_of_a_closed_attempt_is_refused(place: Place) -> None:
    # Generation 0 dispatched; recovery closed it (interrupted, naming generation 0, which stays
    # current -- no retry yet).  Its stalled worker's chunks are not the record's any more.
    async with place.open() as j:
        for ev in interrupted("inv-1"):
            await j.append(ev)
        with pytest.raises(ResultStoreFailed, match="generation 0's attempt is closed"):
            await j.put_result_chunk("inv-1", "body", 0, b"late", generation=0)
        posted = await j.post_result_chunk("inv-1", "body", 0, b"late", generation=0)
        with pytest.raises(ResultStoreFailed, match="generation 0's attempt is closed"):
            await posted.wait()
        # The next attempt takes a new generation, and its chunks are its own.
        await j.acquire_lease("inv-1", "w2", ttl=60)
        await j.append(Event(E.DISPATCH_STARTED, "inv-1", {"generation": 1}), lease=("w2", 1))
        await j.put_result_chunk("inv-1", "body", 0, b"new", generation=1)
    with place.reader() as r:
        assert r.verify().ok


async def test_a_result_cannot_be_committed_before_a_complete_response(place: Place) -> None:
    async with place.open() as j:
        for ev in interrupted("inv-1"):
            await j.append(ev)
        await j.put_result_chunk("inv-1", "body", 0, b"x")
        with pytest.raises(ImpossibleEvent):
            await j.commit_result(Event(E.RESULT_COMMITTED, "inv-1"), summary={})
        assert j.read_result("inv-1") is None
        with pytest.raises(ValueError, match="RESULT_COMMITTED"):
            await j.commit_result(Event(E.RESULT_DELIVERED, "inv-1"), summary={})


async def test_no_chunk_may_be_added_after_the_commit(place: Place) -> None:
    async with place.open() as j:
        await _completed(j, "inv-1")
        await j.commit_result(Event(E.RESULT_COMMITTED, "inv-1"), summary={"empty": True})
        with pytest.raises(JournalError, match="already stored"):
            await j.put_result_chunk("inv-1", "body", 0, b"late")
        res = j.read_result("inv-1")
        assert res is not None and res.streams == {} and res.summary == {"empty": True}


async def test_an_altered_stored_result_is_an_error_not_a_result(place: Place) -> None:
    async with place.open() as j:
        await _completed(j, "inv-1")
        await j.put_result_chunk("inv-1", "body", 0, b"one")
        await j.put_result_chunk("inv-1", "body", 1, b"two")
        await j.commit_result(Event(E.RESULT_COMMITTED, "inv-1"), summary={})
    # Swap the two sealed chunks: each still decrypts only at its own index.
    place.tamper(
        "UPDATE result_chunks SET idx = 9 WHERE idx = 0",
        "UPDATE result_chunks SET idx = 0 WHERE idx = 1",
        "UPDATE result_chunks SET idx = 1 WHERE idx = 9",
    )
    with place.reader() as r, pytest.raises(JournalError):
        r.read_result("inv-1")
    place.tamper("DELETE FROM result_chunks WHERE idx = 0")
    reader = place.reader()
    with reader as r, pytest.raises(JournalError, match="incomplete"):
        r.read_result("inv-1")
    place.tamper("UPDATE results SET sha256 = 'f00d'")
    with place.reader() as r, pytest.raises(JournalError, match="marker"):
        r.read_result("inv-1")


async def test_stored_result_then_delivery_failure_means_fetch_result(place: Place) -> None:
    async with place.open() as j:
        first, *rest = happy("inv-1")
        # Naming its asker, as a record written now does: a record naming none is delivered
        # to no reader, and its hint is not fetch_result (tests/statemachine/test_seed_rules.py).
        await j.append(Event(first.kind, "inv-1", {**first.attrs, "requester": {"uid": 1000}}))
        for ev in rest:
            await j.append(ev)
        await j.put_result_chunk("inv-1", "body", 0, b"ok")
        await j.commit_result(Event(E.RESULT_COMMITTED, "inv-1"), summary={})
        await j.append(Event(E.RESULT_DELIVERY_FAILED, "inv-1"), barrier=True)
    with place.reader() as r:
        rec = r.record("inv-1")
        assert rec is not None
        assert (rec.outcome, rec.retry) == (Outcome.COMMITTED, Retry.FETCH_RESULT)
        assert r.read_result("inv-1") is not None


async def test_a_resealed_summary_is_caught_by_the_chained_hash(place: Place) -> None:
    """The summary (status, exit status, headers) is sealed *and* its hash rides in the chained
    RESULT_COMMITTED event: even someone holding the broker key cannot rewrite it unnoticed."""
    from affidavit.journal.sealing import BrokerKey, summary_aad

    async with place.open() as j:
        await _completed(j, "inv-s")
        await j.put_result_chunk("inv-s", "stdout", 0, b"ok")
        ev = await j.commit_result(Event(E.RESULT_COMMITTED, "inv-s"), summary={"exit_status": 0})
        assert len(ev.attrs["summary_sha256"]) == 64
    # Holding the broker key: the journal's key file.
    forged = BrokerKey.load(place.key_file).seal(b'{"exit_status":23}', summary_aad("inv-s"))
    place.tamper(f"UPDATE results SET summary = {place.blob(forged)} WHERE invocation_id = 'inv-s'")
    with place.reader() as r, pytest.raises(JournalError, match="summary differs"):
        r.read_result("inv-s")


async def test_a_resealed_chunk_is_caught_by_its_chained_hash_even_when_resumed(
    place: Place,
) -> None:
    """A chunk resealed with the broker key at its own index opens cleanly: only the chunk
    hashes the chained RESULT_COMMITTED carries catch it.  A resumed read (from that chunk, so
    the stream's whole plaintext hash is never taken) must fail on it too, and never hand the
    other bytes over as a verified chunk (seed: resume "from the last verified chunk")."""
    from affidavit.journal.sealing import BrokerKey, chunk_aad

    async with place.open() as j:
        await _completed(j, "inv-c")
        for idx, part in enumerate([b"one", b"two", b"six"]):
            await j.put_result_chunk("inv-c", "body", idx, part)
        await j.commit_result(Event(E.RESULT_COMMITTED, "inv-c"), summary={})
    forged = BrokerKey.load(place.key_file).seal(b"TWO", chunk_aad("inv-c", "body", 1))
    place.tamper(
        f"UPDATE result_chunks SET data = {place.blob(forged)} "
        "WHERE invocation_id = 'inv-c' AND stream = 'body' AND idx = 1"
    )
    with place.reader() as r:
        stream = r.result_stream("inv-c")
        assert stream is not None
        for start in (0, 1):
            got: list[bytes] = []
            with pytest.raises(JournalError, match="chunk 1 differs from its chained hash"):
                got.extend(stream.chunks("body", start))
            assert got == [b"one"][start:]  # what came before it, verified; nothing after
        with pytest.raises(JournalError, match="chunk 1"):
            r.read_result("inv-c")


CHUNK = 64 * 1024


def _body(chunks: int, tail: int) -> bytes:
    """``chunks`` full chunks of numbered lines (each chunk unlike any other) and ``tail``
    bytes more."""
    lines = b"".join(b"%07d\n" % i for i in range((chunks * CHUNK + tail) // 8 + 1))
    return lines[: chunks * CHUNK + tail]


async def _put_through_writer(j: Journal, iid: str, streams: dict[str, bytes]) -> Event:
    """Store a result as the engine's sink does: every chunk in order through the journal's
    ``result_writer``, a stream's short tail as ``last``, then the commit with its account."""
    writer = j.result_writer(iid)
    for stream, data in streams.items():
        for idx, start in enumerate(range(0, len(data), CHUNK)):
            part = data[start : start + CHUNK]
            await writer.put(stream, idx, part, last=len(part) < CHUNK)
    await writer.flush()
    expect = {s: hashlib.sha256(d).hexdigest() for s, d in streams.items()}
    return await j.commit_result(
        Event(E.RESULT_COMMITTED, iid), summary={"exit_status": 0}, expect=expect, writer=writer
    )


@pytest.mark.parametrize(
    ("chunks", "tail"),
    [(0, 5), (1, 0), (3, 100), (12, 7), (20, 0)],
    ids=["tiny", "one-chunk", "within-hold", "spills", "spills-exactly"],
)
async def test_a_result_put_through_the_writer_reads_back_whole_and_from_any_chunk(
    place: Place, chunks: int, tail: int
) -> None:
    """Whatever the backend keeps where (SQLite spills a long stream to segment files, a shared
    journal keeps every chunk in its tables), the result reads back byte for byte -- whole,
    and from any chunk on -- and verifies, in the writing process and in a fresh reader."""
    out, err = _body(chunks, tail), _body(1, 3)[::-1]
    async with place.open() as j:
        await _completed(j, "inv-w")
        ev = await _put_through_writer(j, "inv-w", {"stdout": out, "stderr": err})
        n_out = -(-len(out) // CHUNK)
        assert ev.attrs["chunks"] == {"stdout": n_out, "stderr": 2}
        assert ev.attrs["bytes"] == len(out) + len(err)
        res = j.read_result("inv-w")
        assert res is not None and res.streams == {"stdout": out, "stderr": err}
    with place.reader() as r:
        assert r.read_result("inv-w") == res
        stream = r.result_stream("inv-w")
        assert stream is not None
        for start in sorted({0, n_out // 2, n_out - 1}):
            assert b"".join(stream.chunks("stdout", start)) == out[start * CHUNK :]
        report = r.verify()
        assert report.ok and report.results == 1


async def test_a_second_attempt_through_the_writer_replaces_the_first_attempts_chunks(
    place: Place,
) -> None:
    """An attempt that stored chunks and never committed (its connection dropped) leaves them;
    the attempt that commits stores its own, and only its bytes are the result."""
    async with place.open() as j:
        await _completed(j, "inv-2")
        first = j.result_writer("inv-2")
        for idx in range(7):
            await first.put("stdout", idx, bytes([65 + idx]) * CHUNK)
        await first.drain()
        body = _body(6, 11)
        await _put_through_writer(j, "inv-2", {"stdout": body})
        res = j.read_result("inv-2")
        assert res is not None and res.streams == {"stdout": body}
    with place.reader() as r:
        assert r.verify().ok


async def test_a_checkpoint_already_verified_is_not_verified_again(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache of verified checkpoints compares every field of the row as stored with the
    one remembered (the writer's own, or a reader's first check): on both backends a row reads
    back equal, so a broker reading what it signed, or a reader reading twice, checks no
    signature again."""
    from affidavit.journal import checkpoints

    calls: list[int] = []
    real = checkpoints.signed_by

    def counting(cp: Any, keys: Any) -> bool:
        calls.append(cp.seq)
        return real(cp, keys)

    monkeypatch.setattr(checkpoints, "signed_by", counting)
    async with place.open() as j:
        await _completed(j, "inv-1")
        await j.put_result_chunk("inv-1", "body", 0, b"one")
        await j.commit_result(Event(E.RESULT_COMMITTED, "inv-1"), summary={})
        calls.clear()
        assert j.read_result("inv-1") is not None
        assert calls == []  # signed by this writer
    with place.reader() as r:
        assert r.read_result("inv-1") is not None
        assert len(calls) == 1
        assert r.read_result("inv-1", from_chunk=1) is not None
        assert len(calls) == 1
