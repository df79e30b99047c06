"""Credential references, resolution and injection (redaction: tests/broker/test_redaction.py).

Seed, "Validation and credential injection finish before dispatch": "Do not put credential
contents into either the error or the action record.  You may record the secret's identifier or
its non-secret version, the injection method, and the decision that stopped the call."  Every
test that handles a secret uses a canary value and checks it never leaks into an exception,
a repr or a log record.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from affidavit.journal.sealing import BrokerKey
from affidavit.secrets.credentials import (
    Credential,
    CredentialError,
    Injection,
    apply_query,
    inject_http,
    parse_ref,
    predates_value_digests,
    resolve,
    trim_final_newline,
)
from affidavit.secrets.vault import Vault
from affidavit.statemachine import Code

CANARY = "CANARY-s3cr3t-7f1d2c9a"
CANARY_B = CANARY.encode()


def no_leak(*objects: object) -> None:
    for obj in objects:
        assert CANARY not in str(obj)
        assert CANARY not in repr(obj)
        if isinstance(obj, BaseException):
            assert all(CANARY not in str(a) for a in obj.args)


@pytest.fixture(autouse=True)
def _capture_logs(caplog: pytest.LogCaptureFixture) -> object:
    caplog.set_level(logging.DEBUG)
    yield
    assert CANARY not in caplog.text


# --- parse_ref --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ref", "parsed"),
    [
        ("env:BILLING_TOKEN", ("env", "BILLING_TOKEN")),
        ("env:_x1", ("env", "_x1")),
        ("file:/etc/tok", ("file", "/etc/tok")),
        ("file:rel/tok:with:colons", ("file", "rel/tok:with:colons")),
        ("vault:deploy_key", ("vault", "deploy_key")),
        ("vault:a.b-c_1", ("vault", "a.b-c_1")),
    ],
)
def test_parse_ref_kinds(ref: str, parsed: tuple[str, str]) -> None:
    assert parse_ref(ref) == parsed


@pytest.mark.parametrize(
    "ref",
    [CANARY, "env:", "env:1A", "env:A-B", "file:", "vault:", "vault:a/b", "ssm:x", "", ":x",
     "ENV:X", "file:a\x00b", f"vault:{'x' * 129}"],
)  # fmt: skip
def test_parse_ref_rejects_unknown_forms_without_echoing_them(ref: str) -> None:
    with pytest.raises(CredentialError) as info:
        parse_ref(ref)
    assert info.value.code is Code.UNKNOWN_CREDENTIAL
    if ref not in {"", "env:", "file:", "vault:"}:  # those are in the usage hint itself
        assert ref not in str(info.value)
    no_leak(info.value)


def test_parse_ref_rejects_non_strings() -> None:
    with pytest.raises(CredentialError) as info:
        parse_ref(42)  # type: ignore[arg-type]
    assert info.value.code is Code.UNKNOWN_CREDENTIAL


# --- resolve: env and file ----------------------------------------------------------------------


def test_env_ref(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AFF_TEST_TOKEN", CANARY)
    cred = resolve("env:AFF_TEST_TOKEN", vault=None)
    assert cred.value == CANARY_B
    assert cred.version.startswith("env:hmac-sha256:")
    assert cred.ref == "env:AFF_TEST_TOKEN"
    no_leak(cred)


def test_an_env_version_changes_with_the_value_and_reveals_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An approval binds the credential's version: a constant one ("env") let a swapped value
    pass as approved.  The version is keyed (HMAC), never a plain hash a dictionary reverses."""
    monkeypatch.setenv("AFF_TEST_TOKEN", "hunter2")
    first = resolve("env:AFF_TEST_TOKEN", vault=None)
    assert resolve("env:AFF_TEST_TOKEN", vault=None).version == first.version
    monkeypatch.setenv("AFF_TEST_TOKEN", "hunter3")
    assert resolve("env:AFF_TEST_TOKEN", vault=None).version != first.version
    for digest in (hashlib.sha256(b"hunter2").hexdigest(), hashlib.md5(b"hunter2").hexdigest()):
        assert digest[:32] not in first.version
    # The engine passes the journal's keyed digest (the same in every process of a journal).
    seen: list[tuple[str, bytes]] = []
    keyed = resolve(
        "env:AFF_TEST_TOKEN", vault=None, versioner=lambda *a: seen.append(a) or "ab" * 32
    )
    assert seen == [("credential-version:env:AFF_TEST_TOKEN", b"hunter3")]
    assert keyed.version == "env:hmac-sha256:" + "ab" * 16


@pytest.mark.parametrize("value", [None, ""])
def test_missing_or_empty_env_is_credential_missing(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("AFF_TEST_ABSENT", raising=False)
    else:
        monkeypatch.setenv("AFF_TEST_ABSENT", value)
    with pytest.raises(CredentialError) as info:
        resolve("env:AFF_TEST_ABSENT", vault=None)
    assert info.value.code is Code.CREDENTIAL_MISSING
    assert "env:AFF_TEST_ABSENT" in str(info.value)  # the reference helps the operator


def test_file_ref_relative_to_base_dir_with_version(tmp_path: Path) -> None:
    (tmp_path / "tok").write_bytes(CANARY_B + b"\n")
    (tmp_path / "tok").chmod(0o600)  # refused if others can read it
    cred = resolve("file:tok", vault=None, base_dir=tmp_path)
    assert cred.value == CANARY_B  # editors' final newline is not part of a token
    st_ = os.stat(tmp_path / "tok")
    assert cred.version == f"{st_.st_mtime_ns}:{st_.st_ctime_ns}:{st_.st_ino}"
    no_leak(cred)
    (tmp_path / "tok").write_bytes(CANARY_B + b"-rotated")
    os.utime(tmp_path / "tok", ns=(st_.st_mtime_ns + 10**9, st_.st_mtime_ns + 10**9))
    assert resolve(f"file:{tmp_path / 'tok'}", vault=None).version != cred.version


def test_a_file_credential_version_does_not_give_the_secret_length(tmp_path: Path) -> None:
    """The version is recorded in CREDENTIAL_AUTHORIZED, which a caller reads (``record``);
    a single-line file's size is the secret's length (+1 for the newline)."""
    path = tmp_path / "tok"
    path.write_bytes(CANARY_B + b"\n")
    path.chmod(0o600)
    version = resolve("file:tok", vault=None, base_dir=tmp_path).version
    size = path.stat().st_size
    assert str(size) not in version.split(":") and str(len(CANARY_B)) not in version.split(":")
    # A rewrite of the same length with its mtime put back is still a new version.
    st_ = path.stat()
    path.write_bytes(CANARY_B[::-1] + b"\n")
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns))
    assert resolve("file:tok", vault=None, base_dir=tmp_path).version != version


def test_file_ref_keeps_multiline_values_exact(tmp_path: Path) -> None:
    key = b"-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n"
    (tmp_path / "id").write_bytes(key)
    (tmp_path / "id").chmod(0o600)
    assert resolve("file:id", vault=None, base_dir=tmp_path).value == key


@pytest.mark.parametrize(
    ("data", "expected"),
    [(b"tok\n", b"tok"), (b"tok\r\n", b"tok"), (b"tok", b"tok"), (b"a\nb\n", b"a\nb\n"),
     (b"tok\n\n", b"tok\n\n"), (b"\n", b"")],
)  # fmt: skip
def test_trim_final_newline(data: bytes, expected: bytes) -> None:
    assert trim_final_newline(data) == expected


def test_file_ref_errors(tmp_path: Path) -> None:
    with pytest.raises(CredentialError) as info:
        resolve("file:absent", vault=None, base_dir=tmp_path)
    assert info.value.code is Code.CREDENTIAL_MISSING
    (tmp_path / "empty").write_bytes(b"\n")
    (tmp_path / "empty").chmod(0o600)
    with pytest.raises(CredentialError) as info:
        resolve("file:empty", vault=None, base_dir=tmp_path)
    assert info.value.code is Code.CREDENTIAL_MISSING
    (tmp_path / "dir").mkdir()
    with pytest.raises(CredentialError) as info:
        resolve("file:dir", vault=None, base_dir=tmp_path)
    assert info.value.code is Code.CREDENTIAL_INVALID


# --- resolve: vault -----------------------------------------------------------------------------


@pytest.fixture
def vault(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Vault:
    monkeypatch.delenv("AFFIDAVIT_VAULT_PASSPHRASE", raising=False)
    v = Vault.init(tmp_path / "v.vault", "pw", n_log2=10)
    v.unlock("pw")
    v.put("api", CANARY_B)
    v.put("api", CANARY_B + b"2")
    return v


def test_vault_ref_returns_value_and_entry_version(vault: Vault) -> None:
    """The version is the entry's counter (what `vault list` shows), then a keyed digest of
    the value -- keyed from the vault's key: the journal's ``versioner`` is not asked."""
    seen: list[tuple[str, bytes]] = []
    cred = resolve("vault:api", vault=vault, versioner=lambda *a: seen.append(a) or "cd" * 32)
    assert cred.value == CANARY_B + b"2"
    assert re.fullmatch(r"2:vault:hmac-sha256:[0-9a-f]{32}", cred.version), cred.version
    assert seen == []
    no_leak(cred)


@pytest.mark.parametrize(
    "version, bare",
    [
        ("1", True),
        ("42", True),
        # The literal version of an env: credential before it was keyed (a60a2ac): no ':'
        # either, but not a vault counter -- its message must not say it was one.
        ("env", False),
        ("2:vault:hmac-sha256:" + "ab" * 16, False),
        ("env:hmac-sha256:" + "ab" * 16, False),
        ("", False),
        ("\uff11", False),  # a fullwidth digit: str.isdigit, but never a counter written
    ],
)
def test_only_a_bare_vault_counter_predates_value_digests(version: str, bare: bool) -> None:
    assert predates_value_digests(version) is bare


def test_a_vault_version_is_not_reproduced_by_the_journal_key(vault: Vault, tmp_path: Path) -> None:
    """Whoever holds the journal key but not the passphrase (each host of a shared journal, a
    key backup) must not test guesses at the value against the journaled version at HMAC
    speed: the digest is not the journal key's over the value, under any label it uses."""
    key = BrokerKey.create(tmp_path / "journal.key")
    version = resolve("vault:api", vault=vault, versioner=key.digest).version
    digest = version.split(":")[-1]
    value = CANARY_B + b"2"
    for label in ("credential-version:vault:api", "credential-version:env:api", "vault:api"):
        assert key.digest(label, value)[:32] != digest


def _recreated(path: Path, value: bytes, passphrase: str = "another") -> Vault:
    """The operator deletes the vault (a lost passphrase, a compromise) and makes a new one,
    storing ``value`` under the same name: the entry is back at version 1."""
    path.unlink()
    path.with_name(path.name + ".unlock").unlink(missing_ok=True)
    v = Vault.init(path, passphrase, n_log2=10)
    v.unlock(passphrase)
    v.put("api", value)
    return v


def test_a_recreated_vault_entry_with_another_value_is_another_version(
    vault: Vault, tmp_path: Path
) -> None:
    """An approval, and a same-key retry, bind the credential's version: "version 1" of the
    old vault and "version 1" of a re-created (or restored) one must not match when the values
    differ, or a request approved with token A goes out with token B (rv45 finding 1)."""
    path = tmp_path / "v.vault"
    old = Vault(path)
    old.unlock("pw")
    old.put("fresh", CANARY_B + b"A")
    before = resolve("vault:fresh", vault=old).version
    again = _recreated(path, b"unrelated")
    again.put("fresh", CANARY_B + b"B")
    after = resolve("vault:fresh", vault=again).version
    assert before.split(":")[0] == after.split(":")[0] == "1"
    assert after != before


def test_the_same_value_in_a_vault_made_again_is_another_version(
    vault: Vault, tmp_path: Path
) -> None:
    """The digest changes with the vault's key: a vault made again (a fresh salt, hence another
    key even with the same passphrase) holding the very value at the same counter is another
    version -- the conservative side: an approval granted before goes stale."""
    path = tmp_path / "v.vault"
    before = resolve("vault:api", vault=vault).version  # version 2, CANARY_B + b"2"
    again = _recreated(path, CANARY_B + b"1", passphrase="pw")
    again.put("api", CANARY_B + b"2")
    after = resolve("vault:api", vault=again).version
    assert after.split(":")[0] == before.split(":")[0] == "2"
    assert after != before


def test_a_backup_restored_as_it_was_is_the_same_version(vault: Vault, tmp_path: Path) -> None:
    """The same file (its key, the value at that counter) is the same credential, so an
    approval granted for it stays good; another `put`, even of the same bytes, is another."""
    path = tmp_path / "v.vault"
    backup = path.read_bytes()
    before = resolve("vault:api", vault=vault).version
    vault.put("api", CANARY_B + b"2")
    assert resolve("vault:api", vault=vault).version != before
    path.write_bytes(backup)
    assert resolve("vault:api", vault=Vault.open(path)).version == before


def test_a_vault_version_is_the_same_in_another_process(vault: Vault, tmp_path: Path) -> None:
    """Stable across processes and restarts (a same-key retry, an approval dispatched by the
    daemon after a restart compare it): another process, opening the vault from the passphrase
    variable rather than the unlock file, resolves the same version."""
    here = resolve("vault:api", vault=vault).version
    vault.lock()
    code = (
        "import sys\n"
        "from affidavit.secrets.credentials import resolve\n"
        "from affidavit.secrets.vault import Vault\n"
        "print(resolve('vault:api', vault=Vault.open(sys.argv[1])).version)\n"
    )
    env = {**os.environ, "AFFIDAVIT_VAULT_PASSPHRASE": "pw"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(vault.path)],
        env=env,
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.decode().strip() == here


def test_a_vault_version_reveals_nothing_of_the_value(vault: Vault) -> None:
    """The version is journaled and shown to callers: neither the value nor its unkeyed hash."""
    version = resolve("vault:api", vault=vault).version
    value = CANARY_B + b"2"
    assert CANARY not in version and base64.b64encode(value).decode() not in version
    for digest in (hashlib.sha256(value).hexdigest(), hashlib.md5(value).hexdigest()):
        assert digest[:32] not in version and digest[:16] not in version


def test_locked_vault_is_vault_locked(vault: Vault) -> None:
    vault.lock()
    with pytest.raises(CredentialError) as info:
        resolve("vault:api", vault=vault)
    assert info.value.code is Code.VAULT_LOCKED
    no_leak(info.value)


def test_vault_missing_entry_or_vault(vault: Vault, tmp_path: Path) -> None:
    with pytest.raises(CredentialError) as info:
        resolve("vault:nope", vault=vault)
    assert info.value.code is Code.CREDENTIAL_MISSING
    with pytest.raises(CredentialError) as info:
        resolve("vault:api", vault=None)
    assert info.value.code is Code.CREDENTIAL_MISSING
    with pytest.raises(CredentialError) as info:
        resolve("vault:api", vault=Vault(tmp_path / "never-created.vault"))
    assert info.value.code is Code.CREDENTIAL_MISSING


def test_tampered_vault_is_credential_invalid(vault: Vault) -> None:
    raw = bytearray(vault.path.read_bytes())
    raw[-1] ^= 1
    vault.path.write_bytes(bytes(raw))
    with pytest.raises(CredentialError) as info:
        resolve("vault:api", vault=vault)
    assert info.value.code is Code.CREDENTIAL_INVALID
    assert "modified or corrupted" in str(info.value)
    no_leak(info.value)


def test_unknown_ref_at_resolve_time() -> None:
    with pytest.raises(CredentialError) as info:
        resolve(CANARY, vault=None)
    assert info.value.code is Code.UNKNOWN_CREDENTIAL
    no_leak(info.value)


# --- Credential / Injection reprs ---------------------------------------------------------------


def test_credential_repr_and_str_are_redacted() -> None:
    cred = Credential("env:X", CANARY_B, "env")
    assert repr(cred) == "Credential(ref='env:X', version='env', value=<redacted>)"
    assert str(cred) == repr(cred)
    no_leak(cred, [cred], {"c": cred})
    logging.getLogger("affidavit.test").debug("resolved %s %r", cred, cred)


def test_injection_repr_is_redacted() -> None:
    inj = inject_http("query:key", Credential("env:X", CANARY_B, "env"))
    no_leak(inj)
    assert "query_param='key'" in repr(inj)


# --- inject_http ----------------------------------------------------------------------------


def cred(value: bytes) -> Credential:
    return Credential("vault:t", value, "1")


def test_bearer() -> None:
    inj = inject_http("bearer", cred(CANARY_B))
    assert inj.headers == (("Authorization", f"Bearer {CANARY}"),)
    assert inj.header_names == {"authorization"}
    assert (inj.query, inj.query_param) == ((), None)


def test_basic() -> None:
    inj = inject_http("basic", cred(b"alice:" + CANARY_B))
    expected = base64.b64encode(b"alice:" + CANARY_B).decode()
    assert inj.headers == (("Authorization", f"Basic {expected}"),)
    assert inj.header_names == {"authorization"}
    utf8 = inject_http("basic", cred("jürgen:pä:ss".encode()))
    assert base64.b64decode(utf8.headers[0][1].split()[1]) == "jürgen:pä:ss".encode()


def test_custom_header() -> None:
    inj = inject_http("header:X-Api-Key", cred(CANARY_B))
    assert inj.headers == (("X-Api-Key", CANARY),)
    assert inj.header_names == {"x-api-key"}


def test_query_param_is_percent_encoded() -> None:
    inj = inject_http("query:api_key", cred(b"a b&c=d/" + CANARY_B))
    assert inj.query == (("api_key", "a%20b%26c%3Dd%2F" + CANARY),)
    assert inj.query_param == "api_key"
    assert inj.headers == () and inj.header_names == frozenset()
    assert urllib.parse.parse_qs(apply_query("/x", inj).split("?")[1])["api_key"] == [
        "a b&c=d/" + CANARY
    ]


@pytest.mark.parametrize(
    ("target", "expected"),
    [("/x", "/x?k=v"), ("/x?", "/x?k=v"), ("/x?a=1", "/x?a=1&k=v"), ("/x?a=1&", "/x?a=1&k=v")],
)
def test_apply_query(target: str, expected: str) -> None:
    inj = Injection((), (("k", "v"),), frozenset(), "k")
    assert apply_query(target, inj) == expected
    assert apply_query(target, Injection((), (), frozenset(), None)) == target


@pytest.mark.parametrize(
    ("scheme", "value"),
    [
        ("bearer", CANARY_B + b"\r\nX-Evil: 1"),
        ("bearer", CANARY_B + b" two"),
        ("bearer", b" " + CANARY_B),
        ("bearer", CANARY_B + "é".encode()),
        ("basic", CANARY_B),  # no colon
        ("basic", b":" + CANARY_B),  # empty user-id
        ("basic", b"u:" + CANARY_B + b"\n"),
        ("header:X-Key", CANARY_B + b"\x00"),
        ("header:X-Key", CANARY_B + b"\x7fx"),  # DEL is no visible character either
        ("bearer", CANARY_B + b"\tx"),  # nor is a tab inside the value
        ("cookie", CANARY_B),
        ("header:Host", CANARY_B),
    ],
)
def test_unusable_values_are_credential_invalid_and_never_echoed(scheme: str, value: bytes) -> None:
    with pytest.raises(CredentialError) as info:
        inject_http(scheme, cred(value))
    assert info.value.code is Code.CREDENTIAL_INVALID
    no_leak(info.value)
