"""The vault's lock file (audit 50b, ``lockhold.sh``): never opened through a link, refused when
another user could open it -- whoever can open it can hold its flock and stall every vault write
-- and held by another process for at most ``LOCK_WAIT`` before VAULT_BUSY, never a command that
waits without end."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

from affidavit.secrets import vault as vault_module
from affidavit.secrets.vault import Vault, VaultBusy, VaultLockUnusable
from tests.daemon.kit import NOBODY, as_user, client_env, run
from tests.external import require_root


def _unlocked(tmp: Path) -> Vault:
    vault = Vault.init(tmp / "s.vault", "pw", n_log2=10)
    vault.unlock("pw")
    return vault


def test_a_link_at_the_lock_path_is_never_followed(tmp_path: Path) -> None:
    vault = _unlocked(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    vault.lock_path.unlink()
    vault.lock_path.symlink_to(elsewhere)
    with pytest.raises(VaultLockUnusable) as caught:
        vault.put("tok", b"v")
    assert caught.value.code == "VAULT_LOCK_UNUSABLE"
    assert str(caught.value) == (
        f"{vault.lock_path}: cannot open the lock file: it is a link, never followed"
    )
    assert not os.path.lexists(elsewhere) and vault.list() == []


def test_a_lock_file_others_can_open_is_refused_naming_its_chmod(tmp_path: Path) -> None:
    vault = _unlocked(tmp_path)
    vault.lock_path.chmod(0o644)
    with pytest.raises(VaultLockUnusable) as caught:
        vault.put("tok", b"v")
    said = str(caught.value)
    assert "accessible by group or others (mode 0644)" in said, said
    assert f"chmod 600 {vault.lock_path}" in said and vault.list() == []


def test_a_held_lock_is_waited_for_a_bounded_time_then_vault_busy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vault = _unlocked(tmp_path)
    monkeypatch.setattr(vault_module, "LOCK_WAIT", 0.3)
    holder = os.open(vault.lock_path, os.O_RDONLY)  # its own open file: its flock conflicts
    try:
        fcntl.flock(holder, fcntl.LOCK_SH)
        started = time.monotonic()
        raised: list[BaseException] = []

        def put() -> None:
            try:
                vault.put("tok", b"v")
            except BaseException as exc:
                raised.append(exc)

        worker = threading.Thread(target=put, daemon=True)  # a wait without end fails, bounded
        worker.start()
        worker.join(timeout=10)
        waited = time.monotonic() - started
        assert not worker.is_alive(), "vault.put still waiting for the lock after 10 s"
        (exc,) = raised
        assert isinstance(exc, VaultBusy) and "fuser -v" in str(exc), exc
        assert 0.3 <= waited < 5, waited
        fcntl.flock(holder, fcntl.LOCK_UN)
        assert vault.put("tok", b"v") == 1  # let go: the write goes on
    finally:
        os.close(holder)


def test_an_open_and_a_lock_never_wait_on_a_held_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``vault list`` and ``vault lock`` (``Vault.open``'s sweep, ``lock``'s) try the lock once
    and go on: they write nothing the lock guards, and a holder must not hold them for
    ``LOCK_WAIT`` (bounded here: 30 s against a 10 s join)."""
    vault = _unlocked(tmp_path)
    vault.put("tok", b"v")
    monkeypatch.setattr(vault_module, "LOCK_WAIT", 30.0)
    holder = os.open(vault.lock_path, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_SH)
        said: list[object] = []

        def list_then_lock() -> None:
            try:
                opened = Vault.open(vault.path)
                said.append(opened.list())
                opened.lock()
                said.append(opened.is_locked)
            except BaseException as exc:
                said.append(exc)

        worker = threading.Thread(target=list_then_lock, daemon=True)
        worker.start()
        worker.join(timeout=10)
        assert not worker.is_alive(), "vault list/lock waited on the held lock"
        (listed, locked) = said
        assert isinstance(listed, list) and [e[:2] for e in listed] == [("tok", 1)], said
        assert locked is True, said
    finally:
        os.close(holder)


def test_put_derives_the_key_before_it_takes_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From ``$AFFIDAVIT_VAULT_PASSPHRASE`` the key is an scrypt (seconds at the default cost):
    derived under the lock, every other write would wait it out."""
    path = tmp_path / "s.vault"
    Vault.init(path, "pw", n_log2=10)
    monkeypatch.setenv(vault_module.PASSPHRASE_ENV, "pw")
    lock_path = path.with_name(path.name + ".lock")
    held_while_deriving: list[bool] = []
    derive = vault_module._derive

    def watched(*args: object) -> bytes:
        probe = os.open(lock_path, os.O_RDONLY)
        try:
            fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
            held_while_deriving.append(False)
        except BlockingIOError:
            held_while_deriving.append(True)
        finally:
            os.close(probe)
        return derive(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(vault_module, "_derive", watched)
    assert Vault.open(path).put("tok", b"v") == 1
    assert held_while_deriving == [False], held_while_deriving


async def test_a_lock_file_root_left_names_its_owner_and_the_fix() -> None:
    """An earlier ``sudo affidavit vault put`` made ``<vault>.lock`` root's 0600: the broker's
    user's next ``put`` was told only "Permission denied"."""
    require_root()
    home = Path(tempfile.mkdtemp(prefix="affidavit-vault-"))
    try:
        path = home / "s.vault"
        vault = Vault.init(path, "pw", n_log2=10)  # (as root: its lock root's 0600)
        vault.unlock("pw")
        for p in (home, vault.path, vault.unlock_path):
            os.chown(p, NOBODY, NOBODY)
        argv = as_user(NOBODY, "-m", "affidavit", "vault", "put", "--vault", str(path), "tok")
        done = await run(argv, stdin=b"v", env=client_env())
        err = done.stderr.decode()
        lock = vault.lock_path
        assert done.returncode == 2, err
        assert err.startswith(
            f"affidavit: VAULT_LOCK_UNUSABLE: --vault: {lock}: cannot open the lock file: it is "
            f"owned by uid 0, not by this process's uid {NOBODY}"
        ), err
        assert f"`chown {NOBODY} {lock}` as uid 0 or root" in err, err
        assert "Permission denied" not in err and "Traceback" not in err, err
        os.chown(lock, NOBODY, NOBODY)  # mended: the put goes on
        done = await run(argv, stdin=b"v", env=client_env())
        assert done.returncode == 0, done.stderr.decode()
    finally:
        shutil.rmtree(home)
