"""A journal given through a link is resolved once (``SqliteBackend.real``): the lock, SQLite's
open, the writer's pin, the keys and the segment directory all follow that one resolution.

Each resolved the name again: a link re-pointed between the lock and SQLite's open put the lock
and keys in one directory and the database in another, a journal made through a dangling link
came out with the umask's mode, and a writer through a link took a lock an earlier affidavit's
daemon -- which locked ``<link>.lock`` -- never held.  Flocks here are held in this process on
a descriptor of their own: a flock belongs to the open file description, so it conflicts with
another one of this process as with another process's."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from affidavit.journal import Journal, JournalLocked, JournalReplaced
from affidavit.journal.lock import WriterLock
from affidavit.journal.sqlite import SqliteBackend


def _open_and_close(db: Path) -> None:
    async def run() -> None:
        async with Journal.open(db):
            pass

    trio.run(run)


def test_a_link_re_pointed_after_the_lock_is_taken_is_refused_nothing_made_where_it_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reviewer's point: the lock (and so the keys) taken beside ``a/j.db``, the link then
    re-pointed at ``b/j.db`` before SQLite opens the name.  Now SQLite opens the file the lock
    was taken beside, and the first transaction finds the name leads elsewhere:
    ``JournalReplaced``, nothing written to ``b``."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    link = tmp_path / "cur.db"
    link.symlink_to(a / "j.db")
    taken = SqliteBackend.writer_lock

    def re_pointing(self: SqliteBackend, *args: object, **kwargs: object) -> object:
        lock = taken(self, *args, **kwargs)  # type: ignore[arg-type]
        link.unlink()
        link.symlink_to(b / "j.db")
        return lock

    monkeypatch.setattr(SqliteBackend, "writer_lock", re_pointing)
    with pytest.raises(JournalReplaced):
        _open_and_close(link)
    assert list(b.iterdir()) == []
    assert (a / "j.db").exists() and Path(f"{a / 'j.db'}.lock").exists()
    monkeypatch.undo()
    _open_and_close(link)  # the link's journal now, whole in b
    assert {p.name for p in b.iterdir()} >= {"j.db", "j.db.lock", "j.db.key", "j.db.signing.key"}


def test_a_journal_made_through_a_dangling_link_is_private(tmp_path: Path) -> None:
    """``O_CREAT | O_EXCL`` follows no link: made through one, the journal was SQLite's, with
    the umask's mode (0644 under 022) -- and its ``-wal`` and ``-shm`` take the main file's."""
    (tmp_path / "data").mkdir()
    link = tmp_path / "j.db"
    link.symlink_to(tmp_path / "data" / "j.db")  # dangling: no journal yet
    old = os.umask(0o022)
    try:
        _open_and_close(link)
    finally:
        os.umask(old)
    assert (tmp_path / "data" / "j.db").stat().st_mode & 0o777 == 0o600


@contextlib.contextmanager
def _held(path: Path, mode: int, text: bytes = b"") -> Iterator[None]:
    """``path`` flocked as an earlier affidavit held it, on a descriptor of its own."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        os.write(fd, text)
        yield
    finally:
        os.close(fd)


@pytest.fixture
def linked(tmp_path: Path) -> Path:
    """A link ``links/j.db`` to the journal ``data/j.db``."""
    (tmp_path / "data").mkdir()
    (tmp_path / "links").mkdir()
    _open_and_close(tmp_path / "data" / "j.db")
    link = tmp_path / "links" / "j.db"
    link.symlink_to(tmp_path / "data" / "j.db")
    return link


def test_a_daemon_of_an_earlier_version_holding_the_lock_beside_the_link_refuses_writers(
    linked: Path,
) -> None:
    """It locked ``<link>.lock``; a writer through the same link now locks the file's own.
    Probed, the old one held refuses it with the holder's words."""
    with _held(Path(f"{linked}.lock"), fcntl.LOCK_EX, b"affidavit serve on /run/a.sock"):
        with pytest.raises(JournalLocked) as refused:
            _open_and_close(linked)
        assert refused.value.owner == "affidavit serve on /run/a.sock", refused.value
        assert "ask the daemon on its socket" in str(refused.value)
        with pytest.raises(JournalLocked):
            WriterLock.acquire(linked, owner="a new daemon")
    _open_and_close(linked)  # let go: opened as before


def test_an_earlier_embedded_writer_beside_the_link_refuses_an_owner_only(linked: Path) -> None:
    """Held shared (an earlier embedded writer), the old lock lets another embedded writer in
    -- they share a journal, SQLite serialising them -- but not an owner, which must be alone.
    Never created: a link with no old lock beside it gets none."""
    old = Path(f"{linked}.lock")
    with _held(old, fcntl.LOCK_SH):
        _open_and_close(linked)
        with pytest.raises(JournalLocked) as refused:
            WriterLock.acquire(linked, owner="a new daemon")
        assert f"another process holds its lock {old}" in str(refused.value)
        assert refused.value.owner is None  # (shared or not, the old lock does not say)
    old.unlink()
    WriterLock.acquire(linked, owner="a new daemon").release()
    _open_and_close(linked)
    assert not old.exists()
