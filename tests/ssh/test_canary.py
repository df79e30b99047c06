"""Canary: the private key (its PEM text or any line of its base64 body) and a password never
appear in facts, gate facts, summaries, exception messages (str and repr) or log records."""

from __future__ import annotations

import base64
import logging

import pytest
import trio

from affidavit.adapters.base import AttemptInterrupted, SetupError
from affidavit.adapters.ssh import SshTarget, perform, prepare_credential

from .conftest import Recorder, Sshd, SshKeys, hostile_target
from .hostile import HostileServer

CANARY_PASSWORD = b"canary-Pa55word-7f3a9c"


def _needles(secret: bytes) -> list[str]:
    lines = secret.splitlines()
    body = b"".join(lines[1:-1]) if secret.startswith(b"-----") else secret
    raw = base64.b64decode(body) if secret.startswith(b"-----") else secret
    out = [secret.decode(), body.decode()[:48]]
    out += [ln.decode() for ln in lines[1:-1] if len(ln) >= 24]
    out += [raw.hex()[:48], base64.b64encode(raw).decode()[:48]]
    return out


def _haystack(rec: Recorder, extra: list[object]) -> str:
    parts: list[object] = [rec.gate_calls, *((s, f) for s, f in rec.steps), *extra]
    return "\n".join(repr(p) + str(p) for p in parts)


def _rows(server: Sshd | HostileServer) -> list[tuple[SshTarget, str]]:
    """Successes and failures against the real sshd, or the scripted server's own rows."""
    if isinstance(server, Sshd):
        sshd = server
        return [
            (sshd.target(), "echo ok"),
            (sshd.target(), "exit 3"),
            (SshTarget("127.0.0.1", sshd.port, sshd.user, ("ssh-ed25519 AAAA",)), "true"),
        ]
    hostile = server
    return [
        (hostile_target(hostile), "status_then_break"),
        (hostile_target(hostile), "noexit"),
        (hostile_target(hostile, user="refuse"), "exit 0"),
    ]


async def test_private_key_never_leaks_on_success_or_failure(
    ssh_keys: SshKeys, either_server: Sshd | HostileServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    cred = prepare_credential(ssh_keys.client_key)
    seen: list[object] = [cred]
    recs = []
    with trio.fail_after(20):
        for target, command in _rows(either_server):
            rec = Recorder()
            recs.append(rec)
            try:
                res = await perform(target, cred, command, None, rec.ctx)
                seen += [res.facts, res.summary, res]
            except (SetupError, AttemptInterrupted) as exc:
                seen += [exc, exc.args, getattr(exc, "facts", None)]
    text = "\n".join(_haystack(r, seen) for r in recs)
    text += "\n".join(r.getMessage() for r in caplog.records)
    assert "SHA256:" in text  # the haystack is real: fingerprints are in it
    for needle in _needles(ssh_keys.client_key):
        assert needle not in text


async def test_password_never_leaks(
    hostile: HostileServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    cred = prepare_credential(CANARY_PASSWORD, kind="password")
    rec = Recorder()
    with trio.fail_after(10), pytest.raises(SetupError) as ei:
        await perform(hostile_target(hostile, user="pwuser"), cred, "exit 0", None, rec.ctx)
    text = _haystack(rec, [ei.value, cred]) + "\n".join(r.getMessage() for r in caplog.records)
    assert "userauth" in text
    assert CANARY_PASSWORD.decode() not in text
