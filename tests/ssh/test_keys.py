"""Host-key pins, known_hosts parsing and in-memory credential import."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from affidavit.adapters.ssh import (
    CredentialInvalid,
    fingerprint,
    load_known_hosts,
    parse_pin,
    prepare_credential,
)
from affidavit.statemachine import Code

from .conftest import SshKeys


@pytest.fixture
def pins(ssh_keys: SshKeys) -> tuple[str, str]:
    """Two distinct real ed25519 public keys as pins."""
    return ssh_keys.other_pin, ssh_keys.client_pin


def test_fingerprint_matches_ssh_keygen(ssh_keys: SshKeys, ssh_keygen: str) -> None:
    pub = ssh_keys.client_key_path.with_suffix(".pub")
    out = subprocess.run(
        [ssh_keygen, "-l", "-f", str(pub)], check=True, capture_output=True, text=True
    ).stdout.split()
    assert fingerprint(parse_pin(pub.read_text())) == f"ssh-ed25519 {out[1]}"


def test_pin_errors_name_the_problem(pins: tuple[str, str]) -> None:
    with pytest.raises(ValueError, match="'<type> <base64>'"):
        parse_pin("ssh-ed25519")
    with pytest.raises(ValueError, match="not valid base64"):
        parse_pin("ssh-ed25519 !!!!")
    blob_b64 = pins[0].split()[1]
    with pytest.raises(ValueError, match="declares 'ssh-rsa' but holds a 'ssh-ed25519'"):
        parse_pin(f"ssh-rsa {blob_b64}")


def test_known_hosts_plain_bracketed_wildcard_negated_and_comments(
    tmp_path: Path, pins: tuple[str, str]
) -> None:
    a, b = pins
    kh = tmp_path / "known_hosts"
    kh.write_text(
        "# comment\n\n"
        f"example.org,10.0.0.1 {a} c1\n"
        f"[example.org]:2222 {b}\n"
        f"*.example.net,!bad.example.net {a}\n"
        "@cert-authority *.example.org " + a + "\n"
    )
    assert load_known_hosts(str(kh), "example.org", 22) == (a,)
    assert load_known_hosts(str(kh), "EXAMPLE.org", 22) == (a,)
    assert load_known_hosts(str(kh), "10.0.0.1", 22) == (a,)
    assert load_known_hosts(str(kh), "example.org", 2222) == (b,)
    assert load_known_hosts(str(kh), "x.example.net", 22) == (a,)
    assert load_known_hosts(str(kh), "bad.example.net", 22) == ()
    assert load_known_hosts(str(kh), "other.org", 22) == ()


def test_known_hosts_hashed_entries_from_ssh_keygen(
    tmp_path: Path, pins: tuple[str, str], ssh_keygen: str
) -> None:
    a, b = pins
    kh = tmp_path / "known_hosts"
    kh.write_text(f"db.internal {a}\n[db.internal]:2200 {b}\n")
    subprocess.run([ssh_keygen, "-H", "-f", str(kh)], check=True, capture_output=True)
    assert "db.internal" not in kh.read_text() and "|1|" in kh.read_text()
    assert load_known_hosts(str(kh), "db.internal", 22) == (a,)
    assert load_known_hosts(str(kh), "db.internal", 2200) == (b,)
    assert load_known_hosts(str(kh), "other", 22) == ()
    # ssh lowercases the host name before it looks it up (and ssh-keygen before it hashes):
    # a target written "DB.Internal" is the same host, plain or hashed.
    assert load_known_hosts(str(kh), "DB.Internal", 22) == (a,)
    assert load_known_hosts(str(kh), "DB.Internal", 2200) == (b,)


def test_known_hosts_revoked_key_is_never_a_pin(tmp_path: Path, pins: tuple[str, str]) -> None:
    a, b = pins
    kh = tmp_path / "known_hosts"
    kh.write_text(f"h {a}\nh {b}\n@revoked * {a}\n")
    assert load_known_hosts(str(kh), "h", 22) == (b,)


def test_private_key_is_imported_in_memory(ssh_keys: SshKeys) -> None:
    cred = prepare_credential(ssh_keys.client_key)
    assert cred.kind == "private_key"
    assert cred.public_fingerprint == fingerprint(
        parse_pin(ssh_keys.client_key_path.with_suffix(".pub").read_text())
    )
    assert prepare_credential(ssh_keys.client_key, kind="private_key").kind == "private_key"


def test_password_is_wrapped_only_when_asked() -> None:
    assert prepare_credential(b"s3cret", kind="password").kind == "password"


@pytest.mark.parametrize(
    ("secret", "kind", "says"),
    [
        (b"", "private_key", "is empty"),
        (b"", "password", "is empty"),
        (b"ghp_CANARYtoken0123456789", "private_key", "not a private key"),
        (b"s3cret\n", "private_key", 'set auth = "password"'),
        (b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "private_key",
         "not a private key"),
        (b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICANARY user@host\n", "private_key",
         "is a public key"),
        (b"ecdsa-sha2-nistp256 AAAAE2VjZHNh comment", "private_key", "is a public key"),
        (b"ssh-ed25519-cert-v01@openssh.com AAAAIHNzaC1l x", "private_key", "is a public key"),
        (b"-----BEGIN PUBLIC KEY-----\nMCow\n-----END PUBLIC KEY-----\n", "private_key",
         "is a public key"),
        (b"---- BEGIN SSH2 PUBLIC KEY ----\nAAAA\n---- END SSH2 PUBLIC KEY ----\n",
         "private_key", "is a public key"),
        (b"-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n",
         "password", "is an SSH key"),
        (b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICANARY", "password", "is an SSH key"),
        (b"-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n",
         "private_key", "could not be imported"),
        (b"pw\x00x", "password", "NUL"),
        (b"pw", "token", "must be private_key or password"),
        (b"pw", "auto", "must be private_key or password"),
    ],
)  # fmt: skip
def test_a_credential_is_never_guessed_to_be_a_password(
    secret: bytes, kind: str, says: str
) -> None:
    """A token or a public key given where a private key belongs would have been sent to the
    remote as a password; it is refused before connecting, with a fixed message."""
    with pytest.raises(CredentialInvalid) as ei:
        prepare_credential(secret, kind=kind)
    assert ei.value.code == Code.CREDENTIAL_INVALID and isinstance(ei.value, ValueError)
    assert ei.value.__context__ is None and ei.value.__cause__ is None
    assert says in str(ei.value)
    assert "CANARY" not in str(ei.value) and "CANARY" not in repr(ei.value)


def test_public_key_file_from_ssh_keygen_is_refused_as_public(ssh_keys: SshKeys) -> None:
    pub = ssh_keys.client_key_path.with_suffix(".pub").read_bytes()
    with pytest.raises(CredentialInvalid, match="is a public key"):
        prepare_credential(pub)


def test_passphrase_protected_key_is_invalid_and_not_echoed(
    tmp_path: Path, ssh_keygen: str
) -> None:
    # ssh-keygen makes the locked key: cryptography would need bcrypt to encrypt one.
    path = tmp_path / "locked"
    subprocess.run(
        [ssh_keygen, "-q", "-t", "ed25519", "-N", "hunter2", "-f", str(path)], check=True
    )
    secret = path.read_bytes()
    with pytest.raises(CredentialInvalid) as ei:
        prepare_credential(secret)
    body = b"".join(secret.splitlines()[1:-1]).decode()
    for text in (str(ei.value), repr(ei.value)):
        assert body[:40] not in text and "passphrase" in text


def test_credential_repr_never_shows_the_secret(ssh_keys: SshKeys) -> None:
    key = prepare_credential(ssh_keys.client_key)
    pw = prepare_credential(b"canary-password-123", kind="password")
    body = b"".join(ssh_keys.client_key.splitlines()[1:-1]).decode()
    for text in (repr(key), str(key), repr(pw), str(pw)):
        assert body[:32] not in text and "canary-password" not in text
    assert repr(pw) == "SshCredential(password)"
