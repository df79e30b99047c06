"""A COMMIT whose WAL sync fails (EIO) on SQLite: the write's fate is unknown, not "not
committed".  SQLite writes the transaction's frames to the -wal, then syncs it; the sync fails,
the COMMIT raises and no connection sees the rows -- yet they are in the file, and the open
after a crash recovers them.  Only the journal's next commit, written over those frames, settles
it: they are gone for good.  So the writer fails such a write ``CommitUnknown`` (as a shared
journal's lost commit), which keeps the engine from closing a DISPATCH_STARTED so refused
``not_attempted`` on a read that misses it (tests/broker/test_dispatch_barrier_sync_failed.py).

The failing sync is real: an LD_PRELOAD shim (failsync.c, built here with gcc) fails the writer
process's next sync of the -wal; the process then dies (``os._exit``), as a crash would end it.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from affidavit.journal import JournalReader
from tests.external import build_shim

CHILD = Path(__file__).parent / "child.py"
SHIM = Path(__file__).parent / "failsync.c"
TIMEOUT = 60.0
WAL_HEADER, FRAME_HEADER = 32, 24


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_shim(SHIM, tmp_path_factory.mktemp("failsync") / "failsync.so")


def _run(shim: Path, db: Path, then: str) -> tuple[int, list[str]]:
    """The -wal's size before the DISPATCH_STARTED write, and the child's other lines: that
    write's error class, the last kind it reads back, and "closed" if it committed a
    SETUP_FAILED afterwards."""
    done = subprocess.run(
        [sys.executable, str(CHILD), "refused", str(db), "sync", then],
        env={**os.environ, "LD_PRELOAD": str(shim)},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    first, size, *lines = done.stdout.split()
    assert first == "wal", done.stdout
    return int(size), lines


def _commit_frames(wal: Path, after: int) -> list[int]:
    """The offsets of the -wal's commit frames (a database size in their header) of its
    current cycle (the header's salts) that start at or past byte ``after``: whole or not,
    chained or not -- read as bytes, not as SQLite's recovery reads them."""
    data = wal.read_bytes()
    page = struct.unpack(">I", data[8:12])[0]
    salts = data[16:24]
    out = []
    for at in range(WAL_HEADER, len(data) - FRAME_HEADER + 1, page + FRAME_HEADER):
        commit, salt = struct.unpack(">I", data[at + 4 : at + 8])[0], data[at + 8 : at + 16]
        if at >= after and commit and salt == salts:
            out.append(at)
    return out


def _kinds(db: Path) -> list[str]:
    with JournalReader.open(db) as r:
        assert r.verify().ok
        return [e.kind.value for e in r.events("inv-1")]


def test_a_commit_whose_wal_sync_failed_is_unknown_and_lands_after_a_crash(
    shim: Path, tmp_path: Path
) -> None:
    db = tmp_path / "j.db"
    _, (error, seen) = _run(shim, db, "die")
    # Refused as a write whose fate is unknown -- and this process cannot read it...
    assert (error, seen) == ("CommitUnknown", "CREDENTIAL_AUTHORIZED")
    # ...but the process died before the journal's next commit: the open recovers it.
    assert _kinds(db)[-1] == "DISPATCH_STARTED"


def test_the_next_commit_overwrites_what_the_failed_one_left(shim: Path, tmp_path: Path) -> None:
    """Why a record closed after such a failure -- the closing event committed -- is proof:
    the commit was written over the failed one's frames, which no open recovers any more.  The
    failed transaction is the larger: the closing commit overwrites only its first frames, and
    its own commit frame stays in the -wal after the closing one -- whole, its salts current,
    yet no longer chained (each frame's checksum covers every frame before it), so the open
    stops at the closing commit."""
    db = tmp_path / "j.db"
    before, lines = _run(shim, db, "commit")
    assert lines == ["CommitUnknown", "CREDENTIAL_AUTHORIZED", "closed"]
    closing, failed = _commit_frames(Path(f"{db}-wal"), before)  # both there, in this order
    assert closing < failed
    kinds = _kinds(db)
    assert kinds[-1] == "SETUP_FAILED" and "DISPATCH_STARTED" not in kinds
