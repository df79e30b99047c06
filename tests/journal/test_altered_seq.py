"""An event row whose ``seq`` is not an integer reads as altered (``AlteredRow``: "its seq is not
a number"), never as an event that carries it.

SQLite's ``INTEGER PRIMARY KEY`` can hold only integers, so ``test_altered_rows.py`` cannot
store another seq; a shared journal's PostgreSQL column, altered by someone who owns the tables
(``ALTER COLUMN seq TYPE numeric``) hands back whatever that type decodes to -- a ``Decimal``,
a float.  The readers used to pass it on as the event's seq, into records, envelopes (``record
seq``, not JSON for a ``Decimal``) and the fold's order checks (text would compare with an
integer: a raw ``TypeError``).  Both readings of a row (``event_from_row``, and ``fold_events``
of the views) check it.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from affidavit.cli import main as cli_main
from affidavit.journal import Journal, JournalError, JournalReader
from affidavit.journal.rows import AlteredRow, event_from_row, fold_events
from tests.postgres import Cluster, argv_url

from .helpers import happy

NOT_INTEGERS = st.one_of(
    st.text(max_size=6),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
    st.binary(max_size=4),
    st.integers().map(Decimal),
)
"""Every seq a decoded column might carry but an integer (``True`` included: a bool is no seq)."""


def _row(seq: Any) -> tuple[Any, ...]:
    """An ``EVENT_READ_COLUMNS`` row, well-formed but for ``seq``."""
    return (seq, 1.5, "inv-1", "s", "REQUEST_SENT", "transport_observed", None, None, "{}")


def _fold_row(seq: Any) -> tuple[Any, ...]:
    """The same row as ``FOLD_COLUMNS`` (no session)."""
    row = _row(seq)
    return row[:3] + row[4:]


@given(seq=NOT_INTEGERS)
def test_a_row_whose_seq_is_not_an_integer_reads_as_altered(seq: Any) -> None:
    with pytest.raises(AlteredRow) as by_row:
        event_from_row(_row(seq))
    with pytest.raises(AlteredRow) as by_fold:
        next(fold_events([_fold_row(seq)]))
    assert str(by_row.value) == str(by_fold.value)
    assert str(by_row.value) == (
        "the event row at a seq that is not a number was altered: its seq is not a number"
    )


@given(seq=st.integers(1, 2**63 - 1))
def test_a_row_whose_seq_is_an_integer_reads(seq: int) -> None:
    assert event_from_row(_row(seq)).seq == seq
    assert next(fold_events([_fold_row(seq)])).seq == seq


@pytest.mark.parametrize("column_type", ["numeric", "double precision", "real"])
async def test_a_shared_journal_whose_seq_column_was_altered_reads_as_altered(
    pg: Cluster,
    pg_url: str,
    tmp_path: Path,
    column_type: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = {"key_file": tmp_path / "shared.key", "signing_key": tmp_path / "a.signing.key"}
    async with Journal.open(pg_url, **keys) as j:
        for ev in happy("inv-1"):
            await j.append(ev)
    database = pg_url.rsplit("/", 1)[1]
    pg.sql(f"ALTER TABLE events ALTER COLUMN seq TYPE {column_type}", database)
    with JournalReader.open(pg_url) as reader:
        for read in (
            lambda: reader.events("inv-1"),
            lambda: reader.record("inv-1"),
            reader.list_actions,
            lambda: list(reader.iter_actions()),
        ):
            with pytest.raises(JournalError, match="its seq is not a number") as info:
                read()
            assert pg.password not in str(info.value)
    capsys.readouterr()
    assert cli_main(["record", "inv-1", "--journal", argv_url(pg_url, monkeypatch)]) == 2
    err = capsys.readouterr().err
    assert "its seq is not a number" in err and err.count("\n") == 1, err
    assert "Traceback" not in err and pg.password not in err, err
