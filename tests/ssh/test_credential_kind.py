"""An SSH target's credential is a private key unless the target says ``auth = "password"``:
a token or a ``.pub`` file is refused as CREDENTIAL_INVALID before connecting (nothing sent,
not even a TCP connection), instead of going to the remote as a password.  Needs no sshd: a
plain TCP listener counts the connections that must never come."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from affidavit.config import ConfigError, load_config
from tests.broker.helpers import assert_error, open_broker, write_config

from .brokerkit import ssh_target
from .hostile import PASSWORD, HostileServer

CANARY = "CANARY-ssh-token-31c7a9e0"


def _secret_file(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    path.chmod(0o600)
    return f"file:{path}"


def _keypair() -> tuple[bytes, bytes]:
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption())
    public = key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH)
    return private, public


async def test_non_key_credentials_are_refused_before_connecting(tmp_path: Path) -> None:
    private, public = _keypair()
    pin = _keypair()[1].decode()
    connections = 0

    async def count(stream: trio.SocketStream) -> None:
        nonlocal connections
        connections += 1
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, count, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        refs = {
            "token": _secret_file(tmp_path / "tok", CANARY.encode() + b"\n"),
            "pub": _secret_file(tmp_path / "id_ed25519.pub", public + b" CANARY@host\n"),
            "keyaspw": _secret_file(tmp_path / "id_ed25519", private),
        }
        targets: dict[str, dict[str, Any]] = {
            "token": ssh_target(port, "bob", pin, credential=refs["token"]),
            "pub": ssh_target(port, "bob", pin, credential=refs["pub"]),
            "keyaspw": ssh_target(port, "bob", pin, credential=refs["keyaspw"], auth="password"),
        }
        says = {
            "token": "not a private key",
            "pub": "is a public key",
            "keyaspw": 'auth = "password" but the credential is an SSH key',
        }
        cfg = write_config(tmp_path, targets)
        envs = {}
        with trio.fail_after(20):
            async with open_broker(cfg) as broker:
                for name in targets:
                    env = await broker.call({"target": name, "command": "true"})
                    assert_error(
                        broker,
                        env,
                        phase="credential_injection",
                        outcome="not_attempted",
                        retry="after_correction",
                        code="CREDENTIAL_INVALID",
                    )
                    assert env["evidence"]["dispatch_started"] is False
                    err = env["error"]
                    assert err["field"] == f"targets.{name}.credential"
                    assert says[name] in err["message"], err
                    assert refs[name].split(":", 1)[1] not in err["message"]  # no path
                    envs[name] = env
        await trio.sleep(0.1)
        assert connections == 0  # nothing reached the remote, not even a TCP connection
        nursery.cancel_scope.cancel()
    text = json.dumps(envs)
    assert CANARY not in text
    journal = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("journal"))
    assert CANARY.encode() not in journal


def test_auth_must_be_key_or_password(tmp_path: Path) -> None:
    pin = _keypair()[1].decode()
    cfg = write_config(tmp_path, {"box": ssh_target(22, "bob", pin, auth="pubkey")})
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    assert "targets.box.auth" in str(info.value) and '"key" or "password"' in str(info.value)
    for ok in ("key", "password"):
        cfg = write_config(tmp_path, {"box": ssh_target(22, "bob", pin, auth=ok)})
        assert load_config(cfg).targets["box"].auth == (None if ok == "key" else ok)


def test_auth_key_keeps_the_snapshot_of_a_target_without_it(tmp_path: Path) -> None:
    from affidavit.schema import snapshot_hash

    pin = _keypair()[1].decode()
    plain = load_config(write_config(tmp_path, {"box": ssh_target(22, "bob", pin)}))
    keyed = load_config(write_config(tmp_path, {"box": ssh_target(22, "bob", pin, auth="key")}))
    pw = load_config(write_config(tmp_path, {"box": ssh_target(22, "bob", pin, auth="password")}))
    box = "box"
    assert snapshot_hash(plain.targets[box]) == snapshot_hash(keyed.targets[box])
    assert snapshot_hash(plain.targets[box]) != snapshot_hash(pw.targets[box])


async def test_password_auth_when_the_target_says_so(
    tmp_path: Path, hostile: HostileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``auth = "password"`` is the one way a credential is sent as a password; the same
    password without it is refused before connecting."""
    monkeypatch.setenv("AFFIDAVIT_TEST_SSH_PW", PASSWORD)
    pw = {"credential": "env:AFFIDAVIT_TEST_SSH_PW"}
    targets = {
        "pw": ssh_target(hostile.port, "pwuser", hostile.pin, auth="password", **pw),
        "implicit": ssh_target(hostile.port, "pwuser", hostile.pin, **pw),
    }
    cfg = write_config(tmp_path, targets)
    sessions = hostile.sessions_opened
    with trio.fail_after(20):
        async with open_broker(cfg) as broker:
            ok = await broker.call({"target": "pw", "command": "exit 0"})
            assert "error" not in ok, ok
            assert "password" in json.dumps(ok["evidence"])  # the auth method it used
            refused = await broker.call({"target": "implicit", "command": "exit 0"})
            assert_error(broker, refused, phase="credential_injection", outcome="not_attempted",
                         retry="after_correction", code="CREDENTIAL_INVALID")  # fmt: skip
    assert hostile.sessions_opened == sessions + 1
    assert PASSWORD not in json.dumps([ok, refused])


async def test_a_password_the_remote_echoes_in_an_interrupted_result_is_redacted(
    tmp_path: Path, hostile: HostileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The remote knows the password it was sent; what it sends back is redacted everywhere,
    also in the facts of a result that broke off (an exit-signal named as the password, then the
    connection drops: ATTEMPT_INTERRUPTED)."""
    monkeypatch.setenv("AFFIDAVIT_TEST_SSH_PW", PASSWORD)
    pw = {"credential": "env:AFFIDAVIT_TEST_SSH_PW"}
    targets = {"pw": ssh_target(hostile.port, "pwuser", hostile.pin, auth="password", **pw)}
    cfg = write_config(tmp_path, targets)
    with trio.fail_after(20):
        async with open_broker(cfg) as broker:
            answer = await broker.call({"target": "pw", "command": "echosig"})
            assert answer["error"]["outcome"] == "unknown", answer
            record = json.dumps(broker.journal.events(answer["invocation_id"]), default=str)
    assert PASSWORD not in json.dumps(answer)
    assert PASSWORD not in record
