"""Auditor copies of results (issue 9, item 3): with ``auditor_public_key`` configured, every
stored result chunk and summary is also sealed to the auditor's X25519 key.  The auditor opens
them with its private key, checked against the same chained hashes as the broker's copy; the
broker's key does not open them; ``verify`` checks them without any key."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from pathlib import Path

import pytest
import trio

from affidavit.cli import main as cli_main
from affidavit.journal import Journal, JournalError, JournalReader, SigningKey, public_key_pem
from affidavit.journal.sealing import BrokerKey, chunk_aad
from affidavit.statemachine import Event, EventKind

from .helpers import happy


def journal_pub(db: Path) -> Path:
    """The journal's signing public key, exported as ``journal public-key`` does, for the
    auditor to pin (``audit-open --public-key``)."""
    out = db.with_name("journal.pub")
    out.write_bytes(public_key_pem(SigningKey.load(f"{db}.signing.key").public_raw))
    return out


OUT = [b"line one\n", b"line two\n", b"\xff\xfe binary tail"]


async def _store(db: Path, auditor: Path | None) -> int:
    async with Journal.open(db, auditor_public_key=auditor) as j:
        for ev in happy("inv-a"):
            await j.append(ev, payload={"action": {"command": "deploy"}})
        for i, part in enumerate(OUT):
            await j.put_result_chunk("inv-a", "stdout", i, part)
        await j.put_result_chunk("inv-a", "stderr", 0, b"warning")
        ev = await j.commit_result(
            Event(EventKind.RESULT_COMMITTED, "inv-a"), summary={"exit_status": 0}
        )
        assert ev.seq is not None
        return ev.seq


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    d = tmp_path / "auditor-host"
    d.mkdir()
    priv, pub = d / "auditor.pem", tmp_path / "auditor.pub"
    assert cli_main(["journal", "audit-keygen", str(priv), str(pub)]) == 0
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    return priv, pub


async def test_the_auditor_opens_the_result_and_the_broker_cannot(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    priv, pub = keys
    db = tmp_path / "j.db"
    await _store(db, pub)
    with JournalReader.open(db) as r:
        broker_copy = r.read_result("inv-a")
        audit_copy = r.audit_result("inv-a", priv)
    assert broker_copy is not None and audit_copy is not None
    assert audit_copy.streams == {"stdout": b"".join(OUT), "stderr": b"warning"}
    assert audit_copy.summary == broker_copy.summary == {"exit_status": 0}
    assert audit_copy.sha256 == broker_copy.sha256
    # The broker's own key does not open an auditor copy...
    conn = sqlite3.connect(db)
    (blob,) = conn.execute(
        "SELECT data FROM result_audit WHERE invocation_id = 'inv-a' AND stream = 'stdout' "
        "AND idx = 0"
    ).fetchone()
    (n_events,) = conn.execute("SELECT sum(audit IS NOT NULL) FROM events").fetchone()
    conn.close()
    with pytest.raises(JournalError):
        BrokerKey.load(f"{db}.key").open(blob, chunk_aad("inv-a", "stdout", 0))
    # ...nor does another auditor's.
    other = tmp_path / "other.pem"
    assert cli_main(["journal", "audit-keygen", str(other), str(tmp_path / "other.pub")]) == 0
    with JournalReader.open(db) as r, pytest.raises(JournalError, match="does not open"):
        r.audit_result("inv-a", other)
    # Every event with a payload got its auditor copy (the query, no longer 0).
    assert n_events == len(happy("x"))


async def test_audit_open_on_the_command_line(
    tmp_path: Path, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    priv, pub = keys
    db = tmp_path / "j.db"
    await _store(db, pub)
    base = ["journal", "audit-open", "--journal", str(db), "--key", str(priv)]
    base += ["--public-key", str(journal_pub(db))]
    assert cli_main([*base, "--seq", "1"]) == 0
    assert json.loads(capsys.readouterr().out) == {"action": {"command": "deploy"}}
    assert cli_main([*base, "--result", "inv-a"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["stderr"] == "warning" and shown["exit_status"] == 0
    assert "stdout_base64" in shown  # not UTF-8: shown as base64, like any result
    assert cli_main([*base, "--result", "no-such"]) == 2
    assert "no auditor copy" in capsys.readouterr().err
    # A seq past the journal's integer column: a usage error, not SQLite's OverflowError.
    for seq in ("99999999999999999999999", "-1", "\u00b2"):
        assert cli_main([*base, "--seq", seq]) == 2, seq
        err = capsys.readouterr().err
        assert "--seq: expected a whole number" in err and "Traceback" not in err, err


def _audit_open_json(
    capsys: pytest.CaptureFixture[str], db: Path, key: Path, *which: str
) -> dict[str, str]:
    """``journal audit-open --json`` refused: its ``api_error`` (exit 2, nothing else out)."""
    base = ["journal", "audit-open", "--journal", str(db), "--key", str(key), "--json"]
    assert cli_main([*base, "--public-key", str(journal_pub(db)), *which]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    error: dict[str, str] = json.loads(out)["api_error"]
    return error


async def test_audit_open_names_the_key_to_fix_or_the_result_that_fails(
    tmp_path: Path, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A key that cannot open a proven copy (another auditor's, missing, not 0600) is the
    ``--key`` file to fix (FILE_UNUSABLE), not an unreadable journal; a result copy that fails
    its verification is RESULT_UNVERIFIED, as ``affidavit result`` answers the broker's copy.
    Never a byte of what is sealed."""
    priv, pub = keys
    db = tmp_path / "j.db"
    await _store(db, pub)
    other = tmp_path / "other.pem"
    assert cli_main(["journal", "audit-keygen", str(other), str(tmp_path / "other.pub")]) == 0
    capsys.readouterr()
    loose = tmp_path / "loose.pem"
    loose.write_bytes(priv.read_bytes())
    loose.chmod(0o644)
    cases = {
        other: "the key is not the one it was sealed to",
        tmp_path / "absent.pem": "does not exist",
        loose: "chmod 600",
    }
    for key, why in cases.items():
        for which in (["--seq", "1"], ["--result", "inv-a"]):
            error = _audit_open_json(capsys, db, key, *which)
            assert (error["code"], error["field"]) == ("FILE_UNUSABLE", "--key"), error
            assert str(key) in error["message"] and why in error["message"], error
            assert "deploy" not in error["message"] and "line one" not in error["message"]
    # Proven only with the key the journal records itself, the copy may be a rewriter's: the
    # message does not claim the key is at fault, and says how to prove it.
    trusting = ["journal", "audit-open", "--journal", str(db), "--key", str(other), "--json"]
    assert cli_main([*trusting, "--trust-journal-key", "--seq", "1"]) == 2
    error = json.loads(capsys.readouterr().out)["api_error"]
    assert (error["code"], error["field"]) == ("FILE_UNUSABLE", "--key"), error
    assert "or the journal was rewritten" in error["message"], error
    assert "proven by the signed chain" not in error["message"], error
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(
        "UPDATE result_audit SET data = zeroblob(length(data)) "
        "WHERE invocation_id = 'inv-a' AND stream = 'stdout' AND idx = 1"
    )
    conn.close()
    error = _audit_open_json(capsys, db, priv, "--result", "inv-a")
    assert error["code"] == "RESULT_UNVERIFIED" and "copy 1 differs" in error["message"], error
    assert "field" not in error and "line two" not in error["message"], error


async def test_without_an_auditor_key_there_is_no_copy_to_open(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    priv, _ = keys
    db = tmp_path / "j.db"
    await _store(db, None)
    with JournalReader.open(db) as r, pytest.raises(JournalError, match="does not exist"):
        r.audit_result("inv-a", priv)


async def test_verify_checks_the_auditor_copies_without_any_key(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    _, pub = keys
    db = tmp_path / "j.db"
    seq = await _store(db, pub)
    with JournalReader.open(db) as r:
        assert r.verify().ok
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(
        "UPDATE result_audit SET data = zeroblob(length(data)) "
        "WHERE invocation_id = 'inv-a' AND stream = 'stderr'"
    )
    conn.close()
    with JournalReader.open(db) as r:
        report = r.verify()
    assert (report.ok, report.first_bad_seq) == (False, seq)
    assert "auditor copy 0 differs" in report.reason


def test_audit_keygen_never_overwrites_a_key(
    keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    priv, pub = keys
    before = priv.read_bytes()
    assert cli_main(["journal", "audit-keygen", str(priv), str(pub)]) == 2
    assert "exists" in capsys.readouterr().err
    assert priv.read_bytes() == before


def test_audit_keygen_refuses_one_file_for_both_halves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``audit-keygen same.pem ./same.pem`` wrote the public key over the new private key:
    the private half lost, exit 0."""
    same = tmp_path / "same.pem"
    assert cli_main(["journal", "audit-keygen", str(same), str(tmp_path / "." / "same.pem")]) == 2
    err = capsys.readouterr().err
    assert "INVALID_FIELD" in err and "PUBLIC" in err and "same file" in err
    assert not same.exists()


def test_audit_keygen_never_overwrites_a_public_key_nor_leaves_half_a_pair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    priv, pub = tmp_path / "auditor.pem", tmp_path / "auditor.pub"
    pub.write_bytes(b"the public key the broker trusts\n")
    assert cli_main(["journal", "audit-keygen", str(priv), str(pub)]) == 2
    assert "FILE_EXISTS" in capsys.readouterr().err
    assert pub.read_bytes() == b"the public key the broker trusts\n"
    assert not priv.exists()  # the private key made for it is taken away again


@pytest.mark.parametrize("umask", [0o002, 0o077])
def test_audit_keygen_makes_the_public_key_0644_whatever_the_umask(
    tmp_path: Path, umask: int
) -> None:
    """Under umask 002 the public key was 0664, which the broker refuses as a trust anchor
    (writable by group); under 077 it was 0600, which the broker's user may not read."""
    priv, pub = tmp_path / "auditor.pem", tmp_path / "auditor.pub"
    old = os.umask(umask)
    try:
        assert cli_main(["journal", "audit-keygen", str(priv), str(pub)]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(pub.stat().st_mode) == 0o644
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600

    async def opened() -> None:
        async with Journal.open(tmp_path / "j.db", auditor_public_key=pub):
            pass

    trio.run(opened)
