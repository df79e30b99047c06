"""Shared pieces of the segment tests (tests/journal/test_segments.py, test_segment_refs.py):
results stored as the engine's sink stores them, and what a segment journal holds on disk."""

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

from affidavit.journal import Journal, JournalReader
from affidavit.journal import segments as seg_mod
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E

from .helpers import happy

CHUNK = 64 * 1024
LIMIT = 30


def body(chunks: int, tail: int = 0) -> bytes:
    """``chunks`` full chunks of numbered lines (each chunk unlike any other) and ``tail``
    bytes more."""
    lines = b"".join(b"%07d\n" % i for i in range((chunks * CHUNK + tail) // 8 + 1))
    return lines[: chunks * CHUNK + tail]


async def put_all(j: Journal, iid: str, data: bytes, stream: str = "body") -> Any:
    """Every chunk of ``data`` through a new ``result_writer``, in order, the short tail as
    ``last``; returns the writer (not flushed)."""
    writer = j.result_writer(iid)
    for idx, start in enumerate(range(0, len(data), CHUNK)):
        part = data[start : start + CHUNK]
        await writer.put(stream, idx, part, last=len(part) < CHUNK)
    return writer


async def store(j: Journal, iid: str, data: bytes) -> Event:
    """A completed invocation with ``data`` as its committed ``body``."""
    for ev in happy(iid):
        await j.append(ev)
    writer = await put_all(j, iid, data)
    with trio.fail_after(LIMIT):
        return await j.commit_result(
            Event(E.RESULT_COMMITTED, iid),
            summary={"status": 200},
            expect={"body": hashlib.sha256(data).hexdigest()},
            writer=writer,
        )


def segments(db: Path) -> list[Path]:
    d = Path(f"{db}.results")
    return sorted(d.iterdir()) if d.is_dir() else []


def refs(db: Path, iid: str) -> list[tuple[Any, ...]]:
    """(audit, stream, idx, segment, pos, size) of the invocation's reference rows."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT audit, stream, idx, segment, pos, size FROM result_segments "
            "WHERE invocation_id = ? ORDER BY audit, stream, idx",
            (iid,),
        ).fetchall()
    conn.close()
    return rows


def inline(db: Path, iid: str) -> list[int]:
    """The indexes of the invocation's chunks stored as rows."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT idx FROM result_chunks WHERE invocation_id = ? ORDER BY idx", (iid,)
        ).fetchall()
    conn.close()
    return [r[0] for r in rows]


def tamper(db: Path, *statements: str) -> None:
    """Run SQL on the journal file as someone with write access to it would."""
    with sqlite3.connect(db) as conn:
        for sql in statements:
            conn.execute(sql)
    conn.close()


def stall_writes(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Make the segment thread's writes wait until the returned event is set (a stalled disk);
    set it before the journal closes, or closing waits ``LIMIT`` seconds a write."""
    gate = threading.Event()
    real = os.pwritev

    def stalled(fd: int, buffers: Any, pos: int) -> int:
        gate.wait(LIMIT)
        return real(fd, buffers, pos)

    monkeypatch.setattr(seg_mod.os, "pwritev", stalled)
    return gate


def fail_a_sync(monkeypatch: pytest.MonkeyPatch, *, armed: bool) -> dict[str, bool]:
    """Make the segment thread's next ``fdatasync`` fail with EIO once the returned switch's
    ``"next"`` is True (``armed``: from the start); it turns itself off as it fails one."""
    fail = {"next": armed}
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        if fail["next"]:
            fail["next"] = False
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(seg_mod.os, "fdatasync", fdatasync)
    return fail


# -- a journal with bytes to compact (test_segment_compact.py, test_reclaim_cli.py) ---------

CUT = {"code": "REMOTE_OUTCOME_UNKNOWN", "generation": 0}
DONE = body(30, 1234)
"""The committed result (30 chunks spilled, ~2 MiB of segment)."""


async def interrupt(j: Journal, iid: str, chunks: int) -> None:
    """A long body ``chunks`` chunks in, written to a segment, then the attempt interrupted:
    bytes no reference will ever name."""
    for ev in happy(iid)[:-1]:
        await j.append(ev, barrier=True)
    writer = await put_all(j, iid, body(chunks))
    with trio.fail_after(LIMIT):
        await writer.drain()
    await j.append(Event(E.ATTEMPT_INTERRUPTED, iid, CUT), barrier=True)


async def build(db: Path) -> None:
    """Segment A: cut-1's bytes, inv-done's, cut-2's (a gap, the committed bytes, a tail);
    segment B (a second writer): cut-3's only."""
    async with Journal.open(db) as j:
        await interrupt(j, "inv-cut-1", 40)
        await store(j, "inv-done", DONE)
        await interrupt(j, "inv-cut-2", 40)
    async with Journal.open(db) as j:
        await interrupt(j, "inv-cut-3", 40)
    assert len(segments(db)) == 2


def allocated(db: Path) -> int:
    return sum(os.stat(p).st_blocks * 512 for p in segments(db))


def check(db: Path) -> None:
    """The journal opens, verifies, and the committed result reads back byte-identical."""
    with JournalReader.open(db) as r:
        report = r.verify()
        assert report.ok, report
        res = r.read_result("inv-done")
        assert res is not None and res.streams == {"body": DONE}
