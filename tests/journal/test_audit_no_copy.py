"""``journal audit-open --result`` on a result stored while no auditor key was configured: its
chained RESULT_COMMITTED names no auditor copy, so the records prove there is none -- exit 2
with NO_AUDITOR_COPY (docs/configuration.md), as for an event without one, never
JOURNAL_UNREADABLE (the journal was read, and proven).  A marker that lists a stream's auditor
copy while the signed event names no summary copy contradicts itself: RESULT_UNVERIFIED."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from affidavit.cli import main as cli_main
from affidavit.journal import (
    Journal,
    JournalReader,
    NoAuditorCopy,
    ResultUnverified,
    SigningKey,
    generate_auditor_keypair,
    public_key_pem,
)
from affidavit.statemachine import Event, EventKind

from .helpers import happy
from .test_audit_forged import _resign_with, _writable


async def _stored(d: Path, auditor: Path | None) -> tuple[Path, Path, Path]:
    """A journal holding ``inv-r``'s result (auditor copies sealed to ``auditor``, if given);
    (journal, auditor private key, journal's signing public key)."""
    db, priv, pub = d / "j.db", d / "auditor.pem", d / "auditor.pub"
    generate_auditor_keypair(priv, pub)
    async with Journal.open(db, auditor_public_key=auditor and pub) as j:
        for ev in happy("inv-r"):
            await j.append(ev)
        await j.put_result_chunk("inv-r", "body", 0, b"REAL BODY")
        await j.commit_result(Event(EventKind.RESULT_COMMITTED, "inv-r"), summary={"s": 201})
    journal_pub = d / "journal.pub"
    journal_pub.write_bytes(public_key_pem(SigningKey.load(f"{db}.signing.key").public_raw))
    return db, priv, journal_pub


def _refusal(capsys: pytest.CaptureFixture[str], db: Path, priv: Path, pub: Path) -> str:
    capsys.readouterr()
    args = ["journal", "audit-open", "--journal", str(db), "--key", str(priv), "--result", "inv-r"]
    assert cli_main([*args, "--public-key", str(pub)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "REAL BODY" not in err, err
    return err


async def test_a_result_stored_without_an_auditor_key_is_no_auditor_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db, priv, pub = await _stored(tmp_path, auditor=None)
    with JournalReader.open(db) as r, pytest.raises(NoAuditorCopy, match="no auditor key"):
        r.audit_result("inv-r", priv)
    err = _refusal(capsys, db, priv, pub)
    assert err.startswith("affidavit: NO_AUDITOR_COPY: auditor copy of the result of "), err
    assert "invocation inv-r" in err and "no auditor key was configured when stored" in err, err


async def test_stream_copies_without_a_chained_summary_copy_are_result_unverified(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db, priv, pub = await _stored(tmp_path, auditor=tmp_path / "auditor.pub")
    conn = _writable(db)
    (seq, attrs_json) = conn.execute(
        "SELECT seq, attrs FROM events WHERE kind = 'RESULT_COMMITTED'"
    ).fetchone()
    attrs = json.loads(attrs_json)
    del attrs["audit_summary_sha256"]  # the marker still lists the body's auditor copy
    conn.execute("UPDATE events SET attrs = ? WHERE seq = ?", (json.dumps(attrs), seq))
    # Re-signed with the journal's own key: the row is proven, and says what it says.
    _resign_with(conn, SigningKey.load(f"{db}.signing.key"))
    conn.close()
    with JournalReader.open(db) as r, pytest.raises(ResultUnverified, match="no summary copy"):
        r.audit_result("inv-r", priv)
    err = _refusal(capsys, db, priv, pub)
    assert err.startswith("affidavit: RESULT_UNVERIFIED: auditor copy of the result of "), err
