"""A secret file's write killed half-way leaves no copy of the secret behind.

``vault unlock`` SIGKILLed at its fsync left the derived vault key in
``.s.vault.unlock.<hex>.tmp`` (0600); ``vault lock`` said "locked" and left it, and copied to
``s.vault.unlock`` it opened the vault without the passphrase.  Secret files are now written as an
unnamed file (Linux ``O_TMPFILE``) linked into place once whole, so a killed write leaves nothing;
where that is refused, the named temp file as before -- and the vault's lock, unlock and open and
key creation remove such leftovers: names of exactly that pattern, regular files this user owns,
never a link's target.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from affidavit import privatefile
from affidavit.journal import Journal
from affidavit.privatefile import write_private_file
from affidavit.secrets.vault import PASSPHRASE_ENV, Vault, VaultLocked
from tests.external import require_root

PASS = "correct horse battery staple"
FAST = 10  # scrypt N = 2**10
LEFTOVER = "0123456789ab"  # a temp name's 12 hex digits
NOBODY = 65534  # another uid

# Unlock in a child process whose first fsync kills it (SIGKILL): the write of the unlock file,
# killed after its bytes were written and before they had a name.
KILLED_UNLOCK = """
import os, signal, sys
from affidavit.secrets.vault import Vault
vault = Vault.open(sys.argv[1])
os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
vault.unlock(sys.argv[2])
"""


@pytest.fixture(autouse=True)
def _no_env_passphrase(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PASSPHRASE_ENV, raising=False)


@pytest.fixture
def vault(tmp_path: Path) -> Vault:
    return Vault.init(tmp_path / "s.vault", PASS, n_log2=FAST)


def _beside(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}."))


def test_an_unlock_killed_at_its_fsync_leaves_no_copy_of_the_key(vault: Vault) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_UNLOCK, str(vault.path), PASS],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert _beside(vault.unlock_path) == []  # no temp file holds the key
    assert not vault.unlock_path.exists()
    with pytest.raises(VaultLocked):
        Vault.open(vault.path).list()


def _leftover(path: Path, data: bytes = b"derived key bytes") -> Path:
    """What an interrupted write left beside ``path`` (where no unnamed file could be used)."""
    left = path.with_name(f".{path.name}.{LEFTOVER}.tmp")
    fd = os.open(left, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, data)
    os.close(fd)
    return left


def test_vault_lock_removes_a_leftover_temp_file_and_nothing_else(
    vault: Vault, tmp_path: Path
) -> None:
    left = _leftover(vault.unlock_path)
    outside = tmp_path / "elsewhere"
    outside.write_bytes(b"not the vault's")
    link = vault.unlock_path.with_name(f".{vault.unlock_path.name}.{'f' * 12}.tmp")
    link.symlink_to(outside)  # the pattern, but a link: never followed, never removed
    others = [
        vault.unlock_path.with_name(f".{vault.unlock_path.name}.{'g' * 12}.tmp"),  # not hex
        vault.unlock_path.with_name(f".{vault.unlock_path.name}.{LEFTOVER}0.tmp"),  # 13 digits
        vault.unlock_path.with_name(f".{vault.unlock_path.name}.{LEFTOVER}.tmp.bak"),
    ]
    for other in others:
        other.write_bytes(b"someone else's")
    Vault.open(vault.path).lock()
    assert not left.exists()
    assert link.is_symlink() and outside.read_bytes() == b"not the vault's"
    assert all(o.read_bytes() == b"someone else's" for o in others)


def test_a_leftover_another_user_owns_is_left(vault: Vault) -> None:
    """Only this user's temp files go: one of the pattern another uid owns (chowned to nobody
    here: CI runs as root) is not this broker's to remove."""
    require_root()
    theirs = _leftover(vault.unlock_path, b"someone else's")
    os.chown(theirs, NOBODY, NOBODY)
    mine = _leftover(vault.path, b"an older vault")
    assert privatefile.remove_leftovers(vault.unlock_path) == 0
    assert privatefile.remove_leftovers(vault.path) == 1
    assert theirs.read_bytes() == b"someone else's" and not mine.exists()


def test_unlock_and_open_remove_leftovers_of_the_vault_and_its_unlock_file(vault: Vault) -> None:
    left = _leftover(vault.unlock_path)
    Vault.open(vault.path).unlock(PASS)
    assert not left.exists()
    left = _leftover(vault.path, b"an older vault")
    Vault.open(vault.path)
    assert not left.exists()


async def test_key_creation_removes_a_leftover_key_temp_file(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    left = _leftover(Path(f"{db}.signing.key"), b"-----BEGIN PRIVATE KEY-----")
    async with Journal.open(db):
        pass
    assert not left.exists()
    assert Path(f"{db}.signing.key").exists()


def test_where_unnamed_files_are_refused_the_named_temp_file_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open
    refused: list[int] = []

    def no_tmpfile(path: object, flags: int, *args: object, **kw: object) -> int:
        if flags & getattr(os, "O_TMPFILE", 0) == getattr(os, "O_TMPFILE", -1):
            refused.append(flags)
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")
        return real_open(path, flags, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(privatefile.os, "open", no_tmpfile)
    target = tmp_path / "secret"
    write_private_file(target, b"one")
    write_private_file(target, b"two")
    with pytest.raises(FileExistsError):
        write_private_file(target, b"three", replace=False)
    monkeypatch.undo()
    assert refused  # (the unnamed file was asked for, refused)
    assert target.read_bytes() == b"two"
    assert _beside(target) == []
