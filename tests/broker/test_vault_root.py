"""Root on the daemon's vault (audit 50b, ``rootput.sh``): ``sudo affidavit vault put`` or
``unlock`` on a vault the broker's user owns left files of root's, 0600, that the broker could
not read.  Refused (VAULT_NOT_ROOTS) before anything is written, naming the file, its owner and
``sudo -u`` that owner -- the journal's rule (``privatefile.theirs_for_root``).  And ``vault
put`` on a vault it cannot open says why, not only that it is locked."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio

from affidavit.secrets.vault import Vault, VaultNotRoots
from tests.daemon.kit import NOBODY
from tests.external import require_root

LIMIT = 60


async def _vault(*args: str, stdin: bytes = b"") -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AFFIDAVIT_")}
    argv = [sys.executable, "-m", "affidavit", "vault", *args]
    with trio.fail_after(LIMIT):
        done = await trio.run_process(
            argv, stdin=stdin, env=env, capture_stdout=True, capture_stderr=True, check=False
        )
    return done.returncode, done.stderr.decode()


def _theirs(tmp: Path) -> tuple[Path, dict[Path, tuple[int, bytes]]]:
    """An unlocked vault with one entry, every file and the directory given to nobody; what
    each file holds and who owns it."""
    home = tmp / "home"
    home.mkdir()
    path = home / "s.vault"
    vault = Vault.init(path, "pw", n_log2=10)
    vault.unlock("pw")
    vault.put("tok", b"old")
    for p in (home, *home.iterdir()):
        os.chown(p, NOBODY, NOBODY)
    return path, {p: (p.stat().st_uid, p.read_bytes()) for p in home.iterdir()}


@pytest.mark.parametrize(
    ("args", "stdin"),
    [(("put", "tok"), b"new"), (("unlock", "--passphrase-stdin"), b"pw\n")],
)
async def test_root_is_refused_the_daemons_vault_writing_nothing(
    tmp_path: Path, args: tuple[str, ...], stdin: bytes
) -> None:
    require_root()
    path, before = _theirs(tmp_path)
    status, err = await _vault(args[0], "--vault", str(path), *args[1:], stdin=stdin)
    assert status == 2, err
    assert err.startswith(
        f"affidavit: VAULT_NOT_ROOTS: --vault: {path} is owned by uid {NOBODY} and this "
        "process runs as root"
    ), err
    assert f"sudo -u '#{NOBODY}' affidavit" in err and "Traceback" not in err, err
    home = path.parent
    assert {p: (p.stat().st_uid, p.read_bytes()) for p in home.iterdir()} == before


def test_root_init_in_the_daemons_directory_is_refused(tmp_path: Path) -> None:
    require_root()
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    with pytest.raises(VaultNotRoots) as caught:
        Vault.init(home / "s.vault", "pw", n_log2=10)
    assert str(caught.value).startswith(f"{home} is owned by uid {NOBODY} and this process")
    assert list(home.iterdir()) == []


def test_an_open_by_root_makes_no_lock_file_of_roots(tmp_path: Path) -> None:
    """The open's sweep takes the lock, which would create ``<vault>.lock`` root's: passed."""
    require_root()
    path, _ = _theirs(tmp_path)
    lock = path.with_name(path.name + ".lock")
    lock.unlink()
    Vault.open(path)
    assert not lock.exists()


async def test_put_says_why_the_vault_is_locked(tmp_path: Path) -> None:
    path = tmp_path / "s.vault"
    Vault.init(path, "pw", n_log2=10).unlock("pw")
    unlock = path.with_name(path.name + ".unlock")
    unlock.chmod(0o644)
    status, err = await _vault("put", "--vault", str(path), "tok", stdin=b"v")
    assert status == 2, err
    assert err.startswith(
        f"affidavit: VAULT_LOCKED: --vault: {unlock}: cannot read the unlock file ("
    ), err
    assert "0644" in err and "chmod 600" in err, err


def test_the_chown_to_root_names_the_directory_and_only_the_files_there(tmp_path: Path) -> None:
    """Root to run the broker from now on needs the directory too (whoever owns it can swap
    the files), and a ``chown`` of a file not there fails the whole command: a locked vault
    has no unlock file."""
    require_root()
    path, _ = _theirs(tmp_path)
    vault = Vault(path)
    vault.unlock_path.unlink()
    with pytest.raises(VaultNotRoots) as caught:
        vault.refuse_root_on_theirs()
    said = str(caught.value)
    chown = said.rsplit("if root is to run the broker from now on: ", 1)[1]
    assert chown == f"chown 0 {path} {vault.lock_path} {path.parent}", said


async def test_unlock_is_refused_before_the_passphrase_is_asked(tmp_path: Path) -> None:
    """No passphrase anywhere (no --passphrase-stdin, no variable, no terminal): the refusal
    comes first, so nobody is asked for a passphrase that could not be used."""
    require_root()
    path, before = _theirs(tmp_path)
    status, err = await _vault("unlock", "--vault", str(path))
    assert status == 2, err
    assert err.startswith(
        f"affidavit: VAULT_NOT_ROOTS: --vault: {path} is owned by uid {NOBODY}"
    ), err
    assert {p: (p.stat().st_uid, p.read_bytes()) for p in path.parent.iterdir()} == before


def test_root_putting_into_the_daemons_vault_is_refused_before_its_key_is_sought(
    tmp_path: Path,
) -> None:
    """``Vault.put`` (an embedder's, as root) derived the key before its lock's refusal: it
    answered VaultLocked (the unlock file another user's) or ran scrypt first -- not what
    was wrong (cfgfix50b's review)."""
    require_root()
    path, before = _theirs(tmp_path)
    with pytest.raises(VaultNotRoots) as caught:
        Vault(path).put("tok", b"new")
    assert str(caught.value).startswith(f"{path} is owned by uid {NOBODY} and this process")
    assert {p: (p.stat().st_uid, p.read_bytes()) for p in path.parent.iterdir()} == before
