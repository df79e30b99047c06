"""One journal, one lock, whatever name it is opened under (journal/lock.py ``lock_path``).

The lock was made beside the name given: a daemon's journal opened through a link got a lock
file of its own, so a second writer wrote beside the daemon.  Here the owner is another process
(a flock is per open file description, so a second acquisition in this process would conflict
too -- the last test shows it -- but a process is what an operator has)."""

from __future__ import annotations

import os
import re
import selectors
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from affidavit.journal import Journal, JournalError, JournalLocked, journal_exposures
from affidavit.journal.lock import WriterLock, lock_path

HOLD = """
import sys, time
from pathlib import Path
from affidavit.journal.lock import WriterLock
WriterLock.acquire(Path(sys.argv[1]), owner="the daemon")
print("held", flush=True)
sys.stdin.read()  # until the test closes it (or dies)
"""


@pytest.fixture
def owned(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path/d/j.db``, an existing journal whose owner (another process) holds it through
    its real path."""
    (tmp_path / "d").mkdir()
    db = tmp_path / "d" / "j.db"

    async def make() -> None:
        async with Journal.open(db):
            pass

    trio.run(make)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            assert sel.select(timeout=30), "the owner did not take the lock within 30 s"
        assert proc.stdout.readline() == b"held\n"
        yield db
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()


def _refused(name: Path) -> None:
    async def run() -> None:
        with pytest.raises(JournalLocked, match="is owned by the daemon"):
            async with Journal.open(name):
                pass

    trio.run(run)


def test_a_writer_through_a_link_to_an_owned_journal_is_refused(
    owned: Path, tmp_path: Path
) -> None:
    link = tmp_path / "elsewhere.db"  # (another directory than the journal's)
    link.symlink_to(owned)
    chained = tmp_path / "chained.db"
    chained.symlink_to(link)
    _refused(link)
    _refused(chained)
    assert not Path(f"{link}.lock").exists() and not Path(f"{chained}.lock").exists()
    assert not Path(f"{link}-wal").exists()  # nothing written beside the daemon


def test_a_writer_through_dotdot_a_relative_name_or_a_linked_directory_is_refused(
    owned: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "ld").symlink_to(owned.parent)
    _refused(owned.parent / ".." / "d" / "j.db")
    _refused(tmp_path / "other" / "ld" / "j.db")
    monkeypatch.chdir(tmp_path / "other")
    _refused(Path("ld/../d/j.db"))  # (the kernel's ``..`` of ld is d's parent)
    _refused(Path("../d/j.db"))


def test_an_owner_through_a_link_is_refused_while_a_writer_has_it_open(tmp_path: Path) -> None:
    """Separate acquisitions in one process conflict as two processes' would (a flock belongs
    to the open file description, and each acquisition opens the lock file anew)."""
    db = tmp_path / "j.db"
    link = tmp_path / "sub" / "link.db"
    link.parent.mkdir()
    link.symlink_to(db)
    held = WriterLock.acquire(link)  # an embedded writer, through the link
    try:
        assert held.path == lock_path(db) == Path(f"{db}.lock")
        with pytest.raises(JournalLocked, match="is open in another process"):
            WriterLock.acquire(db, owner="the daemon")
    finally:
        held.release()
    WriterLock.acquire(db, owner="the daemon").release()


def test_a_journal_through_a_dangling_link_is_made_with_its_lock_where_the_link_points(
    tmp_path: Path,
) -> None:
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "j.db"
    link = tmp_path / "link.db"
    link.symlink_to(target)  # no journal yet: the first open makes it

    async def run() -> None:
        async with Journal.open(link):
            assert target.is_file()
            assert Path(f"{target}.lock").is_file() and not Path(f"{link}.lock").exists()
            assert (os.stat(f"{target}.lock").st_mode & 0o777) == 0o600

    trio.run(run)


def test_a_journal_with_a_second_name_is_refused_to_every_writer_before_anything_is_made(
    tmp_path: Path,
) -> None:
    """A hard link is the same file under a name SQLite keeps another WAL beside (verified:
    sqlite 3.40, two processes, ``hard.db-wal`` and ``j.db-wal`` for one database)."""
    db = tmp_path / "j.db"

    async def make() -> None:
        async with Journal.open(db):
            pass

    trio.run(make)
    (tmp_path / "other").mkdir()
    hard = tmp_path / "other" / "hard.db"
    os.link(db, hard)
    before = sorted(p.name for p in (tmp_path / "other").iterdir())

    async def refused(name: Path, owner: str | None) -> None:
        with pytest.raises(JournalError, match="has 2 names") as info:
            async with Journal.open(name, owner=owner):
                pass
        assert info.value.public is not None and str(tmp_path) not in info.value.public
        # The names are on the file's own file system: searched from its mount point, -xdev.
        found = re.search(r"`find (\S+) -xdev -samefile (\S+)` lists them", str(info.value))
        assert found is not None, info.value
        mount, file = Path(found[1]), Path(found[2])
        assert file == Path(os.path.realpath(name)) and os.path.ismount(mount), info.value
        assert file.is_relative_to(mount) and mount.stat().st_dev == file.stat().st_dev

    for name in (hard, db):
        trio.run(refused, name, None)
        trio.run(refused, name, "the daemon")
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == before == ["hard.db"]
    hard.unlink()  # one name again: written as before
    trio.run(make)


def test_the_lock_of_a_linked_journal_is_judged_beside_the_file(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    db = tmp_path / "real" / "j.db"
    link = tmp_path / "link.db"
    link.symlink_to(db)
    WriterLock.acquire(link).release()
    lock = Path(f"{db}.lock")
    lock.chmod(0o644)
    found = [(e.path, e.what) for e in journal_exposures(link)]
    assert (lock, "journal lock file") in found
