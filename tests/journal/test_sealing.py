"""Sealing: broker key files, wrong keys, and the write-only auditor copy (issue 3: sealing)."""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.journal import (
    Journal,
    JournalError,
    JournalReader,
    SigningKey,
    generate_auditor_keypair,
    open_audit_payload,
    random_bytes,
)
from affidavit.journal.sealing import BrokerKey
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E

from .helpers import CANARY, accepted, happy


async def test_key_file_is_created_0600_beside_the_journal(tmp_path: Path) -> None:
    async with Journal.open(tmp_path / "j.db"):
        pass
    mode = stat.S_IMODE(os.stat(tmp_path / "j.db.key").st_mode)
    assert mode == 0o600


async def test_payload_round_trips_with_the_broker_key(tmp_path: Path) -> None:
    async with Journal.open(tmp_path / "j.db", key_file=tmp_path / "k") as j:
        ev = await j.append(accepted("inv-1"), payload={"body": CANARY})
        assert j.payload(ev.seq) == {"body": CANARY}
        assert j.audit_copy(ev.seq) is None  # no auditor configured


async def test_a_wrong_key_file_is_a_clear_error_naming_it(tmp_path: Path) -> None:
    async with Journal.open(tmp_path / "j.db") as j:
        await j.append(accepted("inv-1"), payload={"x": 1})
    other = tmp_path / "other.key"
    async with Journal.open(tmp_path / "o.db", key_file=other):
        pass
    with pytest.raises(JournalError, match=r"other\.key.*does not match"):
        async with Journal.open(tmp_path / "j.db", key_file=other):
            pass
    reader = JournalReader.open(tmp_path / "j.db", key_file=other)
    with reader as r, pytest.raises(JournalError, match=r"other\.key"):
        r.payload(1)


async def test_missing_or_loose_or_garbled_key_files_are_refused(tmp_path: Path) -> None:
    async with Journal.open(tmp_path / "j.db"):
        pass
    key = tmp_path / "j.db.key"
    key.chmod(0o644)
    # The fix in the message, as for a file: credential (the operator's next command).
    with pytest.raises(JournalError, match=f"must be 0600: chmod 600 {re.escape(str(key))}$"):
        async with Journal.open(tmp_path / "j.db"):
            pass
    key.unlink()
    # An existing journal never silently gets a fresh key.
    with pytest.raises(JournalError, match="does not exist"):
        async with Journal.open(tmp_path / "j.db"):
            pass
    assert not key.exists()
    fd = os.open(key, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"not a key")
    os.close(fd)
    with pytest.raises(JournalError, match="not an affidavit journal key"):
        async with Journal.open(tmp_path / "j.db"):
            pass


async def test_a_sealed_payload_moved_to_another_row_does_not_open(tmp_path: Path) -> None:
    import sqlite3

    async with Journal.open(tmp_path / "j.db") as j:
        for ev in happy("inv-1")[:2]:
            await j.append(ev, payload={"n": ev.kind.value})
    conn = sqlite3.connect(tmp_path / "j.db", isolation_level=None)
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute(
        "UPDATE events SET payload = (SELECT payload FROM events WHERE seq = 1) WHERE seq = 2"
    )
    conn.close()
    with JournalReader.open(tmp_path / "j.db") as r:
        assert r.payload(1) == {"n": "ACTION_ACCEPTED"}
        with pytest.raises(JournalError, match="does not open"):
            r.payload(2)


async def test_write_only_audit_copy_opens_only_with_the_auditor_private_key(
    tmp_path: Path,
) -> None:
    # The auditor's key pair is made elsewhere; the broker is given only the public half.
    auditor_dir = tmp_path / "auditor"
    auditor_dir.mkdir()
    priv, pub = auditor_dir / "auditor.pem", tmp_path / "auditor.pub.pem"
    generate_auditor_keypair(priv, pub)
    assert stat.S_IMODE(os.stat(priv).st_mode) == 0o600
    async with Journal.open(tmp_path / "j.db", auditor_public_key=pub, payload_copy=False) as j:
        ev = await j.append(accepted("inv-1"), payload={"stdout": CANARY})
        # Write-only: the broker keeps no copy it could read back ...
        assert j.payload(ev.seq) is None
        copy = j.audit_copy(ev.seq)
        assert copy is not None
        iid, kind, sealed = copy
        # ... and nothing the broker holds opens the audit copy: not its own key, nor its key
        # file taken for an auditor's.
        with pytest.raises(JournalError):
            BrokerKey.load(tmp_path / "j.db.key").open(sealed, b"")
        with pytest.raises(JournalError, match="not a PEM private key"):
            open_audit_payload(sealed, tmp_path / "j.db.key", iid, kind)
    # The auditor's private key does.
    assert open_audit_payload(sealed, priv, iid, kind) == {"stdout": CANARY}
    other_priv = auditor_dir / "other.pem"
    generate_auditor_keypair(other_priv, auditor_dir / "other.pub")
    with pytest.raises(JournalError, match=r"other\.pem"):
        open_audit_payload(sealed, other_priv, iid, kind)


async def test_with_an_auditor_both_copies_are_written_by_default(tmp_path: Path) -> None:
    priv, pub = tmp_path / "a.pem", tmp_path / "a.pub"
    generate_auditor_keypair(priv, pub)
    async with Journal.open(tmp_path / "j.db", auditor_public_key=pub) as j:
        ev = await j.append(accepted("inv-1"), payload={"k": 1})
        assert j.payload(ev.seq) == {"k": 1}
        copy = j.audit_copy(ev.seq)
        assert copy is not None
        assert open_audit_payload(copy[2], priv, copy[0], copy[1]) == {"k": 1}
        assert j.verify().ok


def test_a_bad_auditor_key_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pub").write_text("nope")

    async def go() -> None:
        async with Journal.open(tmp_path / "j.db", auditor_public_key=tmp_path / "pub"):
            pass

    with pytest.raises(JournalError, match="auditor public key file"):
        trio.run(go)
    with pytest.raises(JournalError, match="does not exist"):
        trio.run(_open_with, tmp_path / "j2.db", tmp_path / "absent.pub")


async def _open_with(path: Path, pub: Path) -> None:
    async with Journal.open(path, auditor_public_key=pub):
        pass


async def test_events_without_payload_have_no_sealed_columns(tmp_path: Path) -> None:
    async with Journal.open(tmp_path / "j.db") as j:
        ev = await j.append(Event(E.ACTION_ACCEPTED, "inv-1", accepted("inv-1").attrs))
        assert j.payload(ev.seq) is None


def test_nonces_come_from_the_pool_fresh_each_seal(tmp_path: Path) -> None:
    """The same bytes sealed twice never share a nonce, also across a pool refill."""
    key = BrokerKey.create(tmp_path / "k")
    nonces = {key.seal(b"same", b"aad")[1:13] for _ in range(1000)}  # > 4096 bytes of pool
    assert len(nonces) == 1000
    assert key.open(key.seal(b"same", b"aad"), b"aad") == b"same"


def test_a_forked_child_never_repeats_its_parents_random_bytes() -> None:
    random_bytes(1)  # the parent's pool holds unused bytes now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next bytes and leave at once
        os.write(write, random_bytes(32))
        os._exit(0)
    os.close(write)
    child = os.read(read, 32)
    os.close(read)
    os.waitpid(pid, 0)
    assert len(child) == 32
    assert child != random_bytes(32)


@pytest.mark.parametrize(
    ("label", "data"),
    [("credential-version:env:X", b"tok"), ("é-label", b""), ("", b"\x00\xff" * 300)],
)
def test_keyed_digest_is_the_hmac_of_label_nul_data(
    label: str, data: bytes, tmp_path: Path
) -> None:
    """Issue 15: ``BrokerKey.digest`` through the label's keyed state made once and copied
    (``digester``) gives the bytes the one-shot HMAC gave: HMAC-SHA256 under the derived key of
    ``label`` UTF-8, a NUL, then ``data`` -- the first time and every time after."""
    import hashlib
    import hmac

    key = BrokerKey.create(tmp_path / "k")
    mac = hmac.new(key._mac_key, label.encode("utf-8") + b"\0", hashlib.sha256)
    mac.update(data)
    assert key.digest(label, data) == mac.hexdigest()
    assert key.digest(label, data) == mac.hexdigest()  # the kept state, copied again
    one_shot = hmac.digest(key._mac_key, label.encode("utf-8") + b"\0" + data, "sha256")
    assert key.digest(label, data) == one_shot.hex()
    assert key.digest(label, data + b"x") != one_shot.hex()  # the copy, not the state, took it


def test_keyed_digest_keeps_a_bounded_number_of_label_states(tmp_path: Path) -> None:
    """Issue 15: the label states ``digest`` keeps are bounded (a label names a credential
    reference, and a reloaded config may bring new ones): past the bound it starts over, and
    every digest stays the HMAC of its label and data."""
    import hashlib
    import hmac

    from affidavit.journal import sealing

    key = BrokerKey.create(tmp_path / "k")
    for i in range(sealing._LABELS + 3):
        label = f"credential-version:env:V{i}"
        want = hmac.new(key._mac_key, label.encode() + b"\0" + b"v", hashlib.sha256).hexdigest()
        assert key.digest(label, b"v") == want
        assert len(key._digesters) <= sealing._LABELS


KEY_FILES = [(BrokerKey.create, "broker key file"), (SigningKey.create, "signing key file")]


@pytest.mark.parametrize(("create", "what"), KEY_FILES, ids=["broker", "signing"])
def test_a_key_file_whose_write_fails_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, create: Any, what: str
) -> None:
    """A short file left by a failed write blocked every later creation (O_EXCL) and read as
    "not an affidavit journal key"; now the key is written to a temp file that is removed."""
    real = os.fsync

    def full(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(JournalError, match=f"cannot create {what}"):
        create(tmp_path / "j.key")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    create(tmp_path / "j.key")  # not blocked by a leftover


@pytest.mark.parametrize(("create", "what"), KEY_FILES, ids=["broker", "signing"])
def test_a_new_key_file_is_synced_with_its_directory_and_never_replaces_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, create: Any, what: str
) -> None:
    """The journal records the key's id with synchronous=FULL: the key file's name must be as
    durable (its directory fsynced), or a crash keeps the journal and loses its key."""
    synced: list[int] = []
    real = os.fsync

    def noted(fd: int) -> None:
        synced.append(stat.S_IFMT(os.fstat(fd).st_mode))
        real(fd)

    monkeypatch.setattr(os, "fsync", noted)
    create(tmp_path / "j.key")
    assert synced == [stat.S_IFREG, stat.S_IFDIR]
    before = (tmp_path / "j.key").read_bytes()
    with pytest.raises(JournalError, match=f"cannot create {what}"):
        create(tmp_path / "j.key")
    assert (tmp_path / "j.key").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["j.key"]
