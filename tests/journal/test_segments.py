"""Long results in segment files beside a SQLite journal (``journal/segments.py``): where the
bytes go, that a committed marker only ever names synced bytes, that a segment edited, cut,
removed or named wrongly never reads as a result, and that a failed write or sync fails that
result alone -- never the journal."""

from __future__ import annotations

import errno
import hashlib
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.journal import Batch, Journal, JournalReader, ResultStoreFailed, results
from affidavit.journal import segments as seg_mod
from affidavit.journal.sealing import generate_auditor_keypair
from affidavit.journal.segments import IN_FLIGHT
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E

from . import segkit as kit
from .helpers import happy


async def test_a_result_within_the_held_chunks_is_stored_inline_without_a_segment(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    body = kit.body(seg_mod.HOLD, 99)
    async with Journal.open(db) as j:
        await kit.store(j, "inv-s", body)
        res = j.read_result("inv-s")
        assert res is not None and res.streams == {"body": body}
    assert kit.segments(db) == [] and not Path(f"{db}.results").exists()
    assert kit.inline(db, "inv-s") == list(range(seg_mod.HOLD + 1))
    assert kit.refs(db, "inv-s") == []


async def test_a_long_result_spills_its_full_chunks_to_a_segment_and_keeps_its_tail_inline(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    body = kit.body(30, 1234)
    async with Journal.open(db) as j:
        ev = await kit.store(j, "inv-l", body)
        assert ev.attrs["chunks"] == {"body": 31}
    [segment] = kit.segments(db)
    assert segment.name.endswith(".seg")
    assert os.stat(segment).st_mode & 0o777 == 0o600
    assert os.stat(segment.parent).st_mode & 0o777 == 0o700
    refs = kit.refs(db, "inv-l")
    assert [(a, s, i) for a, s, i, *_ in refs] == [(0, "body", i) for i in range(30)]
    assert {r[3] for r in refs} == {segment.name}
    assert kit.inline(db, "inv-l") == [30]  # the short tail
    # The segment holds sealed bytes only: no line of the body appears in it.
    assert b"0000100\n" not in segment.read_bytes()
    with JournalReader.open(db) as r:
        res = r.read_result("inv-l")
        assert res is not None and res.streams == {"body": body}
        stream = r.result_stream("inv-l")
        assert stream is not None
        assert b"".join(stream.chunks("body", 17)) == body[17 * kit.CHUNK :]
        report = r.verify()
        assert report.ok and report.results == 1


async def test_a_copy_without_its_results_directory_is_broken_and_says_why(
    tmp_path: Path,
) -> None:
    """A journal copied without ``<path>.results/`` cannot prove its long results: verify
    says so (their chunks read as altered), and names the missing directory as the likely
    cause instead of leaving the operator to suspect tampering."""
    db = tmp_path / "j.db"
    async with Journal.open(db) as j:
        await kit.store(j, "inv-l", kit.body(30, 10))
    segments = kit.segments(db)
    assert segments  # a long result: its full chunks are in a segment
    for segment in segments:
        segment.unlink()
    Path(f"{db}.results").rmdir()
    with JournalReader.open(db) as r:
        report = r.verify()
    assert not report.ok
    assert "stored result of invocation inv-l" in report.reason
    assert f"its results directory {db}.results is missing" in report.reason


async def test_every_spilled_byte_is_synced_before_the_commit_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The order the durability promise rests on: the segment's ``fdatasync`` covering every
    byte of the result returns before the transaction that writes the references commits."""
    db = tmp_path / "j.db"
    synced: dict[int, int] = {}  # fd -> bytes the last fdatasync that returned covered
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        size = os.fstat(fd).st_size
        real(fd)
        synced[fd] = max(synced.get(fd, 0), size)

    monkeypatch.setattr(seg_mod.os, "fdatasync", fdatasync)
    seen: list[int] = []
    async with Journal.open(db) as j:

        def before_commit(batch: Batch) -> None:
            refs = j.write_connection.execute("SELECT count(*) FROM result_segments").fetchone()
            if refs[0]:
                [segment] = kit.segments(db)
                seen.append(segment.stat().st_size)
                assert max(synced.values(), default=0) >= segment.stat().st_size

        j.before_commit = before_commit
        await kit.store(j, "inv-d", kit.body(40, 10))
    assert seen  # the check ran in the committing transaction


async def test_a_failed_segment_write_fails_that_result_and_the_next_one_is_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "j.db"
    real = os.pwritev
    calls = {"n": 0}

    def pwritev(fd: int, buffers: Any, pos: int) -> int:
        calls["n"] += 1
        if calls["n"] == 2:  # the second batch: the first is written
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, buffers, pos)

    monkeypatch.setattr(seg_mod.os, "pwritev", pwritev)
    async with Journal.open(db) as j:
        for ev in happy("inv-f"):
            await j.append(ev)
        writer = j.result_writer("inv-f")
        with trio.fail_after(kit.LIMIT):
            with pytest.raises(ResultStoreFailed, match="No space left") as info:
                for idx in range(40):
                    await writer.put(
                        "body", idx, kit.body(40)[idx * kit.CHUNK : (idx + 1) * kit.CHUNK]
                    )
                await writer.flush()
            assert str(db) in str(info.value)
            with pytest.raises(ResultStoreFailed):
                await j.commit_result(
                    Event(E.RESULT_COMMITTED, "inv-f"),
                    summary={},
                    expect={"body": hashlib.sha256(kit.body(40)).hexdigest()},
                    writer=writer,
                )
        assert j.read_result("inv-f") is None
        assert j.events("inv-f")[-1].kind is E.REMOTE_RESPONSE_COMPLETE
        await kit.store(j, "inv-g", kit.body(9, 1))  # the journal and its segment go on
        res = j.read_result("inv-g")
        assert res is not None and res.streams["body"] == kit.body(9, 1)
    with JournalReader.open(db) as r:
        assert r.verify().ok


async def test_a_failed_sync_fails_the_result_and_later_chunks_go_to_a_new_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an ``fdatasync`` error nothing past what an earlier sync covered can be trusted
    (the kernel may have dropped those pages): the result fails, and the segment takes no more
    bytes."""
    db = tmp_path / "j.db"
    kit.fail_a_sync(monkeypatch, armed=True)
    async with Journal.open(db) as j:
        for ev in happy("inv-e"):
            await j.append(ev)
        writer = await kit.put_all(j, "inv-e", kit.body(6))
        with trio.fail_after(kit.LIMIT), pytest.raises(ResultStoreFailed, match="Input/output"):
            await writer.flush()
        assert j.read_result("inv-e") is None
        await kit.store(j, "inv-h", kit.body(6, 2))
        res = j.read_result("inv-h")
        assert res is not None and res.streams["body"] == kit.body(6, 2)
    first, second = kit.segments(db)
    assert {r[3] for r in kit.refs(db, "inv-h")} <= {first.name, second.name}
    with JournalReader.open(db) as r:
        assert r.verify().ok


async def test_the_sink_runs_ahead_of_the_segment_thread_by_a_bounded_number_of_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the disk stalled, ``put`` waits once ``IN_FLIGHT`` chunks are queued: memory stays
    bounded however fast the response arrives."""
    db = tmp_path / "j.db"
    gate = kit.stall_writes(monkeypatch)
    put = 0
    async with Journal.open(db) as j:
        for ev in happy("inv-b"):
            await j.append(ev)
        writer = j.result_writer("inv-b")

        async def producer() -> None:
            nonlocal put
            for idx in range(3 * IN_FLIGHT):
                await writer.put("body", idx, bytes([idx]) * kit.CHUNK)
                put += 1

        try:
            with trio.fail_after(kit.LIMIT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(producer)
                    await trio.sleep(0.3)
                    assert seg_mod.HOLD < put <= IN_FLIGHT
                    gate.set()
                await writer.flush()
        finally:
            gate.set()  # the segment thread must not stay stalled past the test
        assert put == 3 * IN_FLIGHT


async def test_an_out_of_order_chunk_is_refused(tmp_path: Path) -> None:
    async with Journal.open(tmp_path / "j.db") as j:
        writer = j.result_writer("inv-o")
        await writer.put("body", 0, b"x" * kit.CHUNK)
        with pytest.raises(ValueError, match="out of order"):
            await writer.put("body", 2, b"y" * kit.CHUNK)


async def test_a_commit_that_is_refused_writes_none_of_the_results_rows(tmp_path: Path) -> None:
    """The references and inline chunks are written only once RESULT_COMMITTED is accepted: a
    second commit of a stored result (refused by the lifecycle) leaves the first intact."""
    db = tmp_path / "j.db"
    body = kit.body(8, 8)
    async with Journal.open(db) as j:
        await kit.store(j, "inv-r", body)
        again = await kit.put_all(j, "inv-r", kit.body(9))
        with pytest.raises(Exception, match="RESULT_COMMITTED"):
            await j.commit_result(
                Event(E.RESULT_COMMITTED, "inv-r"),
                summary={},
                expect={"body": hashlib.sha256(kit.body(9)).hexdigest()},
                writer=again,
            )
        res = j.read_result("inv-r")
        assert res is not None and res.streams["body"] == body
    with JournalReader.open(db) as r:
        assert r.verify().ok


async def test_interleaved_results_share_the_segment_and_each_reads_back(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    bodies = {f"inv-{i}": kit.body(10 + i, i) for i in range(4)}
    async with Journal.open(db) as j:
        with trio.fail_after(kit.LIMIT):
            async with trio.open_nursery() as nursery:
                for iid, body in bodies.items():
                    nursery.start_soon(kit.store, j, iid, body)
    assert len(kit.segments(db)) == 1
    with JournalReader.open(db) as r:
        for iid, body in bodies.items():
            res = r.read_result(iid)
            assert res is not None and res.streams["body"] == body
        report = r.verify()
        assert report.ok and report.results == 4


async def test_auditor_copies_of_a_long_result_open_for_the_auditor_alone(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    private, public = tmp_path / "auditor.pem", tmp_path / "auditor.pub"
    generate_auditor_keypair(private, public)
    body = kit.body(9, 9)
    async with Journal.open(db, auditor_public_key=public) as j:
        await kit.store(j, "inv-a", body)
    assert [r[:3] for r in kit.refs(db, "inv-a") if r[0] == 1] == [(1, "body", i) for i in range(9)]
    with JournalReader.open(db) as r:
        audited = r.audit_result("inv-a", private)
        assert audited is not None and audited.streams["body"] == body
        assert r.verify().ok


def _spill_and_stop(db: str) -> None:
    """Child process: spill a long result's chunks, flush them, then die before the commit."""

    async def main() -> None:
        async with Journal.open(db) as j:
            for ev in happy("inv-c"):
                await j.append(ev)
            writer = await kit.put_all(j, "inv-c", kit.body(10))
            await writer.flush()
            os._exit(0)

    trio.run(main)


def test_a_crash_before_the_commit_leaves_bytes_no_row_names_and_no_result(tmp_path: Path) -> None:
    import multiprocessing

    db = tmp_path / "j.db"
    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(target=_spill_and_stop, args=(str(db),))
    child.start()
    child.join(kit.LIMIT)
    assert child.exitcode == 0
    [segment] = kit.segments(db)
    assert segment.stat().st_size >= 10 * kit.CHUNK
    with JournalReader.open(db) as r:
        assert r.read_result("inv-c") is None
        assert r.verify().ok
    assert kit.refs(db, "inv-c") == []


async def test_two_tasks_waiting_on_one_writer_are_both_woken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An adapter may feed two streams from two tasks (nothing forbids it): both park on
    back-pressure, and both go on once the disk does."""
    gate = kit.stall_writes(monkeypatch)
    done: list[str] = []
    async with Journal.open(tmp_path / "j.db") as j:
        writer = j.result_writer("inv-2")

        async def producer(stream: str) -> None:
            for idx in range(2 * IN_FLIGHT):
                await writer.put(stream, idx, bytes([idx]) * kit.CHUNK)
            done.append(stream)

        try:
            with trio.fail_after(kit.LIMIT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(producer, "stdout")
                    await trio.sleep(0.2)  # parked on back-pressure
                    nursery.start_soon(producer, "stderr")
                    await trio.sleep(0.2)  # parked as well
                    gate.set()
        finally:
            gate.set()
    assert sorted(done) == ["stderr", "stdout"]


async def test_a_failed_sync_of_the_journals_directory_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The segment directory's entry in the journal's directory is synced before anything in it
    is referenced: a failed sync fails that result, and the next segment tries again."""
    db = tmp_path / "j.db"
    real = seg_mod._fsync_dir
    synced: list[Path] = []

    def fsync_dir(path: Path) -> None:
        if path == tmp_path and not synced:
            synced.append(Path("failed"))
            raise OSError(errno.EIO, "Input/output error")
        real(path)
        synced.append(path)

    monkeypatch.setattr(seg_mod, "_fsync_dir", fsync_dir)
    async with Journal.open(db) as j:
        for ev in happy("inv-1"):
            await j.append(ev)
        with trio.fail_after(kit.LIMIT), pytest.raises(ResultStoreFailed, match="Input/output"):
            writer = await kit.put_all(j, "inv-1", kit.body(8))
            await writer.flush()
        await kit.store(j, "inv-2", kit.body(8))
    assert synced[0] == Path("failed") and tmp_path in synced[1:]


@pytest.mark.parametrize("error", [OSError(errno.EIO, "Input/output error"), AttributeError()])
async def test_a_sync_that_cannot_be_done_fails_the_flush_and_never_hangs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    """Whatever the sync raises (an I/O error; a platform without the call), the result fails
    and the sync thread goes on -- a flush never waits for a thread that died.  And every
    segment a failed sync retired is closed: no descriptor is kept per failed result."""

    def broken(fd: int) -> None:
        raise error

    monkeypatch.setattr(seg_mod.os, "fdatasync", broken)
    async with Journal.open(tmp_path / "j.db") as j:
        before = len(os.listdir("/proc/self/fd"))
        for i in range(12):
            writer = await kit.put_all(j, f"inv-{i}", kit.body(6))
            with trio.fail_after(kit.LIMIT), pytest.raises(ResultStoreFailed):
                await writer.flush()
        after = len(os.listdir("/proc/self/fd"))
    assert after - before <= 2  # the current segment (and a transient one)
    assert len(kit.segments(tmp_path / "j.db")) == 12


async def test_a_writer_takes_no_chunk_once_flushed_and_a_commit_names_only_synced_bytes(
    tmp_path: Path,
) -> None:
    async with Journal.open(tmp_path / "j.db") as j:
        for ev in happy("inv-p"):
            await j.append(ev)
        writer = await kit.put_all(j, "inv-p", kit.body(6))
        await writer.flush()
        with pytest.raises(ValueError, match="already flushed"):
            await writer.put("body", 6, b"Z" * kit.CHUNK)
        unflushed = await kit.put_all(j, "inv-q", kit.body(6))
        with pytest.raises(ValueError, match="expect"):
            await j.commit_result(Event(E.RESULT_COMMITTED, "inv-p"), summary={}, writer=writer)
        commit = results.commit_op(
            unflushed._store._key,
            None,
            Event(E.RESULT_COMMITTED, "inv-q"),
            {},
            {"body": hashlib.sha256(kit.body(6)).hexdigest()},
            writer=unflushed,
        )
        # The op itself refuses a writer that was not flushed (a caller that skipped
        # commit_result's own flush), before anything is written.
        with pytest.raises(ResultStoreFailed, match="not flushed"):
            await j._writer.submit(commit, barrier=True, result_store=True)
        assert j.read_result("inv-q") is None


async def test_closing_the_journal_waits_for_the_segment_threads_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing lets the segment threads finish a sync under way; that wait must not hold the
    event loop (a daemon closing its journal still answers, times out, shuts down).  The sync
    here returns only once a task on the loop has run -- or after 5 s, and the order shows."""
    released, entered = threading.Event(), threading.Event()
    real = os.fdatasync

    def gated(fd: int) -> None:
        entered.set()
        released.wait(5)
        real(fd)

    monkeypatch.setattr(seg_mod.os, "fdatasync", gated)
    order: list[str] = []

    async def release() -> None:
        await trio.sleep(0.05)
        order.append("loop ran")
        released.set()

    with trio.fail_after(kit.LIMIT):
        async with trio.open_nursery() as nursery:
            async with Journal.open(tmp_path / "j.db") as j:
                await kit.put_all(j, "inv-c", kit.body(70))  # over 4 MiB: a sync is asked
                # ... and under way when the journal closes (the segment thread may lag).
                await trio.to_thread.run_sync(entered.wait, 10)
                nursery.start_soon(release)
            order.append("closed")
    assert order == ["loop ran", "closed"]


async def test_a_chunk_that_cannot_be_sealed_fails_the_result_and_never_hangs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A sealing failure once counted the chunk as queued before it was sealed: drain() then
    # waited for a chunk no thread would ever write.
    db = tmp_path / "j.db"
    async with Journal.open(db) as j:
        for ev in happy("inv-s"):
            await j.append(ev)
        writer = j.result_writer("inv-s")
        store = writer._store
        real = store._seal
        calls = {"n": 0}

        def seal(w: Any, stream: str, index: int, plain: bytes) -> Any:
            calls["n"] += 1
            if calls["n"] == 20:
                raise RuntimeError("key gone")
            return real(w, stream, index, plain)

        monkeypatch.setattr(store, "_seal", seal)
        data = kit.body(40)
        with trio.fail_after(kit.LIMIT):
            with pytest.raises(ResultStoreFailed, match="sealing a result chunk failed") as info:
                for idx in range(40):
                    await writer.put("body", idx, data[idx * kit.CHUNK : (idx + 1) * kit.CHUNK])
            assert "key gone" not in str(info.value)  # the exception's text is not repeated
            with pytest.raises(ResultStoreFailed):
                await writer.flush()
            with pytest.raises(ResultStoreFailed):
                await j.commit_result(
                    Event(E.RESULT_COMMITTED, "inv-s"),
                    summary={},
                    expect={"body": hashlib.sha256(data).hexdigest()},
                    writer=writer,
                )
        assert j.read_result("inv-s") is None
        await kit.store(j, "inv-t", kit.body(9, 1))  # the store goes on
        res = j.read_result("inv-t")
        assert res is not None and res.streams["body"] == kit.body(9, 1)
