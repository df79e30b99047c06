"""``affidavit journal open-sealed ID`` (affidavit/cli/sealed.py): the operator, holding the
broker key file, reads why a credential failed -- the reference, the file, the OS's words --
which the caller is never told.  With a canary in every credential: the caller's envelope,
record and events and the broker's log never show it, and neither does the sealed detail the
operator opens (the reason, never the value).  A wrong key file or an altered blob is refused,
naming the file; nothing is printed then."""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.cli import main as cli_main
from affidavit.config import load_config
from affidavit.journal.sealing import BrokerKey
from affidavit.secrets.vault import PASSPHRASE_ENV, Vault
from affidavit.statemachine import EventKind
from affidavit.views import event_to_json, record_to_json

from .helpers import write_config

CANARY = "CANARY-opsealed-7d41c2"
PASS = "correct horse battery staple"


@pytest.fixture(autouse=True)
def _no_env_passphrase(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PASSPHRASE_ENV, raising=False)


def _target(ref: str) -> dict[str, Any]:
    return {
        "kind": "http",
        "url": "http://127.0.0.1:9",
        "methods": ["GET"],
        "credential": ref,
        "inject": "bearer",
    }


async def _failures(
    tmp: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> tuple[Path, dict[str, tuple[str, str, str]]]:
    """Three credentials that fail, each holding the canary: {target: (invocation, reference,
    the operator's reason)}; asserts what the caller sees holds neither canary nor reference."""
    monkeypatch.setenv("AFF_OPSEALED_SPACED", f"{CANARY} spaced")
    loose = tmp / "loose.token"
    loose.write_text(CANARY)
    loose.chmod(0o644)
    vault = Vault.init(tmp / "s.vault", PASS, n_log2=10)
    vault.unlock(PASS)
    vault.put("api", CANARY.encode())
    vault.lock()
    refs = {
        "spaced": ("env:AFF_OPSEALED_SPACED", "a bearer token has no spaces"),
        "loose": (f"file:{loose}", "it must be 0600"),
        "locked": ("vault:api", str(tmp / "s.vault")),
    }
    cfg = write_config(
        tmp, {n: _target(ref) for n, (ref, _) in refs.items()}, vault=str(tmp / "s.vault")
    )
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    out = {}
    with trio.fail_after(15):
        async with Broker.open(config=load_config(cfg)) as broker:
            for name, (ref, reason) in refs.items():
                env = await broker.call({"target": name, "method": "GET", "path": "/"})
                iid = env["invocation_id"]
                assert env["error"]["field"] == f"targets.{name}.credential", env
                assert broker.events(iid)[-1].kind is EventKind.CREDENTIAL_FAILED
                fetched = await broker.fetch_result(iid)
                events = [event_to_json(e) for e in broker.events(iid)]
                caller = json.dumps([env, fetched, record_to_json(broker.record(iid)), events])
                assert ref not in caller and ref.split(":", 1)[1] not in caller, caller
                seen.append(caller)
                out[name] = (iid, ref, reason)
    assert all(CANARY not in s for s in seen)
    assert CANARY not in caplog.text
    return cfg, out


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli_main(["journal", "open-sealed", *args])
    done = capsys.readouterr()
    return code, done.out, done.err


async def test_the_operator_opens_the_detail_the_caller_never_sees(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cfg, failed = await _failures(tmp_path, monkeypatch, caplog)
    for name, (iid, ref, reason) in failed.items():
        code, out, err = _run(capsys, iid, "--config", str(cfg), "--json")
        assert code == 0, err
        shown = json.loads(out)
        by_kind = {s["kind"]: s["payload"] for s in shown["sealed"]}
        detail = by_kind["CREDENTIAL_FAILED"]["detail"]
        assert detail.startswith(f"{ref}: ") and reason in detail, detail
        action = {"target": name, "method": "GET", "path": "/"}
        assert by_kind["ACTION_ACCEPTED"] == {"action": action}
        assert shown["key_file"] == str(tmp_path / "journal.db.key")
        code, text, err = _run(capsys, iid, "--config", str(cfg))
        assert code == 0 and f"detail: {detail}" in text, (text, err)
        assert CANARY not in out + text + err
    # Beside --journal, without a config: the key file beside it.
    iid = failed["spaced"][0]
    code, out, _ = _run(capsys, iid, "--journal", str(tmp_path / "journal.db"))
    assert code == 0 and "a bearer token has no spaces" in out


async def test_a_wrong_or_unusable_key_file_is_named_and_nothing_is_shown(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cfg, failed = await _failures(tmp_path, monkeypatch, caplog)
    iid = failed["locked"][0]
    other = tmp_path / "other.key"
    BrokerKey.create(other)
    loose = tmp_path / "loose.key"
    loose.write_bytes((tmp_path / "journal.db.key").read_bytes())
    loose.chmod(0o644)
    cases = {
        other: "does not match this journal",
        tmp_path / "absent.key": "does not exist",
        loose: "must be 0600",
        tmp_path / "loose.token": "is not an affidavit journal key",
    }
    (tmp_path / "loose.token").chmod(0o600)
    for key, why in cases.items():
        code, out, err = _run(capsys, iid, "--config", str(cfg), "--key-file", str(key))
        assert (code, out) == (2, ""), (key, out)
        assert err.startswith("affidavit: FILE_UNUSABLE: ") and str(key) in err, err
        assert why in err and "Traceback" not in err, err
        # and the fix: which key file to name, and how (the mode's is its chmod)
        fix = "chmod 600" if key == loose else "--key-file FILE, or --config"
        assert fix in err, err
        assert CANARY not in err


async def test_an_altered_sealed_blob_is_refused_never_shown(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cfg, failed = await _failures(tmp_path, monkeypatch, caplog)
    iid = failed["loose"][0]
    db = tmp_path / "journal.db"
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        seq, blob = conn.execute(
            "SELECT seq, payload FROM events WHERE invocation_id = ? "
            "AND kind = 'CREDENTIAL_FAILED'",
            (iid,),
        ).fetchone()
        flipped = bytearray(blob)
        flipped[20] ^= 1  # one ciphertext byte, nothing else touched
        conn.execute("DROP TRIGGER events_no_update")  # as whoever can write the file
        conn.execute("UPDATE events SET payload = ? WHERE seq = ?", (bytes(flipped), seq))
    finally:
        conn.close()
    code, out, err = _run(capsys, iid, "--config", str(cfg))
    assert (code, out) == (2, ""), out
    assert err.startswith("affidavit: JOURNAL_UNREADABLE: "), err
    assert f"the payload of seq {seq} cannot be read" in err, err
    assert "does not open with broker key file" in err and "the row was altered" in err, err
    assert "Traceback" not in err
    # The other invocations' payloads still open.
    code, out, _ = _run(capsys, failed["spaced"][0], "--config", str(cfg))
    assert code == 0 and "a bearer token has no spaces" in out
    # A journal that no longer records its key's id cannot tell whose key opens what.
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("DELETE FROM meta WHERE name = 'key_id'")
    finally:
        conn.close()
    code, out, err = _run(capsys, failed["spaced"][0], "--config", str(cfg))
    assert (code, out) == (2, ""), out
    assert err.startswith("affidavit: JOURNAL_UNREADABLE: ") and "no broker key id" in err, err


async def test_unknown_invocation_and_a_postgres_journal_without_a_key_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_config(tmp_path, {"api": _target("env:AFF_OPSEALED_NONE")})
    async with Broker.open(config=load_config(cfg)):
        pass
    code, out, err = _run(capsys, "act_nope", "--config", str(cfg))
    assert (code, out) == (2, "") and "NO_SUCH_INVOCATION" in err and "act_nope" in err, err
    code, out, err = _run(capsys, "act_nope", "--journal", "postgresql://u@127.0.0.1:9/x")
    assert (code, out) == (2, "") and "--key-file: required with a PostgreSQL journal" in err, err


async def test_a_payload_sealed_to_the_auditor_alone_is_said_not_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from affidavit.journal import Journal, generate_auditor_keypair
    from tests.journal.helpers import accepted

    generate_auditor_keypair(tmp_path / "auditor.pem", tmp_path / "auditor.pub")
    db = tmp_path / "j.db"
    opened = Journal.open(db, auditor_public_key=tmp_path / "auditor.pub", payload_copy=False)
    async with opened as j:
        await j.append(accepted("inv-a"), payload={"action": {"path": "/x"}})
    code, out, err = _run(capsys, "inv-a", "--journal", str(db))
    assert code == 0, err
    assert "inv-a: 0 payload(s) opened with" in out and "1 sealed to the auditor alone" in out
    assert "audit-open --seq 1" in out, out
    code, out, err = _run(capsys, "inv-a", "--journal", str(db), "--json")
    (item,) = json.loads(out)["sealed"]
    assert item["auditor_only"] is True and item["payload"] is None
