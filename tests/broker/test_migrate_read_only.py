"""``affidavit journal migrate`` from a journal on a read-only file system (a backup snapshot, a
mount remounted ``ro``): no writer lock can be made there, and none is needed -- nothing can
write the journal -- so it is copied without one, and the output says so.  A read-only *bind*
mount of a writable directory is not that (a writer may append through the other mount): the
lock file there is held, opened read-only (flock needs no write access), and with none there the
migrate is refused.  Real mounts: a tmpfs (``tests.external.tmpfs``) remounted."""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from affidavit.cli import main as cli_main
from affidavit.journal import JournalError, JournalLocked, JournalReader
from affidavit.journal import migrate as migrate_module
from affidavit.journal.lock import WriterLock, lock_path
from tests.broker.test_migrate_held import _fill
from tests.external import tmpfs
from tests.postgres import Cluster, argv_url


def _mount(*argv: str) -> None:
    subprocess.run(["mount", *argv], capture_output=True, timeout=30, check=True)


@contextlib.contextmanager
def _live(db: Path) -> Iterator[None]:
    """``db`` open, as a broker has it: its ``-wal`` and ``-shm`` beside it (SQLite reads a
    journal on a read-only file system only with them there: a snapshot of a live one)."""
    conn = sqlite3.connect(db)
    try:
        conn.execute("SELECT count(*) FROM events").fetchall()
        yield
    finally:
        conn.close()


@contextlib.contextmanager
def _filled_read_only(tmp_path: Path) -> Iterator[Path]:
    """A snapshot of a live journal (with its keys) on a tmpfs, which is then remounted
    read-only."""
    src = tmp_path / "src"
    src.mkdir()
    trio.run(_fill, src / "j.db")
    with tmpfs(tmp_path / "ro", "16m") as where, _live(src / "j.db"):
        for f in src.iterdir():
            if f.is_file():
                shutil.copy2(f, where / f.name)
        _mount("-o", "remount,ro", str(where))
        yield where / "j.db"


@pytest.mark.parametrize("json_out", [True, False], ids=["json", "text"])
def test_a_source_on_a_read_only_file_system_is_copied_without_its_lock_and_says_so(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], json_out: bool,
) -> None:  # fmt: skip
    cli_url = argv_url(pg_url, monkeypatch)
    with _filled_read_only(tmp_path) as db:
        with JournalReader.open(db) as r:
            head = r.head()
        argv = ["journal", "migrate", "--journal", str(db), "--to", cli_url]
        assert cli_main([*argv, "--json"] if json_out else argv) == 0, capsys.readouterr()
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    if json_out:
        done = json.loads(out)
        assert done["source_read_only"] is True and done["target_ok"], done
        assert (done["head_seq"], done["head_hash"]) == head
    else:
        lines = out.splitlines()
        assert lines[0] == (
            f"the source {db} is on a read-only file system, so no writer can be appending to "
            "it: copied without taking its writer lock"
        ), out
        assert lines[2].startswith(f"both verify: head seq {head[0]}, hash {head[1]}"), out
    with JournalReader.open(pg_url) as r:
        assert r.head() == head


def test_a_source_on_a_writable_disk_is_said_to_be_locked_as_before(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    db = tmp_path / "j.db"
    trio.run(_fill, db)
    argv = ["journal", "migrate", "--journal", str(db), "--to", argv_url(pg_url, monkeypatch)]
    assert cli_main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["source_read_only"] is False


@contextlib.contextmanager
def _bound_read_only(tmp_path: Path, *, lock_file: bool) -> Iterator[tuple[Path, Path]]:
    """A journal on a writable tmpfs (its lock file removed unless ``lock_file``), and the same
    journal through a read-only bind mount of that tmpfs: (writable, read-only) names of it,
    open as a broker has it (``_live``)."""
    with tmpfs(tmp_path / "rw", "16m") as rw:
        trio.run(_fill, rw / "j.db")
        if not lock_file:
            lock_path(rw / "j.db").unlink()
        view = tmp_path / "view"
        view.mkdir()
        _mount("--bind", str(rw), str(view))
        try:
            _mount("-o", "remount,bind,ro", str(view))
            with _live(rw / "j.db"):
                yield rw / "j.db", view / "j.db"
        finally:
            _mount_undo(view)


def test_a_read_only_bind_mount_is_copied_holding_its_lock_file_opened_read_only(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """The bind mount is read-only, its source is not: a writer may append through the other
    mount.  flock needs no write access, so the lock file there is held, opened read-only --
    a writer through the writable mount is refused while the copy runs (told only that another
    process owns it: no description can be written through that descriptor) -- and copied."""
    cli_url = argv_url(pg_url, monkeypatch)
    copy, tried = migrate_module._copy, []
    with _bound_read_only(tmp_path, lock_file=True) as (rw, view):

        def copying(*args: object) -> object:
            for owner in (None, "affidavit serve (pid 1) on /run/d.sock"):
                with pytest.raises(JournalLocked) as exc:
                    WriterLock.acquire(rw, owner)
                tried.append(exc.value)
            return copy(*args)  # type: ignore[arg-type]

        monkeypatch.setattr(migrate_module, "_copy", copying)
        with JournalReader.open(rw) as r:
            head = r.head()
        argv = ["journal", "migrate", "--journal", str(view), "--to", cli_url, "--json"]
        assert cli_main(argv) == 0, capsys.readouterr()
        done = json.loads(capsys.readouterr().out)
        assert done["source_read_only"] is False and done["target_ok"], done
        assert (done["head_seq"], done["head_hash"]) == head
        assert [str(e) for e in tried] == [
            f"journal {rw} is owned by another process",
            f"journal {rw} is open in another process (an embedded broker); a daemon must be "
            "its only writer -- stop that process first",
        ]
        WriterLock.acquire(rw, None).release()  # let go once done
    with JournalReader.open(pg_url) as r:
        assert r.head() == head


def test_a_read_only_bind_mount_without_a_lock_file_is_refused(
    pg: Cluster, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """No lock file there to hold (none can be made): nothing would keep a writer through the
    writable mount out -- refused, with where to migrate from instead; nothing copied."""
    cli_url = argv_url(pg_url, monkeypatch)
    with _bound_read_only(tmp_path, lock_file=False) as (_, view):
        argv = ["journal", "migrate", "--journal", str(view), "--to", cli_url]
        assert cli_main(argv) == 2
    out, err = capsys.readouterr()
    assert err == (
        f"affidavit: JOURNAL_UNUSABLE: the source {view} is on a read-only mount and has no "
        "lock file to hold (a writer may be appending to it through a writable mount, and "
        "nothing here keeps it out): migrate from the writable mount, or from a copy; nothing "
        "was copied\n"
    ), err
    assert pg.password not in out + err
    with pytest.raises(JournalError, match="no journal"):
        JournalReader.open(pg_url)  # nothing copied


def _mount_undo(where: Path) -> None:
    subprocess.run(["umount", str(where)], capture_output=True, timeout=30, check=True)
