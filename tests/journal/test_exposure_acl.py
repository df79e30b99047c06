"""Exposure judged by a POSIX access ACL (journal/exposure.py, affidavit/acl.py): with one, the
group bits are its mask -- the entries say who else reaches the file, and are named."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from affidavit.acl import GROUP, GROUP_OBJ, MASK, OTHER, USER, USER_OBJ, Unreadable, access_entries
from affidavit.journal.exposure import (
    CONFIG,
    DIRECTORY,
    PRIVATE,
    config_exposure,
    directory_exposures,
    exposure,
)
from tests.external import require_posix_acl


def _file(tmp: Path, mode: int = 0o600) -> Path:
    path = tmp / "f"
    path.write_bytes(b"x")
    path.chmod(mode)
    return path


def test_a_named_user_is_named_with_its_setfacl_not_as_the_group(tmp_path: Path) -> None:
    path = _file(tmp_path)
    require_posix_acl(
        path, (USER_OBJ, 6, 0), (USER, 6, 1000), (GROUP_OBJ, 0, 0), (MASK, 6, 0), (OTHER, 0, 0)
    )
    assert path.stat().st_mode & 0o777 == 0o660  # what the mode bits alone would judge
    found = exposure(path, "journal", PRIVATE)
    assert found is not None
    assert str(found) == (
        f"journal {path} is reachable through its access ACL (user:1000 can read and write): "
        f"setfacl -x u:1000 {path}"
    )
    assert found.granted == ("user:1000",) and found.bits == 0


def test_the_mask_limits_what_an_entry_gets_and_this_user_and_root_are_fine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _file(tmp_path)
    me = 4321  # the daemon's user, not root
    os.chown(path, me, me)
    monkeypatch.setattr(os, "geteuid", lambda: me)
    require_posix_acl(
        path,
        (USER_OBJ, 6, 0),
        (USER, 6, me),
        (USER, 4, 0),
        (USER, 7, 1000),
        (GROUP_OBJ, 0, 0),
        (MASK, 4, 0),
        (OTHER, 0, 0),
    )
    # user:1000 holds rwx, but the mask lets it read only: that is what is named
    found = exposure(path, "journal", PRIVATE)
    assert found is not None and "(user:1000 can read)" in found.why
    require_posix_acl(
        path,
        (USER_OBJ, 6, 0),
        (USER, 6, me),
        (USER, 4, 0),
        (GROUP_OBJ, 0, 0),
        (MASK, 6, 0),
        (OTHER, 0, 0),
    )
    assert exposure(path, "journal", PRIVATE) is None


def test_a_config_may_be_read_through_an_acl_but_not_written(tmp_path: Path) -> None:
    path = _file(tmp_path, 0o644)
    require_posix_acl(
        path,
        (USER_OBJ, 6, 0),
        (GROUP_OBJ, 4, 0),
        (GROUP, 6, 50),
        (USER, 4, 1000),
        (MASK, 6, 0),
        (OTHER, 4, 0),
    )
    found = exposure(path, "config file", CONFIG)
    assert found is not None
    assert found.why == "reachable through its access ACL (group:50 can write)"
    assert found.fix == f"setfacl -m g:50:r-- {path}"  # its read stays: a config's is fine


def test_a_directory_writable_through_an_acl_is_named_with_its_entry(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    directory.mkdir(mode=0o755)
    require_posix_acl(
        directory,
        (USER_OBJ, 7, 0),
        (GROUP_OBJ, 5, 0),
        (USER, 7, 1000),
        (MASK, 7, 0),
        (OTHER, 5, 0),
    )
    [found] = [e for e in directory_exposures([(directory / "f", "journal")]) if e.granted]
    assert found.path == directory and found.what == "directory"
    assert "(user:1000 can write)" in found.why and "group or others" not in found.why
    assert found.fix == f"setfacl -m u:1000:r-x {directory}"
    assert exposure(directory, "directory", DIRECTORY) == found.__class__(
        directory, "directory", found.why, found.fix, 0, None, "", ("user:1000",)
    )


def test_an_unreadable_acl_leaves_the_mode_bits_to_judge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _file(tmp_path)
    require_posix_acl(
        path, (USER_OBJ, 6, 0), (USER, 4, 1000), (GROUP_OBJ, 0, 0), (MASK, 4, 0), (OTHER, 0, 0)
    )
    monkeypatch.setattr(os, "getxattr", lambda *a: b"\x03\x00\x00\x00")  # version 3
    with pytest.raises(Unreadable):
        access_entries(path)
    found = exposure(path, "journal", PRIVATE)
    assert found is not None
    assert found.why == "accessible by group or others (mode 0640)"  # never less than before


def test_a_config_with_a_password_is_named_for_the_groups_its_acl_lets_read(
    tmp_path: Path,
) -> None:
    """The agents' group reading the journal's password: by the ACL, the owning group may have
    nothing (the group bits are the mask a named user's entry needs) and a named group may read."""
    config = _file(tmp_path, 0o640)
    url = "postgresql://broker:hunter2@db.example/affidavit"
    owning = config.stat().st_gid
    base = ((USER_OBJ, 6, 0), (MASK, 4, 0), (OTHER, 0, 0))
    reader = 4321  # no daemon (this process) and no root: any user an entry names
    assert reader != os.geteuid()
    require_posix_acl(config, *base, (GROUP_OBJ, 0, 0), (USER, 4, reader))
    assert config.stat().st_mode & 0o777 == 0o640
    # The mask, not a reader, for the owning group -- but the named user reads the password,
    # whichever groups its account lists (the socket admits a process by its own groups).
    found = config_exposure(config, url, agent_gids=(owning,))
    assert found is not None
    assert found.why == f"readable by user {reader} (an access ACL entry), with the password in it"
    assert found.fix == f"setfacl -x u:{reader} {config}"
    named = {(USER, 4, os.geteuid()), (USER, 4, 0)}  # (one entry when this process is root)
    require_posix_acl(config, *base, (GROUP_OBJ, 0, 0), *named)
    assert config_exposure(config, url, agent_gids=(owning,)) is None  # the daemon's and root's
    require_posix_acl(config, *base, (GROUP_OBJ, 0, 0), (GROUP, 4, 998))
    found = config_exposure(config, url, agent_gids=(owning, 998))
    assert found is not None and "hunter2" not in str(found)
    assert found.why == (
        "readable by group 998, which the daemon's socket admits, with the password in it"
    )
    assert found.fix == f"setfacl -x g:998 {config}"
