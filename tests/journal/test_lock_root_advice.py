"""A root writer's refusal of a journal another user owns (``lock._refuse_root_on_theirs``):
its "if root is to run the broker from now on" names every file of the journal's another user
owns -- the journal, its ``-wal``/``-shm``, lock, results directory (``chown -R``) and its key
files wherever they are configured (``exposure.journal_files``, the list the exposure checks
use, and the store's keys) -- and the directory SQLite keeps it in only when that directory
holds the journal's files alone: a shared one (``$HOME``, a mount) is never to be given to
root, its journal is to move.  It named the journal and its directory, whatever they held.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import trio

from affidavit.journal import Journal, JournalError
from tests.external import require_root

from .test_exposure import NOBODY, _make, _run_as


def _refused(db: Path, **keys: Path) -> str:
    async def run() -> None:
        async with Journal.open(db, **keys):
            pass

    with pytest.raises(JournalError) as refused:
        trio.run(run)
    return str(refused.value)


def _give(owner: int, *paths: Path) -> None:
    for path in paths:
        os.chown(path, owner, owner)


def test_a_directory_of_the_journals_alone_is_given_whole_a_key_elsewhere_by_name(
    tmp_path: Path,
) -> None:
    require_root()
    home, keys = tmp_path / "journal", tmp_path / "keys"
    home.mkdir()
    keys.mkdir()
    db = home / "journal.db"
    key, signing = keys / "broker.key", keys / "signing.key"
    _make_with(db, key_file=key, signing_key=signing)
    _give(NOBODY, home, *home.iterdir(), key)
    before = sorted(home.iterdir())
    said = _refused(db, key_file=key, signing_key=signing)
    assert said.endswith(_run_as(NOBODY, f"chown -R 0 -- {home} && chown -h 0 -- {key}")), said
    assert sorted(home.iterdir()) == before  # nothing of root's made


def test_a_shared_directory_is_never_given_to_root_its_journal_moves(tmp_path: Path) -> None:
    require_root()
    home = tmp_path / "alice"
    home.mkdir()
    db = home / "journal.db"
    _make(db)
    (home / "notes.txt").write_text("alice's own")
    _give(NOBODY, home, *home.iterdir())
    said = _refused(db)
    files = " ".join(str(p) for p in (db, Path(f"{db}-wal"), Path(f"{db}.lock")))
    keys = f"{db}.key {db}.signing.key"
    assert said.endswith(
        _run_as(
            NOBODY,
            f"chown -h 0 -- {files} {keys}, and keep the journal in a directory of its own root "
            f"owns ({home} holds other files: a chown of it would take them from their owner)",
        )
    ), said
    assert f"chown -R 0 -- {home}" not in said and f"chown 0 -- {home} " not in said
    # No journal there yet: nothing to give, the journal to be named elsewhere.
    (home / "journal.db").unlink()
    for leftover in home.glob("journal.db*"):
        leftover.unlink()
    said = _refused(db)
    assert said.startswith(f"the directory of journal {db} is owned by uid {NOBODY}"), said
    assert said.endswith(
        "if root is to run the broker from now on: keep the journal in a directory of its own "
        f"root owns ({home} holds other files: a chown of it would take them from their owner)"
    ), said


def _make_with(db: Path, **keys: Path) -> None:
    async def run() -> None:
        async with Journal.open(db, **keys):
            pass

    trio.run(run)


def _theirs_through(tmp_path: Path, *, shared: bool) -> tuple[Path, Path]:
    """``tmp_path/data/j.db`` with a long results' directory (a segment file in it) and the
    console's login tokens' directory, all another user's, and a link ``tmp_path/links/j.db``
    to it; ``shared``: ``data`` holds a file of its owner's too."""
    data, links = tmp_path / "data", tmp_path / "links"
    data.mkdir()
    links.mkdir()
    db = data / "j.db"
    _make(db)
    for made in (Path(f"{db}.results"), Path(f"{db}.console-tokens")):
        made.mkdir(mode=0o700, exist_ok=True)
        (made / "theirs").touch(mode=0o600)
        _give(NOBODY, made / "theirs")
    if shared:
        (data / "notes.txt").write_text("theirs")
    _give(NOBODY, data, *data.iterdir())
    (links / "j.db").symlink_to(db)
    return db, links / "j.db"


def test_through_a_link_or_a_relative_name_a_directory_of_the_journals_alone_is_given_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Judged from the name given, the journal's directory (beside a link's: another one) held
    "other files" -- the journal itself, the console's token directory -- and the results
    directory (``<link>.results``) was never the one found: it was told ``chown 0``, its
    segment files left the other user's.  Every path said is absolute (a relative journal was
    said as given, beside absolute ones)."""
    require_root()
    db, link = _theirs_through(tmp_path, shared=False)
    want = _run_as(NOBODY, f"chown -R 0 -- {db.parent}")
    assert _refused(link).endswith(want), _refused(link)
    monkeypatch.chdir(tmp_path)
    assert _refused(Path("links/j.db")).endswith(want)
    assert _refused(Path("data/j.db")).endswith(want)


def test_in_a_shared_directory_the_results_and_tokens_directories_are_given_with_their_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_root()
    db, link = _theirs_through(tmp_path, shared=True)
    files = f"{db} {db}-wal {db}.lock {db}.key {db}.signing.key"
    trees = f"chown -R 0 -- {db}.console-tokens && chown -R 0 -- {db}.results"
    want = _run_as(
        NOBODY,
        f"chown -h 0 -- {files} && {trees}, and keep the journal in a directory of its own root "
        f"owns ({db.parent} holds other files: a chown of it would take them from their owner)",
    )
    assert _refused(link).endswith(want), _refused(link)
    monkeypatch.chdir(tmp_path)
    assert _refused(Path("links/j.db")).endswith(want), _refused(Path("links/j.db"))


def test_a_link_planted_at_the_lock_is_given_as_a_link_never_its_file(tmp_path: Path) -> None:
    """``<journal>.lock`` (or ``-wal``), a link another user planted to a file of theirs -- or
    of a third's: root's pasted ``chown 0 -- <journal>.lock`` followed it and took that file
    from its owner.  Judged by ``lstat`` and given with ``chown -h``: the link, not its file."""
    require_root()
    home = tmp_path / "journal"  # root's: the files are named one by one
    home.mkdir()
    db = home / "journal.db"
    _make(db)
    victim = tmp_path / "victim.conf"
    victim.write_text("another service's")
    _give(NOBODY, db, victim)
    lock = Path(f"{db}.lock")
    lock.unlink()
    lock.symlink_to(victim)
    os.lchown(lock, NOBODY, NOBODY)
    said = _refused(db)
    pasted = said.rsplit("from now on: ", 1)[1]
    assert pasted.startswith("chown -h 0 -- ") and str(lock) in pasted, said
    subprocess.run(["sh", "-c", pasted], check=True, timeout=30)
    assert victim.stat().st_uid == NOBODY  # its file untouched
    assert os.lstat(lock).st_uid == 0 and db.stat().st_uid == 0
