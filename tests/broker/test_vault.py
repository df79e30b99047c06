"""The vault: encryption at rest, lock state shared across processes, tamper detection.

Seed, "Validation and credential injection finish before dispatch": a locked vault and a local
key decryption error are credential_injection failures the broker must tell apart.  The broker
and ``affidavit vault …`` are separate processes, so the CLI tests run a real subprocess.
"""

from __future__ import annotations

import fcntl
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from affidavit.cli.vault import MAX_PASSPHRASE, MAX_VALUE
from affidavit.secrets.credentials import CredentialError, resolve
from affidavit.secrets.vault import (
    PASSPHRASE_ENV,
    EntryMissing,
    Vault,
    VaultCorrupt,
    VaultError,
    VaultExists,
    VaultLocked,
    VaultMissing,
    WrongPassphrase,
)
from affidavit.statemachine import Code

CANARY = b"CANARY-vault-9c4e1b77d0"
PASS = "correct horse battery staple"
FAST = 10  # scrypt N = 2**10 for in-process tests; the CLI uses the real default


@pytest.fixture(autouse=True)
def _no_env_passphrase(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PASSPHRASE_ENV, raising=False)


@pytest.fixture
def vault(tmp_path: Path) -> Vault:
    v = Vault.init(tmp_path / "s.vault", PASS, n_log2=FAST)
    v.unlock(PASS)
    return v


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_put_get_list_and_versions(vault: Vault) -> None:
    assert vault.list() == []
    assert vault.put("api", CANARY) == 1
    assert vault.put("db", b"x") == 1
    assert vault.put("api", CANARY + b"-2") == 2
    assert vault.get("api") == (CANARY + b"-2", 2)
    listed = vault.list()
    assert [(n, v) for n, v, _ in listed] == [("api", 2), ("db", 1)]
    assert all(isinstance(t, float) and t > 0 for _, _, t in listed)
    assert CANARY not in repr(listed).encode()


def test_a_fresh_instance_sees_the_same_entries(vault: Vault) -> None:
    vault.put("api", CANARY)
    assert Vault.open(vault.path).get("api") == (CANARY, 1)


def test_init_starts_locked_and_refuses_to_overwrite(tmp_path: Path) -> None:
    v = Vault.init(tmp_path / "s.vault", PASS, n_log2=FAST)
    assert v.is_locked
    with pytest.raises(VaultLocked):
        v.get("x")
    with pytest.raises(VaultLocked):
        v.put("x", b"y")
    with pytest.raises(VaultExists):
        Vault.init(tmp_path / "s.vault", PASS, n_log2=FAST)
    with pytest.raises(WrongPassphrase):
        Vault.init(tmp_path / "other.vault", "", n_log2=FAST)


def test_lock_in_one_instance_locks_every_other(vault: Vault) -> None:
    vault.put("api", CANARY)
    other = Vault.open(vault.path)
    assert not other.is_locked
    vault.lock()
    assert other.is_locked
    with pytest.raises(VaultLocked):
        other.get("api")
    other.unlock(PASS)
    assert vault.get("api") == (CANARY, 1)
    vault.lock()
    vault.lock()  # idempotent


def test_lock_forgets_the_key_even_when_the_lock_file_cannot_be_opened(vault: Vault) -> None:
    """The unlock file goes before the vault's lock is taken: a lock file that cannot be
    opened (here its path is a directory) or a holder that keeps it never leaves the key on
    disk after ``vault lock`` answered."""
    os.unlink(vault.lock_path)
    vault.lock_path.mkdir()
    assert vault.unlock_path.exists()
    vault.lock()
    assert not vault.unlock_path.exists()
    assert Vault.open(vault.path).is_locked


def test_lock_forgets_the_key_while_another_holds_the_vaults_lock(vault: Vault) -> None:
    fd = os.open(vault.lock_path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        done = threading.Thread(target=vault.lock, daemon=True)
        done.start()
        done.join(timeout=10)  # (the leftovers' sweep tries the lock once: never waits)
        assert not done.is_alive()
        assert not vault.unlock_path.exists()  # gone while the holder still holds the lock
    finally:
        os.close(fd)


def test_wrong_passphrase_is_a_clear_error(vault: Vault) -> None:
    vault.lock()
    with pytest.raises(WrongPassphrase) as info:
        vault.unlock("not it")
    assert "wrong passphrase" in str(info.value)
    assert "not it" not in str(info.value)
    assert vault.is_locked


def test_env_passphrase_opens_without_an_unlock_file(
    vault: Vault, monkeypatch: pytest.MonkeyPatch
) -> None:
    vault.put("api", CANARY)
    vault.lock()
    monkeypatch.setenv(PASSPHRASE_ENV, PASS)
    assert not vault.is_locked
    assert vault.get("api") == (CANARY, 1)
    monkeypatch.setenv(PASSPHRASE_ENV, "wrong")
    with pytest.raises(WrongPassphrase):
        vault.get("api")


def test_tampered_ciphertext_is_detected(vault: Vault) -> None:
    vault.put("api", CANARY)
    raw = bytearray(vault.path.read_bytes())
    raw[-5] ^= 0x01
    vault.path.write_bytes(bytes(raw))
    with pytest.raises(VaultCorrupt, match="modified or corrupted"):
        vault.get("api")
    vault.lock()
    with pytest.raises(VaultCorrupt, match="modified or corrupted"):
        vault.unlock(PASS)


@pytest.mark.parametrize(
    ("offset", "error"),
    [
        (0, VaultCorrupt),  # magic
        (8, VaultCorrupt),  # scrypt N out of range
        (12, VaultLocked),  # salt: the stored key no longer matches this vault
        (30, VaultLocked),  # check value
    ],
)
def test_tampered_header_is_detected(vault: Vault, offset: int, error: type[VaultError]) -> None:
    vault.put("api", CANARY)
    raw = bytearray(vault.path.read_bytes())
    raw[offset] = (raw[offset] + 0x40) % 256
    vault.path.write_bytes(bytes(raw))
    with pytest.raises(error):
        vault.get("api")


def test_header_aad_binds_kdf_parameters(vault: Vault) -> None:
    """Even with the right key, a header edit the key check cannot see (here r) fails AEAD."""
    vault.put("api", CANARY)
    raw = bytearray(vault.path.read_bytes())
    raw[9] = 9  # r: 8 -> 9 (the unlock file's key is still checked against salt+check only)
    vault.path.write_bytes(bytes(raw))
    with pytest.raises(VaultCorrupt):
        vault.get("api")


def test_truncated_or_missing_or_foreign_file(tmp_path: Path, vault: Vault) -> None:
    vault.path.write_bytes(vault.path.read_bytes()[:40])
    with pytest.raises(VaultCorrupt):
        vault.get("api")
    with pytest.raises(VaultMissing):
        Vault.open(tmp_path / "absent.vault")
    (tmp_path / "text.vault").write_text("hello")
    with pytest.raises(VaultCorrupt, match="not an affidavit vault"):
        Vault.open(tmp_path / "text.vault")


def test_reinit_invalidates_an_old_unlock_file(vault: Vault) -> None:
    unlock_bytes = vault.unlock_path.read_bytes()
    vault.path.unlink()
    Vault.init(vault.path, PASS, n_log2=FAST)
    vault.unlock_path.write_bytes(unlock_bytes)
    assert vault.is_locked


def test_entries_and_names(vault: Vault) -> None:
    with pytest.raises(EntryMissing):
        vault.get("absent")
    with pytest.raises(VaultError):
        vault.put("bad/name", b"x")
    with pytest.raises(VaultError):
        vault.put("ok", b"")


def test_files_are_0600_and_never_hold_plaintext(vault: Vault) -> None:
    vault.put("canary_entry_name", CANARY)
    vault.put("canary_entry_name", CANARY + b"2")
    assert mode(vault.path) == 0o600
    assert mode(vault.unlock_path) == 0o600
    data = vault.path.read_bytes()
    assert CANARY not in data
    assert b"canary_entry_name" not in data  # names can be sensitive too
    leftovers = [p.name for p in vault.path.parent.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


def test_concurrent_puts_lose_nothing(vault: Vault) -> None:
    def worker(prefix: str) -> None:
        v = Vault.open(vault.path)
        for i in range(8):
            v.put(f"{prefix}{i}", b"v")

    threads = [threading.Thread(target=worker, args=(p,)) for p in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(vault.list()) == 16


# --- the CLI in a real subprocess --------------------------------------------------------------


def cli(
    cwd: Path, *args: str, stdin: bytes = b"", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    base = {k: v for k, v in os.environ.items() if k not in (PASSPHRASE_ENV, "AFFIDAVIT_CONFIG")}
    return subprocess.run(
        [sys.executable, "-m", "affidavit", "vault", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        env={**base, **(env or {})},
        timeout=60,
        check=False,
    )


def test_cli_lifecycle_across_processes(tmp_path: Path) -> None:
    (tmp_path / "affidavit.toml").write_text('[vault]\npath = "data/s.vault"\n')
    (tmp_path / "data").mkdir()
    vpath = tmp_path / "data" / "s.vault"

    r = cli(tmp_path, "init", "--passphrase-stdin", stdin=PASS.encode() + b"\n")
    assert r.returncode == 0, r.stderr
    assert mode(vpath) == 0o600

    # locked after init: put refuses, and never echoes the value it was given
    r = cli(tmp_path, "put", "api", stdin=CANARY + b"\n")
    assert r.returncode == 2 and b"locked" in r.stderr
    assert CANARY not in r.stdout + r.stderr

    r = cli(tmp_path, "unlock", "--passphrase-stdin", stdin=b"wrong\n")
    assert r.returncode == 2 and b"wrong passphrase" in r.stderr
    assert b"Traceback" not in r.stderr

    r = cli(tmp_path, "unlock", "--passphrase-stdin", stdin=PASS.encode() + b"\n")
    assert r.returncode == 0, r.stderr
    assert mode(vpath.with_name("s.vault.unlock")) == 0o600

    r = cli(tmp_path, "put", "api", stdin=CANARY + b"\n")
    assert r.returncode == 0, r.stderr
    assert b"version 1" in r.stdout
    assert CANARY not in r.stdout + r.stderr
    key = b"-----BEGIN KEY-----\nAAAA\n-----END KEY-----\n"
    assert cli(tmp_path, "put", "key", stdin=key).returncode == 0
    assert cli(tmp_path, "put", "api", stdin=CANARY + b"-2").returncode == 0

    r = cli(tmp_path, "list")
    assert r.returncode == 0
    lines = r.stdout.decode().splitlines()
    assert [line.split("\t")[:2] for line in lines] == [["api", "v2"], ["key", "v1"]]
    assert CANARY not in r.stdout
    r = cli(tmp_path, "list", "--json")
    assert b'"version": 2' in r.stdout and CANARY not in r.stdout

    # the broker side (this process) sees what the CLI processes wrote
    vault = Vault.open(vpath)
    assert resolve("vault:api", vault=vault).value == CANARY + b"-2"
    assert vault.get("key") == (key, 1)  # multi-line values are stored byte for byte
    assert CANARY not in vpath.read_bytes()

    # lock in another process -> this process's next lookup is VAULT_LOCKED
    assert cli(tmp_path, "lock").returncode == 0
    with pytest.raises(CredentialError) as info:
        resolve("vault:api", vault=vault)
    assert info.value.code is Code.VAULT_LOCKED

    r = cli(tmp_path, "list")
    assert r.returncode == 2 and b"locked" in r.stderr

    # the passphrase variable works without an unlock file
    r = cli(tmp_path, "list", env={PASSPHRASE_ENV: PASS})
    assert r.returncode == 0 and r.stdout.startswith(b"api\tv2")


def test_cli_tampered_vault_is_a_clear_error(tmp_path: Path) -> None:
    v = Vault.init(tmp_path / "s.vault", PASS, n_log2=FAST)
    v.unlock(PASS)
    v.put("api", CANARY)
    raw = bytearray(v.path.read_bytes())
    raw[-1] ^= 0xFF
    v.path.write_bytes(bytes(raw))
    r = cli(tmp_path, "list", "--vault", "s.vault")
    assert r.returncode == 2
    assert b"modified or corrupted" in r.stderr
    assert b"Traceback" not in r.stderr


def test_cli_usage_errors(tmp_path: Path) -> None:
    r = cli(tmp_path, "init", "--vault", "n.vault")  # stdin is no terminal: no passphrase
    assert r.returncode == 2 and b"no passphrase" in r.stderr
    r = cli(tmp_path, "list")  # no config, no --vault
    assert r.returncode == 2 and b"config file not found" in r.stderr
    (tmp_path / "affidavit.toml").write_text("[journal]\n")
    r = cli(tmp_path, "list")
    assert r.returncode == 2 and b"no [vault] section" in r.stderr
    r = cli(tmp_path, "put", "bad/name", "--vault", "x.vault", stdin=b"v")
    assert r.returncode == 2 and b"entry names" in r.stderr
    r = cli(tmp_path, "list", "--vault", "missing.vault")
    assert r.returncode == 2 and b"no vault file" in r.stderr
    r = cli(tmp_path, "init", "--vault", "e.vault", "--passphrase-stdin", stdin=b"\n")
    assert r.returncode == 2 and b"must not be empty" in r.stderr


def test_cli_os_errors_are_clear_errors_not_tracebacks(tmp_path: Path) -> None:
    # A vault in a directory that does not exist: init cannot create its lock file.
    r = cli(tmp_path, "init", "--vault", "no/such/dir/s.vault", "--passphrase-stdin", stdin=b"pw\n")
    assert r.returncode == 2 and b"cannot open the lock file" in r.stderr, r.stderr
    assert b"Traceback" not in r.stderr
    # The unlock file's place is taken by a directory: unlock cannot write it, and every
    # lookup reads the vault as locked (not a traceback from read_bytes()).
    Vault.init(tmp_path / "s.vault", PASS, n_log2=FAST)
    (tmp_path / "s.vault.unlock").mkdir()
    r = cli(tmp_path, "unlock", "--vault", "s.vault", "--passphrase-stdin", stdin=PASS.encode())
    assert r.returncode == 2 and b"cannot write the unlock file" in r.stderr, r.stderr
    assert b"Traceback" not in r.stderr and PASS.encode() not in r.stderr
    r = cli(tmp_path, "list", "--vault", "s.vault")
    assert r.returncode == 2 and b"cannot read the unlock file" in r.stderr, r.stderr
    assert b"Traceback" not in r.stderr


@pytest.mark.parametrize(
    ("tail", "stored"),
    [
        (b"\n" + b"B" * 170, None),  # a line of MAX_VALUE, then more: was stored cut, exit 0
        (b"\n\n", None),  # two lines: the final newline stays, one byte too many
        (b"\nB", None),
        (b"\r\n", b"A" * MAX_VALUE),  # the largest value, its final newline (CRLF) dropped
        (b"\n", b"A" * MAX_VALUE),
    ],
    ids=["line-then-more", "two-newlines", "newline-then-a-byte", "max-crlf", "max-lf"],
)
def test_cli_put_never_stores_a_value_cut_short(
    vault: Vault, tail: bytes, stored: bytes | None
) -> None:
    """``vault put`` stores what stdin held (less a single line's final newline) or refuses it
    PAYLOAD_LIMIT: the size is checked on what was read, not only on what the trim left."""
    r = cli(vault.path.parent, "put", "big", "--vault", "s.vault", stdin=b"A" * MAX_VALUE + tail)
    if stored is None:
        assert r.returncode == 2, r.stderr
        assert r.stderr.startswith(b"affidavit: PAYLOAD_LIMIT: value: ") and r.stdout == b""
        with pytest.raises(EntryMissing):
            vault.get("big")
    else:
        assert r.returncode == 0, r.stderr
        assert vault.get("big") == (stored, 1)


def test_cli_a_passphrase_line_too_long_is_refused_never_cut(tmp_path: Path) -> None:
    """``--passphrase-stdin`` took the first 4096 bytes of a longer line without a word: the
    vault then opened only from stdin, never with the whole passphrase from the variable or
    the prompt.  A longer line is PASSPHRASE_INVALID; one of 4096 bytes is taken whole."""
    for line in (b"p" * 5000 + b"\n", b"p" * (MAX_PASSPHRASE + 1), b"p" * 4097 + b"\r\n"):
        r = cli(tmp_path, "init", "--vault", "s.vault", "--passphrase-stdin", stdin=line)
        assert r.returncode == 2 and b"Traceback" not in r.stderr, r.stderr
        assert r.stderr == (
            b"affidavit: PASSPHRASE_INVALID: the passphrase is longer than 4096 bytes\n"
        )
        assert not (tmp_path / "s.vault").exists()
    longest = "p" * (MAX_PASSPHRASE - 1) + "q"
    r = cli(tmp_path, "init", "--vault", "s.vault", "--passphrase-stdin", stdin=longest.encode())
    assert r.returncode == 0, r.stderr
    r = cli(tmp_path, "unlock", "--vault", "s.vault", env={PASSPHRASE_ENV: longest})
    assert r.returncode == 0, r.stderr
