"""``JournalReader.verify_since`` (issue 15: the console's journal page ran a whole verify per
request): an intact report extended to the head by reading only the rows after the one it
reached -- reporting what a whole verify reports of those rows, on every backend, and
declining (None: a whole verify is due) when the journal is no longer the report's.  What it
does not read again -- a row before that point altered since -- only a whole verify finds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.journal import Journal, JournalError, VerifyReport
from affidavit.journal import reader_proofs as reader_module
from affidavit.journal.signing import SigningKey
from affidavit.journal.tables import Tables

from ..helpers import Ticking, fill_results, happy, interrupted
from .conftest import Place


def _fill(place: Place, iids: list[str], signing_key: Path | None = None) -> None:
    async def fill() -> None:
        key = signing_key or place.signing_key
        opened = Journal.open(
            place.location, key_file=place.key_file, signing_key=key, clock=Ticking()
        )
        async with opened as j:
            for iid in iids:
                for ev in interrupted(iid) if iid.endswith("x") else happy(iid):
                    await j.append(ev)

    trio.run(fill)


def _verify(place: Place) -> VerifyReport:
    with place.reader() as r:
        return r.verify()


def _since(place: Place, base: VerifyReport) -> tuple[VerifyReport | None, list[int]]:
    """The extension, and the first seq of each ``event_rows`` read it made."""
    read: list[int] = []
    real = Tables.event_rows

    def spy(t: Tables, first: int = 1, last: int | None = None) -> Any:
        read.append(first)
        return real(t, first, last)

    Tables.event_rows = spy  # type: ignore[method-assign]
    try:
        with place.reader() as r:
            return r.verify_since(base), read
    finally:
        Tables.event_rows = real  # type: ignore[method-assign]


def _same(a: VerifyReport, b: VerifyReport) -> tuple[Any, ...]:
    return (a.ok, a.count, a.first_bad_seq, a.head_hash, a.signed_seq, a.key_ids)


def test_an_extension_reads_only_the_new_rows_and_reports_what_a_whole_verify_does(
    place: Place,
) -> None:
    _fill(place, ["a", "b"])
    base = _verify(place)
    assert base.ok and base.count > 0
    same, read = _since(place, base)
    assert same is not None and _same(same, base) == _same(base, base) and read == [base.count + 1]
    _fill(place, ["c", "dx"])  # a broker restarted on the same journal appends
    ext, read = _since(place, base)
    whole = _verify(place)
    assert ext is not None and whole.ok and _same(ext, whole) == _same(whole, whole)
    assert read == [base.count + 1]  # the rows after the report's, no other


def test_a_row_altered_after_the_report_is_found_by_the_extension(place: Place) -> None:
    _fill(place, ["a"])
    base = _verify(place)
    _fill(place, ["b", "cx"])
    bad = base.count + 3
    place.tamper(f"UPDATE events SET attrs = '{{\"x\": 1}}' WHERE seq = {bad}")
    ext, _ = _since(place, base)
    whole = _verify(place)
    assert ext is not None and not ext.ok and ext.first_bad_seq == bad == whole.first_bad_seq
    assert ext.count == bad - 1 and ext.reason == whole.reason


def test_a_row_altered_before_the_report_is_found_by_a_whole_verify_only(place: Place) -> None:
    """Documented: the extension does not read the rows the report checked (the console's
    journal page says so, and its button runs the whole verify that finds it)."""
    _fill(place, ["a", "b"])
    base = _verify(place)
    place.tamper("UPDATE events SET attrs = '{\"x\": 1}' WHERE seq = 2")
    ext, _ = _since(place, base)
    assert ext is not None and ext.ok
    whole = _verify(place)
    assert not whole.ok and whole.first_bad_seq == 2


def test_a_journal_that_is_not_the_reports_any_more_is_not_extended(
    place: Place, tmp_path: Path
) -> None:
    _fill(place, ["a", "b"])
    base = _verify(place)
    # Re-chained at the row the report reached (or replaced): its hash is another.
    place.tamper(f"UPDATE events SET hash = '{'0' * 64}' WHERE seq = {base.count}")
    assert _since(place, base)[0] is None
    # Broken reports are not extended; nor one checked with keys the journal does not record.
    assert _since(place, _verify(place))[0] is None


def test_another_signing_key_means_a_whole_verify(place: Place, tmp_path: Path) -> None:
    """Another broker of a shared journal (its own signing key) appended: the recorded keys
    changed, the report was checked with others -- not extended.  (A SQLite journal has one
    broker: another key is refused, the case cannot arise.)"""
    _fill(place, ["a"])
    base = _verify(place)
    SigningKey.create(tmp_path / "other.signing.key")
    if place.cluster is None:
        with pytest.raises(JournalError, match="does not match journal"):
            _fill(place, ["b"], signing_key=tmp_path / "other.signing.key")
        return
    _fill(place, ["b"], signing_key=tmp_path / "other.signing.key")
    assert _since(place, base)[0] is None
    assert _verify(place).ok


def test_rows_appended_without_a_checkpoint_are_reported_unsigned(place: Place) -> None:
    _fill(place, ["a"])
    base = _verify(place)
    _fill(place, ["b"])
    last = place.rows("SELECT max(seq) FROM checkpoints")[0][0]
    place.tamper(f"DELETE FROM checkpoints WHERE seq = {last}")
    ext, _ = _since(place, base)
    whole = _verify(place)
    assert ext is not None and not ext.ok and not whole.ok
    assert ext.first_bad_seq == whole.first_bad_seq and "not covered" in ext.reason


def test_a_broker_joining_between_the_key_read_and_the_rows_is_not_reported_broken(
    pg: Any, tmp_path: Path
) -> None:
    """A shared journal: another broker records its key and appends a checkpoint it signed
    while an extension (a whole verify, an anchor) runs.  The keys and the rows are read in one
    snapshot -- either both or neither: never a checkpoint signed by a key read as unrecorded,
    which it would report BROKEN (an intact journal said tampered)."""
    place = Place(
        "postgresql",
        pg.database(),
        tmp_path / "journal.key",
        tmp_path / "journal.signing.key",
        cluster=pg,
    )
    _fill(place, ["a"])
    base = _verify(place)
    real = reader_module.recorded_keys
    joined: list[int] = []
    done: list[int] = []

    def then_join(t: Tables) -> dict[str, bytes]:
        keys = real(t)
        if not joined:  # once, right after the extension read the keys
            joined.append(1)
            key = tmp_path / f"other{len(done)}.signing.key"  # a broker new each time
            SigningKey.create(key)
            _fill(place, [f"b{len(done)}"], signing_key=key)
            done.append(1)
        return keys

    joined.append(0)  # (not while a reader opens)
    reader_module.recorded_keys = then_join  # type: ignore[assignment]
    try:
        with place.reader() as r:
            joined.clear()
            ext = r.verify_since(base)
        assert joined
        assert ext is None or ext.ok, ext
        _fill(place, ["c"])
        with place.reader() as r:
            joined.clear()  # the whole verify reads them as it: another broker joins again
            whole = r.verify()
        assert joined and whole.ok, whole
        with place.reader() as r:
            joined.clear()  # and an anchor, taken with the keys the journal records
            report, anchor = r.anchor()
        assert joined and report.ok and anchor is not None, report
    finally:
        reader_module.recorded_keys = real
    assert _verify(place).ok


def test_a_result_the_new_rows_commit_is_checked_as_a_whole_verify_checks_it(
    place: Place,
) -> None:
    """The results committed after the report are checked against their chained hashes by the
    extension (counted in ``results``); one altered -- its marker, a chunk, or removed -- is
    reported at its RESULT_COMMITTED, as a whole verify reports it."""
    _fill(place, ["a"])
    base = _verify(place)

    async def more() -> int:
        async with Journal.open(
            place.location, key_file=place.key_file, signing_key=place.signing_key,
            clock=Ticking(),
        ) as j:  # fmt: skip
            return await fill_results(j, b"x" * 70_000)

    seq = trio.run(more)
    ext, _ = _since(place, base)
    assert ext is not None and ext.ok and ext.results == base.results + 1 == _verify(place).results
    for tamper in (
        "DELETE FROM result_chunks WHERE idx = 1",  # (70 000 bytes: two chunks)
        "UPDATE results SET sha256 = '" + "0" * 64 + "'",
        "DELETE FROM results",
    ):
        place.tamper(tamper)
        ext, _ = _since(place, base)
        whole = _verify(place)
        assert ext is not None and not ext.ok and not whole.ok
        assert ext.first_bad_seq == whole.first_bad_seq == seq, (ext, whole)
        assert ext.reason == whole.reason
