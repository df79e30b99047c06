"""A vault reached by another name is one vault, and every refusal of the vault's file names its
code and the field to fix (audit 53d, findings 1 and 2).

A symbolic link to the vault: ``vault put`` renamed its new file onto the link, which became a
file of its own, and the broker -- reading the name its config gives -- kept sending the revoked
value; the unlock file and lock were made beside the link.  The vault now resolves its path once
(as the journal does, ``journal.names``): every name writes the one file, its unlock file and lock
beside it.  A hard link cannot be resolved so (every name is the file's own): a vault file with
more than one name is refused, at every open, at each ``put`` and at a broker's start
(``VAULT_HARD_LINKED``).  The file's other refusals had one undocumented code, ``VAULT_ERROR``,
and no field: now ``VAULT_UNREADABLE``, ``VAULT_WRITE_FAILED`` and ``INVALID_FIELD``, with the
field (``--vault``, ``vault.path``, an entry's ``name``) -- and a failed write keeps the old vault.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

import affidavit.privatefile
from affidavit.api.broker import Broker
from affidavit.config import ConfigError, load_config
from affidavit.secrets.vault import (
    PASSPHRASE_ENV,
    InvalidEntry,
    Vault,
    VaultHardLinked,
    VaultUnreadable,
    VaultWriteFailed,
)
from tests.external import tmpfs
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import http_target, open_broker, write_config

OLD = b"VAULT-CANARY-revoked-5e1d"
NEW = b"VAULT-CANARY-rotated-8a2f"
PASS = "names and links"
LIMIT = 20
GET = {"target": "api", "method": "GET", "path": "/x"}


@pytest.fixture(autouse=True)
def _no_env_passphrase(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PASSPHRASE_ENV, raising=False)


def _state(tmp_path: Path) -> Path:
    """``state/v.vault`` (``tok = OLD``), unlocked, and ``etc/v.vault`` a link to it."""
    (tmp_path / "state").mkdir(mode=0o700)
    (tmp_path / "etc").mkdir(mode=0o700)
    real = tmp_path / "state" / "v.vault"
    vault = Vault.init(real, PASS, n_log2=10)
    vault.unlock(PASS)
    vault.put("tok", OLD)
    (tmp_path / "etc" / "v.vault").symlink_to(real)
    return real


def cli(cwd: Path, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in (PASSPHRASE_ENV, "AFFIDAVIT_CONFIG")}
    return subprocess.run(
        [sys.executable, "-m", "affidavit", "vault", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        env=env,
        timeout=60,
        check=False,
    )


def _api_error(r: subprocess.CompletedProcess[bytes]) -> dict[str, str]:
    assert r.returncode == 2 and b"Traceback" not in r.stderr, r.stderr
    error: dict[str, str] = json.loads(r.stdout)["api_error"]
    return error


async def test_a_rotation_through_a_symlink_reaches_the_file_the_config_names(
    tmp_path: Path,
) -> None:
    real = _state(tmp_path)
    link = tmp_path / "etc" / "v.vault"
    Vault.open(link).lock()  # through the link: the unlock file beside the file goes
    assert not Vault(real).unlock_path.exists()
    r = cli(tmp_path, "unlock", "--vault", str(link), "--passphrase-stdin", stdin=PASS.encode())
    assert r.returncode == 0, r.stderr
    r = cli(tmp_path, "put", "--vault", str(link), "tok", stdin=NEW + b"\n")
    assert r.returncode == 0 and b"version 2" in r.stdout, r.stderr
    assert link.is_symlink() and os.readlink(link) == str(real)  # still the one file
    assert sorted(p.name for p in link.parent.iterdir()) == ["v.vault"]  # nothing beside it
    async with HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv:
        target = http_target(srv.url, credential="vault:tok")
        cfg = write_config(tmp_path, {"api": target}, vault=str(real))
        async with open_broker(cfg) as b:
            with trio.fail_after(LIMIT):
                env = await b.call(GET)
    assert env["evidence"]["outcome"] == "committed", env
    assert env["evidence"]["credential"]["version"].startswith("2:vault:")
    assert [q.header("authorization") for q in srv.requests] == [f"Bearer {NEW.decode()}"]


async def test_a_hard_linked_vault_is_refused_at_open_put_and_start(tmp_path: Path) -> None:
    real = _state(tmp_path)
    opened = Vault.open(real)
    second = tmp_path / "state" / "hard.vault"
    os.link(real, second)
    before = real.read_bytes()
    for name in (real, second):
        with pytest.raises(VaultHardLinked, match="2 names"):
            Vault.open(name)
    with pytest.raises(VaultHardLinked):
        opened.put("tok", NEW)  # opened before the link was made: refused under the lock
    assert real.read_bytes() == before and os.stat(real).st_nlink == 2
    r = cli(tmp_path, "put", "--vault", str(second), "tok", stdin=NEW + b"\n")
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"affidavit: VAULT_HARD_LINKED: --vault: {second}: ".encode())
    error = _api_error(cli(tmp_path, "list", "--json", "--vault", str(real)))
    assert (error["code"], error["field"]) == ("VAULT_HARD_LINKED", "--vault"), error
    assert f"-samefile {real}" in error["message"]
    assert real.read_bytes() == before
    async with HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv:
        target = http_target(srv.url, credential="vault:tok")
        cfg = write_config(tmp_path, {"api": target}, vault=str(real))
        with pytest.raises(ConfigError) as caught:
            async with Broker.open(config=load_config(cfg)):
                pass
    assert (caught.value.code, caught.value.field) == ("VAULT_HARD_LINKED", "vault.path")
    assert srv.requests == []


def test_an_unreadable_vault_names_its_code_and_field(tmp_path: Path) -> None:
    (tmp_path / "dir.vault").mkdir()
    error = _api_error(cli(tmp_path, "list", "--json", "--vault", "dir.vault"))
    assert (error["code"], error["field"]) == ("VAULT_UNREADABLE", "--vault"), error
    assert "is a directory" in error["message"]
    (tmp_path / "affidavit.toml").write_text('[vault]\npath = "dir.vault"\n')
    error = _api_error(cli(tmp_path, "list", "--json"))
    assert (error["code"], error["field"]) == ("VAULT_UNREADABLE", "vault.path"), error
    with pytest.raises(VaultUnreadable):
        Vault.open(tmp_path / "dir.vault")


def test_a_bad_entry_names_its_field(tmp_path: Path) -> None:
    vault = Vault.init(tmp_path / "v.vault", PASS, n_log2=10)
    vault.unlock(PASS)
    for name, value, field in (("bad/name", b"x", "name"), ("ok", b"", "value")):
        with pytest.raises(InvalidEntry) as caught:
            vault.put(name, value)
        assert (caught.value.code, caught.value.field) == ("INVALID_FIELD", field)


def test_a_write_that_fails_keeps_the_old_vault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC at the write of the new file's bytes (injected: ``tests.external.tmpfs`` fills a real
    file system where it may mount one): VAULT_WRITE_FAILED, the old vault whole, no temp."""
    vault = Vault.init(tmp_path / "v.vault", PASS, n_log2=10)
    vault.unlock(PASS)
    vault.put("tok", OLD)
    before = sorted(p.name for p in tmp_path.iterdir())
    real_write = os.write

    def no_space(fd: int, data: bytes) -> int:
        if len(data) > 4000:  # the vault's new bytes (an unlock file is a few dozen)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    with monkeypatch.context() as m:
        m.setattr(affidavit.privatefile.os, "write", no_space)
        with pytest.raises(VaultWriteFailed, match="No space left on device"):
            vault.put("big", b"B" * 4000)
    assert vault.list()[0][:2] == ("tok", 1) and len(vault.list()) == 1
    assert vault.get("tok") == (OLD, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_write_on_a_full_file_system_keeps_the_old_vault(tmp_path: Path) -> None:
    where = tmp_path / "mnt"
    with tmpfs(where, "64k"):
        vault = Vault.init(where / "v.vault", PASS, n_log2=10)
        vault.unlock(PASS)
        vault.put("tok", OLD)
        before = vault.path.read_bytes()
        with (where / "fill").open("wb") as f, contextlib.suppress(OSError):
            f.write(b"\0" * 200_000)  # more than its 64 KiB: filled to the last block (ENOSPC)
        with pytest.raises(VaultWriteFailed, match="No space left on device"):
            vault.put("big", os.urandom(40_000))
        assert vault.path.read_bytes() == before
        assert vault.get("tok") == (OLD, 1)
        assert sorted(p.name for p in where.iterdir()) == [
            "fill",
            "v.vault",
            "v.vault.lock",
            "v.vault.unlock",
        ]


def test_an_unlock_file_left_beside_a_link_is_named(tmp_path: Path) -> None:
    """Upgrading: an earlier affidavit kept the unlock file beside the link it was given."""
    real = _state(tmp_path)
    link = tmp_path / "etc" / "v.vault"
    Vault(real).unlock_path.rename(tmp_path / "etc" / "v.vault.unlock")
    r = cli(tmp_path, "put", "--vault", str(link), "tok", stdin=NEW + b"\n")
    assert r.returncode == 2 and b"VAULT_LOCKED" in r.stderr, r.stderr
    assert b"beside the link" in r.stderr and b"rm " in r.stderr, r.stderr
    assert Vault.open(real).is_locked
