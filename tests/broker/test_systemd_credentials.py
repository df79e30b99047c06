"""``systemd:NAME``: the credential systemd's ``LoadCredential=NAME:/path`` places in
``$CREDENTIALS_DIRECTORY`` (a directory standing in for ``/run/credentials/<unit>/`` here), read
with the ``file:`` rules -- and judged, as systemd makes it, by its access ACL: root's, ``0400``
plus ``user:<the service>:r``, shown ``0440`` (affidavit/acl.py, journal/exposure.py)."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from affidavit.acl import GROUP_OBJ, MASK, OTHER, USER, USER_OBJ
from affidavit.api.broker import exposed_files
from affidavit.config import Config, ConfigError, load_config
from affidavit.secrets.credentials import MAX_CREDENTIAL_BYTES, CredentialError, resolve
from affidavit.statemachine import Code
from tests.external import require_posix_acl
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import assert_ok, http_target, open_broker, write_config

CANARY = "CANARY-systemd-cred-7d41a2"
OTHER_UID = 1000


@pytest.fixture(autouse=True)
def _no_canary_in_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.set_level(logging.DEBUG)
    yield
    assert CANARY not in caplog.text


@pytest.fixture
def creds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``$CREDENTIALS_DIRECTORY``, as systemd makes it: root's, ``0500``."""
    directory = tmp_path / "credentials" / "affidavit.service"
    directory.mkdir(parents=True)
    directory.chmod(0o500)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(directory))
    return directory


def _lent(directory: Path, name: str, value: bytes, uid: int) -> Path:
    """The file ``LoadCredential=`` places for a service run as ``uid``: root's, ``0400``, and an
    ACL entry ``user:<uid>:r`` (so ``0440`` shown: the mask is the group bits)."""
    path = directory / name
    path.write_bytes(value)
    os.chown(path, 0, 0)
    path.chmod(0o400)
    require_posix_acl(
        path, (USER_OBJ, 4, 0), (USER, 4, uid), (GROUP_OBJ, 0, 0), (MASK, 4, 0), (OTHER, 0, 0)
    )
    assert path.stat().st_mode & 0o777 == 0o440
    return path


def _refused(ref: str, code: Code) -> CredentialError:
    with pytest.raises(CredentialError) as info:
        resolve(ref, vault=None)
    assert info.value.code is code
    for text in (str(info.value), info.value.message, info.value.detail):
        assert CANARY not in text
    return info.value


def test_the_credential_systemd_lends_the_daemon_is_read_with_its_version(creds: Path) -> None:
    path = _lent(creds, "billing_token", f"{CANARY}\n".encode(), os.geteuid())

    def versioner(label: str, value: bytes) -> str:
        return hashlib.sha256(label.encode() + b"\0" + value).hexdigest()

    got = resolve("systemd:billing_token", vault=None, versioner=versioner)
    assert got.value == CANARY.encode()  # the final newline dropped, as for file:
    # The value decides, keyed (as env:): systemd writes a fresh copy at every start of the
    # unit, and its inode or times would make an approval granted before a restart stale.
    version = versioner("credential-version:systemd:billing_token", CANARY.encode())
    assert got.version == f"systemd:hmac-sha256:{version[:32]}"
    path.unlink()
    _lent(creds, "billing_token", f"{CANARY}\n".encode(), os.geteuid())  # the next start's
    assert resolve("systemd:billing_token", vault=None, versioner=versioner) == got
    path.unlink()
    _lent(creds, "billing_token", b"another value", os.geteuid())
    other = resolve("systemd:billing_token", vault=None, versioner=versioner)
    assert other.version != got.version
    assert exposed_files(_config(creds.parent.parent, "systemd:billing_token")) == []


def test_an_acl_naming_another_user_is_refused_with_its_words_and_setfacl(creds: Path) -> None:
    path = _lent(creds, "tok", CANARY.encode(), OTHER_UID)
    err = _refused("systemd:tok", Code.CREDENTIAL_INVALID)
    said = f"reachable through its access ACL (user:{OTHER_UID} can read)"
    assert err.message == (  # the caller's words name no uid (the operator's detail does)
        "file is reachable through its access ACL by another user or group; only the broker's "
        "user may read it"
    )
    assert f"file is {said}; only this process's user may read it" in err.detail, err.detail
    assert f": setfacl -x u:{OTHER_UID} {path} (read as {path}: " in err.detail, err.detail
    [found] = exposed_files(_config(creds.parent.parent, "systemd:tok"))
    assert str(found) == (
        f"systemd credential file {path} is {said}: setfacl -x u:{OTHER_UID} {path}"
    )


def test_the_daemons_own_user_lent_the_file_by_root_is_no_exposure(
    creds: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a service user (not root) sees it: root owns the file, the ACL lets this user read it
    -- fine; without that entry root's file is named (it owns a credential it did not lend)."""
    _lent(creds, "tok", CANARY.encode(), 4321)
    monkeypatch.setattr(os, "geteuid", lambda: 4321)
    config = _config(creds.parent.parent, "systemd:tok")
    assert exposed_files(config) == []
    _lent(creds, "tok", CANARY.encode(), 4322)  # lent to someone else
    whys = [e.why for e in exposed_files(config)]
    assert whys == [
        "owned by uid 0, not by this process's uid 4321 (or root's, lent by an access ACL entry "
        "user:4321:r) and reachable through its access ACL "
        "(user:4322 can read)"
    ]


def test_another_users_file_lent_to_the_broker_by_its_acl_is_refused_for_its_owner(
    creds: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's own ``0400`` file plus ``user:<the broker>:r`` shows ``0440`` and its ACL names
    no one else -- but its owner can rewrite the secret: refused, naming the owner and its
    ``chown`` (not the mode's ``chmod 600``, which would take the broker's entry away).  Root's
    file lent the same way is systemd's and is read."""
    path = _lent(creds, "tok", CANARY.encode(), 4321)
    monkeypatch.setattr(os, "geteuid", lambda: 4321)
    os.chown(path, OTHER_UID, OTHER_UID)  # (chown clears no ACL entry: still user:4321:r)
    err = _refused("systemd:tok", Code.CREDENTIAL_INVALID)
    # The caller's words name no uid; the operator's name the owner and the fix.
    assert err.message == (
        "file is owned by another user, who can rewrite it; the broker's user must own it (or "
        "root lend it)"
    )
    assert f"file is owned by uid {OTHER_UID}, not by this process's user (uid 4321) or " in (
        err.detail
    )
    assert err.detail.endswith(
        f": chown 4321 {path} (read as {path}: the unit's credentials directory)"
    ), err.detail
    # Without any ACL, a 0600 file of another user too (a root broker reads it: its owner can
    # still rewrite it) -- and root's file read through its group is told chown, then chmod.
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    plain = creds / "plain"
    plain.write_bytes(CANARY.encode())
    plain.chmod(0o600)
    os.chown(plain, OTHER_UID, OTHER_UID)
    assert "owned by another user" in _refused("systemd:plain", Code.CREDENTIAL_INVALID).message
    monkeypatch.setattr(os, "geteuid", lambda: 4321)
    os.chown(plain, 0, 0)
    plain.chmod(0o640)
    err = _refused("systemd:plain", Code.CREDENTIAL_INVALID)
    assert err.detail.endswith(
        f"it must be 0600: chown 4321 {plain} && chmod 600 {plain} "
        f"(read as {plain}: the unit's credentials directory)"
    ), err.detail
    os.chown(path, 0, 0)
    assert resolve("systemd:tok", vault=None).value == CANARY.encode()


@pytest.mark.parametrize("directory", ["relative/dir", "/run/credentials/../../tmp", "/a//b"])
def test_a_credentials_directory_systemd_would_not_set_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, directory: str
) -> None:
    """Relative (read from the working directory) or unnormalised: not systemd's, which sets an
    absolute, normalised path -- refused before any file is opened there."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "relative" / "dir").mkdir(parents=True)
    (tmp_path / "relative" / "dir" / "tok").write_bytes(CANARY.encode())
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", directory)
    err = _refused("systemd:tok", Code.CREDENTIAL_MISSING)
    assert "not an absolute, normalised path" in err.detail
    # ... and a start looks at no file there, nor fails: the call says why it has none
    assert exposed_files(_config(tmp_path, "systemd:tok")) == []


def test_without_credentials_directory_the_call_says_what_the_unit_lacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    err = _refused("systemd:billing_token", Code.CREDENTIAL_MISSING)
    assert err.message == "no systemd credentials are passed to the broker"
    assert "CREDENTIALS_DIRECTORY" not in err.message  # a variable's name: the operator's
    assert err.detail.startswith("systemd:billing_token: $CREDENTIALS_DIRECTORY is not set")
    assert "add LoadCredential=billing_token:/path/to/the/file" in err.detail


def test_a_missing_empty_or_oversized_credential_keeps_the_file_rules(creds: Path) -> None:
    err = _refused("systemd:absent", Code.CREDENTIAL_MISSING)
    assert err.message == "file not found"
    assert f"(read as {creds / 'absent'}: the unit's credentials directory)" in err.detail
    assert "add LoadCredential=absent:/path/to/the/file to the unit" in err.detail
    (creds / "empty").write_bytes(b"\n")
    (creds / "empty").chmod(0o400)
    assert _refused("systemd:empty", Code.CREDENTIAL_MISSING).message == "file is empty"
    big = creds / "big"
    big.write_bytes(CANARY.encode() + b"x" * MAX_CREDENTIAL_BYTES)
    big.chmod(0o400)
    assert "64 KiB limit" in _refused("systemd:big", Code.CREDENTIAL_INVALID).message
    os.mkfifo(creds / "fifo", 0o400)
    assert "FIFO" in _refused("systemd:fifo", Code.CREDENTIAL_INVALID).message


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a/b", "../etc/shadow", "x" * 256, "a:b", "t\u00f6ken"]
)
def test_a_bad_name_is_refused_at_load_with_its_field_never_echoed(
    tmp_path: Path, name: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _config(tmp_path, f"systemd:{name}")
    assert info.value.field == "targets.api.credential"
    assert "systemd:NAME credential's NAME is a file name" in str(info.value)
    if len(name) > 2:  # (not '.', '..': the rule names them)
        assert name not in str(info.value)
    # (':' too: LoadCredential=a:b:/path would name another credential, "a")
    # (a control character is refused before, by the config's strings: resolve's own rule)
    assert _refused(f"systemd:{name or 'a'}\n", Code.UNKNOWN_CREDENTIAL).message.startswith(
        "a systemd:NAME credential's NAME is a file name"
    )


async def test_a_broker_calls_with_the_systemd_credential(creds: Path) -> None:
    _lent(creds, "token", f"{CANARY}\n".encode(), os.geteuid())
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(
            creds.parent.parent, {"api": http_target(srv.url, credential="systemd:token")}
        )
        async with open_broker(cfg) as broker:
            with trio.fail_after(30):
                got = await broker.call({"target": "api", "method": "GET", "path": "/x"})
            assert_ok(broker, got)
        assert [r.header("authorization") for r in srv.requests] == [f"Bearer {CANARY}"]


def _config(tmp: Path, ref: str) -> Config:
    path = write_config(tmp, {"api": http_target("http://127.0.0.1:9", credential=ref)})
    return load_config(path)
