"""A COMMIT whose write to the -wal fails (a full disk: ENOSPC, SQLITE_FULL; past a file size
limit: EFBIG, SQLITE_IOERR_WRITE) on SQLite is "not committed", not ``CommitUnknown``: SQLite
writes the commit frame last and stops at the first write that fails, so no open -- even after a
crash -- recovers the transaction.  In WAL mode a small transaction's pages stay in memory until
its COMMIT, so that is where a full disk shows: answered ``CommitUnknown``, the commonest storage
fault lost the engine's ``not_attempted`` (tests/broker/test_journal_faults.py).  A failed sync
stays unknown (test_commit_sync_failure.py), as does any error the code does not name.

The limit is real: the child (child.py ``refused``) caps RLIMIT_FSIZE at the -wal's size before
DISPATCH_STARTED's commit, then dies (``os._exit``) without another commit."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from affidavit.journal import JournalReader
from affidavit.journal import sqlite_wal as wal
from affidavit.journal.sqlite import SqliteBackend

CHILD = Path(__file__).parent / "child.py"
TIMEOUT = 60.0


def test_a_commit_whose_wal_write_failed_is_not_committed_and_no_crash_recovers_it(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    done = subprocess.run(
        [sys.executable, str(CHILD), "refused", str(db), "size", "die"],
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    # Refused as not committed (JournalWriteError itself, not its CommitUnknown subclass)...
    assert done.stdout.split()[2:] == ["JournalWriteError", "CREDENTIAL_AUTHORIZED"]
    # ...and the open after the crash agrees: nothing of it was recovered.
    with JournalReader.open(db) as r:
        assert r.verify().ok
        assert [e.kind.value for e in r.events("inv-1")][-1] == "CREDENTIAL_AUTHORIZED"


def _error(code: int | None) -> sqlite3.Error:
    exc = sqlite3.OperationalError("injected")
    if code is not None:
        exc.sqlite_errorcode = code  # type: ignore[attr-defined]
    return exc


SQLITE_IOERR_FSYNC = 10 | (4 << 8)
SQLITE_IOERR_SHMSIZE = 10 | (19 << 8)


@pytest.mark.parametrize(
    ("code", "may_land"),
    [
        (wal.SQLITE_FULL, False),  # ENOSPC writing a frame
        (wal.SQLITE_IOERR_WRITE, False),  # EFBIG, EIO writing a frame
        (SQLITE_IOERR_FSYNC, True),  # the frames are whole: a crash recovers them
        (SQLITE_IOERR_SHMSIZE, True),  # indexing the frames, after the sync
        (10, True),  # a bare SQLITE_IOERR: which write, unknown
        (None, True),  # no code at all
    ],
)
def test_only_a_failed_wal_write_proves_a_commit_did_not_land(
    tmp_path: Path, code: int | None, may_land: bool
) -> None:
    backend = SqliteBackend(tmp_path / "j.db")
    assert backend.commit_may_have_landed(_error(code)) is may_land


def test_a_padded_wal_may_have_landed_whatever_write_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built with SQLITE_POWERSAFE_OVERWRITE=0, SQLite pads a commit with copies of its commit
    frame: a write error may follow a whole one."""
    monkeypatch.setattr(wal, "_pads_wal", lambda: True)
    backend = SqliteBackend(tmp_path / "j.db")
    assert backend.commit_may_have_landed(_error(wal.SQLITE_FULL)) is True
    assert backend.commit_may_have_landed(_error(wal.SQLITE_IOERR_WRITE)) is True
