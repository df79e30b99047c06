"""What a passing ``journal verify`` says it proves, and what an anchor vouches for.

Each transaction signs its own checkpoint, so cutting the last rows and their checkpoints leaves
a shorter journal every row of which is signed: the public key cannot tell (docs/journal.md,
"What verify proves").  A passing report says so -- complete only through an anchor's seq, or
not at all without one -- in its text and in ``--json`` (``complete_through``).

An anchor taken without ``--public-key`` vouches for the key the journal names itself, and
``verify --anchor`` trusts the key the anchor names: both say so.  ``anchor --previous`` refuses a
journal that does not continue from the anchor before (another key, another or shorter history).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from affidavit.cli import main as cli_main
from affidavit.journal import (
    Journal,
    JournalReader,
    SigningKey,
    load_anchor,
    load_public_key,
    public_key_pem,
)
from affidavit.journal.chain import row_hash

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


# -- item: an anchor does not vouch for its own key unseen --------------------------------------


def test_an_anchor_from_the_journals_own_key_says_so(
    built: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "a.json"
    argv = ("journal", "anchor", "--journal", str(built.db), "--out", str(out))
    code, _, err = _cli(capsys, *argv)
    assert code == 0 and "recorded in the journal itself" in err
    code, _, err = _cli(capsys, *argv, "--public-key", str(built.public_key))
    assert code == 0 and "recorded in the journal itself" not in err
    # To stdout: the anchor alone there, the note on stderr.
    code, stdout, err = _cli(capsys, "journal", "anchor", "--journal", str(built.db))
    assert code == 0 and json.loads(stdout)["seq"] == built.rows and "note:" in err


def test_verify_with_an_anchors_key_says_where_the_key_came_from(
    built: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    anchor = tmp_path / "a.json"
    assert _anchor(built, anchor, capsys, "--public-key", str(built.public_key)) == 0
    verify = ("journal", "verify", "--journal", str(built.db), "--anchor", str(anchor))
    code, out, _ = _cli(capsys, *verify)
    assert code == 0 and "note: checked with the key the anchor names itself" in out
    code, out, _ = _cli(capsys, *verify, "--public-key", str(built.public_key))
    assert code == 0 and "note:" not in out


def _replaced(b: Built, tmp_path: Path) -> Path:
    """A journal of someone's own, with its own signing key, put where ``b``'s was."""
    other = tmp_path / "other" / "j.db"
    other.parent.mkdir()
    trio.run(_fill, other)
    b.db.unlink()
    for suffix in ("-wal", "-shm"):
        Path(f"{b.db}{suffix}").unlink(missing_ok=True)
    shutil.copy2(other, b.db)
    return b.db


def _anchored(b: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    first = tmp_path / "first.json"
    assert _anchor(b, first, capsys, "--public-key", str(b.public_key)) == 0
    return first


def test_anchor_previous_refuses_a_journal_replaced_with_another_key(
    built: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _anchored(built, tmp_path, capsys)
    _replaced(built, tmp_path)
    out = tmp_path / "next.json"
    argv = ("journal", "anchor", "--journal", str(built.db), "--out", str(out))
    assert _cli(capsys, *argv)[0] == 0  # without --previous: the new key, vouched for (noted)
    out.unlink()
    code, stdout, _ = _cli(capsys, *argv, "--previous", str(first))
    assert code == 1 and "(ANCHOR_KEY_DIFFERS)" in stdout and "no anchor written" in stdout
    assert "BROKEN at seq None" not in stdout and not out.exists()


def test_anchor_previous_empty_is_refused_not_taken_as_no_previous(
    built: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--previous "$LAST"`` with ``LAST`` unset: the continuation check asked for, not off --
    a journal replaced with another key would be anchored (verifyfix50b's review)."""
    _anchored(built, tmp_path, capsys)
    _replaced(built, tmp_path)
    out = tmp_path / "next.json"
    argv = ("journal", "anchor", "--journal", str(built.db), "--out", str(out))
    code, stdout, err = _cli(capsys, *argv, "--previous", "")
    assert code == 2 and not out.exists(), (stdout, err)
    assert err == (
        "affidavit: INVALID_FIELD: --previous: empty: name the previous anchor's file (or leave "
        "--previous off to take a first anchor)\n"
    ), err


def test_anchor_previous_refuses_a_journal_cut_before_it_or_rewritten(
    built: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _anchored(built, tmp_path, capsys)
    out = tmp_path / "next.json"
    argv = ("journal", "anchor", "--journal", str(built.db), "--out", str(out))
    code, _, _ = _cli(capsys, *argv, "--previous", str(first))
    assert code == 0 and out.exists()  # the same history: it continues
    out.unlink()
    _cut(built.db, built.rows - 2)  # back to a checkpoint: every row left is signed
    code, stdout, _ = _cli(capsys, *argv, "--previous", str(first))
    assert code == 1 and "(ANCHOR_HISTORY_DIFFERS)" in stdout and not out.exists()


def _forge_with_a_registered_key(b: Built, tmp_path: Path) -> None:
    """Register a key of one's own beside the journal's (as a broker of a shared journal
    registers its own) and append a row signed by it: the recorded keys verify it."""
    other = SigningKey.create(tmp_path / "mine.key")
    conn = sqlite3.connect(b.db, isolation_level=None)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {name}")
    raw = base64.b64encode(other.public_raw).decode()
    conn.execute("INSERT INTO meta VALUES (?, ?)", (f"signing_key:{other.key_id}", raw))
    seq, prev = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    row = (seq + 1, 1_900_000_000.0, "inv-u", "sess-1", "RECONCILED", "operator_attested",
           None, None, '{"outcome":"rejected"}', None, None)  # fmt: skip
    h = row_hash(prev, *row)
    conn.execute(f"INSERT INTO events VALUES ({','.join('?' * 13)})", (*row, prev, h))
    cp = other.sign(seq + 1, h, seq, 1_900_000_000.0)
    conn.execute(
        "INSERT INTO checkpoints VALUES (?,?,?,?,?,?,?)",
        (cp.seq, cp.hash, cp.prev, cp.at, 0, cp.key_id, cp.signature),
    )
    conn.close()


def test_anchor_previous_refuses_a_head_signed_by_a_key_the_file_added(
    built: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _anchored(built, tmp_path, capsys)
    _forge_with_a_registered_key(built, tmp_path)
    out = tmp_path / "next.json"
    argv = ("journal", "anchor", "--journal", str(built.db), "--out", str(out))
    code, stdout, _ = _cli(capsys, *argv, "--previous", str(first))
    assert code == 1 and "(ANCHOR_KEY_DIFFERS)" in stdout and not out.exists()
    # Pinned to the broker's key, the forged checkpoint is what fails.
    code, stdout, _ = _cli(
        capsys, *argv, "--previous", str(first), "--public-key", str(built.public_key)
    )
    assert code == 1 and f"BROKEN at seq {built.rows + 1}" in stdout and not out.exists()


def test_an_extension_that_finds_a_problem_claims_no_completeness(built: Built) -> None:
    """``verify_since`` extends an intact report; one that finds a new row altered is broken
    and, as a whole verify's broken report, proves the journal complete through nothing --
    it kept ``base.complete_through``."""
    with JournalReader.open(built.db) as r:
        base = dataclasses.replace(r.verify(), complete_through=3)  # as an anchored one says
    trio.run(_more, built.db)
    conn = sqlite3.connect(built.db, isolation_level=None)
    conn.execute("DROP TRIGGER IF EXISTS events_no_update")
    conn.execute("UPDATE events SET at = at + 1 WHERE seq = ?", (built.rows + 1,))
    conn.close()
    with JournalReader.open(built.db) as r:
        ext = r.verify_since(base)
    assert ext is not None and not ext.ok and ext.first_bad_seq == built.rows + 1
    assert ext.complete_through is None


async def _more(db: Path) -> None:
    async with Journal.open(db) as j:
        for ev in happy("inv-c"):
            await j.append(ev)


def test_the_library_anchor_refuses_a_head_signed_by_a_key_the_file_added(
    built: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The "same key as the previous anchor" rule lived only in the CLI: ``anchor(previous=)``
    with the recorded keys returned an anchor for the key the file added."""
    first = load_anchor(_anchored(built, tmp_path, capsys))
    _forge_with_a_registered_key(built, tmp_path)
    with JournalReader.open(built.db) as r:
        report, anchor = r.anchor(previous=first)
        assert anchor is None and not report.ok and report.code == "ANCHOR_KEY_DIFFERS"
        assert report.first_bad_seq is None and "not the previous anchor's" in report.reason
        # Given keys decide: the broker's alone, the forged checkpoint is what fails.
        pinned = load_public_key(built.public_key)
        report, anchor = r.anchor(public_keys=[pinned], previous=first)
        assert anchor is None and report.first_bad_seq == built.rows + 1
