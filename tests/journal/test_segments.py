"""Long results in segment files beside a SQLite journal (``journal/segments.py``): where the
bytes go, that a committed marker only ever names synced bytes, that a segment edited, cut,
removed or named wrongly never reads as a result, and that a failed write or sync fails that
result alone -- never the journal."""

from __future__ import annotations

import errno
import hashlib
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.journal import Batch, Journal, JournalError, JournalReader, ResultStoreFailed
from affidavit.journal import segments as seg_mod
from affidavit.journal.results import IN_FLIGHT
from affidavit.journal.sealing import generate_auditor_keypair
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E

from .helpers import flip_stored_byte, happy

CHUNK = 64 * 1024
LIMIT = 30


def _body(chunks: int, tail: int = 0) -> bytes:
    lines = b"".join(b"%07d\n" % i for i in range((chunks * CHUNK + tail) // 8 + 1))
    return lines[: chunks * CHUNK + tail]


async def _put(j: Journal, iid: str, data: bytes, stream: str = "body") -> Any:
    writer = j.result_writer(iid)
    for idx, start in enumerate(range(0, len(data), CHUNK)):
        part = data[start : start + CHUNK]
        await writer.put(stream, idx, part, last=len(part) < CHUNK)
    return writer


async def _store(j: Journal, iid: str, data: bytes) -> Event:
    for ev in happy(iid):
        await j.append(ev)
    writer = await _put(j, iid, data)
    with trio.fail_after(LIMIT):
        return await j.commit_result(
            Event(E.RESULT_COMMITTED, iid),
            summary={"status": 200},
            expect={"body": hashlib.sha256(data).hexdigest()},
            writer=writer,
        )


def _segments(db: Path) -> list[Path]:
    d = Path(f"{db}.results")
    return sorted(d.iterdir()) if d.is_dir() else []


def _refs(db: Path, iid: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT audit, stream, idx, segment, pos, size FROM result_segments "
            "WHERE invocation_id = ? ORDER BY audit, stream, idx",
            (iid,),
        ).fetchall()
    conn.close()
    return rows


def _inline(db: Path, iid: str) -> list[int]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT idx FROM result_chunks WHERE invocation_id = ? ORDER BY idx", (iid,)
        ).fetchall()
    conn.close()
    return [r[0] for r in rows]


async def test_a_result_within_the_held_chunks_is_stored_inline_without_a_segment(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    body = _body(seg_mod.HOLD, 99)
    async with Journal.open(db) as j:
        await _store(j, "inv-s", body)
        res = j.read_result("inv-s")
        assert res is not None and res.streams == {"body": body}
    assert _segments(db) == [] and not Path(f"{db}.results").exists()
    assert _inline(db, "inv-s") == list(range(seg_mod.HOLD + 1))
    assert _refs(db, "inv-s") == []


async def test_a_long_result_spills_its_full_chunks_to_a_segment_and_keeps_its_tail_inline(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    body = _body(30, 1234)
    async with Journal.open(db) as j:
        ev = await _store(j, "inv-l", body)
        assert ev.attrs["chunks"] == {"body": 31}
    [segment] = _segments(db)
    assert segment.name.endswith(".seg")
    assert os.stat(segment).st_mode & 0o777 == 0o600
    assert os.stat(segment.parent).st_mode & 0o777 == 0o700
    refs = _refs(db, "inv-l")
    assert [(a, s, i) for a, s, i, *_ in refs] == [(0, "body", i) for i in range(30)]
    assert {r[3] for r in refs} == {segment.name}
    assert _inline(db, "inv-l") == [30]  # the short tail
    # The segment holds sealed bytes only: no line of the body appears in it.
    assert b"0000100\n" not in segment.read_bytes()
    with JournalReader.open(db) as r:
        res = r.read_result("inv-l")
        assert res is not None and res.streams == {"body": body}
        stream = r.result_stream("inv-l")
        assert stream is not None
        assert b"".join(stream.chunks("body", 17)) == body[17 * CHUNK :]
        report = r.verify()
        assert report.ok and report.results == 1


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
                [segment] = _segments(db)
                seen.append(segment.stat().st_size)
                assert max(synced.values(), default=0) >= segment.stat().st_size

        j.before_commit = before_commit
        await _store(j, "inv-d", _body(40, 10))
    assert seen  # the check ran in the committing transaction


@pytest.mark.parametrize("damage", ["flipped", "truncated", "removed", "renamed-ref"])
async def test_a_damaged_segment_fails_verification_and_reads_never_a_result(
    tmp_path: Path, damage: str
) -> None:
    db = tmp_path / "j.db"
    body = _body(12, 5)
    async with Journal.open(db) as j:
        await _store(j, "inv-x", body)
        await _store(j, "inv-y", _body(1, 3))  # inline: untouched by any damage below
    [segment] = _segments(db)
    if damage == "flipped":
        flip_stored_byte(db, "inv-x", "body", 7)
    elif damage == "truncated":
        os.truncate(segment, segment.stat().st_size - 100)
    elif damage == "removed":
        segment.unlink()
    else:  # a reference edited to name a file that is not a segment: never opened
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE result_segments SET segment = '../j.db' WHERE idx = 7")
        conn.close()
    bad = {"flipped": 7, "truncated": 11, "removed": 0, "renamed-ref": 7}[damage]
    with JournalReader.open(db) as r:
        report = r.verify()
        assert not report.ok
        assert "inv-x" in report.reason
        with pytest.raises(JournalError, match=f"chunk {bad} "):
            r.read_result("inv-x")
        stream = r.result_stream("inv-x")
        assert stream is not None
        got = b""
        with pytest.raises(JournalError, match=f"chunk {bad} "):
            for chunk in stream.chunks("body"):
                got += chunk
        assert got == body[: bad * CHUNK]  # every chunk before the damaged one, verified
        other = r.read_result("inv-y")
        assert other is not None and other.streams["body"] == _body(1, 3)


async def test_a_failed_segment_write_fails_that_result_and_the_next_one_is_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "j.db"
    real = os.pwrite
    calls = {"n": 0}

    def pwrite(fd: int, data: Any, pos: int) -> int:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, pos)

    monkeypatch.setattr(seg_mod.os, "pwrite", pwrite)
    async with Journal.open(db) as j:
        for ev in happy("inv-f"):
            await j.append(ev)
        writer = j.result_writer("inv-f")
        with trio.fail_after(LIMIT):
            with pytest.raises(ResultStoreFailed, match="No space left") as info:
                for idx in range(10):
                    await writer.put("body", idx, _body(10)[idx * CHUNK : (idx + 1) * CHUNK])
                await writer.flush()
            assert str(db) in str(info.value)
            with pytest.raises(ResultStoreFailed):
                await j.commit_result(
                    Event(E.RESULT_COMMITTED, "inv-f"),
                    summary={},
                    expect={"body": hashlib.sha256(_body(10)).hexdigest()},
                    writer=writer,
                )
        assert j.read_result("inv-f") is None
        assert j.events("inv-f")[-1].kind is E.REMOTE_RESPONSE_COMPLETE
        await _store(j, "inv-g", _body(9, 1))  # the journal and its segment go on
        res = j.read_result("inv-g")
        assert res is not None and res.streams["body"] == _body(9, 1)
    with JournalReader.open(db) as r:
        assert r.verify().ok


async def test_a_failed_sync_fails_the_result_and_later_chunks_go_to_a_new_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an ``fdatasync`` error nothing past what an earlier sync covered can be trusted
    (the kernel may have dropped those pages): the result fails, and the segment takes no more
    bytes."""
    db = tmp_path / "j.db"
    real = os.fdatasync
    fail = {"next": True}

    def fdatasync(fd: int) -> None:
        if fail["next"]:
            fail["next"] = False
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(seg_mod.os, "fdatasync", fdatasync)
    async with Journal.open(db) as j:
        for ev in happy("inv-e"):
            await j.append(ev)
        writer = await _put(j, "inv-e", _body(6))
        with trio.fail_after(LIMIT), pytest.raises(ResultStoreFailed, match="Input/output"):
            await writer.flush()
        assert j.read_result("inv-e") is None
        await _store(j, "inv-h", _body(6, 2))
        res = j.read_result("inv-h")
        assert res is not None and res.streams["body"] == _body(6, 2)
    first, second = _segments(db)
    assert {r[3] for r in _refs(db, "inv-h")} <= {first.name, second.name}
    with JournalReader.open(db) as r:
        assert r.verify().ok


async def test_the_sink_runs_ahead_of_the_segment_thread_by_a_bounded_number_of_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the disk stalled, ``put`` waits once ``IN_FLIGHT`` chunks are queued: memory stays
    bounded however fast the response arrives."""
    db = tmp_path / "j.db"
    gate = threading.Event()
    real = os.pwrite

    def stalled(fd: int, data: Any, pos: int) -> int:
        gate.wait(LIMIT)
        return real(fd, data, pos)

    monkeypatch.setattr(seg_mod.os, "pwrite", stalled)
    put = 0
    async with Journal.open(db) as j:
        for ev in happy("inv-b"):
            await j.append(ev)
        writer = j.result_writer("inv-b")

        async def producer() -> None:
            nonlocal put
            for idx in range(3 * IN_FLIGHT):
                await writer.put("body", idx, bytes([idx]) * CHUNK)
                put += 1

        try:
            with trio.fail_after(LIMIT):
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
        await writer.put("body", 0, b"x" * CHUNK)
        with pytest.raises(ValueError, match="out of order"):
            await writer.put("body", 2, b"y" * CHUNK)


async def test_a_commit_that_is_refused_writes_none_of_the_results_rows(tmp_path: Path) -> None:
    """The references and inline chunks are written only once RESULT_COMMITTED is accepted: a
    second commit of a stored result (refused by the lifecycle) leaves the first intact."""
    db = tmp_path / "j.db"
    body = _body(8, 8)
    async with Journal.open(db) as j:
        await _store(j, "inv-r", body)
        again = await _put(j, "inv-r", _body(9))
        with pytest.raises(Exception, match="RESULT_COMMITTED"):
            await j.commit_result(
                Event(E.RESULT_COMMITTED, "inv-r"),
                summary={},
                expect={"body": hashlib.sha256(_body(9)).hexdigest()},
                writer=again,
            )
        res = j.read_result("inv-r")
        assert res is not None and res.streams["body"] == body
    with JournalReader.open(db) as r:
        assert r.verify().ok


async def test_interleaved_results_share_the_segment_and_each_reads_back(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    bodies = {f"inv-{i}": _body(10 + i, i) for i in range(4)}
    async with Journal.open(db) as j:
        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                for iid, body in bodies.items():
                    nursery.start_soon(_store, j, iid, body)
    assert len(_segments(db)) == 1
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
    body = _body(9, 9)
    async with Journal.open(db, auditor_public_key=public) as j:
        await _store(j, "inv-a", body)
    assert [r[:3] for r in _refs(db, "inv-a") if r[0] == 1] == [(1, "body", i) for i in range(9)]
    with JournalReader.open(db) as r:
        audited = r.audit_result("inv-a", private)
        assert audited is not None and audited.streams["body"] == body
        assert r.verify().ok


async def test_a_journal_from_before_segments_reads_its_results_and_gains_the_table(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    async with Journal.open(db) as j:
        await _store(j, "inv-old", _body(2, 2))
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE result_segments")
    conn.close()
    with JournalReader.open(db) as r:
        res = r.read_result("inv-old")
        assert res is not None and res.streams["body"] == _body(2, 2)
        assert r.verify().ok
    async with Journal.open(db) as j:
        await _store(j, "inv-new", _body(7))
    with JournalReader.open(db) as r:
        assert r.verify().results == 2


def _spill_and_stop(db: str) -> None:
    """Child process: spill a long result's chunks, flush them, then die before the commit."""

    async def main() -> None:
        async with Journal.open(db) as j:
            for ev in happy("inv-c"):
                await j.append(ev)
            writer = await _put(j, "inv-c", _body(10))
            await writer.flush()
            os._exit(0)

    trio.run(main)


def test_a_crash_before_the_commit_leaves_bytes_no_row_names_and_no_result(tmp_path: Path) -> None:
    import multiprocessing

    db = tmp_path / "j.db"
    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(target=_spill_and_stop, args=(str(db),))
    child.start()
    child.join(LIMIT)
    assert child.exitcode == 0
    [segment] = _segments(db)
    assert segment.stat().st_size >= 10 * CHUNK
    with JournalReader.open(db) as r:
        assert r.read_result("inv-c") is None
        assert r.verify().ok
    assert _refs(db, "inv-c") == []
