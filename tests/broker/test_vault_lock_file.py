"""The vault's lock file (audit 50b, ``lockhold.sh``): never opened through a link, refused when
another user could open it -- whoever can open it can hold its flock and stall every vault write
-- and held by another process for at most ``LOCK_WAIT`` before VAULT_BUSY, never a command that
waits without end."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

import pytest

from affidavit.secrets import vault as vault_module
from affidavit.secrets.vault import Vault, VaultBusy, VaultLockUnusable


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
