"""What a passing ``journal verify`` says it proves, and what an anchor vouches for.

Each transaction signs its own checkpoint, so cutting the last rows and their checkpoints leaves
a shorter journal every row of which is signed: the public key cannot tell (docs/journal.md,
"What verify proves").  A passing report says so -- complete only through an anchor's seq, or
not at all without one -- in its text and in ``--json`` (``complete_through``).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from affidavit.cli import main as cli_main
from affidavit.journal import Journal, SigningKey, public_key_pem

from .helpers import happy, interrupted


@dataclass(frozen=True)
class Built:
    db: Path
    public_key: Path
    rows: int


async def _fill(db: Path) -> int:
    async with Journal.open(db) as j:
        for ev in [*happy("inv-a"), *happy("inv-b"), *interrupted("inv-u")]:
            await j.append(ev)
        return int(j.head()[0])


@pytest.fixture
def built(tmp_path: Path) -> Built:
    db = tmp_path / "j.db"
    rows = trio.run(_fill, db)
    pub = tmp_path / "journal.pub"
    pub.write_bytes(public_key_pem(SigningKey.load(f"{db}.signing.key").public_raw))
    return Built(db, pub, rows)


def _cut(db: Path, after: int) -> None:
    """Remove every row after ``after`` and their checkpoints, as someone with write access
    and no key would (the append-only triggers dropped first)."""
    conn = sqlite3.connect(db, isolation_level=None)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {name}")
    conn.execute("DELETE FROM events WHERE seq > ?", (after,))
    conn.execute("DELETE FROM checkpoints WHERE seq > ?", (after,))
    conn.close()


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli_main(list(argv))
    got = capsys.readouterr()
    return code, got.out, got.err


def _anchor(b: Built, out: Path, capsys: pytest.CaptureFixture[str], *more: str) -> int:
    code, _, _ = _cli(capsys, "journal", "anchor", "--journal", str(b.db), "--out", str(out), *more)
    return code


# -- item: what a passing report proves of the journal's end ------------------------------------


def test_a_tail_cut_to_a_checkpoint_passes_saying_rows_could_have_been_removed(
    built: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    _cut(built.db, built.rows - 3)
    verify = (
        "journal",
        "verify",
        "--journal",
        str(built.db),
        "--public-key",
        str(built.public_key),
    )
    code, out, _ = _cli(capsys, *verify)
    assert code == 0 and f"signed through seq {built.rows - 3}" in out
    assert "no anchor: rows after any checkpoint could have been removed unseen" in out
    code, out, _ = _cli(capsys, *verify, "--json")
    data = json.loads(out)
    assert code == 0 and data["ok"] and data["complete_through"] is None
    assert data["anchor_seq"] is None and data["signed_seq"] == built.rows - 3  # fields kept


def test_an_anchor_proves_the_journal_complete_through_its_seq_only(
    built: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    early = tmp_path / "early.db"
    shutil.copy2(built.db, early)
    _cut(early, built.rows - 5)
    anchor = tmp_path / "anchor.json"
    code, _, _ = _cli(capsys, "journal", "anchor", "--journal", str(early), "--out", str(anchor))
    assert code == 0
    seq = built.rows - 5
    # The full journal, then the one cut back to seq + 2: both reach the anchor, both pass,
    # and neither report claims more than the anchor's seq.
    for cut in (None, seq + 2):
        if cut is not None:
            _cut(built.db, cut)
        verify = ("journal", "verify", "--journal", str(built.db), "--anchor", str(anchor))
        code, out, _ = _cli(capsys, *verify)
        assert code == 0, out
        assert f"matches the anchor at seq {seq}: complete through seq {seq} only" in out
        assert "rows after it could have been removed unseen" in out
        code, out, _ = _cli(capsys, *verify, "--json")
        data = json.loads(out)
        assert (data["complete_through"], data["anchor_seq"]) == (seq, seq)


def test_a_broken_journal_is_proven_complete_through_nothing(
    built: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    anchor = tmp_path / "anchor.json"
    assert _anchor(built, anchor, capsys) == 0
    _cut(built.db, built.rows - 2)
    verify = ("journal", "verify", "--journal", str(built.db), "--anchor", str(anchor), "--json")
    code, out, _ = _cli(capsys, *verify)
    data = json.loads(out)
    assert code == 1 and not data["ok"] and data["complete_through"] is None
