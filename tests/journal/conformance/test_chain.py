"""The chain on every backend: append-only in the database itself, one monotonic seq however
many writers append, and ``verify`` (chain, signed checkpoints, anchors, stored results) finding
what someone with write access to the database did -- with public keys only.

Seed, "Audit integrity and outcome evidence solve different problems": "A hash chain can confirm
that the recorded events were not altered later"; "Record monotonic sequence numbers".
"""

from __future__ import annotations

import pytest
import trio

from affidavit.journal import JournalError, SigningKey, VerifyReport, load_anchor
from affidavit.journal.chain import row_hash

from ..helpers import fill_results, happy
from .conftest import Place

BODY = bytes(range(256)) * 300  # two 64 KiB chunks


async def _fill(place: Place) -> int:
    """Three invocations and a two-chunk result; returns the RESULT_COMMITTED seq."""
    async with place.open() as j:
        return await fill_results(j, BODY)


def _verify(place: Place, **kw: object) -> VerifyReport:
    public = SigningKey.load(place.signing_key).public_raw
    with place.reader() as r:
        return r.verify(public_key=public, **kw)  # type: ignore[arg-type]


def _refused(place: Place, statement: str) -> None:
    with pytest.raises(Exception, match=r"append-only|must extend") as info:
        place.write(statement)
    assert "Journal" not in type(info.value).__name__  # the database refused, not our code


async def test_events_checkpoints_and_results_cannot_be_changed_or_deleted(place: Place) -> None:
    await _fill(place)
    for statement in (
        "UPDATE events SET kind = 'RECONCILED' WHERE seq = 5",
        "DELETE FROM events WHERE seq = 1",
        "UPDATE checkpoints SET hash = 'x' WHERE seq = 1",
        "DELETE FROM checkpoints WHERE seq = 1",
    ):
        _refused(place, statement)
    if place.kind == "postgresql":
        for statement in (
            "TRUNCATE events CASCADE",
            "UPDATE results SET sha256 = 'f00d'",
            "DELETE FROM results",
        ):
            _refused(place, statement)
    assert _verify(place).ok


async def test_a_row_that_does_not_extend_the_chain_is_refused(place: Place) -> None:
    await _fill(place)
    with place.reader() as r:
        seq, head = r.head()
    row = "1.0, 'x', NULL, 'ACTION_ACCEPTED', 'transport_observed', NULL, NULL, '{}'"
    for bad_seq, prev in ((seq + 2, head), (seq + 1, "0" * 64), (seq, head)):
        with pytest.raises(Exception, match=r"extend|UNIQUE|duplicate") as info:
            place.write(
                "INSERT INTO events (seq, at, invocation_id, session_id, kind, source, observer, "
                "observer_seq, attrs, payload, audit, prev_hash, hash) VALUES ("
                + f"{bad_seq}, {row}, NULL, NULL, '{prev}', 'h')"
            )
        assert "Journal" not in type(info.value).__name__
    assert _verify(place).count == seq


async def test_two_writers_extend_one_chain_with_one_monotonic_seq(place: Place) -> None:
    """Two writers (two brokers on a database; two embedded processes' worth on a file) append
    concurrently: every seq is taken once, in one order, and the chain and every checkpoint
    verify."""
    async with place.open() as a, place.open() as b:

        async def run(j: object, prefix: str) -> None:
            for n in range(15):
                for ev in happy(f"{prefix}-{n}"):
                    await j.append(ev, barrier=True)  # type: ignore[attr-defined]

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, a, "a")
                nursery.start_soon(run, b, "b")
    seqs = [r[0] for r in place.rows("SELECT seq FROM events ORDER BY seq")]
    assert seqs == list(range(1, 2 * 15 * 7 + 1))
    report = _verify(place)
    assert report.ok and report.signed_seq == len(seqs)


async def test_an_edited_row_is_found_at_its_seq(place: Place) -> None:
    await _fill(place)
    place.tamper('UPDATE events SET attrs = \'{"code":"forged"}\' WHERE seq = 3')
    report = _verify(place)
    assert (report.ok, report.first_bad_seq) == (False, 3)
    assert "altered" in report.reason


async def test_a_forged_row_appended_with_a_correct_hash_is_caught_by_the_signatures(
    place: Place,
) -> None:
    """Someone with write access appends a RECONCILED row that turns the unknown invocation
    into a known one, with a hash that extends the chain: the chain alone accepts it, the
    signed checkpoints do not -- and no broker will sign over it."""
    await _fill(place)
    with place.reader() as r:
        seq, head = r.head()
        assert r.verify(accept_unsigned=False).ok
    attrs = '{"outcome":"rejected","source":"operator_attested"}'
    h = row_hash(head, seq + 1, 2.0, "inv-u", "sess-1", "RECONCILED", "operator_attested", None,
                 None, attrs, None, None)  # fmt: skip
    place.tamper(
        "INSERT INTO events (seq, at, invocation_id, session_id, kind, source, observer, "
        "observer_seq, attrs, payload, audit, prev_hash, hash) VALUES "
        f"({seq + 1}, 2.0, 'inv-u', 'sess-1', 'RECONCILED', 'operator_attested', NULL, NULL, "
        f"'{attrs}', NULL, NULL, '{head}', '{h}')"
    )
    report = _verify(place)
    assert (report.ok, report.first_bad_seq) == (False, seq + 1)
    assert "not covered by a signed checkpoint" in report.reason
    with pytest.raises(JournalError, match="not covered by a valid signed checkpoint"):
        async with place.open():
            pass


async def test_an_anchor_catches_a_tail_cut_back_to_a_checkpoint(
    place: Place, tmp_path: object
) -> None:
    await _fill(place)
    with place.reader() as r:
        report, anchor = r.anchor(SigningKey.load(place.signing_key).public_raw)
        assert report.ok and anchor is not None
        cut = anchor.checkpoint.seq - 7  # inv-z's transactions, and their checkpoints
    path = place.key_file.parent / "anchor.json"
    import json

    path.write_text(json.dumps(anchor.to_json()))
    place.tamper(
        f"DELETE FROM events WHERE seq > {cut}", f"DELETE FROM checkpoints WHERE seq > {cut}"
    )
    assert _verify(place).ok  # shorter, and every row still signed
    with place.reader() as r:
        cut_report = r.verify(anchor=load_anchor(path))
    assert (cut_report.ok, cut_report.first_bad_seq) == (False, cut + 1)
    assert "before the anchor" in cut_report.reason


async def test_a_corrupted_result_chunk_is_caught_without_the_broker_key(place: Place) -> None:
    result_seq = await _fill(place)
    place.tamper(
        f"UPDATE result_chunks SET data = {place.blob(b'forged')} WHERE invocation_id = 'inv-r' "
        "AND idx = 1"
    )
    place.key_file.unlink()  # verify needs no secret key
    report = _verify(place)
    assert (report.ok, report.first_bad_seq) == (False, result_seq)
    assert "chunk 1 differs" in report.reason


_MISPLACED = {
    # inv-r's marker moved past the journal's end; a copy of it given to inv-z, whose result
    # was never stored (so no RESULT_COMMITTED): (statement, what PostgreSQL's owner meets,
    # invocation named, seq reported -- 0: inv-r's RESULT_COMMITTED; -1: the journal's end,
    # its last row + 1, never a seq the journal does not have).
    "past the end": (
        "UPDATE results SET seq = 999999 WHERE invocation_id = 'inv-r'",
        "append-only",
        "inv-r",
        0,
    ),
    "of no result": (
        "INSERT INTO results SELECT 'inv-z', 999998, sha256, streams, summary FROM results "
        "WHERE invocation_id = 'inv-r'",
        "foreign key",
        "inv-z",
        -1,
    ),
}


@pytest.mark.parametrize("edit", sorted(_MISPLACED))
async def test_a_results_row_naming_a_seq_that_is_not_its_event_is_caught(
    place: Place, edit: str
) -> None:
    """A results row naming a seq past the journal's end is caught at its invocation's
    RESULT_COMMITTED, or -- when it has none -- at the journal's end.  PostgreSQL's foreign key
    refuses such a row to the owner; a superuser with triggers off (which turns foreign keys off
    too) or anyone writing a SQLite file gets it in, and verify is what tells."""
    result_seq = await _fill(place)
    rows = _verify(place).count
    statement, refusal, iid, at = _MISPLACED[edit]
    at = {0: result_seq, -1: rows + 1}[at]
    if place.kind == "postgresql":
        with pytest.raises(Exception, match=refusal) as info:
            place.write(statement)
        assert "Journal" not in type(info.value).__name__
        assert _verify(place).ok
    place.tamper(statement)
    report = _verify(place)
    assert (report.ok, report.first_bad_seq, report.count) == (False, at, at - 1), report
    assert f"results row of invocation {iid} names seq" in report.reason
