"""Checkpoints are signed with PyNaCl (libsodium; issue 15: about half the CPU of OpenSSL's
Ed25519 in the single writer): the same signature bytes ``cryptography`` makes for the same key
and message, for a created and a loaded key and for every checkpoint a journal writes."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from affidavit.journal import Journal, JournalReader, SigningKey
from affidavit.journal.signing import checkpoint_message, verify_signature

from .helpers import happy

CHECKPOINTS = [
    (1, "00" * 32, 0, 1.7e9, False),
    (7, "ab" * 32, 1, 1796445319.748941, False),
    (2**40, "0f" * 32, 2**40 - 64, 0.1, True),
    (123, "ff" * 32, 99, 1733372800.0000002, False),
]


def test_libsodium_signs_the_bytes_openssl_signs(tmp_path: Path) -> None:
    key = SigningKey.create(tmp_path / "k.pem")
    for seq, h, prev, at, adopted in CHECKPOINTS:
        cp = key.sign(seq, h, prev, at, adopted)
        message = checkpoint_message(seq, h, prev, at, adopted)
        assert cp.signature == key._priv.sign(message)
        assert verify_signature(cp, key.public_raw)
    loaded = SigningKey.load(tmp_path / "k.pem")
    assert loaded.public_raw == key.public_raw
    assert loaded.sign(*CHECKPOINTS[1]) == key.sign(*CHECKPOINTS[1])
    other = SigningKey.create(tmp_path / "other.pem")
    assert other.sign(*CHECKPOINTS[1]).signature != key.sign(*CHECKPOINTS[1]).signature
    assert not verify_signature(other.sign(*CHECKPOINTS[1]), key.public_raw)


async def test_a_journal_signed_through_libsodium_verifies(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    async with Journal.open(db) as j:
        for ev in happy("inv-1") + happy("inv-2"):
            await j.append(ev, barrier=True)
    key = SigningKey.load(f"{db}.signing.key")
    conn = sqlite3.connect(db)
    sql = "SELECT seq, hash, prev, at, adopted, signature FROM checkpoints"
    rows = conn.execute(sql).fetchall()
    conn.close()
    assert len(rows) > 1
    for seq, h, prev, at, adopted, sig in rows:
        assert sig == key._priv.sign(checkpoint_message(seq, h, prev, at, bool(adopted)))
    with JournalReader.open(db) as r:
        report = r.verify()
    assert report.ok, report


async def test_reading_and_verifying_a_journal_does_not_load_libsodium(tmp_path: Path) -> None:
    """Only a broker that signs needs PyNaCl: a reader (``affidavit actions``, ``journal
    verify``, the console) verifies with cryptography and pays no libsodium load (~10 ms)."""
    db = tmp_path / "j.db"
    async with Journal.open(db) as j:
        for ev in happy("inv-1"):
            await j.append(ev)
    code = (
        "import sys; from affidavit.journal import JournalReader\n"
        f"with JournalReader.open({str(db)!r}) as r:\n"
        "    assert r.verify().ok\n"
        "    r.list_actions()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'nacl'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
