"""``affidavit init`` and the ``--out`` of ``journal public-key``/``anchor`` never write through
a link at their path (audit 50b, ``init.sh``/``initforce.sh``): a link another user planted in a
directory they can write would have root create or truncate the file it names -- or create the
config inside a directory the planter owns, to rewrite it later.  A name already there is
FILE_EXISTS; ``--force`` (and ``--out``, which replaces a regular file) put a new file in place
of the link, whose target stays as it was."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest
import trio

from affidavit.acl import GROUP_OBJ, MASK, OTHER, USER, USER_OBJ, access_entries
from affidavit.cli import main as cli_main
from affidavit.config import load_config
from affidavit.journal import Journal
from tests.daemon.kit import NOBODY, as_user, client_env, run
from tests.external import require_posix_acl, require_root

LIMIT = 60


async def _init(*args: str) -> trio.Process:
    argv = [sys.executable, "-m", "affidavit", "init", *args]
    with trio.fail_after(LIMIT):
        return await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)


async def test_init_refuses_a_dangling_link_at_its_path_creating_nothing(tmp_path: Path) -> None:
    victim = tmp_path / "victim" / "created-by-root"
    victim.parent.mkdir()
    config = tmp_path / "affidavit.toml"
    config.symlink_to(victim)
    done = await _init("--config", str(config))
    assert done.returncode == 2, done.stderr
    assert done.stderr.decode() == (
        f"affidavit: FILE_EXISTS: {config} exists; use --force to overwrite\n"
    )
    assert not os.path.lexists(victim) and config.is_symlink()


async def test_init_force_replaces_a_link_never_the_file_it_names(tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.write_text("root:important\n")
    precious.chmod(0o600)
    config = tmp_path / "affidavit.toml"
    config.symlink_to(precious)
    done = await _init("--config", str(config), "--force")
    assert done.returncode == 0, done.stderr
    assert precious.read_text() == "root:important\n"
    st = os.lstat(config)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600, st
    assert set(load_config(config).targets) == {"example", "deploy"}


async def test_init_force_keeps_the_replaced_files_mode_less_others_write(tmp_path: Path) -> None:
    config = tmp_path / "affidavit.toml"
    assert (await _init("--config", str(config))).returncode == 0
    config.chmod(0o664)
    done = await _init("--config", str(config), "--force")
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(config.stat().st_mode) == 0o644


@pytest.mark.parametrize("owner", [0, NOBODY])
async def test_init_force_keeps_the_replaced_files_owner_group_and_acl(
    tmp_path: Path, owner: int
) -> None:
    """``root:affidavit 0640`` stays so (it became ``root:root 0640``, which the daemon, reading
    it through its group, could not open), a named user's ACL entry too -- its mask, as the
    group bits, less write."""
    require_root()
    config = tmp_path / "affidavit.toml"
    assert (await _init("--config", str(config))).returncode == 0
    os.chown(config, owner, NOBODY)  # (nogroup: a group that is not root's)
    config.chmod(0o640)
    entries = [(USER_OBJ, 6, 0), (USER, 4, 4242), (GROUP_OBJ, 4, 0), (MASK, 6, 0), (OTHER, 0, 0)]
    require_posix_acl(config, *entries)  # (mask rw: 0660 until --force takes the write away)
    done = await _init("--config", str(config), "--force")
    assert done.returncode == 0, done.stderr
    st = os.lstat(config)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (owner, NOBODY, 0o640), st
    kept = access_entries(config)
    assert kept is not None and (USER, 4, 4242) in kept and (MASK, 4, 0xFFFFFFFF) in kept, kept
    assert set(load_config(config).targets) == {"example", "deploy"}


@pytest.mark.parametrize(("owner", "group"), [(0, 0), (NOBODY, 0)])
async def test_init_force_as_a_user_who_cannot_keep_the_owner_writes_nothing(
    owner: int, group: int
) -> None:
    """``init --force`` as nobody in its own directory over a config whose owner or group it
    cannot give a file (root's; its own in root's group): refused OWNER_NOT_KEPT before a
    byte is written -- it failed FILE_UNUSABLE "Operation not permitted" at the fchown, with
    no word of why (cfgfix50b's review) -- naming the uid, the gid and what to do."""
    require_root()
    home = Path(tempfile.mkdtemp(prefix="affidavit-init-"))  # (tmp_path: under root's 0700)
    try:
        os.chown(home, NOBODY, NOBODY)
        config = home / "affidavit.toml"
        config.write_text("# the operator's\n")
        os.chown(config, owner, group)
        config.chmod(0o644)
        before = os.lstat(config)
        argv = as_user(NOBODY, "-m", "affidavit", "init", "--config", str(config), "--force")
        done = await run(argv, env=client_env())
        err = done.stderr.decode()
        assert done.returncode == 2, err
        assert err == (
            f"affidavit: OWNER_NOT_KEPT: cannot replace {config} keeping its owner uid {owner} "
            f"and group gid {group}: rerun as root, or `chown {NOBODY}:{NOBODY} {config}` "
            "first for a config of this user's, or remove the file and run init again\n"
        ), err
        after = os.lstat(config)
        assert (after.st_ino, after.st_uid, after.st_gid) == (before.st_ino, owner, group)
        assert config.read_text() == "# the operator's\n"
        assert sorted(p.name for p in home.iterdir()) == ["affidavit.toml"]
        os.chown(config, NOBODY, NOBODY)  # the chown it says: then it goes through
        done = await run(argv, env=client_env())
        assert done.returncode == 0, done.stderr.decode()
        assert os.lstat(config).st_uid == NOBODY and "[targets.example]" in config.read_text()
    finally:
        shutil.rmtree(home)


async def _journal(path: Path) -> None:
    async with Journal.open(path):
        pass


async def test_public_key_out_is_never_written_through_a_link(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j.db"
    await _journal(db)
    precious = tmp_path / "precious"
    precious.write_text("root:important\n")
    out = tmp_path / "journal.pub"
    out.symlink_to(precious)
    argv = ["journal", "public-key", "--journal", str(db), "--out", str(out)]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"affidavit: FILE_UNUSABLE: cannot write public key file {out}: "), err
    assert precious.read_text() == "root:important\n" and out.is_symlink()
    out.unlink()
    out.write_text("an older key\n")
    out.chmod(0o600)
    assert cli_main(argv) == 0
    st = os.lstat(out)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644, st
    assert b"an older key" not in out.read_bytes()
