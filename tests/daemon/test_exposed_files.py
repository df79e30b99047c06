"""``affidavit serve`` is the boundary that keeps the journal (its lock and result segments too),
the keys and the vault from every other account: it refuses to start while group or others can
reach one of them, or write its config (FILES_EXPOSED, exit 2, each file named with the
``chmod`` that mends it; never a traceback), and serves with ``--allow-exposed-files``, logging
each (docs/deployment.md, "Files others can reach")."""

from __future__ import annotations

import base64
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from affidavit.acl import GROUP_OBJ, MASK, OTHER, USER, USER_OBJ
from affidavit.api.broker import Broker, exposed_files
from affidavit.config import load_config
from affidavit.journal import Journal, config_exposure
from affidavit.secrets.vault import Vault
from tests.external import require_file, require_posix_acl, require_root

from .kit import NOBODY, PYTHON, as_user, client_env, run, start_daemon, stop, write_daemon_config

LOOSE = (
    "journal.db",
    "journal.db.lock",
    "journal.db.key",
    "journal.db.signing.key",
    "affidavit.vault",
)


def _home(tmp: Path) -> tuple[Path, Path]:
    """A config naming the journal and a vault in ``tmp``, and its socket path."""
    socket = tmp / "affidavit.sock"
    config = write_daemon_config(tmp, {}, socket=socket)
    with config.open("a", encoding="utf-8") as f:
        f.write(f'\n[vault]\npath = "{tmp / "affidavit.vault"}"\n')
    return config, socket


async def _made(tmp: Path) -> None:
    """The journal, its lock and keys and the vault, each 0600 as the broker makes them."""
    async with Journal.open(tmp / "journal.db"):
        pass
    Vault.init(tmp / "affidavit.vault", "a passphrase", n_log2=10)


@pytest.mark.parametrize("name", LOOSE)
async def test_serve_refuses_a_file_others_can_reach_naming_it_and_its_chmod(
    tmp_path: Path, name: str
) -> None:
    config, _ = _home(tmp_path)
    await _made(tmp_path)
    loose = tmp_path / name
    loose.chmod(0o644)
    done = await run(
        [PYTHON, "-m", "affidavit", "serve", "--config", str(config)], env=client_env()
    )
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err.startswith("affidavit: FILES_EXPOSED: "), err
    assert f" {loose} is accessible by group or others (mode 0644): chmod 600 {loose} -- " in err
    assert "--allow-exposed-files" in err and "Traceback" not in err
    assert err.count("chmod 600") == 1 and err.count("\n") == 1, err  # that file alone, one line


async def _served_anyway(config: Path, socket: Path, tmp: Path, token: str) -> str:
    """The log of ``affidavit serve --allow-exposed-files``, started (ready) and stopped."""
    serve = [PYTHON, "-m", "affidavit", "serve", "--config", str(config), "--allow-exposed-files"]
    daemon = await start_daemon(config, socket, tmp / "daemon.log", token, serve)
    try:
        return daemon.log_text()
    finally:
        stop(daemon)


async def test_serve_with_the_override_serves_and_logs_each_file(
    tmp_path: Path, token: str
) -> None:
    config, socket = _home(tmp_path)
    await _made(tmp_path)
    db, vault = tmp_path / "journal.db", tmp_path / "affidavit.vault"
    db.chmod(0o640)
    vault.chmod(0o604)
    log = await _served_anyway(config, socket, tmp_path, token)
    for path, mode in ((db, "0640"), (vault, "0604")):
        want = f"is accessible by group or others (mode {mode}): chmod 600 {path}"
        assert "WARNING" in log and want in log, log
    assert "Traceback" not in log
    assert os.stat(db).st_mode & 0o777 == 0o640  # named, not changed: the operator's to mend


async def test_a_root_daemon_on_a_journal_another_user_owns_is_told_the_chown_and_may_serve(
    tmp_path: Path, token: str
) -> None:
    """A container run as root on a bind mount uid 1000 owns, a root_squash'd NFS: ``serve`` is
    the broker root runs -- told the ``chown 0`` alone, and with ``--allow-exposed-files`` it
    serves (its lock refused a root writer of another user's journal: no way forward)."""
    require_root()
    config, socket = _home(tmp_path)
    await _made(tmp_path)
    db = tmp_path / "journal.db"
    os.chown(db, NOBODY, NOBODY)
    for path in _segments(tmp_path, 5, 0o600):  # their summary: said again on the daemon's log
        os.chown(path, NOBODY, -1)
    err = await _refusal(config)
    assert (
        f"journal {db} is owned by uid {NOBODY}, not by this process's uid 0: chown 0 {db}" in err
    )
    assert "run this as its owner" not in err, err
    log = await _served_anyway(config, socket, tmp_path, token)
    assert f"chown 0 {db}" in log and "Traceback" not in log, log
    assert "-exec chown 0 {} +" in log and "run this as its owner" not in log, log


async def _refusal(config: Path) -> str:
    """``affidavit serve``'s refusal: its one line, after the code."""
    done = await run(
        [PYTHON, "-m", "affidavit", "serve", "--config", str(config)], env=client_env()
    )
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err.startswith("affidavit: FILES_EXPOSED: "), err
    assert "--allow-exposed-files" in err and "Traceback" not in err
    assert err.count("\n") == 1, err
    return err


async def _config_refusal(config: Path) -> str:
    """``affidavit serve``'s refusal of the config itself (CONFIG_EXPOSED, ``api.trusted``:
    no override lifts it), its one line."""
    done = await run(
        [PYTHON, "-m", "affidavit", "serve", "--config", str(config)], env=client_env()
    )
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err.startswith(f"affidavit: CONFIG_EXPOSED: {config}: refused: "), err
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("mode", [0o664, 0o646])
async def test_serve_refuses_a_config_others_can_write(tmp_path: Path, mode: int) -> None:
    """Whoever can write it can point a target's credential at their own host."""
    config, _ = _home(tmp_path)
    await _made(tmp_path)
    config.chmod(mode)
    err = await _config_refusal(config)
    fix = f"chmod {mode & ~0o022:o} {config}"
    assert f"config file {config} is writable by group or others (mode {mode:04o}): {fix}" in err
    assert err.count("chmod") == 1, err


async def test_serve_refuses_a_results_directory_others_can_enter(tmp_path: Path) -> None:
    config, _ = _home(tmp_path)
    await _made(tmp_path)
    results = tmp_path / "journal.db.results"
    results.mkdir(mode=0o700)
    results.chmod(0o755)
    err = await _refusal(config)
    want = f"result segment directory {results} is accessible by group or others (mode 0755)"
    assert f"{want}: chmod 700 {results} -- " in err, err


async def test_serve_refuses_a_config_another_user_owns(tmp_path: Path) -> None:
    require_root()
    config, _ = _home(tmp_path)
    await _made(tmp_path)
    os.chown(config, NOBODY, NOBODY)  # 0644: nobody could rewrite it
    err = await _config_refusal(config)
    want = f"config file {config} is owned by uid {NOBODY}, not by this process's uid 0"
    # serve is the broker root runs: told the chown alone (a config root may own), not to run
    # as its owner -- nor that a chown to root would lock a daemon out.
    assert f"{want}: chown 0 {config}" in err, err
    assert "run this as its owner" not in err and "lock its owner out" not in err, err


_LOOK = (
    "import sys; from pathlib import Path; from affidavit.journal import config_exposure; "
    "print(config_exposure(Path(sys.argv[1]), None))"
)


async def test_a_config_root_owns_is_fine_for_a_daemon_of_another_user(
    shared_socket_dir: Path,
) -> None:
    """The usual layout (``root:affidavit 0640``, or 0644): root owns the config, the daemon's
    user reads it.  Root owning it is fine; another user, or a write bit for others, is not."""
    config = shared_socket_dir / "affidavit.toml"
    config.touch(mode=0o644)
    assert config_exposure(config, None) is None  # (and to root itself)

    async def looked() -> str:
        done = await run(as_user(NOBODY, "-c", _LOOK, str(config)), env=client_env())
        assert done.returncode == 0, done.stderr.decode()
        return done.stdout.decode().strip()

    assert await looked() == "None"
    dirs = "from affidavit.journal import directory_exposures as d; "
    looks = f"{dirs}import sys; from pathlib import Path; print(d([(Path(sys.argv[1]), 'c')]))"
    done = await run(as_user(NOBODY, "-c", looks, str(config)), env=client_env())
    assert done.stdout.decode().strip() == "[]", done  # root's directories, up to /: normal
    config.chmod(0o664)
    want = f"config file {config} is writable by group or others (mode 0664): chmod 644 {config}"
    assert await looked() == want
    config.chmod(0o644)
    os.chown(config, 1000, 1000)  # a login user's
    want = (
        f"config file {config} is owned by uid 1000, not by this process's uid {NOBODY} or "
        f"root: chown {NOBODY} {config}"
    )
    assert await looked() == want


async def test_an_embedded_broker_only_warns_once_of_a_vault_others_can_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It runs as its caller, whose files they are: it opens, and says so once.  (Not the
    config: another user able to change it is refused, CONFIG_EXPOSED, tests/broker/
    test_config_exposed.py.)"""
    config, _ = _home(tmp_path)
    await _made(tmp_path)
    vault = tmp_path / "affidavit.vault"
    vault.chmod(0o644)
    caplog.set_level(logging.WARNING, logger="affidavit.journal")
    for _ in range(2):
        async with Broker.open(config):
            pass
    want = f"vault file {vault} is accessible by group or others (mode 0644): chmod 600 {vault}"
    said = [r.getMessage() for r in caplog.records if r.name == "affidavit.journal"]
    assert said.count(want) == 1, said


async def test_serve_refuses_a_config_others_can_read_the_journal_password_in(
    tmp_path: Path,
) -> None:
    """A PostgreSQL journal's password in ``[journal] url``: the one secret a config can hold.
    Refused before the journal is reached, naming the file, never the password."""
    journal = {
        "url": "postgresql://broker:hunter2@127.0.0.1:9/affidavit",
        "key_file": str(tmp_path / "journal.key"),
        "signing_key": str(tmp_path / "journal.signing.key"),
    }
    config = write_daemon_config(tmp_path, {}, socket=tmp_path / "s.sock", journal=journal)
    config.chmod(0o644)
    err = await _refusal(config)
    want = "readable by others with the journal URL's password in it (mode 0644)"
    assert f"config file {config} is " in err and f"{want}: chmod 640 {config} -- " in err, err
    assert "hunter2" not in err


def _segments(tmp: Path, count: int, mode: int) -> list[Path]:
    """``count`` files named as segment files (``segment_tables.is_segment_name``) in the
    journal's results directory (0700, as the broker makes it), each ``mode``."""
    results = tmp / "journal.db.results"
    results.mkdir(mode=0o700, exist_ok=True)
    made = [results / f"{n:032x}.seg" for n in range(count)]
    for path in made:
        path.write_bytes(b"sealed")
        path.chmod(mode)
    return made


async def test_many_exposed_segment_files_are_one_entry_with_one_command_for_them_all(
    tmp_path: Path,
) -> None:
    """A ``chmod -R`` on a big results directory: one entry -- the directory, how many, a few
    by name, one command that mends them all -- where the refusal listed each file (a line of
    thousands of entries); the other files keep their own entry."""
    config, _ = _home(tmp_path)
    await _made(tmp_path)
    segments = _segments(tmp_path, 300, 0o644)
    db = tmp_path / "journal.db"
    db.chmod(0o640)
    err = await _refusal(config)
    results = tmp_path / "journal.db.results"
    assert f"300 result segment files in {results} are accessible by group or others" in err, err
    assert f"(e.g. {segments[0].name}, {segments[1].name}, {segments[2].name})" in err, err
    assert err.count(".seg") == 4 and len(err) < 1500, err  # 3 examples and the command's
    assert f"journal {db} is accessible by group or others (mode 0640): chmod 600 {db}" in err
    fix = err.split(" are accessible by group or others ")[1].split(": ", 1)[1].split("; ")[0]
    done = await run(["sh", "-c", fix.split(" -- mend them")[0]], env=client_env())
    assert done.returncode == 0, done
    assert {p.stat().st_mode & 0o777 for p in segments} == {0o600}
    db.chmod(0o600)
    assert exposed_files(load_config(config)) == []


async def test_the_one_command_mends_a_results_directory_that_is_a_link(tmp_path: Path) -> None:
    """The broker follows a results directory that is a link (only segment files are opened
    ``O_NOFOLLOW``); so does the command it prints -- ``find DIR`` would not descend into it,
    change nothing and exit 0, and serve would refuse again."""
    config, _ = _home(tmp_path)
    await _made(tmp_path)
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    (tmp_path / "journal.db.results").symlink_to(real)
    segments = _segments(tmp_path, 5, 0o644)
    err = await _refusal(config)
    assert "5 result segment files in " in err, err
    fix = err.split(" are accessible by group or others ")[1].split(": ", 1)[1].split(" -- mend")[0]
    done = await run(["sh", "-c", fix.split("; ")[0]], env=client_env())
    assert done.returncode == 0, done
    assert {p.stat().st_mode & 0o777 for p in segments} == {0o600}
    assert exposed_files(load_config(config)) == []


async def test_a_few_exposed_segment_files_keep_their_own_entries(tmp_path: Path) -> None:
    config, _ = _home(tmp_path)
    await _made(tmp_path)
    segments = _segments(tmp_path, 3, 0o604)
    err = await _refusal(config)
    for path in segments:
        want = f"result segment file {path} is accessible by group or others (mode 0604)"
        assert f"{want}: chmod 600 {path}" in err, err
    assert "result segment files in" not in err, err


async def test_segment_files_another_user_owns_are_summed_up_with_their_chown(
    tmp_path: Path,
) -> None:
    require_root()  # to give them to another user
    config, _ = _home(tmp_path)
    await _made(tmp_path)
    segments = _segments(tmp_path, 10, 0o600)
    for path in segments[:4]:
        os.chown(path, NOBODY, -1)
    segments[5].chmod(0o660)
    err = await _refusal(config)
    results = tmp_path / "journal.db.results"
    uid = os.geteuid()
    assert (
        f"5 result segment files in {results} are owned by another uid than this process's uid "
        f"{uid} or accessible by group or others (bits 060 among them)"
    ) in err, err
    # serve, the broker root runs, is told the chown to root with the chmod: no run-as advice.
    fix = err.split(f" (e.g. {segments[0].name}, ")[1].split(": ", 1)[1].split(" -- mend")[0]
    assert f"-exec chown {uid} {{}} +" in fix and "-exec chmod go= {} +" in fix, fix
    done = await run(["sh", "-c", fix], env=client_env())
    assert done.returncode == 0, done
    assert {(p.stat().st_uid, p.stat().st_mode & 0o777) for p in segments} == {(uid, 0o600)}
    assert exposed_files(load_config(config)) == []


async def test_serve_refuses_a_journal_directory_its_group_can_write(tmp_path: Path) -> None:
    """Whoever can write the directory can swap the journal or its keys in it, whatever their
    own modes: refused, naming the directory and its ``chmod``.  (The config is kept out of
    it: a config in such a directory is CONFIG_EXPOSED, before this.)"""
    home = tmp_path / "home"
    home.mkdir()
    config, _ = _home(home)
    config = config.rename(tmp_path / config.name)
    await _made(home)
    home.chmod(0o770)
    err = await _refusal(config)
    held = "the journal, the broker key file, the signing key file and the vault file"
    want = f"directory {home} (on the path to {held}) is writable by group or others (mode 0770)"
    assert f"{want}: chmod 750 {home} -- " in err, err
    assert err.count("chmod") == 1, err  # the files themselves are private


async def test_serve_refuses_a_vault_lock_file_others_can_open(tmp_path: Path) -> None:
    """Whoever can open it can hold its flock and stall every vault write."""
    config, _ = _home(tmp_path)
    await _made(tmp_path)
    lock = tmp_path / "affidavit.vault.lock"
    lock.touch(mode=0o600)
    lock.chmod(0o604)
    err = await _refusal(config)
    want = f"vault lock file {lock} is accessible by group or others (mode 0604)"
    assert f"{want}: chmod 600 {lock} -- " in err, err


async def test_serve_refuses_a_credential_file_others_can_read_never_saying_its_content(
    tmp_path: Path,
) -> None:
    """A ``file:`` credential others can read has leaked already: refused at start, not only
    at the first call that would use it (CREDENTIAL_INVALID then)."""
    secret = tmp_path / "token"
    secret.write_text("s3cr3t-canary-value\n")
    secret.chmod(0o640)
    target = {"kind": "http", "url": "http://127.0.0.1:9", "methods": ["GET"]}
    target |= {"credential": f"file:{secret}", "inject": "bearer"}
    config = write_daemon_config(tmp_path, {"api": target}, socket=tmp_path / "s.sock")
    await _made(tmp_path)
    err = await _refusal(config)
    want = f"credential file {secret} is accessible by group or others (mode 0640)"
    assert f"{want}: chmod 600 {secret} -- " in err, err
    assert "s3cr3t" not in err
    require_root()
    secret.chmod(0o600)
    os.chown(secret, NOBODY, NOBODY)  # its owner could swap it (and reads it)
    err = await _refusal(config)
    assert f"credential file {secret} is owned by uid {NOBODY}" in err, err
    # Most often another service's secret: root copies it, a chown would lock that one out.
    assert f"(`install -D -o 0 -m 600 -- {secret} /etc/affidavit/token`" in err, err
    assert f"chown 0 {secret}" not in err and "s3cr3t" not in err, err


async def test_serve_starts_with_the_credential_systemd_lends_it_and_names_one_lent_to_others(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``LoadCredential=``'s file -- root's, ``0400`` plus ``user:<the daemon>:r``, shown
    ``0440`` -- is private: judged by its ACL, not its group bits (which are the mask); an
    entry for another user is named as such, with the ``setfacl`` that removes it."""
    creds = tmp_path / "credentials"
    creds.mkdir(mode=0o500)
    secret = creds / "token"
    secret.write_text("s3cr3t-canary-value\n")
    os.chown(secret, 0, 0)
    secret.chmod(0o400)
    lent = ((USER_OBJ, 4, 0), (GROUP_OBJ, 0, 0), (MASK, 4, 0), (OTHER, 0, 0))
    require_posix_acl(secret, (USER, 4, os.geteuid()), *lent)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    target = {"kind": "http", "url": "http://127.0.0.1:9", "methods": ["GET"]}
    target |= {"credential": "systemd:token", "inject": "bearer"}
    socket = tmp_path / "s.sock"
    config = write_daemon_config(tmp_path, {"api": target}, socket=socket)
    await _made(tmp_path)
    daemon = await start_daemon(config, socket, tmp_path / "daemon.log", token)
    try:
        log = daemon.log_text()
    finally:
        stop(daemon)
    assert "WARNING" not in log and "s3cr3t" not in log, log
    require_posix_acl(secret, (USER, 4, 1000), *lent)
    err = await _refusal(config)
    said = "is reachable through its access ACL (user:1000 can read)"
    assert f"systemd credential file {secret} {said}: setfacl -x u:1000 {secret} -- " in err, err
    assert "group or others" not in err and "s3cr3t" not in err, err


async def test_a_key_file_root_lends_the_daemons_user_is_held_as_a_credential(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key files are read under a credential's rule (``journal.sealing.read_secret_file``):
    the start judges them by it too -- root's key lent to the daemon's user by an ACL entry is
    not another owner's; one lent to another user is named with its ``setfacl``."""
    require_root()
    config, _ = _home(tmp_path)
    await _made(tmp_path)
    key = tmp_path / "journal.db.key"
    key.chmod(0o400)  # root's, as the test runs
    me = 4321
    lent = ((USER_OBJ, 4, 0), (GROUP_OBJ, 0, 0), (MASK, 4, 0), (OTHER, 0, 0))
    require_posix_acl(key, (USER, 4, me), *lent)
    monkeypatch.setattr(os, "geteuid", lambda: me)

    def said() -> list[str]:
        return [str(e) for e in exposed_files(load_config(config)) if e.path == key]

    assert said() == []
    require_posix_acl(key, (USER, 4, 1000), *lent)
    want = "reachable through its access ACL (user:1000 can read)"
    assert said() == [
        f"broker key file {key} is owned by uid 0, not by this process's uid {me} "
        f"(or root's, lent by an access ACL entry user:{me}:r) and {want}: "
        f"chown {me} {key} && setfacl -x u:1000 {key}"
    ]


async def test_a_vault_unlock_file_root_lends_the_daemons_user_is_judged_as_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vault reads its unlock file as a credential (``read_small_file``, ``private``):
    root's, lent the daemon's user by an ACL entry, it is read -- and the start, which judged
    it as the broker's own file (``PRIVATE``), refused it for root owning it.  Judged now as
    it is read (``CREDENTIAL``)."""
    from affidavit.privatefile import read_small_file

    require_root()
    config, _ = _home(tmp_path)
    await _made(tmp_path)
    vault = Vault(tmp_path / "affidavit.vault")
    vault.unlock("a passphrase")
    unlock = vault.unlock_path
    unlock.chmod(0o400)  # root's, as the test runs
    me = 4321
    lent = ((USER_OBJ, 4, 0), (GROUP_OBJ, 0, 0), (MASK, 4, 0), (OTHER, 0, 0))
    require_posix_acl(unlock, (USER, 4, me), *lent)
    monkeypatch.setattr(os, "geteuid", lambda: me)
    assert read_small_file(unlock, 1 << 16, private=True)[0]  # read...
    assert [e for e in exposed_files(load_config(config)) if e.path == unlock] == []  # ...passed
    require_posix_acl(unlock, (USER, 4, 1000), *lent)  # lent to someone else: named
    [found] = [e for e in exposed_files(load_config(config)) if e.path == unlock]
    assert "reachable through its access ACL (user:1000 can read)" in found.why, found


async def test_serve_says_at_start_which_systemd_credential_it_cannot_find(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``$CREDENTIALS_DIRECTORY`` (a unit without ``LoadCredential=``), or no file of that
    name in it: the start names the reference and the line to add, before a call fails on it;
    it still starts (an ``env:`` variable unset does not stop it either)."""
    target = {"kind": "http", "url": "http://127.0.0.1:9", "methods": ["GET"]}
    targets = {
        "a": target | {"credential": "systemd:billing_token", "inject": "bearer"},
        "b": target | {"credential": "systemd:other", "inject": "bearer"},
    }
    socket = tmp_path / "s.sock"
    config = write_daemon_config(tmp_path, targets, socket=socket)
    await _made(tmp_path)
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    daemon = await start_daemon(config, socket, tmp_path / "daemon.log", token)
    try:
        log = daemon.log_text()
    finally:
        stop(daemon)
    want = "WARNING systemd:billing_token: $CREDENTIALS_DIRECTORY is not set"
    assert want in log and "add LoadCredential=billing_token:/path/to/the/file" in log, log
    assert "WARNING systemd:other: $CREDENTIALS_DIRECTORY is not set" in log, log
    creds = tmp_path / "credentials"
    creds.mkdir(mode=0o500)
    (creds / "other").write_bytes(b"x")
    (creds / "other").chmod(0o400)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    daemon = await start_daemon(config, socket, tmp_path / "daemon2.log", token)
    try:
        log = daemon.log_text()
    finally:
        stop(daemon)
    want = f"WARNING systemd:billing_token: no file {creds / 'billing_token'} in the unit's"
    assert want in log and "systemd:other" not in log, log


# --- the files that decide whom the broker trusts -----------------------------------------------


def _trusting(tmp: Path, *, ca: Path, known_hosts: Path) -> Path:
    """A daemon config whose HTTPS target trusts ``ca`` and whose SSH target pins the host keys
    in ``known_hosts`` (one line for 127.0.0.1 written there when it is not there yet)."""
    if not known_hosts.exists():
        key = base64.b64encode(b"\0\0\0\x0bssh-ed25519\0\0\0\x20" + b"\x01" * 32).decode()
        known_hosts.write_text(f"127.0.0.1 ssh-ed25519 {key}\n", encoding="utf-8")
        known_hosts.chmod(0o644)
    web = {"kind": "http", "url": "https://127.0.0.1:9", "methods": ["GET"]}
    web |= {"credential": "env:T", "ca_file": str(ca)}
    box = {"kind": "ssh", "host": "127.0.0.1", "user": "bob", "credential": "env:T"}
    box |= {"known_hosts": str(known_hosts)}
    return write_daemon_config(
        tmp,
        {"web": web, "box": box},
        socket=tmp / "s.sock",
        journal={"path": str(tmp / "journal.db")},
    )


async def test_serve_refuses_a_ca_file_and_known_hosts_their_group_can_write(
    tmp_path: Path,
) -> None:
    """Whoever can write the CA bundle adds their own CA and reads the credential off the TLS
    connection; whoever can write ``known_hosts`` pins their own host key and receives it."""
    ca, known_hosts = tmp_path / "ca.pem", tmp_path / "known_hosts"
    ca.write_text("-----BEGIN CERTIFICATE-----\n", encoding="utf-8")
    config = _trusting(tmp_path, ca=ca, known_hosts=known_hosts)
    await _made(tmp_path)
    ca.chmod(0o664)
    known_hosts.chmod(0o664)
    err = await _refusal(config)
    named = (("CA file of target web", ca), ("known_hosts file of target box", known_hosts))
    for what, path in named:
        want = f"{what} {path} is writable by group or others (mode 0664): chmod 644 {path}"
        assert want in err, err
    assert err.count("chmod") == 2 and "BEGIN" not in err and "AAAA" not in err, err


async def test_serve_refuses_an_auditor_public_key_others_can_write(tmp_path: Path) -> None:
    """Swapped, every audit copy of a payload and a result is sealed to the swapper's key."""
    config, _ = _home(tmp_path)
    await _made(tmp_path)
    private, public = tmp_path / "auditor.key", tmp_path / "auditor.pub"
    done = await run(
        [PYTHON, "-m", "affidavit", "journal", "audit-keygen", str(private), str(public)],
        env=client_env(),
    )
    assert done.returncode == 0, done.stderr.decode()
    text = config.read_text(encoding="utf-8")
    config.write_text(
        text.replace("[journal]\n", f'[journal]\nauditor_public_key = "{public}"\n', 1),
        encoding="utf-8",
    )
    assert load_config(config).journal.auditor_public_key == public
    public.chmod(0o646)
    err = await _refusal(config)
    want = f"auditor public key file {public} is writable by group or others (mode 0646)"
    assert f"{want}: chmod 644 {public} -- " in err, err


async def test_trust_anchors_others_may_read_say_nothing_but_their_directory_is_looked_at(
    tmp_path: Path,
) -> None:
    """Public material: a 0644 CA file and known_hosts of this user's are fine; a directory
    others can write on the path to one is named as for any file of the broker's."""
    anchors = tmp_path / "anchors"
    anchors.mkdir()
    ca, known_hosts = anchors / "ca.pem", anchors / "known_hosts"
    ca.write_text("-----BEGIN CERTIFICATE-----\n", encoding="utf-8")
    ca.chmod(0o644)
    config = _trusting(tmp_path, ca=ca, known_hosts=known_hosts)
    await _made(tmp_path)
    assert exposed_files(load_config(config)) == []
    anchors.chmod(0o775)
    said = [str(e) for e in exposed_files(load_config(config))]
    held = "the known_hosts file of target box and the CA file of target web"
    assert said == [
        f"directory {anchors} (on the path to {held}) is writable by group or others "
        f"(mode 0775): chmod 755 {anchors}"
    ]


async def _vault_by_link(tmp: Path) -> tuple[Path, Path, Path]:
    """A config naming the vault by a link in ``tmp/etc`` to the vault in ``tmp/real`` (both
    0700, the journal and keys in ``tmp``): the config, the link's directory, the file's."""
    here, real = tmp / "etc", tmp / "real"
    here.mkdir(mode=0o700)
    real.mkdir(mode=0o700)
    socket = tmp / "affidavit.sock"
    config = write_daemon_config(tmp, {}, socket=socket)
    with config.open("a", encoding="utf-8") as f:
        f.write(f'\n[vault]\npath = "{here / "affidavit.vault"}"\n')
    async with Journal.open(tmp / "journal.db"):
        pass
    Vault.init(real / "affidavit.vault", "a passphrase", n_log2=10)
    (here / "affidavit.vault").symlink_to(real / "affidavit.vault")
    return config, here, real


@pytest.mark.parametrize("loose", ["link", "file"])
async def test_a_vault_named_by_a_link_has_the_directories_of_both_looked_at(
    tmp_path: Path, loose: str
) -> None:
    """Whoever writes the link's directory can point it at a vault of theirs, whoever writes
    the file's can swap the file: each directory is named, the other (0700) is not."""
    config, here, real = await _vault_by_link(tmp_path)
    assert exposed_files(load_config(config)) == []
    writable = here if loose == "link" else real
    mode, fix = (0o770, "750") if loose == "link" else (0o777, "755")
    writable.chmod(mode)
    said = [str(e) for e in exposed_files(load_config(config))]
    assert said == [
        f"directory {writable} (on the path to the vault file) is writable by group or others "
        f"(mode {mode:04o}): chmod {fix} {writable}"
    ]


_ANCHORS = (
    "import sys; from affidavit.api.broker import exposed_files; "
    "from affidavit.config import load_config; "
    "print([str(e) for e in exposed_files(load_config(sys.argv[1]))])"
)


async def test_the_system_ca_bundle_and_the_daemon_users_known_hosts_are_fine(
    shared_socket_dir: Path,
) -> None:
    """The README's layout, as the daemon's user: root owns the system CA bundle, the daemon's
    user its 0644 ``known_hosts`` -- nothing named; another user's ``known_hosts`` is."""
    require_root()
    system = require_file("/etc/ssl/certs/ca-certificates.crt", "ca-certificates")
    known_hosts = shared_socket_dir / "known_hosts"
    config = _trusting(shared_socket_dir, ca=system, known_hosts=known_hosts)
    os.chown(known_hosts, NOBODY, NOBODY)

    async def looked() -> str:
        done = await run(as_user(NOBODY, "-c", _ANCHORS, str(config)), env=client_env())
        assert done.returncode == 0, done.stderr.decode()
        return done.stdout.decode().strip()

    assert await looked() == "[]"
    os.chown(known_hosts, 1000, 1000)  # a login user's: they could pin their own host key
    want = (
        f"known_hosts file of target box {known_hosts} is owned by uid 1000, not by this "
        f"process's uid {NOBODY} or root: chown {NOBODY} {known_hosts}"
    )
    assert await looked() == f"[{want!r}]"


async def test_an_embedded_broker_warns_of_a_known_hosts_others_can_write_and_opens(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``affidavit mcp`` run embedded, or any ``Broker.open``: a warning, not a refusal."""
    ca, known_hosts = tmp_path / "ca.pem", tmp_path / "known_hosts"
    ca.write_text("-----BEGIN CERTIFICATE-----\n", encoding="utf-8")
    config = _trusting(tmp_path, ca=ca, known_hosts=known_hosts)
    await _made(tmp_path)
    known_hosts.chmod(0o646)
    caplog.set_level(logging.WARNING, logger="affidavit.journal")
    async with Broker.open(config):
        pass
    want = (
        f"known_hosts file of target box {known_hosts} is writable by group or others "
        f"(mode 0646): chmod 644 {known_hosts}"
    )
    said = [r.getMessage() for r in caplog.records if r.name == "affidavit.journal"]
    assert said == [want], said


class _Started(Exception):
    """Raised where the daemon has opened its broker: the start is over."""


def test_a_start_looks_for_exposed_files_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``affidavit serve --allow-exposed-files`` logs what it found before it would have
    refused: ``Broker.open`` is handed that list.  It looked again, listing and stat'ing every
    result segment file twice at each start."""
    import trio

    import affidavit.api.broker as broker_module
    import affidavit.daemon.server as server_module
    import affidavit.engine
    import affidavit.heap
    from affidavit.cli import build_parser
    from affidavit.cli.serve import _serve

    config, socket = _home(tmp_path)
    trio.run(_made, tmp_path)
    segments = _segments(tmp_path, 5, 0o644)
    looks: list[int] = []
    real = broker_module.exposed_files

    def counted(cfg: Any) -> list[Any]:
        found = real(cfg)
        looks.append(len(found))
        return found

    def started(broker: Any) -> None:
        raise _Started

    monkeypatch.setattr(broker_module, "exposed_files", counted)
    monkeypatch.setattr(server_module, "_refuse_unusable_segments", started)
    # The process-wide settings a real start makes, kept out of the test's process.
    monkeypatch.setattr(server_module, "_raise_open_files", lambda: None)
    monkeypatch.setattr(affidavit.engine, "tune_collector", lambda: None)
    monkeypatch.setattr(affidavit.heap, "keep_freed_buffers", lambda: [])
    caplog.set_level(logging.WARNING, logger="affidavit.journal")
    argv = ["serve", "--config", str(config), "--socket", str(socket), "--allow-exposed-files"]
    umask = os.umask(0o077)
    try:
        with pytest.raises(BaseException) as stopped:
            _serve(build_parser().parse_args(argv))
    finally:
        os.umask(umask)
    assert stopped.type is _Started, stopped
    assert looks == [5]  # once, at the start: the five segment files (and nothing else)
    said = [r.getMessage() for r in caplog.records if r.name == "affidavit.journal"]
    assert [line for line in said if ".seg" in line] == [
        f"5 result segment files in {segments[0].parent} are accessible by group or others "
        f"(bits 044 among them) (e.g. {segments[0].name}, {segments[1].name}, "
        f"{segments[2].name}): find {segments[0].parent}/ -maxdepth 1 -type f -name '*.seg' "
        "-perm /077 -exec chmod go= {} +"
    ], said  # logged, the refusal's one entry for them all


async def test_many_exposed_segment_files_are_one_warning_line_for_every_reader(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker that opens (embedded, or ``serve --allow-exposed-files``) and every reader of
    the journal (here: its results directory is exposed, so they list its files) log the
    refusal's entries: 400 exposed segment files are one line naming how many and the one
    ``find`` that mends them -- it was 400 lines, at every start."""
    from affidavit.journal import JournalReader

    config, _ = _home(tmp_path)
    await _made(tmp_path)
    segments = _segments(tmp_path, 400, 0o640)
    results = tmp_path / "journal.db.results"
    results.chmod(0o750)
    caplog.set_level(logging.WARNING, logger="affidavit.journal")
    with JournalReader.open(tmp_path / "journal.db"):
        pass
    async with Broker.open(config):
        pass
    said = [r.getMessage() for r in caplog.records if r.name == "affidavit.journal"]
    seg_lines = [line for line in said if "result segment file" in line]
    assert len(seg_lines) == 1, said  # once: the reader's; the broker's is the same words
    assert seg_lines[0].startswith(f"400 result segment files in {results} are "), seg_lines
    assert "-exec chmod go= {} +" in seg_lines[0], seg_lines
    assert not any(segments[399].name in line for line in said), said
    want = f"result segment directory {results} is accessible by group or others (mode 0750)"
    assert sum(line.startswith(want) for line in said) == 1, said
    assert len(said) < 10, said
    # Another reason found later in this process (other users' read bit now): said again.
    caplog.clear()
    for path in segments[:5]:
        path.chmod(0o644)
    with JournalReader.open(tmp_path / "journal.db"):
        pass
    again = [r.getMessage() for r in caplog.records if "result segment file" in r.getMessage()]
    assert len(again) == 1 and "(bits 044 among them)" in again[0], again
