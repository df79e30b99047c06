"""Canary through the whole broker (seed: "Exclude secrets, full authorization headers, private
keys"): across success and failure calls — including a command that prints the key file back —
no form of the private key (PEM text, any base64 line, the joined body, the raw seed) appears
in an envelope, a fetched envelope, a log record, or the journal's database, WAL or shm bytes
(read while the broker is open, and again after it closed)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from tests.broker.helpers import open_broker, write_config

from .brokerkit import KEY_ENV, OTHER_KEY_ENV, leaked, ssh_target
from .hostile import HostileServer
from .sshd import Sshd, SshKeys

LIMIT = 30


@pytest.fixture
def key_env(ssh_keys: SshKeys) -> Iterator[None]:
    os.environ[KEY_ENV] = ssh_keys.client_key.decode()
    os.environ[OTHER_KEY_ENV] = ssh_keys.other_key.decode()
    try:
        yield
    finally:
        del os.environ[KEY_ENV], os.environ[OTHER_KEY_ENV]


def _journal_files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.name.startswith("journal")}


@pytest.mark.usefixtures("key_env")
async def test_private_key_never_in_envelopes_logs_or_journal_files(
    tmp_path: Path, sshd: Sshd, hostile: HostileServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    cfg = write_config(
        tmp_path,
        {
            "box": ssh_target(sshd.port, sshd.user, sshd.host_pin),
            "badkey": ssh_target(sshd.port, sshd.user, sshd.host_pin, key_env=OTHER_KEY_ENV),
            "wrongpin": ssh_target(sshd.port, sshd.user, hostile.pin),
            "evil": ssh_target(hostile.port, "bob", hostile.pin),
        },
    )
    key_file = sshd.client_key_path
    calls: list[tuple[str, str, float | None, str | None]] = [
        # Whole file on stdout; only some of its base64 lines on stderr (a partial leak must
        # be caught line by line, not only as the whole value).
        ("box", f"cat {key_file}; sed -n 2,4p {key_file} >&2", None, None),
        ("box", "echo fine", None, None),
        ("box", f"cat {key_file}; exit 23", None, "REMOTE_COMMAND_FAILED"),
        ("badkey", "true", None, "REMOTE_AUTH_FAILED"),
        ("wrongpin", "true", None, "HOST_KEY_MISMATCH"),
        ("evil", "refuse", None, "EXEC_REJECTED"),
        ("evil", "signal", None, "REMOTE_COMMAND_FAILED"),
        ("evil", "noexit", None, "REMOTE_RESULT_INCOMPLETE"),
        ("evil", "drop", None, "REMOTE_OUTCOME_UNKNOWN"),
        ("evil", "status_then_break", None, "REMOTE_RESULT_INCOMPLETE"),
        ("evil", "hang", 0.5, "CALLER_CANCELLED"),
    ]
    texts: list[str] = []
    with trio.fail_after(LIMIT):
        async with open_broker(cfg) as b:
            for target, command, timeout, code in calls:
                env = await b.call({"target": target, "command": command}, timeout=timeout)
                assert env.get("error", {}).get("code") == code, (command, env.get("error"))
                fetched = await b.fetch_result(env["invocation_id"])
                texts += [json.dumps(env), json.dumps(fetched)]
                rec = b.record(env["invocation_id"])
                texts.append(repr(rec))
            while_open = _journal_files(tmp_path)
    after_close = _journal_files(tmp_path)

    printed = json.loads(texts[0])["result"]
    # The haystacks are real: the key was printed (and redacted) on both streams, the
    # client key's fingerprint is in the evidence, and the WAL held data while open.
    assert printed["stdout"].strip() == "[REDACTED]"
    assert printed["stderr"].split() == ["[REDACTED]"] * 3
    assert "SHA256:" in "".join(texts)
    assert while_open.get("journal.db-wal", b"") != b""
    logs = "\n".join(
        r.getMessage() + (r.exc_text or "") + repr(r.args) for r in caplog.records
    ).encode()
    haystacks = {
        "envelopes": "\n".join(texts).encode(),
        "logs": logs,
        **{f"open:{k}": v for k, v in while_open.items()},
        **{f"closed:{k}": v for k, v in after_close.items()},
    }
    for where, blob in haystacks.items():
        for pem in (sshd.client_key, sshd.other_key):
            assert leaked(blob, pem) == [], where
