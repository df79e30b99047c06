"""The journal's words for a file it cannot open name the file, never its directory apart:
``engine.unplaced`` takes the path out whole of what a caller is told, and a directory named
beside it ("its directory /srv/x is read-only") would stay."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from affidavit.engine.location import unplaced
from journal.sqlite import SqliteBackend, unreadable, unusable

CANARY = "CANARY-journal-dir-e51"


def test_no_word_about_an_unusable_journal_names_its_directory_to_a_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = tmp_path / CANARY / "journal.db"  # its directory does not exist
    words = [str(unusable(gone))]
    home = tmp_path / f"{CANARY}-2"
    home.mkdir()
    db = home / "journal.db"
    db.touch()
    # A directory this user may not write (root writes every one: the check is told so).
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != home)
    words += [str(unusable(db)), str(unreadable(db, OSError("unable to open database file")))]
    assert "does not exist" in words[0] and "read-only" in words[1] and "-shm" in words[2]
    for said, where in zip(words, (gone, db, db), strict=True):
        assert str(where) in said, said  # the operator's words name the file
        told = unplaced("JOURNAL_UNREADABLE", said, where)
        assert CANARY not in told and str(tmp_path) not in told, told


def test_a_segment_failure_of_a_linked_journal_names_neither_path_to_a_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The segment directory follows the file a link names (``names.py``), and the words of a
    segment that cannot be read or written name it: the resolved path, which ``unplaced`` did
    not take out -- it knew only the name given."""
    home = tmp_path / CANARY
    home.mkdir()
    (tmp_path / "links").mkdir()
    link = tmp_path / "links" / "journal.db"
    link.symlink_to(home / "journal.db")
    segments = SqliteBackend(link).segments
    assert segments is not None and CANARY in str(segments)
    monkeypatch.chdir(tmp_path)
    for given in (link, Path("links/journal.db")):
        said = f"result segment {segments / 'seg-000001'} cannot be read: Permission denied"
        told = unplaced("JOURNAL_UNREADABLE", said, given)
        assert CANARY not in told and str(tmp_path) not in told, told
        assert told == "result segment the journal.results/seg-000001 cannot be read: " + (
            "Permission denied"
        )


def test_a_segment_failure_after_the_link_is_re_pointed_names_neither_path(
    tmp_path: Path,
) -> None:
    """The backend reads the file it opened (``SqliteBackend.real``, resolved once); the link
    re-pointed since resolves elsewhere, so resolving it again at the message named the wrong
    file and told the caller the one opened, whole (the reviewer's unpl.py).  The surfaces
    (the daemon's, MCP's) pass the path the backend opened."""
    old, new = tmp_path / CANARY / "a", tmp_path / CANARY / "b"
    old.mkdir(parents=True)
    new.mkdir()
    link = tmp_path / "current.db"
    link.symlink_to(old / "j.db")
    backend = SqliteBackend(link)
    said = f"journal {link}: result segment {backend.segments}/w1.seg unreadable"
    link.unlink()
    link.symlink_to(new / "j.db")
    told = unplaced("JOURNAL_UNREADABLE", said, link, opened=backend.path)
    assert told == "the journal: result segment the journal.results/w1.seg unreadable", told
