"""Tamper evidence beyond the chain (issue 9, item 3): someone who can write the journal file but
holds no key rewrites history; ``journal verify`` names the first bad seq, checked once with an
anchor kept elsewhere and once with the signing public key alone -- never with a secret key.

One test per case the issue lists: truncate the tail, forge an appended row with a recomputed
hash (an ``unknown`` turned ``reconciled_rejected``), edit and re-chain from genesis, corrupt a
result row, corrupt a chunk, delete a checkpoint, swap the signing key file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from affidavit.cli import main as cli_main
from affidavit.journal import (
    Anchor,
    Journal,
    JournalError,
    JournalReader,
    ResultUnverified,
    SigningKey,
    VerifyReport,
    load_public_key,
    public_key_pem,
)
from affidavit.journal.chain import canonical_json, row_hash
from affidavit.statemachine import EventKind, Outcome, Projector

from .helpers import fill_results, happy

BODY = bytes(range(256)) * 700  # three 64 KiB chunks (the last one short)
CHUNK = 64 * 1024
TRUST = ["anchor", "public-key"]


@dataclass(frozen=True)
class Built:
    db: Path
    anchor: Path
    public_key: Path
    rows: int
    result_seq: int
    """The RESULT_COMMITTED of ``inv-r`` (a three-chunk body)."""
    unknown: str
    """An invocation left ``unknown`` (dispatched, then interrupted)."""


async def _fill(db: Path) -> int:
    async with Journal.open(db) as j:
        return await fill_results(j, BODY)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    d = tmp_path_factory.mktemp("tamper")
    db = d / "j.db"
    result_seq = trio.run(_fill, db)
    (d / "journal.pub").write_bytes(
        public_key_pem(SigningKey.load(d / "j.db.signing.key").public_raw)
    )
    assert (
        cli_main(["journal", "anchor", "--journal", str(db), "--out", str(d / "anchor.json")]) == 0
    )
    with JournalReader.open(db) as r:
        rows = r.head()[0]
    return Built(db, d / "anchor.json", d / "journal.pub", rows, result_seq, "inv-u")


@pytest.fixture
def j(built: Built, tmp_path: Path) -> Iterator[Built]:
    """A private copy of the built journal (and its key files) to tamper with."""
    db = tmp_path / "j.db"
    with sqlite3.connect(built.db) as a, sqlite3.connect(db) as b:
        a.backup(b)
    a.close()
    b.close()
    for suffix in (".key", ".signing.key"):
        shutil.copy2(f"{built.db}{suffix}", f"{db}{suffix}")
    yield Built(db, built.anchor, built.public_key, built.rows, built.result_seq, built.unknown)


def _sql(db: Path, *statements: tuple[str, tuple[object, ...]]) -> None:
    """Edit the file directly, as someone with write access and no key would: drop the
    append-only triggers first."""
    conn = sqlite3.connect(db, isolation_level=None)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {name}")
    for sql, params in statements:
        conn.execute(sql, params)
    conn.close()


def _verify(b: Built, trust: str, **kw: bool) -> VerifyReport:
    with JournalReader.open(b.db) as r:
        if trust == "anchor":
            from affidavit.journal import load_anchor

            return r.verify(anchor=load_anchor(b.anchor), **kw)
        return r.verify(public_key=load_public_key(b.public_key), **kw)


def _cli_verify(b: Built, trust: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    flag = ["--anchor", str(b.anchor)] if trust == "anchor" else ["--public-key", str(b.public_key)]
    code = cli_main(["journal", "verify", "--journal", str(b.db), *flag])
    return code, capsys.readouterr().out


def _rechain_from(db: Path, seq: int) -> None:
    """Recompute every row's prev_hash and hash from ``seq`` on, as a forger would."""
    conn = sqlite3.connect(db, isolation_level=None)
    rows = conn.execute("SELECT * FROM events WHERE seq >= ? ORDER BY seq", (seq,)).fetchall()
    prev = conn.execute("SELECT hash FROM events WHERE seq = ?", (seq - 1,)).fetchone()
    prev_hash = prev[0] if prev else "0" * 64
    for row in rows:
        h = row_hash(prev_hash, *row[:11])
        conn.execute(
            "UPDATE events SET prev_hash = ?, hash = ? WHERE seq = ?", (prev_hash, h, row[0])
        )
        prev_hash = h
    conn.close()


# -- the untouched journal ------------------------------------------------------------------------


@pytest.mark.parametrize("trust", TRUST)
def test_an_untouched_journal_verifies_with_a_public_key_alone(
    j: Built, trust: str, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _verify(j, trust)
    assert report.ok and report.count == j.rows and report.results == 1, report
    assert report.signed_seq == j.rows and report.key_source == trust
    code, out = _cli_verify(j, trust, capsys)
    assert code == 0 and f"signed through seq {j.rows}" in out
    # No secret key was needed: verify works with both key files gone.
    Path(f"{j.db}.key").unlink()
    Path(f"{j.db}.signing.key").unlink()
    assert _verify(j, trust).ok


def test_every_committing_transaction_signs_a_checkpoint(j: Built) -> None:
    conn = sqlite3.connect(j.db)
    (n,) = conn.execute("SELECT count(*) FROM checkpoints").fetchone()
    (head,) = conn.execute("SELECT max(seq) FROM checkpoints").fetchone()
    conn.close()
    assert head == j.rows
    assert n == j.rows  # sequential appends: one transaction, so one checkpoint, per row


# -- truncate the tail ----------------------------------------------------------------------------


def test_truncating_the_tail_at_a_checkpoint_is_caught_by_the_anchor_only(
    j: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    cut = j.rows - 3
    _sql(
        j.db,
        ("DELETE FROM events WHERE seq > ?", (cut,)),
        ("DELETE FROM checkpoints WHERE seq > ?", (cut,)),
    )
    report = _verify(j, "anchor")
    assert (report.ok, report.first_bad_seq) == (False, cut + 1)
    assert "before the anchor's seq" in report.reason
    code, out = _cli_verify(j, "anchor", capsys)
    assert code == 1 and f"seq {cut + 1}" in out
    # The public key alone sees a shorter journal whose every row is signed: a clean cut back to
    # a checkpoint is exactly what an anchor kept elsewhere is for (docs/journal.md).
    report = _verify(j, "public-key")
    assert report.ok and report.signed_seq == cut


@pytest.mark.parametrize("trust", TRUST)
def test_truncating_rows_but_not_their_checkpoints_is_caught(j: Built, trust: str) -> None:
    cut = j.rows - 3
    _sql(j.db, ("DELETE FROM events WHERE seq > ?", (cut,)))
    report = _verify(j, trust)
    assert (report.ok, report.first_bad_seq) == (False, cut + 1)
    assert "were removed" in report.reason


# -- forge an appended row ------------------------------------------------------------------------


def _forge_reconciled(b: Built) -> int:
    """Append RECONCILED (operator_attested, outcome rejected) to the unknown invocation, with a
    correctly recomputed hash: the chain alone cannot tell."""
    conn = sqlite3.connect(b.db, isolation_level=None)
    seq, prev = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    at = 1_900_000_000.0
    row = (seq + 1, at, b.unknown, "sess-1", "RECONCILED", "operator_attested", None, None,
           '{"outcome":"rejected"}', None, None)  # fmt: skip
    conn.execute(
        f"INSERT INTO events VALUES ({','.join('?' * 13)})", (*row, prev, row_hash(prev, *row))
    )
    conn.close()
    return int(seq) + 1


@pytest.mark.parametrize("trust", TRUST)
def test_a_forged_appended_row_with_a_recomputed_hash_is_caught(
    j: Built, trust: str, capsys: pytest.CaptureFixture[str]
) -> None:
    forged = _forge_reconciled(j)
    with JournalReader.open(j.db) as r:
        events = r.events(j.unknown)
        # The forgery would matter: the record now reads as reconciled and rejected.
        assert Projector(j.unknown).extend(events).record().outcome is Outcome.REJECTED
    report = _verify(j, trust)
    assert (report.ok, report.first_bad_seq) == (False, forged)
    assert "not covered by a signed checkpoint" in report.reason
    code, out = _cli_verify(j, trust, capsys)
    assert code == 1 and f"BROKEN at seq {forged}" in out


async def test_the_broker_refuses_to_sign_over_a_forged_row(j: Built) -> None:
    forged = _forge_reconciled(j)
    with pytest.raises(JournalError, match=f"seq {forged}.*not covered"):
        async with Journal.open(j.db):
            pass


async def test_the_broker_refuses_to_open_over_a_head_edited_in_place(j: Built) -> None:
    """The last row's attrs edited, its hash columns left alone: the checkpoint still matches
    the stored hash, but the row no longer hashes to it -- the broker re-hashes a head it did
    not write before it signs over it."""
    _sql(j.db, ("UPDATE events SET attrs = ? WHERE seq = ?", ('{"code":"EDITED"}', j.rows)))
    with pytest.raises(JournalError, match=f"seq {j.rows}.*not covered.*edited in place"):
        async with Journal.open(j.db):
            pass
    with JournalReader.open(j.db) as r:
        assert r.head()[0] == j.rows  # nothing was appended


async def test_a_running_broker_refuses_a_foreign_head_edited_in_place(j: Built) -> None:
    """Another writer appended (so the head is not this writer's own), then its last row was
    edited in place: the next write re-hashes that head and refuses."""
    async with Journal.open(j.db) as mine, Journal.open(j.db) as other:
        await mine.append(happy("inv-mine")[0])
        await other.append(happy("inv-other")[0])
        head = j.rows + 2
        _sql(j.db, ("UPDATE events SET attrs = ? WHERE seq = ?", ('{"forged":true}', head)))
        with pytest.raises(JournalError, match=f"seq {head}.*edited in place"):
            await mine.append(happy("inv-mine")[1])
    with JournalReader.open(j.db) as r:
        assert r.head()[0] == head


# -- edit and re-chain ----------------------------------------------------------------------------


@pytest.mark.parametrize("trust", TRUST)
@pytest.mark.parametrize("seq", [1, 9, "last"])
def test_an_edit_rechained_from_genesis_is_caught_at_its_row(
    j: Built, trust: str, seq: int | str
) -> None:
    target = j.rows if seq == "last" else int(seq)
    _sql(j.db, ("UPDATE events SET at = at + 1 WHERE seq = ?", (target,)))
    _rechain_from(j.db, 1)
    report = _verify(j, trust)
    assert (report.ok, report.first_bad_seq) == (False, target), report
    assert "differ from the signed checkpoint" in report.reason


@pytest.mark.parametrize("trust", TRUST)
def test_a_rewritten_outcome_rechained_is_caught(j: Built, trust: str) -> None:
    # Turn the committed REMOTE_RESPONSE_COMPLETE of inv-z into a rejection and re-chain.
    conn = sqlite3.connect(j.db)
    (seq,) = conn.execute(
        "SELECT seq FROM events WHERE invocation_id = 'inv-z' AND kind = ?",
        (EventKind.REMOTE_RESPONSE_COMPLETE.value,),
    ).fetchone()
    conn.close()
    _sql(
        j.db,
        ("UPDATE events SET attrs = ? WHERE seq = ?", ('{"outcome":"rejected","status":409}', seq)),
    )
    _rechain_from(j.db, seq)
    report = _verify(j, trust)
    assert (report.ok, report.first_bad_seq) == (False, seq)


# -- corrupt a result -----------------------------------------------------------------------------


def _other_byte(column: str, pos: int) -> str:
    """SQL for a byte that differs from the one at ``pos`` (sealed bytes are random: a fixed
    replacement byte would equal the original once in 256 runs)."""
    return f"(CASE WHEN substr({column}, {pos}, 1) = x'00' THEN x'01' ELSE x'00' END)"


RESULT_EDITS = {
    "marker hash": ("UPDATE results SET sha256 = 'f00d' WHERE invocation_id = 'inv-r'", ()),
    "marker streams": (
        "UPDATE results SET streams = replace(streams, '\"chunks\":3', '\"chunks\":2') "
        "WHERE invocation_id = 'inv-r'",
        (),
    ),
    "sealed summary": (
        f"UPDATE results SET summary = substr(summary, 1, 20) || {_other_byte('summary', 21)} "
        "|| substr(summary, 22) WHERE invocation_id = 'inv-r'",
        (),
    ),
    "marker removed": ("DELETE FROM results WHERE invocation_id = 'inv-r'", ()),
    # SQLite checks no foreign key: a results row may name a seq the journal does not have.
    "marker past the end": ("UPDATE results SET seq = 999999 WHERE invocation_id = 'inv-r'", ()),
    "marker of no result": (
        "INSERT INTO results SELECT 'inv-z', 999998, sha256, streams, summary FROM results "
        "WHERE invocation_id = 'inv-r'",
        (),
    ),
    "marker of no result at a row": (
        "INSERT INTO results SELECT 'inv-z', 2, sha256, streams, summary FROM results "
        "WHERE invocation_id = 'inv-r'",
        (),
    ),
    "marker of no result at seq 0": (
        "INSERT INTO results SELECT 'inv-z', 0, sha256, streams, summary FROM results "
        "WHERE invocation_id = 'inv-r'",
        (),
    ),
}
ELSEWHERE: dict[str, Callable[[Built], int | None]] = {
    "marker of no result": lambda j: j.rows + 1,
    "marker of no result at a row": lambda j: 2,
    "marker of no result at seq 0": lambda j: None,
}
"""Edits reported at another invocation than inv-r, and another seq than its RESULT_COMMITTED:
inv-z (committed, its result never stored) has no RESULT_COMMITTED to be judged at.  Never at a
seq the journal does not have: past its end, at the end (as rows removed from it are); at a seq
no row can have, at journal level (None)."""


@pytest.mark.parametrize("trust", TRUST)
@pytest.mark.parametrize("edit", sorted(RESULT_EDITS))
def test_a_corrupted_result_row_is_caught_at_its_result_committed(
    j: Built, trust: str, edit: str
) -> None:
    _sql(j.db, RESULT_EDITS[edit])
    iid, at = ("inv-z", ELSEWHERE[edit](j)) if edit in ELSEWHERE else ("inv-r", j.result_seq)
    report = _verify(j, trust)
    assert (report.ok, report.first_bad_seq) == (False, at), report
    assert report.count == (j.rows if at is None else at - 1), report
    assert iid in report.reason
    with JournalReader.open(j.db) as r:
        if edit == "marker removed":
            # Its RESULT_COMMITTED is on record: unverified in verify's words, never "no result"
            # (a fetch then recorded a delivery of nothing).
            with pytest.raises(ResultUnverified, match="no completeness marker"):
                r.read_result("inv-r")
        else:
            with pytest.raises(JournalError, match=iid):
                r.read_result(iid)


_R = "invocation_id = 'inv-r'"
CHUNK_EDITS: dict[str, list[tuple[str, tuple[object, ...]]]] = {
    # substr() || ... also turns the blob into text: read back as bytes all the same.
    "flipped byte": [
        (f"UPDATE result_chunks SET data = substr(data, 1, 100) || {_other_byte('data', 101)} "
         f"|| substr(data, 102) WHERE {_R} AND idx = 1", ()),
    ],
    "deleted": [(f"DELETE FROM result_chunks WHERE {_R} AND idx = 1", ())],
    "swapped": [
        (f"UPDATE result_chunks SET idx = 99 WHERE {_R} AND idx = 0", ()),
        (f"UPDATE result_chunks SET idx = 0 WHERE {_R} AND idx = 1", ()),
        (f"UPDATE result_chunks SET idx = 1 WHERE {_R} AND idx = 99", ()),
    ],
}  # fmt: skip


@pytest.mark.parametrize("trust", TRUST)
@pytest.mark.parametrize("edit", sorted(CHUNK_EDITS))
def test_a_corrupted_chunk_is_caught_without_the_broker_key(
    j: Built, trust: str, edit: str
) -> None:
    _sql(j.db, *CHUNK_EDITS[edit])
    Path(f"{j.db}.key").unlink()  # verify needs no broker key to check chunks
    report = _verify(j, trust)
    assert (report.ok, report.first_bad_seq) == (False, j.result_seq), report
    assert "chunk" in report.reason


# -- a result's event row edited in place ------------------------------------------------------


def _downgrade_result(b: Built) -> list[tuple[str, tuple[object, ...]]]:
    """Edit RESULT_COMMITTED's attrs in place (hash columns untouched) to look like a result
    from before per-chunk hashes -- no marker_sha256, sealed_summary_sha256 or summary_sha256 --
    declaring an empty body, and rewrite the results row to match."""
    conn = sqlite3.connect(b.db)
    (attrs_json,) = conn.execute(
        "SELECT attrs FROM events WHERE seq = ?", (b.result_seq,)
    ).fetchone()
    conn.close()
    attrs = json.loads(attrs_json)
    for k in ("marker_sha256", "sealed_summary_sha256", "summary_sha256"):
        attrs.pop(k, None)
    empty = hashlib.sha256(b"").hexdigest()
    whole = hashlib.sha256(canonical_json({"body": empty}).encode()).hexdigest()
    attrs.update(sha256=whole, chunks=0, bytes=0)
    streams = json.dumps({"body": {"chunks": 0, "bytes": 0, "sha256": empty}})
    return [
        ("UPDATE events SET attrs = ? WHERE seq = ?", (json.dumps(attrs), b.result_seq)),
        (f"UPDATE results SET streams = ?, sha256 = ? WHERE {_R}", (streams, whole)),
    ]


def test_a_result_event_edited_in_place_to_an_older_format_is_refused(j: Built) -> None:
    """The edit leaves every hash column alone, so the broker still opens the journal; a read
    re-hashes the event row itself and finds it outside its signed checkpoint -- never the
    empty body it now declares."""
    _sql(j.db, *_downgrade_result(j))
    bad = f"inv-r \\(seq {j.result_seq}\\) fails verification: its RESULT_COMMITTED event row"

    async def through_the_broker() -> None:
        async with Journal.open(j.db) as jj:
            with pytest.raises(JournalError, match=bad):
                jj.read_result("inv-r")
            with pytest.raises(JournalError, match=bad):
                jj.result_stream("inv-r")

    trio.run(through_the_broker)
    with JournalReader.open(j.db) as r:
        for read in (r.read_result, r.result_stream):
            with pytest.raises(JournalError, match=bad):
                read("inv-r")
        assert (r.verify().ok, r.verify().first_bad_seq) == (False, j.result_seq)


def _resign_from(db: Path, seq: int) -> None:
    """Re-sign, with the journal's own signing key, every checkpoint at or after ``seq`` over
    the rows as they now are (what only a holder of the signing key can do)."""
    key = SigningKey.load(f"{db}.signing.key")
    conn = sqlite3.connect(db, isolation_level=None)
    cps = conn.execute(
        "SELECT seq, prev, at FROM checkpoints WHERE seq >= ? ORDER BY seq", (seq,)
    ).fetchall()
    for cp_seq, prev, at in cps:
        (h,) = conn.execute("SELECT hash FROM events WHERE seq = ?", (cp_seq,)).fetchone()
        cp = key.sign(cp_seq, h, prev, at)
        conn.execute(
            "UPDATE checkpoints SET hash = ?, signature = ? WHERE seq = ?",
            (cp.hash, cp.signature, cp_seq),
        )
    conn.close()


def test_a_signed_result_event_without_the_current_fields_is_refused(j: Built) -> None:
    """Per-chunk hashes and signing came together: a RESULT_COMMITTED that a non-adopted
    checkpoint covers must carry marker_sha256 and the summary hashes, even if its row and
    checkpoint check out -- it is not an old result, it was altered."""
    _sql(j.db, *_downgrade_result(j))
    _rechain_from(j.db, j.result_seq)
    _resign_from(j.db, j.result_seq)
    lacks = "event was altered: it lacks marker_sha256, sealed_summary_sha256, summary_sha256"
    with JournalReader.open(j.db) as r, pytest.raises(JournalError, match=lacks):
        r.read_result("inv-r")


def _legacy_unsigned(b: Built) -> None:
    """Turn the journal into one written before signing and per-chunk hashes: results without
    marker_sha256 and sealed-chunk lists, re-chained, no checkpoints, no signing key."""
    conn = sqlite3.connect(b.db)
    (attrs_json,) = conn.execute(
        "SELECT attrs FROM events WHERE seq = ?", (b.result_seq,)
    ).fetchone()
    (streams_json,) = conn.execute(f"SELECT streams FROM results WHERE {_R}").fetchone()
    conn.close()
    attrs = {k: v for k, v in json.loads(attrs_json).items()
             if k not in ("marker_sha256", "sealed_summary_sha256")}  # fmt: skip
    streams = {name: {k: v for k, v in info.items() if k in ("chunks", "bytes", "sha256")}
               for name, info in json.loads(streams_json).items()}  # fmt: skip
    _sql(
        b.db,
        ("UPDATE events SET attrs = ? WHERE seq = ?", (json.dumps(attrs), b.result_seq)),
        (f"UPDATE results SET streams = ? WHERE {_R}", (json.dumps(streams),)),
        ("DELETE FROM checkpoints", ()),
        ("DELETE FROM meta WHERE name IN ('signing_key_id', 'signing_public_key')", ()),
        ("UPDATE meta SET value = '1' WHERE name = 'schema'", ()),  # as such a broker left it
    )
    _rechain_from(b.db, 1)
    os.unlink(f"{b.db}.signing.key")


def test_a_result_from_before_signing_is_read_once_its_journal_is_adopted(j: Built) -> None:
    """A genuine old result (no marker_sha256) is read as before -- whole, its stream hash
    checked -- once a signing broker has adopted the journal: its row is re-hashed and covered
    by the adopted checkpoint.  Until then no checkpoint covers it, and the read says so."""
    _legacy_unsigned(j)
    with (
        JournalReader.open(j.db) as r,
        pytest.raises(JournalError, match="not covered by a signed checkpoint"),
    ):
        r.read_result("inv-r")

    async def adopt() -> bytes:
        async with Journal.open(j.db) as jj:
            stored = jj.read_result("inv-r")
            assert stored is not None
            return stored.streams["body"]

    assert trio.run(adopt) == BODY
    with JournalReader.open(j.db) as r:
        stored = r.read_result("inv-r", from_chunk=1)
        assert stored is not None and stored.streams["body"] == BODY[CHUNK:]
    # Edited in place after adoption, the old result is refused like any other.
    _sql(j.db, *_downgrade_result(j))
    with (
        JournalReader.open(j.db) as r,
        pytest.raises(JournalError, match="its RESULT_COMMITTED event row"),
    ):
        r.read_result("inv-r")


def test_a_result_from_before_per_chunk_hashes_is_counted_apart(
    j: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its chunks have no chained hash to be checked against: verify checks its marker only,
    and says so instead of counting it among the results that match their chained hashes."""
    argv = ["journal", "verify", "--journal", str(j.db), "--accept-unsigned"]
    assert cli_main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["results"], data["results_marker_only"]) == (1, 0)  # checked chunk by chunk
    _legacy_unsigned(j)
    assert cli_main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["results"], data["results_marker_only"]) == (1, 1)
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert "0 stored results match their chained hashes" in out
    assert "1 stored results predate per-chunk hashes: only their marker matches" in out


# -- a checkpoint's hash changed under a signature already checked ------------------------------


def _shorten_under_a_known_signature(b: Built) -> None:
    """Drop the result's last chunk from its marker (the stream hash kept: only a resumed read
    would not check it), fix marker_sha256 to match, re-chain, and write the new hash into the
    covering checkpoint's ``hash`` column -- its signature left as it was."""
    conn = sqlite3.connect(b.db)
    (attrs_json,) = conn.execute(
        "SELECT attrs FROM events WHERE seq = ?", (b.result_seq,)
    ).fetchone()
    (streams_json,) = conn.execute(f"SELECT streams FROM results WHERE {_R}").fetchone()
    (cp_seq,) = conn.execute(
        "SELECT seq FROM checkpoints WHERE seq >= ? ORDER BY seq LIMIT 1", (b.result_seq,)
    ).fetchone()
    conn.close()
    attrs, streams = json.loads(attrs_json), json.loads(streams_json)
    body = streams["body"]
    body.update(chunks=2, bytes=2 * CHUNK, sealed=body["sealed"][:2])
    if body.get("audit"):
        body["audit"] = body["audit"][:2]
    attrs["marker_sha256"] = hashlib.sha256(canonical_json(streams).encode()).hexdigest()
    _sql(
        b.db,
        ("UPDATE events SET attrs = ? WHERE seq = ?", (json.dumps(attrs), b.result_seq)),
        (f"UPDATE results SET streams = ? WHERE {_R}", (canonical_json(streams),)),
    )
    _rechain_from(b.db, b.result_seq)
    conn = sqlite3.connect(b.db, isolation_level=None)
    (h,) = conn.execute("SELECT hash FROM events WHERE seq = ?", (cp_seq,)).fetchone()
    conn.execute("UPDATE checkpoints SET hash = ? WHERE seq = ?", (h, cp_seq))
    conn.close()


def test_a_checkpoint_hash_changed_under_a_remembered_signature_is_refused(j: Built) -> None:
    """A long-running reader remembers the checkpoints it has verified; a row with the same
    seq and signature but another hash is not one of them: its signature is checked again."""
    with JournalReader.open(j.db) as r:
        first = r.read_result("inv-r")
        assert first is not None and first.streams["body"] == BODY
        _shorten_under_a_known_signature(j)
        with pytest.raises(JournalError, match="not validly signed"):
            r.read_result("inv-r", from_chunk=1)


async def test_the_broker_refuses_a_checkpoint_hash_changed_under_a_known_signature(
    j: Built,
) -> None:
    async with Journal.open(j.db) as jj:
        first = jj.read_result("inv-r")
        assert first is not None and first.streams["body"] == BODY
        _shorten_under_a_known_signature(j)
        with pytest.raises(JournalError, match="not validly signed"):
            stream = jj.result_stream("inv-r")
            assert stream is not None
            b"".join(stream.chunks("body", 1))


# -- delete a checkpoint --------------------------------------------------------------------------


@pytest.mark.parametrize("trust", TRUST)
def test_deleting_the_last_checkpoint_leaves_its_rows_unauthenticated(j: Built, trust: str) -> None:
    _sql(j.db, ("DELETE FROM checkpoints WHERE seq = ?", (j.rows,)))
    report = _verify(j, trust)
    assert (report.ok, report.first_bad_seq) == (False, j.rows)


@pytest.mark.parametrize("trust", TRUST)
def test_deleting_a_middle_checkpoint_breaks_the_links(j: Built, trust: str) -> None:
    _sql(j.db, ("DELETE FROM checkpoints WHERE seq = ?", (7,)))
    report = _verify(j, trust)
    assert (report.ok, report.first_bad_seq) == (False, 7)
    assert "a checkpoint was removed" in report.reason


@pytest.mark.parametrize("trust", TRUST)
def test_a_checkpoint_with_a_forged_signature_is_refused(j: Built, trust: str) -> None:
    _sql(j.db, ("UPDATE checkpoints SET signature = zeroblob(64) WHERE seq = ?", (5,)))
    report = _verify(j, trust)
    assert (report.ok, report.first_bad_seq) == (False, 5)
    assert "is not signed by key" in report.reason


# -- swap the signing key file --------------------------------------------------------------------


async def test_a_swapped_signing_key_file_is_refused_at_open(j: Built) -> None:
    key = Path(f"{j.db}.signing.key")
    key.unlink()
    SigningKey.create(key)
    with pytest.raises(JournalError, match=r"signing key file .* does not match"):
        async with Journal.open(j.db):
            pass


@pytest.mark.parametrize("trust", TRUST)
def test_rows_signed_with_a_swapped_key_fail_verification(j: Built, trust: str) -> None:
    # The forger swaps the key file *and* the journal's record of it, so the broker opens and
    # signs on with the forger's key; only a key kept elsewhere tells.
    import base64

    key = Path(f"{j.db}.signing.key")
    key.unlink()
    new = SigningKey.create(key)
    _sql(
        j.db,
        ("UPDATE meta SET value = ? WHERE name = 'signing_key_id'", (new.key_id,)),
        (
            "UPDATE meta SET value = ? WHERE name = 'signing_public_key'",
            (base64.b64encode(new.public_raw).decode(),),
        ),
        # ...and re-signs the head with it, so that the broker agrees to extend it.
        *_resign_head(new, j),
    )

    async def more() -> None:
        async with Journal.open(j.db) as jj:
            for ev in happy("inv-after"):
                await jj.append(ev)

    trio.run(more)
    report = _verify(j, trust)
    assert not report.ok and report.first_bad_seq == j.rows, report
    assert "is not signed by key" in report.reason
    # The journal's own record of the key now names the forger's: checked with it, the rows
    # the real key signed fail instead -- never a pass.
    with JournalReader.open(j.db) as r:
        assert not r.verify().ok


def _resign_head(new: SigningKey, b: Built) -> list[tuple[str, tuple[object, ...]]]:
    conn = sqlite3.connect(b.db)
    prev, h = conn.execute("SELECT prev, hash FROM checkpoints WHERE seq = ?", (b.rows,)).fetchone()
    conn.close()
    cp = new.sign(b.rows, h, prev, 1_900_000_000.0)
    row = (cp.seq, cp.hash, cp.prev, cp.at, 0, cp.key_id, cp.signature)
    return [
        ("DELETE FROM checkpoints WHERE seq = ?", (b.rows,)),
        ("INSERT INTO checkpoints VALUES (?,?,?,?,?,?,?)", row),
    ]


# -- anchors --------------------------------------------------------------------------------------


def test_an_anchor_is_a_signed_head_that_names_its_key(built: Built) -> None:
    data = json.loads(built.anchor.read_text())
    assert data["seq"] == built.rows and data["format"] == "affidavit-anchor-v1"
    assert {"hash", "signature", "key_id", "public_key"} <= set(data)
    assert data["key_id"] == SigningKey.load(f"{built.db}.signing.key").key_id


def test_an_anchor_from_another_key_is_refused(j: Built, tmp_path: Path) -> None:
    other = SigningKey.create(tmp_path / "other.key")
    forged = Anchor(other.sign(j.rows, "ab" * 32, j.rows - 1, 1.0), other.public_raw)
    path = tmp_path / "forged.json"
    path.write_text(json.dumps(forged.to_json()))
    from affidavit.journal import load_anchor

    with JournalReader.open(j.db) as r:
        report = r.verify(public_key=load_public_key(j.public_key), anchor=load_anchor(path))
    assert not report.ok and "not the trusted key" in report.reason


def test_a_tampered_anchor_file_is_a_usage_error(
    j: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(j.anchor.read_text())
    data["seq"] += 5  # the signature no longer holds
    path = tmp_path / "a.json"
    path.write_text(json.dumps(data))
    assert cli_main(["journal", "verify", "--journal", str(j.db), "--anchor", str(path)]) == 2
    assert "signature does not hold" in capsys.readouterr().err


def test_no_anchor_is_written_for_a_journal_that_does_not_verify(
    j: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _forge_reconciled(j)
    out = tmp_path / "anchor.json"
    assert cli_main(["journal", "anchor", "--journal", str(j.db), "--out", str(out)]) == 1
    assert "no anchor written" in capsys.readouterr().out
    assert not out.exists()
