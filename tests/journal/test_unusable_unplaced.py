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
