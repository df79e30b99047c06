"""``SqliteTables.insert_events`` writes a run of rows (issue 15 tried multi-row ``INSERT``s:
fewer instructions, more writer CPU time measured; reverted): whatever it runs, the tables must
hold exactly what one ``INSERT`` a row makes of the same rows -- events and the ``invocations``
the trigger derives, byte for byte -- and a run with a row that does not extend the chain must be
refused by the database itself, leaving nothing of the run.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.journal.chain import EVENT_COLUMNS, GENESIS
from affidavit.journal.sqlite import SCHEMA, SqliteTables, _split_sql

_ONE_ROW = f"INSERT INTO events ({EVENT_COLUMNS}) VALUES ({','.join('?' * 13)})"
_REFUSED = "journal rows must extend the hash chain by one"
_NULL = SqliteTables.NULL


def _db() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    for stmt in _split_sql(SCHEMA):
        conn.execute(stmt)
    return conn


def _rows(start: int, prev: str, specs: list[tuple[int, bool, bool]]) -> list[tuple[Any, ...]]:
    """Chained rows from seq ``start`` after ``prev``: each spec is (invocation, session or
    NULL, payload or NULL) -- NULL as the writer binds it (``SqliteTables.NULL``) or None."""
    rows = []
    for n, (inv, session, payload) in enumerate(specs):
        seq = start + n
        rows.append(
            (seq, 1.7e9 + seq / 7, f"act_{inv}", f"s{inv}" if session else _NULL,
             "REQUEST_SENT", "broker", None, _NULL, '{"k":"v\\u00e9"}',
             b"\x00sealed" if payload else _NULL, None, prev, f"h{seq}")
        )  # fmt: skip
        prev = f"h{seq}"
    return rows


def _dump(conn: sqlite3.Connection) -> tuple[list[Any], list[Any]]:
    events = conn.execute(
        "SELECT seq, quote(at), typeof(at), invocation_id, quote(session_id), kind, source, "
        "quote(observer), quote(observer_seq), attrs, quote(payload), quote(audit), prev_hash, "
        "hash FROM events ORDER BY seq"
    ).fetchall()
    firsts = conn.execute("SELECT first_seq, invocation_id FROM invocations ORDER BY 1").fetchall()
    return events, firsts


SPECS = st.lists(
    st.tuples(st.integers(0, 5), st.booleans(), st.booleans()), min_size=1, max_size=140
)


@settings(max_examples=60, deadline=None)
@given(runs=st.lists(SPECS, min_size=1, max_size=4))
def test_runs_store_what_one_insert_a_row_stored(runs: list[list[tuple[int, bool, bool]]]) -> None:
    ours, before = _db(), _db()
    tables = SqliteTables(ours)
    seq, prev = 1, GENESIS
    for specs in runs:
        rows = _rows(seq, prev, specs)
        tables.insert_events(rows)
        before.executemany(_ONE_ROW, rows)
        seq, prev = rows[-1][0] + 1, rows[-1][-1]
    assert _dump(ours) == _dump(before)
    ours.close()
    before.close()


@pytest.mark.parametrize(("bad", "length"), [(0, 5), (3, 5), (4, 5), (40, 64), (64, 70)])
@pytest.mark.parametrize("what", ["seq", "prev"])
def test_a_run_with_a_row_off_the_chain_is_refused_by_the_database(
    bad: int, length: int, what: str
) -> None:
    conn = _db()
    tables = SqliteTables(conn)
    tables.insert_events(_rows(1, GENESIS, [(0, False, False)]))
    rows = _rows(2, "h1", [(n % 4, False, False) for n in range(length)])
    row = list(rows[bad])
    if what == "seq":
        row[0] += 1
    else:
        row[11] = "h0"
    rows[bad] = tuple(row)
    conn.execute("BEGIN")
    with pytest.raises(sqlite3.IntegrityError, match=_REFUSED):
        tables.insert_events(rows)
    conn.execute("ROLLBACK")
    assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 1
    conn.close()
