"""A journal file others can reach, or another user owns, is named on the operator's log -- with
the ``chmod``/``chown`` that mends it -- by every process that opens the journal: the embedded
broker, a reader, a CLI command (``journal/exposure.py``; docs/deployment.md, "Files others can
reach").  Real files, real modes; a private journal says nothing."""

from __future__ import annotations

import errno
import importlib
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.journal import (
    Journal,
    JournalError,
    JournalReader,
    config_exposure,
    directory_exposures,
    exposure,
    journal_exposures,
    told,
)
from affidavit.journal.lock import WriterLock
from tests.external import require_root
from tests.journal.helpers import accepted

exposure_module = importlib.import_module("affidavit.journal.exposure")
"""The module (``affidavit.journal.exposure`` is also the name of its function)."""

NOBODY = 65534


def _make(db: Path) -> None:
    """A journal with one event, closed; its WAL kept (as a killed broker leaves it)."""

    async def run() -> None:
        async with Journal.open(db) as journal:
            await journal.append(accepted(f"inv-{os.urandom(4).hex()}"), barrier=True)

    trio.run(run)
    Path(f"{db}-wal").touch(mode=0o600)


def _open_and_close(db: Path) -> None:
    async def run() -> None:
        async with Journal.open(db):
            pass

    trio.run(run)


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "affidavit.journal"]


@pytest.mark.parametrize("suffix", ["", "-wal"])
def test_a_journal_file_others_can_read_is_named_with_its_chmod(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, suffix: str
) -> None:
    db = tmp_path / "journal.db"
    _make(db)
    loose = Path(f"{db}{suffix}")
    loose.chmod(0o644)  # as an earlier version's umask made it
    caplog.set_level(logging.WARNING, logger="affidavit.journal")
    _open_and_close(db)
    what = "journal" if not suffix else "journal WAL file"
    want = f"{what} {loose} is accessible by group or others (mode 0644): chmod 600 {loose}"
    assert want in _said(caplog)
    assert len([m for m in _said(caplog) if str(loose) in m]) == 1  # once, however many opens


def test_a_reader_names_it_too_and_a_private_journal_says_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "journal.db"
    _make(db)
    caplog.set_level(logging.WARNING, logger="affidavit.journal")
    _open_and_close(db)
    JournalReader.open(db).close()
    assert not [m for m in _said(caplog) if "accessible" in m or "owned" in m]
    db.chmod(0o606)  # others alone
    JournalReader.open(db).close()
    # (SQLite gives a -wal it makes anew the main file's mode: named as well.)
    want = f"journal {db} is accessible by group or others (mode 0606): chmod 600 {db}"
    assert want in _said(caplog)


def _run_as(owner: int, chown: str) -> str:
    """What root is told of a file ``owner`` owns: to run as it -- a chown to root locks the
    daemon out -- or ``chown`` if root is to run the broker from now on."""
    return (
        f"run this as its owner, not as root (sudo -u '#{owner}' affidavit ...; in a container: "
        f"--user {owner}): a chown to root would lock its owner out; or, if root is to run the "
        f"broker from now on: {chown}"
    )


def test_a_journal_another_user_owns_is_named_and_a_key_it_owns_refused_for_root_to_run_as_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The journal another user owns is named on the log (a reader needs no secret kept) --
    root told to run as its owner, not to chown it (the daemon's user could not open it then);
    a key file it owns is refused, as a credential file is (``read_secret_file``): its owner
    reads the key, and can replace it -- it was only named until the key files took the
    credentials' rule."""
    require_root()
    db = tmp_path / "journal.db"
    _make(db)
    key = Path(f"{db}.key")
    os.chown(key, NOBODY, NOBODY)  # still 0600: root reads it, nobody could replace it
    with pytest.raises(JournalError) as refused:
        _open_and_close(db)
    assert str(refused.value) == (  # "chown 0" only for a root-run broker: it locks out the owner
        f"broker key file {key} is owned by uid {NOBODY}, who can rewrite it, and this process "
        f"runs as root; {_run_as(NOBODY, f'chown 0 {key}')}"
    )
    os.chown(key, 0, 0)
    os.chown(db, NOBODY, NOBODY)
    caplog.set_level(logging.WARNING, logger="affidavit.journal")
    JournalReader.open(db).close()
    want = f"journal {db} is owned by uid {NOBODY}, not by this process's uid 0: "
    assert want + _run_as(NOBODY, f"chown 0 {db}") in _said(caplog), _said(caplog)


def test_root_writing_a_journal_another_user_owns_is_refused_before_it_makes_a_file(
    tmp_path: Path,
) -> None:
    """``sudo affidavit journal reclaim`` on the daemon's journal made root's ``.lock`` beside
    it (then refused the key): the daemon, its owner, could no longer open its lock.  Refused
    before anything is made, saying to run as the owner; a caller is told no uid nor path."""
    require_root()
    db = tmp_path / "journal.db"
    _make(db)
    lock = Path(f"{db}.lock")
    lock.unlink()  # (restored from a backup without it, say)
    wal, key, results = Path(f"{db}-wal"), Path(f"{db}.key"), Path(f"{db}.results")
    results.mkdir(mode=0o700)
    (results / "seg-0001").touch(mode=0o600)  # (root's: in a directory of theirs)
    for theirs in (db, wal, key, results):
        os.chown(theirs, NOBODY, NOBODY)
    before = sorted(tmp_path.iterdir())
    with pytest.raises(JournalError) as refused:
        _open_and_close(db)
    # Every file of the journal's another user owns (its directory is root's: not named).
    gives_root = f"chown -h 0 -- {db} {wal} {key} && chown -R 0 -- {results}"
    assert str(refused.value) == (  # both ways forward: as its owner, or root's from now on
        f"journal {db} is owned by uid {NOBODY} and this process runs as root, which would make "
        "the files a writer creates beside it (its lock, result segments, keys, console login "
        f"tokens) root's, which its owner cannot open; {_run_as(NOBODY, gives_root)}"
    )
    assert sorted(tmp_path.iterdir()) == before  # no lock, no -wal: nothing of root's
    public = told(refused.value)
    assert str(NOBODY) not in public and str(tmp_path) not in public, public
    assert public.startswith("the journal or its directory is owned by another user"), public
    fresh = tmp_path / "theirs"
    fresh.mkdir()
    os.chown(fresh, NOBODY, NOBODY)  # no journal yet: root would make it, and its lock
    with pytest.raises(JournalError) as refused:
        _open_and_close(fresh / "journal.db")
    assert str(refused.value).startswith(f"the directory of journal {fresh}/journal.db is owned")
    # A directory of the journal's alone (empty, here) is given whole.
    assert str(refused.value).endswith(_run_as(NOBODY, f"chown -R 0 -- {fresh}")), refused.value
    assert list(fresh.iterdir()) == []
    for theirs in (db, wal, key, results):
        os.chown(theirs, 0, 0)
    _open_and_close(db)  # root's own journal: written as before


def test_a_dangling_link_as_the_journal_is_judged_by_its_targets_directory(tmp_path: Path) -> None:
    """SQLite makes the journal where the link points: that directory's owner is the one root's
    files would lock out, not the link's own directory's (root's here)."""
    require_root()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    link = tmp_path / "journal.db"
    link.symlink_to(theirs / "journal.db")  # dangling: no journal yet
    with pytest.raises(JournalError) as refused:
        _open_and_close(link)
    assert str(refused.value).startswith(f"the directory of journal {link} is owned by uid "), (
        refused.value
    )
    assert str(refused.value).endswith(_run_as(NOBODY, f"chown -R 0 -- {theirs}")), refused.value
    assert list(theirs.iterdir()) == [] and not Path(f"{link}.lock").exists()


def test_root_as_the_journals_daemon_is_left_to_its_starts_check(tmp_path: Path) -> None:
    """A root daemon (an owner of the lock) on a journal another user owns -- a container's
    bind mount, a root_squash'd NFS -- is not refused by its lock: ``serve`` refuses it at start
    unless ``--allow-exposed-files`` (root then owns all it makes from now on)."""
    require_root()
    db = tmp_path / "journal.db"
    _make(db)
    os.chown(db, NOBODY, NOBODY)
    with pytest.raises(JournalError):
        WriterLock.acquire(db).release()  # a one-off writer: refused
    with pytest.raises(JournalError):  # an embedded program naming itself an owner: refused
        WriterLock.acquire(db, owner="not the daemon").release()
    with exposure_module.serving():
        WriterLock.acquire(db, owner="the daemon").release()


def test_root_is_told_the_mode_unconditionally_the_chown_only_for_a_root_run_broker(
    tmp_path: Path,
) -> None:
    """The owner's daemon needs the chmod too: only the chown to root waits on root running
    the broker."""
    require_root()
    db = tmp_path / "journal.db"
    _make(db)
    os.chown(db, NOBODY, NOBODY)
    db.chmod(0o640)
    found = exposure(db, "journal")
    assert found is not None
    assert found.fix == f"chmod 600 {db}; and {_run_as(NOBODY, f'chown 0 {db}')}", found.fix


def test_a_cli_command_names_it_on_stderr_without_a_traceback(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    _make(db)
    db.chmod(0o644)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AFFIDAVIT_")}
    done = subprocess.run(
        [sys.executable, "-m", "affidavit", "actions", "--journal", str(db)],
        capture_output=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert f"journal {db} is accessible by group or others (mode 0644): chmod 600 {db}" in err
    assert "Traceback" not in err


def test_a_linked_journals_wal_is_looked_for_beside_the_file_it_names(tmp_path: Path) -> None:
    """SQLite keeps a linked journal's ``-wal``/``-shm`` beside the file the link names, not
    beside the link: that is where they are looked at (a loose WAL was not named at all).
    (Asked directly: SQLite itself gives an *empty* WAL it opens the journal's mode.)"""
    (tmp_path / "real").mkdir()
    real = tmp_path / "real" / "journal.db"
    _make(real)
    link = tmp_path / "linked.db"
    link.symlink_to(real)
    wal = Path(f"{real}-wal")
    wal.write_bytes(b"\0" * 32)
    wal.chmod(0o644)
    found = journal_exposures(link)
    assert [(e.path, e.what, e.fix) for e in found] == [
        (wal, "journal WAL file", f"chmod 600 {wal}")
    ]
    real.chmod(0o640)
    assert [e.path for e in journal_exposures(link)] == [link, wal]  # the journal as named


SEGMENT = "0" * 32 + ".seg"  # a segment file's name (``segment_tables.is_segment_name``)


def _with_segment(db: Path) -> tuple[Path, Path]:
    """``<db>.results`` and a segment file in it, 0700 and 0600 as ``segments.py`` makes them."""
    results = Path(f"{db}.results")
    results.mkdir(mode=0o700)
    segment = results / SEGMENT
    segment.touch(mode=0o600)
    return results, segment


def test_the_lock_the_results_directory_and_its_segments_are_the_brokers_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Whoever can open the lock can hold it (flock needs no write bit): no daemon starts.
    Whoever can list or enter the results directory sees each long result's size, and when;
    whoever can write it or a segment can swap or delete a result the chain then only proves
    missing.  Each is named with the mode that mends it (a directory's is 700); made by the
    broker they say nothing."""
    db = tmp_path / "journal.db"
    _make(db)
    results, segment = _with_segment(db)
    lock = Path(f"{db}.lock")
    assert lock.stat().st_mode & 0o777 == 0o600  # the writer made it, 0600 whatever the umask
    (results / "notes.txt").touch(mode=0o644)  # no segment's name: the broker never reads it
    assert journal_exposures(db) == []
    lock.chmod(0o604)
    results.chmod(0o751)
    segment.chmod(0o660)
    caplog.set_level(logging.WARNING, logger="affidavit.journal")
    JournalReader.open(db).close()  # a reader says it too: they are the journal's
    said = _said(caplog)
    for want in (
        f"journal lock file {lock} is accessible by group or others (mode 0604): chmod 600 {lock}",
        f"result segment directory {results} is accessible by group or others (mode 0751): "
        f"chmod 700 {results}",
        f"result segment file {segment} is accessible by group or others (mode 0660): "
        f"chmod 600 {segment}",
    ):
        assert want in said, said
    assert not [m for m in said if "notes.txt" in m]


def test_the_consoles_token_directory_is_the_brokers_alone(tmp_path: Path) -> None:
    """``<journal>.console-tokens/`` is held to the token store's own rule (this user's, 0700:
    ``console.auth.TokenStore``), named with the journal's other files -- so a root writer's
    refusal gives it root too (``lock.py``), where it judged the directory holding it shared."""
    db = tmp_path / "journal.db"
    _make(db)
    tokens = Path(f"{db}.console-tokens")
    tokens.mkdir(mode=0o700)
    assert journal_exposures(db) == []
    tokens.chmod(0o755)
    assert [str(e) for e in journal_exposures(db)] == [
        f"console token directory {tokens} is accessible by group or others (mode 0755): "
        f"chmod 700 {tokens}"
    ]


def test_a_segment_and_a_lock_another_user_owns_are_named_root_told_to_run_as_it(
    tmp_path: Path,
) -> None:
    """Even 0600: another user could replace or delete it (root owning one, when the broker is
    not root, is said too -- the broker could not write or compact it: a ``sudo`` left it)."""
    require_root()
    db = tmp_path / "journal.db"
    _make(db)
    results, segment = _with_segment(db)
    lock = Path(f"{db}.lock")
    for path in (results, segment, lock):
        os.chown(path, NOBODY, NOBODY)
    found = {e.path: e for e in journal_exposures(db)}
    assert sorted(found) == sorted([results, segment, lock])
    for path in (results, segment, lock):
        assert found[path].fix == _run_as(NOBODY, f"chown 0 {path}")
        assert found[path].why == f"owned by uid {NOBODY}, not by this process's uid 0"


PG = "postgresql://broker@db.example/affidavit"


@pytest.mark.parametrize(
    ("url", "mode", "why", "fix"),
    [
        (None, 0o664, "writable by group or others (mode 0664)", "chmod 644"),
        (None, 0o602, "writable by group or others (mode 0602)", "chmod 600"),
        (PG, 0o620, "writable by group or others (mode 0620)", "chmod 600"),
        (PG.replace("broker@", "broker:hunter2@"), 0o644, None, "chmod 640"),
        (f"{PG}?password=hunter2", 0o604, None, "chmod 600"),
    ],
)
def test_a_config_others_can_write_or_read_its_password_in_is_named_with_its_chmod(
    tmp_path: Path, url: str | None, mode: int, why: str | None, fix: str
) -> None:
    """Whoever can write the config can point a target's credential at their own host; a
    journal URL's password in it makes others' read one too -- never quoted in the message."""
    config = tmp_path / "affidavit.toml"
    config.touch()
    config.chmod(mode)
    found = config_exposure(config, url)
    assert found is not None
    assert str(found).startswith(f"config file {config} is "), found
    why = why or f"readable by others with the journal URL's password in it (mode {mode:04o})"
    assert why in found.why and found.fix == f"{fix} {config}"
    assert "hunter2" not in str(found)


@pytest.mark.parametrize(
    ("url", "mode"),
    [(None, 0o644), (None, 0o640), (None, 0o444), (PG, 0o644), (f"{PG}?sslmode=require", 0o604)],
)
def test_a_config_others_may_only_read_says_nothing(
    tmp_path: Path, url: str | None, mode: int
) -> None:
    """It holds references (``env:``/``file:``/``vault:``), never a credential: reading it is
    normal -- unless its journal URL holds a password (above); with one, the group may."""
    config = tmp_path / "affidavit.toml"
    config.touch()
    config.chmod(mode)
    assert config_exposure(config, url) is None
    config.chmod(0o640)
    assert config_exposure(config, PG.replace("broker@", "broker:hunter2@")) is None


def test_a_segment_in_a_private_directory_is_looked_at_by_a_start_not_by_each_reader(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """In a directory that is this user's alone no one else reaches a segment: a reader's open
    does not list and stat them all (the daemon's view pool opens readers often); a broker's
    start (``exposed_files``: ``segments=True``) still names one left open or another's."""
    db = tmp_path / "journal.db"
    _make(db)
    _, segment = _with_segment(db)
    segment.chmod(0o644)
    listed: list[str] = []
    real_listdir = os.listdir

    def counting(path: str | os.PathLike[str]) -> list[str]:
        listed.append(str(path))
        return real_listdir(path)

    caplog.set_level(logging.WARNING, logger="affidavit.journal")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "listdir", counting)
        JournalReader.open(db).close()
    assert not [p for p in listed if p.endswith(".results")], listed
    assert not [m for m in _said(caplog) if str(segment) in m]
    found = {e.path: e for e in journal_exposures(db, segments=True)}
    assert found[segment].fix == f"chmod 600 {segment}"


def test_a_password_in_the_config_is_no_traceback_without_psycopg(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without psycopg (the PostgreSQL extra not installed) the config's check still runs --
    the journal's open then says what to install -- and errs on the side of a password."""
    config = tmp_path / "affidavit.toml"
    config.touch()
    config.chmod(0o644)
    for name in [m for m in sys.modules if m.endswith("journal.postgres")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "psycopg", None)  # ``import psycopg``: ImportError
    found = config_exposure(config, PG.replace("broker@", "broker:hunter2@"))
    assert found is not None and "password" in found.why and "hunter2" not in str(found)
    assert config_exposure(config, f"{PG}?password=hunter2") is not None
    assert config_exposure(config, PG) is None


def test_a_password_the_agents_group_can_read_is_named(tmp_path: Path) -> None:
    """``root:affidavit 0640`` is the documented layout; the same mode with the group the
    daemon's socket admits (``allow_gids``, ``operator_gids``) hands every agent the journal's
    password -- write access to the evidence."""
    config = tmp_path / "affidavit.toml"
    config.touch()
    config.chmod(0o640)
    url = PG.replace("broker@", "broker:hunter2@")
    group = config.stat().st_gid
    assert config_exposure(config, url, agent_gids=(group + 1,)) is None
    found = config_exposure(config, url, agent_gids=(group,))
    assert found is not None and f"readable by group {group}" in found.why
    assert "hunter2" not in str(found)
    assert config_exposure(config, None, agent_gids=(group,)) is None  # no password: fine
    config.chmod(0o644)
    both = config_exposure(config, url, agent_gids=(group,))
    assert both is not None and "readable by others" in both.why and "chmod 640" in both.fix


def test_a_directory_others_can_write_on_the_path_to_a_file_is_named_with_its_chmod(
    tmp_path: Path,
) -> None:
    """Whoever can write a directory can rename or replace the files in it, whatever their own
    modes -- and whoever can write one above can rename the directory itself away."""
    above, home = tmp_path / "srv", tmp_path / "srv" / "affidavit"
    home.mkdir(parents=True)
    db, config = home / "journal.db", home / "affidavit.toml"
    files = [(db, "journal"), (config, "config file")]  # (a missing file's directory too)
    assert directory_exposures(files) == []
    home.chmod(0o775)
    above.chmod(0o757)
    said = [str(e) for e in directory_exposures(files)]
    assert said == [
        f"directory {home} (on the path to the journal and the config file) is writable by "
        f"group or others (mode 0775): chmod 755 {home}",
        f"directory {above} (on the path to the journal and the config file) is writable by "
        f"group or others (mode 0757): chmod 755 {above}",
    ]


def test_a_sticky_directory_is_fine_its_files_owners_are_checked_instead(tmp_path: Path) -> None:
    """In a sticky directory (``/tmp``) only a file's owner renames it: the file's own owner
    rule decides (``/tmp`` itself is above every ``tmp_path``)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    assert directory_exposures([(shared / "journal.db", "journal")]) == []
    shared.chmod(0o0777)
    found = directory_exposures([(shared / "journal.db", "journal")])
    assert [(e.path, e.fix) for e in found] == [(shared, f"chmod 755 {shared}")]


def test_a_directory_another_user_owns_is_named_root_told_to_run_as_it(tmp_path: Path) -> None:
    require_root()
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    os.chown(home, NOBODY, NOBODY)  # 0755: no write bit, but its owner may rename anything
    (found,) = directory_exposures([(home / "affidavit.toml", "config file")])
    assert str(found) == (
        f"directory {home} (on the path to the config file) is owned by uid {NOBODY}, not by "
        f"this process's uid 0: {_run_as(NOBODY, f'chown 0 {home}')}"
    )


def test_the_directory_a_linked_file_resolves_into_is_looked_at_too(tmp_path: Path) -> None:
    private, loose = tmp_path / "private", tmp_path / "loose"
    private.mkdir(mode=0o700)
    loose.mkdir()
    loose.chmod(0o777)
    (loose / "broker.key").touch(mode=0o600)
    (private / "broker.key").symlink_to(loose / "broker.key")
    found = directory_exposures([(private / "broker.key", "broker key file")])
    assert [(e.path, e.holding) for e in found] == [(loose, "broker key file")]


def test_a_link_on_the_way_another_user_owns_is_named_in_a_sticky_directory_only(
    tmp_path: Path,
) -> None:
    """In a sticky directory its owner may replace it; its mode means nothing.  In any other
    only the directory's writers may (a link cannot be re-pointed, only replaced), and the
    directory is judged: root's 0755 holding another user's link is fine."""
    require_root()
    (tmp_path / "real").mkdir(mode=0o700)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    link = shared / "state"
    link.symlink_to(tmp_path / "real")
    os.lchown(link, NOBODY, NOBODY)
    assert directory_exposures([(link / "journal.db", "journal")]) == []
    shared.chmod(0o1777)
    (found,) = directory_exposures([(link / "journal.db", "journal")])
    assert str(found) == (
        f"link {link} (on the path to the journal) is owned by uid {NOBODY}, not by this "
        f"process's uid 0: {_run_as(NOBODY, f'chown -h 0 {link}')}"  # (the link, not its target)
    )


def _mounted_read_only(
    monkeypatch: pytest.MonkeyPatch, where: Path, files: dict[str, int], *, whole: bool
) -> Path:
    """A directory 0777 under ``where`` holding ``files`` (name: mode, nobody's), seen as on a
    read-only mount: ``statvfs`` says ``ST_RDONLY`` for it, and the mount table lists its device
    with super block options ``ro`` (``whole``: a file system read-only as a whole, a squashfs
    or a tmpfs remounted ``ro``) or ``rw`` (a read-only *bind* mount of a writable source).  No
    real mount: CI may run without the privilege to make one.  What the kernel reports in both
    cases was checked on a real tmpfs remounted ``ro`` and a real ``mount --bind`` remounted
    ``bind,ro`` (the mount flag ro in both; the super block ro only in the first)."""
    require_root()  # to give the files to another user
    d = where / "d"
    d.mkdir(parents=True)
    d.chmod(0o777)
    for name, mode in files.items():
        (d / name).write_text("[journal]\n")
        (d / name).chmod(mode)
        os.chown(d / name, NOBODY, NOBODY)  # another user's: no matter on a whole ro fs
    st = os.stat(d)
    device = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    table = where / "mountinfo"
    table.write_text(
        "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
        f"90 27 {device} / {where} ro,relatime - tmpfs tmpfs {'ro' if whole else 'rw'},size=1m\n"
    )
    monkeypatch.setattr(exposure_module, "MOUNTINFO", table)
    real = os.statvfs

    class ReadOnly:
        def __init__(self, path: Any) -> None:
            self.f_flag = real(path).f_flag | (os.ST_RDONLY if Path(path).is_relative_to(d) else 0)

    monkeypatch.setattr(os, "statvfs", ReadOnly)
    return d


def test_on_a_read_only_file_system_write_bits_are_no_exposure_read_bits_still_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No one writes a file system mounted read-only as a whole (nor could the ``chmod`` be
    run): a config 0664 or a directory 0777 there is fine; a key others can read is read all
    the same."""
    files = {"affidavit.toml": 0o664, "broker.key": 0o644}
    d = _mounted_read_only(monkeypatch, tmp_path / "ro", files, whole=True)
    config, key = d / "affidavit.toml", d / "broker.key"
    assert config_exposure(config, None) is None
    assert directory_exposures([(config, "config file")]) == []
    found = exposure(key, "broker key file")
    assert found is not None, found
    assert found.fix == f"chmod 600 {key}; and {_run_as(NOBODY, f'chown 0 {key}')}", found
    assert found is not None and f"owned by uid {NOBODY}" in found.why  # its owner reads it
    found = config_exposure(config, "postgresql://u:pw@127.0.0.1/x")
    assert found is not None, found
    assert found.fix == f"chmod 660 {config}; and {_run_as(NOBODY, f'chown 0 {config}')}", found


def test_a_key_file_others_may_write_is_refused_on_a_read_only_file_system_as_its_read_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key file (``CREDENTIAL``) is read under ``private``, which refuses any bit for group
    or others: start-up passed a root's key at 0620 on a file system read-only as a whole,
    and the read then refused it.  They agree now; a config's write bits there still pass."""
    from affidavit.journal import CREDENTIAL
    from affidavit.journal.sealing import read_secret_file

    files = {"broker.key": 0o620, "affidavit.toml": 0o664}
    d = _mounted_read_only(monkeypatch, tmp_path / "ro", files, whole=True)
    key = d / "broker.key"
    os.chown(key, 0, 0)  # (root's: the broker's own)
    found = exposure(key, "broker key file", CREDENTIAL)
    assert found is not None and found.why == "accessible by group or others (mode 0620)", found
    with pytest.raises(JournalError, match=r"accessible by group or others \(mode 0620\)"):
        read_secret_file(key, "broker key file")
    assert config_exposure(d / "affidavit.toml", None) is None


def test_a_read_only_bind_mount_of_files_others_can_write_is_judged_by_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ProtectSystem=strict`` (docs/deployment.md's unit) and ``docker -v src:dst:ro`` make
    read-only *bind* mounts: read-only there, while whoever may write the source changes the
    files under the broker. Only a file system read-only as a whole is exempt (above)."""
    d = _mounted_read_only(monkeypatch, tmp_path / "bind", {"affidavit.toml": 0o666}, whole=False)
    config = d / "affidavit.toml"
    assert os.statvfs(config).f_flag & os.ST_RDONLY  # the mount is read-only...
    found = config_exposure(config, None)
    assert found is not None and "writable by group or others (mode 0666)" in found.why
    assert found is not None and f"owned by uid {NOBODY}" in found.why
    named = [e.path for e in directory_exposures([(config, "config file")])]
    assert d in named, named  # ...its source is not


def test_a_directory_holding_a_link_in_the_middle_of_a_chain_is_walked(tmp_path: Path) -> None:
    """``a/l1 -> b/l2 -> c/f``: whoever can write ``b`` re-points ``l2`` at their own CA or
    config. The path as written and the one it resolves to never pass through ``b``."""
    a, b, c = (tmp_path / n for n in "abc")
    for d in (a, b, c):
        d.mkdir(mode=0o700)
    target = c / "f"
    target.write_text("[journal]\n")
    (b / "l2").symlink_to(target)
    (a / "l1").symlink_to(b / "l2")
    b.chmod(0o777)
    named = [e.path for e in directory_exposures([(a / "l1", "config file")])]
    assert named == [b], named
    b.chmod(0o700)
    assert directory_exposures([(a / "l1", "config file")]) == []


def test_a_walk_whose_open_of_the_root_fails_after_an_absolute_link_closes_each_fd_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Following an absolute link, the walk closed the directory it held and then opened
    ``/``: when that open failed (EMFILE, injected here), its ``finally`` closed the same
    number again -- by then perhaps another thread's descriptor (cfgfix50b's review).  It opens
    ``/`` first now: a failure leaves it holding the one it had, closed once."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "abs").symlink_to(tmp_path / "d")
    opened: list[int] = []
    closed: list[int] = []
    real_open, real_close = os.open, os.close

    def fake_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if path == "/" and opened:  # the second "/": the absolute link's
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        fd = real_open(path, flags, *args, **kwargs)
        opened.append(fd)
        return fd

    def fake_close(fd: int) -> None:
        closed.append(fd)
        real_close(fd)

    monkeypatch.setattr(exposure_module.os, "open", fake_open)
    monkeypatch.setattr(exposure_module.os, "close", fake_close)
    with pytest.raises(OSError) as caught:
        exposure_module.walk(tmp_path / "d" / "abs" / "x", [])
    monkeypatch.undo()
    assert caught.value.errno == errno.EMFILE
    assert sorted(closed) == sorted(opened), (opened, closed)  # each once
