"""Auditor reads prove what they open (review: integrity items 1 and 3).

An auditor copy is sealed to the auditor's *public* key: anyone holding ``auditor.pub`` can make
one bound to any row's (invocation, kind).  So ``audit-open`` and ``JournalReader.audit_payload``
/ ``audit_result`` open a copy only once its row is proven as ``verify`` proves it -- its hash
recomputed from its columns (the auditor copy's SHA-256 included), linked, and covered by a
checkpoint signed with a trusted key -- and the auditor pins that key (``--public-key``): a
journal re-chained and re-signed with a key the attacker recorded in it proves nothing.  A
forged or unproven row is a ``JournalError`` (exit 2) naming the seq and what failed, never the
payload."""

from __future__ import annotations

import base64
import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from affidavit.cli import main as cli_main
from affidavit.journal import (
    Journal,
    JournalError,
    JournalReader,
    SigningKey,
    generate_auditor_keypair,
    public_key_pem,
)
from affidavit.journal.chain import canonical_json, row_hash
from affidavit.journal.sealing import AuditSealer, chunk_aad, payload_aad, summary_aad
from affidavit.statemachine import Event, EventKind

from .helpers import happy

REAL = {"real": "payload"}
FORGED = {"planted": "PLANTED-7f3a"}
FORGED_BODY = b"PLANTED RESULT, all good\n"


class Built:
    def __init__(self, d: Path) -> None:
        self.dir = d
        self.db = d / "j.db"
        self.priv, self.pub = d / "auditor.pem", d / "auditor.pub"
        self.journal_pub = d / "journal.pub"
        self.result_seq = 0

    def cli(self, *args: str) -> int:
        base = ["journal", "audit-open", "--journal", str(self.db), "--key", str(self.priv)]
        return cli_main([*base, *args])

    def pinned(self) -> JournalReader:
        raw = SigningKey.load(f"{self.db}.signing.key").public_raw
        return JournalReader.open(self.db, public_keys=[raw])


@pytest.fixture
async def built(tmp_path: Path) -> Built:
    b = Built(tmp_path)
    generate_auditor_keypair(b.priv, b.pub)
    async with Journal.open(b.db, auditor_public_key=b.pub) as j:
        for ev in happy("inv-r"):
            if ev.kind is EventKind.ACTION_ACCEPTED:
                await j.append(ev, payload=REAL)
            else:
                await j.append(ev)
        await j.put_result_chunk("inv-r", "body", 0, b"REAL BODY")
        ev = await j.commit_result(Event(EventKind.RESULT_COMMITTED, "inv-r"), summary={"s": 201})
        assert ev.seq is not None
        b.result_seq = ev.seq
    raw = SigningKey.load(f"{b.db}.signing.key").public_raw
    b.journal_pub.write_bytes(public_key_pem(raw))
    return b


def _writable(db: Path) -> sqlite3.Connection:
    """The attacker: write access to the file, no key but the auditor's public one."""
    conn = sqlite3.connect(db, isolation_level=None)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'"):
        conn.execute(f"DROP TRIGGER {name}")
    return conn


def _forge_payload_copy(b: Built, seq: int = 1) -> None:
    """Replace the row's auditor copy with one of the attacker's, bound to its (iid, kind)."""
    conn = _writable(b.db)
    _forge_payload_copy_in(conn, b, seq)
    conn.close()


def _forge_result_copies(conn: sqlite3.Connection, b: Built, legacy: bool) -> None:
    """Replace the result's auditor copies and its marker with the attacker's; ``legacy``: drop
    ``marker_sha256`` from the chained event (a result from before per-chunk hashes)."""
    sealer = AuditSealer.load(b.pub)
    fsum = json.dumps({"s": 200}).encode()
    sc = sealer.seal(fsum, summary_aad("inv-r"))
    cc = sealer.seal(FORGED_BODY, chunk_aad("inv-r", "body", 0))
    conn.execute("DELETE FROM result_audit WHERE invocation_id = 'inv-r'")
    conn.execute("INSERT INTO result_audit VALUES ('inv-r', '', 0, ?)", (sc,))
    conn.execute("INSERT INTO result_audit VALUES ('inv-r', 'body', 0, ?)", (cc,))
    (streams_json,) = conn.execute("SELECT streams FROM results").fetchone()
    streams = json.loads(streams_json)
    body = streams["body"]
    body.update(bytes=len(FORGED_BODY), sha256=hashlib.sha256(FORGED_BODY).hexdigest())
    body["audit"] = [hashlib.sha256(cc).hexdigest()]
    whole = hashlib.sha256(canonical_json({"body": body["sha256"]}).encode()).hexdigest()
    seq = b.result_seq
    (attrs_json,) = conn.execute("SELECT attrs FROM events WHERE seq = ?", (seq,)).fetchone()
    attrs = json.loads(attrs_json)
    attrs.update(
        sha256=whole,
        summary_sha256=hashlib.sha256(fsum).hexdigest(),
        audit_summary_sha256=hashlib.sha256(sc).hexdigest(),
        marker_sha256=hashlib.sha256(canonical_json(streams).encode()).hexdigest(),
    )
    if legacy:
        del attrs["marker_sha256"]
    conn.execute("UPDATE events SET attrs = ? WHERE seq = ?", (json.dumps(attrs), seq))
    conn.execute("UPDATE results SET streams = ?, sha256 = ?", (canonical_json(streams), whole))


def _resign_with(conn: sqlite3.Connection, evil: SigningKey) -> None:
    """Re-chain every row, replace the checkpoints with one signed by ``evil`` and record its
    public key in the journal in place of the broker's."""
    prev = "0" * 64
    rows = conn.execute("SELECT * FROM events ORDER BY seq").fetchall()
    for row in rows:
        h = row_hash(prev, *row[:11])
        conn.execute("UPDATE events SET prev_hash = ?, hash = ? WHERE seq = ?", (prev, h, row[0]))
        prev = h
    conn.execute("DELETE FROM checkpoints")
    cp = evil.sign(rows[-1][0], prev, 0, 1.0)
    conn.execute(
        "INSERT INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?)",
        (cp.seq, cp.hash, cp.prev, cp.at, 0, cp.key_id, cp.signature),
    )
    conn.execute(
        "UPDATE meta SET value = ? WHERE name = 'signing_public_key'",
        (base64.b64encode(evil.public_raw).decode(),),
    )


def _refused(b: Built, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """``audit-open ARGS`` exits 2, prints nothing on stdout; its one stderr line."""
    capsys.readouterr()
    assert b.cli(*args) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "PLANTED" not in err
    return err


# -- the honest path ----------------------------------------------------------------------------


async def test_an_untouched_journal_opens_with_the_pinned_key(
    built: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    b = built
    with b.pinned() as r:
        assert r.key_source == "public-key"
        assert r.audit_payload(1, b.priv) == REAL
        stored = r.audit_result("inv-r", b.priv)
        assert stored is not None and stored.streams == {"body": b"REAL BODY"}
    capsys.readouterr()
    assert b.cli("--seq", "1", "--public-key", str(b.journal_pub)) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == REAL and err == ""
    assert b.cli("--result", "inv-r", "--public-key", str(b.journal_pub)) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["body"] == "REAL BODY" and err == ""


async def test_audit_open_without_a_pinned_key_refuses_or_says_whose_key_it_trusted(
    built: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    b = built
    err = _refused(b, capsys, "--seq", "1")
    assert "--public-key: audit-open needs the journal's signing public key" in err
    capsys.readouterr()
    assert b.cli("--seq", "1", "--trust-journal-key") == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == REAL
    key_id = SigningKey.load(f"{b.db}.signing.key").key_id
    assert f"signing key {key_id} recorded in the journal itself" in err
    assert "not independent of the journal" in err


# -- r4 (A): a forged auditor copy of an event ----------------------------------------------------


async def test_a_forged_auditor_copy_of_an_event_is_not_opened(
    built: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    b = built
    _forge_payload_copy(b, 1)
    # The key the journal records is still the broker's here: the row itself was not proven.
    with JournalReader.open(b.db) as r, pytest.raises(JournalError, match="seq 1 is not proven"):
        r.audit_payload(1, b.priv)
    with b.pinned() as r:
        assert not r.verify(public_key=SigningKey.load(f"{b.db}.signing.key").public_raw).ok
        with pytest.raises(JournalError) as caught:
            r.audit_payload(1, b.priv)
        with pytest.raises(JournalError):
            r.audit_copy(1)
    assert "the auditor copy of seq 1 is not proven, not opened: row 1 was altered" in str(
        caught.value
    )
    for trust in (["--public-key", str(b.journal_pub)], ["--trust-journal-key"]):
        err = _refused(b, capsys, "--seq", "1", *trust)
        assert "the auditor copy of seq 1 is not proven, not opened: row 1 was altered" in err


async def test_an_auditor_copy_on_a_row_no_checkpoint_covers_is_not_opened(
    built: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    """A row appended with a correct hash but no signed checkpoint (the forged-RECONCILED
    attack, carrying an auditor copy)."""
    b = built
    sealer = AuditSealer.load(b.pub)
    conn = _writable(b.db)
    last = conn.execute("SELECT * FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    seq = last[0] + 1
    row = list(last[:11])
    row[0] = seq
    row[10] = sealer.seal(json.dumps(FORGED).encode(), payload_aad(row[2], row[4]))
    h = row_hash(last[12], *row)
    conn.execute(
        "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", (*row, last[12], h)
    )
    conn.close()
    err = _refused(b, capsys, "--seq", str(seq), "--public-key", str(b.journal_pub))
    want = f"the auditor copy of seq {seq} is not proven, not opened: row {seq} is not covered"
    assert want in err


# -- r4 (B): a forged auditor copy of a result, downgraded to a legacy marker ---------------------


async def test_a_forged_result_copy_downgraded_to_a_legacy_marker_is_not_opened(
    built: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    b = built
    conn = _writable(b.db)
    _forge_result_copies(conn, b, legacy=True)
    conn.close()
    seq = b.result_seq
    with JournalReader.open(b.db) as r, pytest.raises(JournalError, match=f"seq {seq}\\) is not"):
        r.audit_result("inv-r", b.priv)
    with b.pinned() as r, pytest.raises(JournalError) as caught:
        r.audit_result("inv-r", b.priv)
    want = (
        f"the auditor copy of invocation inv-r (its RESULT_COMMITTED event, seq {seq}) is not "
        f"proven, not opened: row {seq} was altered"
    )
    assert want in str(caught.value)
    err = _refused(b, capsys, "--result", "inv-r", "--public-key", str(b.journal_pub))
    assert want in err


# -- r5: re-chained, re-signed with the attacker's key recorded in the journal ---------------------


async def test_a_journal_resigned_with_a_key_recorded_in_it_is_refused_with_the_pinned_key(
    built: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    b = built
    evil = SigningKey.create(b.dir / "evil.key")
    conn = _writable(b.db)
    _forge_result_copies(conn, b, legacy=False)
    _forge_payload_copy_in(conn, b)
    _resign_with(conn, evil)
    conn.close()
    # The journal's own record now vouches for the forgery...
    with JournalReader.open(b.db) as r:
        assert r.verify().ok and r.key_source == "journal"
    # ...the pinned key does not.
    with b.pinned() as r:
        with pytest.raises(JournalError, match="is not proven, not opened: the checkpoint"):
            r.audit_result("inv-r", b.priv)
        with pytest.raises(JournalError, match="is not proven, not opened: the checkpoint"):
            r.audit_payload(1, b.priv)
    pin = ["--public-key", str(b.journal_pub)]
    err = _refused(b, capsys, "--result", "inv-r", *pin)
    key_id = SigningKey.load(f"{b.db}.signing.key").key_id
    assert f"is not validly signed (checked with key {key_id}, public-key)" in err
    err = _refused(b, capsys, "--seq", "1", *pin)
    assert "the auditor copy of seq 1 is not proven, not opened" in err
    # Without a pinned key, audit-open refuses; trusting the file, it says whose key it used.
    assert "--public-key: audit-open needs" in _refused(b, capsys, "--seq", "1")
    capsys.readouterr()
    assert b.cli("--seq", "1", "--trust-journal-key") == 0
    _, err = capsys.readouterr()
    assert f"signing key {evil.key_id} recorded in the journal itself" in err


def _forge_payload_copy_in(conn: sqlite3.Connection, b: Built, seq: int = 1) -> None:
    sealer = AuditSealer.load(b.pub)
    q = "SELECT invocation_id, kind FROM events WHERE seq = ?"
    iid, kind = conn.execute(q, (seq,)).fetchone()
    forged = sealer.seal(json.dumps(FORGED).encode(), payload_aad(iid, kind))
    conn.execute("UPDATE events SET audit = ? WHERE seq = ?", (forged, seq))
