"""The journal's words for a file it cannot open name the file, never its directory apart:
``engine.unplaced`` takes the path out whole of what a caller is told, and a directory named
beside it ("its directory /srv/x is read-only") would stay."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from affidavit.engine.location import unplaced
from journal.sqlite import unreadable, unusable

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
