"""The signing key and its checkpoints (issue 9, item 3): created 0600 with the journal, one
checkpoint per committing transaction (so per batch under group commit, not per row), the public
key exported for auditors, and journals from before signing reported -- not silently passed."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from pathlib import Path

import pytest
import trio

from affidavit.cli import main as cli_main
from affidavit.journal import Batch, Journal, JournalError, JournalReader, SigningKey
from affidavit.journal.signing import load_public_key
from affidavit.statemachine import Event

from .helpers import happy, interrupted


def _written(db: Path, events: list[Event]) -> Path:
    """A journal at ``db`` holding ``events``, written by a (signing) broker and closed."""

    async def write() -> None:
        async with Journal.open(db) as j:
            for ev in events:
                await j.append(ev)

    trio.run(write)
    return db


async def test_a_new_journal_creates_its_signing_key_0600(tmp_path: Path) -> None:
    async with Journal.open(tmp_path / "j.db") as j:
        await j.append(happy("inv-1")[0])
        key = SigningKey.load(tmp_path / "j.db.signing.key")
        assert j.public_key == key.public_raw
    assert stat.S_IMODE((tmp_path / "j.db.signing.key").stat().st_mode) == 0o600
    with JournalReader.open(tmp_path / "j.db") as r:
        assert r.recorded_public_key() == key.public_raw
        cp = r.latest_checkpoint()
        assert cp is not None and (cp.seq, cp.prev, cp.adopted) == (1, 0, False)
        assert cp.key_id == key.key_id


async def test_group_commit_signs_once_per_transaction(tmp_path: Path) -> None:
    batches: list[Batch] = []
    async with Journal.open(tmp_path / "j.db") as j:
        j.before_commit = batches.append

        async def one(i: int) -> None:
            for ev in happy(f"inv-{i}"):
                await j.append(ev, barrier=True)

        async with trio.open_nursery() as nursery:
            for i in range(32):
                nursery.start_soon(one, i)
    conn = sqlite3.connect(tmp_path / "j.db")
    (checkpoints,) = conn.execute("SELECT count(*) FROM checkpoints").fetchone()
    (rows,) = conn.execute("SELECT count(*) FROM events").fetchone()
    conn.close()
    assert checkpoints == len(batches) < rows / 4  # one per batch, not one per row
    with JournalReader.open(tmp_path / "j.db") as r:
        report = r.verify()
    assert report.ok and report.signed_seq == rows


async def test_a_transaction_that_appends_no_row_signs_nothing(tmp_path: Path) -> None:
    async with Journal.open(tmp_path / "j.db") as j:
        for ev in happy("inv-1"):
            await j.append(ev)
        await j.put_result_chunk("inv-1", "body", 0, b"x")  # a chunk alone: no event
    conn = sqlite3.connect(tmp_path / "j.db")
    (n,) = conn.execute("SELECT count(*) FROM checkpoints").fetchone()
    conn.close()
    assert n == len(happy("x"))


def test_public_key_export_for_auditors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _written(tmp_path / "j.db", happy("inv-1")[:1])
    out = tmp_path / "journal.pub"
    assert (
        cli_main(["journal", "public-key", "--journal", str(tmp_path / "j.db"), "--out", str(out)])
        == 0
    )
    key = SigningKey.load(tmp_path / "j.db.signing.key")
    assert load_public_key(out) == key.public_raw
    assert key.key_id in capsys.readouterr().out
    assert b"PRIVATE" not in out.read_bytes()
    # Verify with it, with no key file of the broker's in reach.
    os.unlink(tmp_path / "j.db.signing.key")
    os.unlink(tmp_path / "j.db.key")
    assert (
        cli_main(
            ["journal", "verify", "--journal", str(tmp_path / "j.db"), "--public-key", str(out)]
        )
        == 0
    )
    assert "signed through seq 1" in capsys.readouterr().out
    assert cli_main(["journal", "public-key", "--journal", str(tmp_path / "j.db")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_verify_json_tells_what_was_checked_and_with_which_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _written(tmp_path / "j.db", interrupted("inv-1"))
    assert cli_main(["journal", "verify", "--journal", str(tmp_path / "j.db"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["signed_seq"] == out["count"] == 5
    assert out["key_source"] == "journal"  # not independent of the file: the text says so
    assert cli_main(["journal", "verify", "--journal", str(tmp_path / "j.db")]) == 0
    assert "recorded in the journal" in capsys.readouterr().out


# -- journals from before signing -----------------------------------------------------------------


def _unsigned(tmp_path: Path) -> Path:
    """A journal as a broker before signing left it: rows, no checkpoints, no signing key."""
    db = _written(tmp_path / "old.db", happy("inv-old"))
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("DROP TABLE checkpoints")
    conn.execute("DELETE FROM meta WHERE name IN ('signing_key_id', 'signing_public_key')")
    conn.execute("UPDATE meta SET value = '1' WHERE name = 'schema'")
    conn.close()
    os.unlink(f"{db}.signing.key")
    return db


def test_an_unsigned_journal_fails_verify_unless_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _unsigned(tmp_path)
    n = len(happy("x"))
    with JournalReader.open(db) as r:
        report = r.verify()
        assert (report.ok, report.first_bad_seq) == (False, 1)
        assert f"rows 1..{n} were written before this journal was signed" in report.reason
        accepted = r.verify(accept_unsigned=True)
        assert accepted.ok and accepted.unsigned_through == n and accepted.signed_seq is None
    assert cli_main(["journal", "verify", "--journal", str(db)]) == 1
    assert "--accept-unsigned" in capsys.readouterr().out
    assert cli_main(["journal", "verify", "--journal", str(db), "--accept-unsigned"]) == 0
    assert f"rows 1..{n} predate signing" in capsys.readouterr().out


def test_a_signing_broker_adopts_an_unsigned_journal_and_says_so(tmp_path: Path) -> None:
    db = _written(_unsigned(tmp_path), interrupted("inv-new"))
    n = len(happy("x"))
    key = SigningKey.load(f"{db}.signing.key")
    conn = sqlite3.connect(db)
    assert conn.execute(
        "SELECT seq, prev, adopted FROM checkpoints ORDER BY seq LIMIT 1"
    ).fetchone() == (
        n,
        0,
        1,
    )
    conn.close()
    with JournalReader.open(db) as r:
        report = r.verify(public_key=key.public_raw)
        assert (report.ok, report.first_bad_seq) == (False, 1)
        assert "adopted by a signing broker" in report.reason
        accepted = r.verify(public_key=key.public_raw, accept_unsigned=True)
        assert accepted.ok and accepted.unsigned_through == n
        assert accepted.signed_seq == n + len(interrupted("x"))


def test_a_journal_whose_signing_records_were_removed_is_not_adopted(tmp_path: Path) -> None:
    """Rows and a signing key file, but no checkpoints and no recorded key: someone removed
    them (to rewrite history and have the broker sign it).  The broker refuses to open it."""
    db = _written(tmp_path / "j.db", happy("inv-1"))
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("DROP TRIGGER checkpoints_no_delete")
    conn.execute("DELETE FROM checkpoints")
    conn.execute("DELETE FROM meta WHERE name IN ('signing_key_id', 'signing_public_key')")
    conn.close()

    async def reopen() -> None:
        async with Journal.open(db):
            pass

    with pytest.raises(JournalError, match="signing records were removed"):
        trio.run(reopen)
    with JournalReader.open(db) as r:
        assert not r.verify().ok


async def test_a_missing_signing_key_file_is_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    async with Journal.open(db) as j:
        await j.append(happy("inv-1")[0])
    os.unlink(f"{db}.signing.key")
    with pytest.raises(JournalError, match=r"signing key file .*does not exist"):
        async with Journal.open(db):
            pass


async def test_a_configured_signing_key_path_is_used(tmp_path: Path) -> None:
    keydir = tmp_path / "keys"
    keydir.mkdir()
    async with Journal.open(tmp_path / "j.db", signing_key=keydir / "sign.pem") as j:
        await j.append(happy("inv-1")[0])
    assert (keydir / "sign.pem").exists() and not (tmp_path / "j.db.signing.key").exists()
