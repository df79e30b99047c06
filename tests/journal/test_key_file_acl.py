"""The journal's key files (``[journal] key_file``, ``signing_key``) are read under a
credential file's rule (``journal.sealing.read_secret_file`` through
``affidavit.privatefile.read_small_file``): refused when anyone but the broker's user (or
root) may read one -- by its mode bits or, with a POSIX access ACL, whose mask the group bits
then show, by an entry -- with the command that mends it.  The mode bits alone refused a
private file with an ACL (its mask shows as group bits) and said ``chmod 600``, which masks
the entry (``setfacl -x`` removes it) where a ``setfacl`` names who it lets in; a file another
user owns was only named on the log."""

from __future__ import annotations

import os
import shlex
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from affidavit.acl import GROUP_OBJ, MASK, OTHER, USER, USER_OBJ
from affidavit.journal import Journal, JournalError
from affidavit.journal.exposure import CREDENTIAL, TARGET_CREDENTIAL, exposure, serving
from affidavit.journal.sealing import BrokerKey, read_secret_file
from affidavit.privatefile import FileRefused, read_small_file
from tests.external import require_posix_acl, require_root

ME = 4321
"""The broker's user in the tests that are not root's (``os.geteuid`` patched)."""


def _journal(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A journal made and closed: its path, broker key and signing key."""
    db = tmp_path / "j.db"

    async def make() -> None:
        async with Journal.open(db):
            pass

    trio.run(make)
    return db, Path(f"{db}.key"), Path(f"{db}.signing.key")


def _opens(db: Path) -> None:
    async def run() -> None:
        async with Journal.open(db):
            pass

    trio.run(run)


@pytest.mark.parametrize("which", ["broker key file", "signing key file"])
def test_a_key_an_acl_entry_lends_to_another_user_is_refused_with_its_setfacl(
    tmp_path: Path, which: str
) -> None:
    db, key, signing = _journal(tmp_path)
    path = key if which == "broker key file" else signing
    secret = path.read_bytes()
    base = [(USER_OBJ, 6, 0), (GROUP_OBJ, 0, 0), (OTHER, 0, 0)]
    require_posix_acl(path, *base, (USER, 4, 1000), (MASK, 4, 0))
    assert path.stat().st_mode & 0o777 == 0o640  # the mask: no group can read it
    with pytest.raises(JournalError) as refused:
        _opens(db)
    said = str(refused.value)
    assert said == (
        f"{which} {path} is reachable through its access ACL (user:1000 can read); only this "
        f"process's user may read it: setfacl -x u:1000 {path}"
    )
    assert "chmod" not in said and secret.decode(errors="replace").strip() not in said
    # What ``setfacl -x u:1000`` leaves (the mask recomputed from what remains): read again.
    require_posix_acl(path, *base, (MASK, 0, 0))
    assert path.stat().st_mode & 0o777 == 0o600
    _opens(db)


def test_a_private_key_whose_acl_names_only_this_user_and_root_is_read(tmp_path: Path) -> None:
    """Refused before on its mask (``0640``, "chmod 600"): no one else can read it."""
    db, key, _ = _journal(tmp_path)
    require_posix_acl(
        key,
        (USER_OBJ, 6, 0),
        (USER, 4, os.geteuid()),
        (USER, 4, 0),
        (GROUP_OBJ, 0, 0),
        (MASK, 4, 0),
        (OTHER, 0, 0),
    )
    assert key.stat().st_mode & 0o777 == 0o640
    _opens(db)


def test_roots_key_lent_to_the_brokers_user_is_read_and_its_group_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """systemd's ``LoadCredential=`` layout (root's, ``0400``, ``user:<the service>:r``) holds
    a key as it holds a credential; root's file its group reads is refused with the ``chown``
    that keeps the broker reading it (``chmod 600`` alone would lock it out)."""
    require_root()  # the key file root's (a non-root run's own files are not)
    _, key, _ = _journal(tmp_path)
    monkeypatch.setattr(os, "geteuid", lambda: ME)
    key.chmod(0o400)
    base = [(USER_OBJ, 4, 0), (USER, 4, ME), (OTHER, 0, 0)]
    require_posix_acl(key, *base, (GROUP_OBJ, 0, 0), (MASK, 4, 0))
    assert isinstance(BrokerKey.load(key), BrokerKey)
    require_posix_acl(key, *base, (GROUP_OBJ, 4, 0), (MASK, 4, 0))
    with pytest.raises(JournalError) as refused:
        BrokerKey.load(key)
    gid = os.stat(key).st_gid
    assert str(refused.value) == (
        f"broker key file {key} is reachable through its access ACL (the owning group {gid} "
        f"can read); only this process's user may read it: setfacl -m g::--- {key}"
    )


def test_a_key_another_user_owns_is_refused_with_its_chown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its owner reads the key and can replace it: only named on the log before.  The words
    name this process's user, not "the broker's": an auditor's private key is read so too."""
    _, key, _ = _journal(tmp_path)
    if os.geteuid() == 0:
        owner = 65534
        os.chown(key, owner, owner)
    else:
        owner = os.stat(key).st_uid
    broker = owner + 1  # (the broker as another user, not root; the key still 0600)
    monkeypatch.setattr(os, "geteuid", lambda: broker)
    with pytest.raises(JournalError) as refused:
        read_secret_file(key, "broker key file")
    assert str(refused.value) == (
        f"broker key file {key} is owned by uid {owner}, not by this process's user (uid "
        f"{broker}) or root, who can rewrite it; this process's user must own it (or root "
        f"lend it): chown {broker} {key}"
    )


def test_root_is_told_to_run_as_the_owner_of_a_key_not_to_chown_it(tmp_path: Path) -> None:
    """``sudo affidavit journal reclaim`` on the daemon's journal: its key is the daemon's
    user's.  Following "chown 0 <key>" would lock the daemon out (its user cannot read a root
    0600 key, and it refuses one root owns unlent): the words say to run as the owner."""
    require_root()  # to chown the key to another user
    _, key, _ = _journal(tmp_path)
    os.chown(key, 65534, 65534)
    with pytest.raises(JournalError) as refused:
        read_secret_file(key, "broker key file")
    said = str(refused.value)
    assert said == (
        f"broker key file {key} is owned by uid 65534, who can rewrite it, and this process "
        "runs as root; run this as its owner, not as root (sudo -u '#65534' affidavit ...; in a "
        "container: --user 65534): a chown to root would lock its owner out; or, if root is to run "
        f"the broker from now on: chown 0 {key}"
    )
    assert refused.value.public == (
        "broker key file is owned by another user, who can rewrite it; run the broker as its "
        "owner, not as root"
    )


def test_a_root_daemon_is_told_the_chown_of_a_key_alone_as_of_its_journal(
    tmp_path: Path,
) -> None:
    """Root's daemon (``serving``) is the broker root runs from now on: a key file another user
    owns is still refused (its owner can rewrite it), mended by a ``chown 0`` -- as the
    journal's own files are told (``exposure._owned_fix``) -- not "run this as its owner",
    which a daemon that switched owner would follow by locking the other out."""
    require_root()  # to chown the key to another user
    _, key, _ = _journal(tmp_path)
    os.chown(key, 65534, 65534)
    with serving(), pytest.raises(JournalError) as refused:
        read_secret_file(key, "broker key file")
    assert str(refused.value) == (
        f"broker key file {key} is owned by uid 65534, who can rewrite it, and the broker runs "
        f"as root: root must own it: chown 0 {key}"
    )
    assert refused.value.public == (
        "broker key file is owned by another user, who can rewrite it; the broker's user must "
        "own it"
    )
    with serving():  # the start's judgement of the same file (``exposed_files``): one advice
        judged = exposure(key, "broker key file", CREDENTIAL)
    assert judged is not None and judged.fix == f"chown 0 {key}", judged


def test_root_is_told_to_copy_a_targets_credential_another_user_owns_never_to_chown_it(
    tmp_path: Path,
) -> None:
    """A ``file:`` credential is most often another service's secret: ``chown 0`` on it, as a
    key file is told, locks that service out.  Root -- its daemon, or a one-off -- is told to
    take a copy of its own and point the target at it; the start's judgement says the same."""
    require_root()  # to chown the credential to another user
    secret = tmp_path / "token"
    secret.write_text("s3cr3t-canary\n")
    secret.chmod(0o600)
    os.chown(secret, 65534, 65534)
    copy = (
        "give root a copy of its own, a new file in a directory only root writes "
        f"(`install -D -o 0 -m 600 -- {secret} /etc/affidavit/token`, or another such place), "
        "then point the target's credential at file:/etc/affidavit/token; the copy must be "
        "made again whenever its owner rotates the original. A chown of the original would "
        "lock out its owner"
    )
    with serving(), pytest.raises(FileRefused) as refused:
        read_small_file(secret, 1024, private=True, subject="credential file", credential=True)
    assert str(refused.value).endswith(f"runs as root: root must own it: {copy}"), refused.value
    with serving():
        judged = exposure(secret, "credential file", TARGET_CREDENTIAL)
    assert judged is not None and judged.fix == copy, judged
    with pytest.raises(FileRefused) as refused:  # a one-off: as its owner, or root's copy
        read_small_file(secret, 1024, private=True, credential=True)
    assert str(refused.value).endswith(f"if root is to run the broker from now on: {copy}")
    assert "chown 0" not in str(refused.value) and "s3cr3t" not in str(refused.value)


def test_root_copying_another_services_credential_never_mends_the_original(
    tmp_path: Path,
) -> None:
    """The reviewer's case: a ``0640`` credential uid 1234 owns, judged for a root daemon.
    Root is to copy it -- and was told, joined by ``&&`` to that prose, to ``chmod 600`` the
    original, another service's file.  Its bits are its owner's to mend; the copy is private
    whatever they are.  The command stands apart from the words, to paste."""
    require_root()
    secret = tmp_path / "token"
    secret.write_text("s3cr3t-canary\n")
    secret.chmod(0o640)
    os.chown(secret, 1234, 1234)
    with serving():
        judged = exposure(secret, "credential file", TARGET_CREDENTIAL)
    assert judged is not None and "mode 0640" in judged.why, judged
    assert "&&" not in judged.fix and "chmod" not in judged.fix, judged.fix
    assert "setfacl" not in judged.fix and f"chown 0 {secret}" not in judged.fix, judged.fix
    command = judged.fix.split("`")[1]
    assert shlex.split(command) == [
        *("install", "-D", "-o", "0", "-m", "600", "--", str(secret), "/etc/affidavit/token")
    ], judged.fix
    assert judged.fix.endswith("who else may read the original is for its owner to mend")
    root = tmp_path / "root-owned"  # root's own, no copy: the chmod is root's to make
    root.write_text("s3cr3t-canary\n")
    root.chmod(0o640)
    with serving():
        judged = exposure(root, "credential file", TARGET_CREDENTIAL)
    assert judged is not None and judged.fix == f"chmod 600 {root}", judged


def _refusals_of_fifo(
    fifo: Path, *reads: Callable[[Path], object], say: Callable[[JournalError], str] = str
) -> list[str]:
    """Each of ``reads`` of the FIFO ``fifo``'s ``JournalError`` words (``say``: the
    operator's, ``str``), in a thread: one still blocked after 10 s is let go (a writer opened,
    then closed) and the test fails."""
    got: list[str] = []

    def load() -> None:
        for read in reads:
            try:
                read(fifo)
            except JournalError as exc:
                got.append(say(exc))

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # blocked: let it go before failing
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        reader.join(10)
        pytest.fail(f"reading a FIFO at {fifo.name} blocked")
    return got


FIFO_WORDS = "is a FIFO (named pipe), not a regular file"


def test_a_fifo_at_a_key_files_path_is_refused_at_once(tmp_path: Path) -> None:
    """Read as a plain file, a FIFO blocked the open until something wrote to it."""
    fifo = tmp_path / "broker.key"
    os.mkfifo(fifo, 0o600)
    got = _refusals_of_fifo(fifo, BrokerKey.load)
    assert got == [f"cannot read broker key file {fifo}: {FIFO_WORDS}"]


def test_a_fifo_or_a_huge_file_at_a_public_key_files_path_is_refused_at_once(
    tmp_path: Path,
) -> None:
    """The auditor's public key (which ``serve`` reads) and a public signing key were read
    whole with ``read_bytes``: a FIFO blocked the open, a huge file was read into memory."""
    from affidavit.journal.sealing import MAX_KEY_FILE_BYTES, AuditSealer
    from affidavit.journal.signing import load_public_key

    fifo = tmp_path / "auditor.pub"
    os.mkfifo(fifo, 0o644)
    got = _refusals_of_fifo(fifo, AuditSealer.load, load_public_key)
    assert got == [
        f"cannot read auditor public key file {fifo}: {FIFO_WORDS}",
        f"cannot read public key file {fifo}: {FIFO_WORDS}",
    ]
    huge = tmp_path / "huge.pub"
    with huge.open("wb") as f:
        f.truncate(MAX_KEY_FILE_BYTES + 1)  # (sparse: no MiB written)
    with pytest.raises(JournalError, match="is larger than the 1024 KiB limit"):
        load_public_key(huge)
