"""A SQLite journal the broker creates is the broker's alone: 0600 whatever the umask, and
SQLite's ``-wal``/``-shm`` beside it take that mode -- an agent on the same host reads none of
the journal (docs/deployment.md).  A journal already there keeps the mode its operator gave it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import trio

from affidavit.journal import Journal
from tests.journal.helpers import accepted


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _append_one(db: Path) -> None:
    async def run() -> None:
        async with Journal.open(db) as journal:
            await journal.append(accepted(f"inv-mode-{os.urandom(4).hex()}"), barrier=True)

    trio.run(run)


@pytest.fixture
def wide_umask() -> object:
    old = os.umask(0o022)
    try:
        yield None
    finally:
        os.umask(old)


def test_a_new_journal_and_its_wal_are_readable_by_the_broker_alone(
    tmp_path: Path, wide_umask: object
) -> None:
    db = tmp_path / "journal.db"
    _append_one(db)
    assert _mode(db) == 0o600
    for side in ("-wal", "-shm"):
        f = Path(f"{db}{side}")
        if f.exists():
            assert _mode(f) == 0o600, side


def test_a_journal_already_there_keeps_its_operators_mode(
    tmp_path: Path, wide_umask: object
) -> None:
    db = tmp_path / "journal.db"
    _append_one(db)
    os.chmod(db, 0o640)
    _append_one(db)
    assert _mode(db) == 0o640
