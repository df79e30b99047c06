"""Reading long results through their segment references (``journal/segment_tables.py``):
whoever edits the journal file or its segments, a reference never reads as another result's
bytes, never opens anything but a regular segment file in the segment directory, never blocks
or allocates what a row says, and an unreadable segment is an error saying so -- not evidence
of tampering, and never an empty chunk passed on silently."""

from __future__ import annotations

import errno
import gc
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from affidavit.journal import Journal, JournalError, JournalReader, segment_tables

from . import segkit as kit
from .helpers import flip_stored_byte


@pytest.mark.parametrize("damage", ["flipped", "truncated", "removed", "renamed-ref"])
async def test_a_damaged_segment_fails_verification_and_reads_never_a_result(
    tmp_path: Path, damage: str
) -> None:
    db = tmp_path / "j.db"
    body = kit.body(12, 5)
    async with Journal.open(db) as j:
        await kit.store(j, "inv-x", body)
        await kit.store(j, "inv-y", kit.body(1, 3))  # inline: untouched by any damage below
    [segment] = kit.segments(db)
    if damage == "flipped":
        flip_stored_byte(db, "inv-x", "body", 7)
    elif damage == "truncated":
        os.truncate(segment, segment.stat().st_size - 100)
    elif damage == "removed":
        segment.unlink()
    else:  # a reference edited to name a file that is not a segment: never opened
        kit.tamper(db, "UPDATE result_segments SET segment = '../j.db' WHERE idx = 7")
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
        assert got == body[: bad * kit.CHUNK]  # every chunk before the damaged one, verified
        other = r.read_result("inv-y")
        assert other is not None and other.streams["body"] == kit.body(1, 3)


async def test_a_journal_from_before_segments_reads_its_results_and_gains_the_table(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    async with Journal.open(db) as j:
        await kit.store(j, "inv-old", kit.body(2, 2))
    kit.tamper(db, "DROP TABLE result_segments")
    with JournalReader.open(db) as r:
        res = r.read_result("inv-old")
        assert res is not None and res.streams["body"] == kit.body(2, 2)
        assert r.verify().ok
    async with Journal.open(db) as j:
        await kit.store(j, "inv-new", kit.body(7))
    with JournalReader.open(db) as r:
        assert r.verify().results == 2


async def test_a_chunk_stored_twice_fails_verification_and_the_read(tmp_path: Path) -> None:
    """A row and a reference for one chunk (two tables: their keys cannot see each other):
    which one is the result is unknowable, so neither is taken."""
    db = tmp_path / "j.db"
    async with Journal.open(db) as j:
        await kit.store(j, "inv-x", kit.body(10, 1))  # chunks 0..9 in a segment, 10 inline
    kit.tamper(db, "INSERT INTO result_chunks VALUES ('inv-x', 'body', 3, X'00')")
    with JournalReader.open(db) as r:
        report = r.verify()
        assert not report.ok and "chunk 3 is stored twice" in report.reason
        with pytest.raises(JournalError, match="chunk 3 "):
            r.read_result("inv-x")


async def test_a_reference_past_any_chunk_size_reads_as_altered_without_reading_it(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    async with Journal.open(db) as j:
        await kit.store(j, "inv-x", kit.body(10, 1))
    kit.tamper(db, "UPDATE result_segments SET size = 1 << 62 WHERE idx = 3")
    with JournalReader.open(db) as r:
        report = r.verify()
        assert not report.ok and "chunk 3 differs" in report.reason


@pytest.mark.parametrize("planted", ["fifo", "symlink"])
def test_only_a_regular_file_is_read_as_a_segment(tmp_path: Path, planted: str) -> None:
    """A FIFO under a segment's name would block the reader; a symlink would take it out of
    the segment directory.  Neither is followed: the chunks read as missing.  (In a child
    process with a timeout: a reader that blocked would hang the test run.)"""
    db = tmp_path / "j.db"
    script = f"""
import os, trio
from pathlib import Path
from affidavit.journal import Journal, JournalReader
from tests.journal import segkit as kit
db = Path({str(db)!r})
async def main():
    async with Journal.open(db) as j:
        await kit.store(j, "inv-x", kit.body(10, 1))
trio.run(main)
[seg] = kit.segments(db)
outside = db.parent / "outside"
os.replace(seg, outside)
if {planted!r} == "fifo":
    os.mkfifo(seg)
else:
    os.symlink(outside, seg)
with JournalReader.open(db) as r:
    report = r.verify()
    print("OK" if not report.ok and "chunk 0 differs" in report.reason else report.reason)
"""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=root
    )
    assert out.stdout.strip() == "OK", out.stderr[-2000:]


@pytest.mark.parametrize("code", [errno.EMFILE, errno.EACCES, errno.EIO])
async def test_a_segment_that_cannot_be_opened_is_an_error_not_tampering(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    db = tmp_path / "j.db"
    async with Journal.open(db) as j:
        await kit.store(j, "inv-x", kit.body(10, 1))
    real = os.open

    def failing(path: Any, flags: int, *a: Any) -> int:
        if str(path).endswith(".seg"):
            raise OSError(code, os.strerror(code))
        return real(path, flags, *a)

    monkeypatch.setattr(segment_tables.os, "open", failing)
    with JournalReader.open(db) as r:
        with pytest.raises(JournalError, match=f"cannot be read: {os.strerror(code)}"):
            r.verify()
        with pytest.raises(JournalError, match="cannot be read"):
            r.read_result("inv-x")


async def test_a_scan_that_fails_closes_its_cursor_while_the_journal_is_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The error leaves the reader's ``with`` (as in ``affidavit journal verify``): the row
    generator it stopped must be closed there, not when the traceback is freed after the
    connection closed ("Exception ignored in: <generator Tables.rows>" on stderr)."""
    db = tmp_path / "j.db"
    async with Journal.open(db) as j:
        await kit.store(j, "inv-x", kit.body(10, 1))
    real = os.open

    def failing(path: Any, flags: int, *a: Any) -> int:
        if str(path).endswith(".seg"):
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(path, flags, *a)

    monkeypatch.setattr(segment_tables.os, "open", failing)
    ignored: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)
    for scan in ("verify", "read_result"):
        try:
            with JournalReader.open(db) as r:
                getattr(r, scan)(*(("inv-x",) if scan == "read_result" else ()))
        except JournalError as exc:
            del exc
        else:
            raise AssertionError(f"{scan} read an unreadable segment")
        gc.collect()
    assert [str(u.exc_value) for u in ignored] == []


async def test_a_scan_over_many_segments_keeps_a_few_open_at_once(tmp_path: Path) -> None:
    """Each process that spilled has a segment of its own: ``every_chunk`` (verify, migrate)
    must not hold one descriptor per segment for the whole scan."""
    db = tmp_path / "j.db"
    for i in range(12):
        async with Journal.open(db) as j:
            await kit.store(j, f"inv-{i:02}", kit.body(5, i))
    assert len(kit.segments(db)) == 12
    with JournalReader.open(db) as r:
        base = len(os.listdir("/proc/self/fd"))
        most = base
        with r.snapshot():
            for *_, blob in r.tables.every_chunk(False):
                assert blob
                most = max(most, len(os.listdir("/proc/self/fd")))
        assert most - base <= 8
        report = r.verify()
        assert report.ok and report.results == 12


async def test_a_journal_of_a_newer_schema_is_neither_written_nor_read(tmp_path: Path) -> None:
    """What a broker makes of a schema it does not know is not what the journal holds (this
    one's long results, read by a broker from before schema 4, would read as missing)."""
    db = tmp_path / "j.db"
    async with Journal.open(db) as j:
        await kit.store(j, "inv-x", kit.body(1, 1))
    kit.tamper(db, "UPDATE meta SET value = '99' WHERE name = 'schema'")
    with pytest.raises(JournalError, match=r"newer affidavit \(schema 99; this one knows"):
        JournalReader.open(db)
    with pytest.raises(JournalError, match="newer affidavit"):
        async with Journal.open(db):
            pass
