"""SQLite's ``events_extend_chain``: one lookup of the last row per insert (issue 15: it runs
once per row in the single writer), refusing exactly what the triggers journals from before
hold refused (the two-lookup one, and schema 7's beside ``events_first_of_invocation``) -- and
a writer opening such a journal replaces them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import trio

from affidavit.journal import Journal, JournalReader
from affidavit.journal.chain import GENESIS
from affidavit.journal.sqlite import _EXTEND_CHAIN_BEFORE, EXTEND_CHAIN, SCHEMA, _split_sql
from affidavit.journal.sqlite_schema import _EXTEND_CHAIN_7, _FIRST_OF_INVOCATION_7

from .helpers import happy

_INSERT = f"INSERT INTO events VALUES ({','.join('?' * 13)})"
_REFUSED = "journal rows must extend the hash chain by one"


_SCHEMAS = {
    "before": (_EXTEND_CHAIN_BEFORE, _FIRST_OF_INVOCATION_7),  # two lookups (schemas 3-6)
    "7": (_EXTEND_CHAIN_7, _FIRST_OF_INVOCATION_7),
    "8": (),  # SCHEMA's own
}


def _db(schema: str) -> sqlite3.Connection:
    """An in-memory journal with the insert triggers of ``schema``."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    for stmt in _split_sql(SCHEMA):
        conn.execute(stmt)
    if _SCHEMAS[schema]:
        conn.execute("DROP TRIGGER events_extend_chain")
        for trigger in _SCHEMAS[schema]:
            conn.execute(trigger)
    return conn


def _row(
    seq: int | None, prev: str | None, h: str, iid: str = "act_1", kind: str = "ACTION_ACCEPTED"
) -> tuple[object, ...]:
    return (seq, 1.7e9, iid, None, kind, "broker", None, None, "{}", None, None, prev, h)


def _try(conn: sqlite3.Connection, row: tuple[object, ...]) -> str:
    try:
        conn.execute(_INSERT, row)
    except sqlite3.IntegrityError as exc:
        return str(exc)
    return "inserted"


# (rows already there, the candidate): seq, prev_hash.
_CASES = [
    ([], (1, GENESIS)),
    ([], (2, GENESIS)),
    ([], (0, GENESIS)),
    ([], (None, GENESIS)),
    ([], (1, "a" * 64)),
    ([], (1, None)),
    ([(1, GENESIS, "h1")], (2, "h1")),
    ([(1, GENESIS, "h1")], (2, GENESIS)),
    ([(1, GENESIS, "h1")], (3, "h1")),
    ([(1, GENESIS, "h1")], (1, GENESIS)),
    ([(1, GENESIS, "h1")], (None, "h1")),
    ([(1, GENESIS, "h1")], (2, None)),
    ([(1, GENESIS, "h1")], ("2", "h1")),
    ([(1, GENESIS, "h1"), (2, "h1", "h2")], (3, "h2")),
    ([(1, GENESIS, "h1"), (2, "h1", "h2")], (3, "h1")),
    ([(1, GENESIS, "h1"), (2, "h1", "h2")], (2, "h1")),
    ([(1, GENESIS, "h1"), (2, "h1", "h2")], (4, "h2")),
]


@pytest.mark.parametrize(("before", "candidate"), _CASES)
def test_the_trigger_refuses_exactly_what_the_one_from_before_refused(
    before: list[tuple[int, str, str]], candidate: tuple[object, str | None]
) -> None:
    answers = []
    for schema in _SCHEMAS:
        conn = _db(schema)
        for seq, prev, h in before:
            assert _try(conn, _row(seq, prev, h)) == "inserted"
        answers.append(_try(conn, _row(candidate[0], candidate[1], "new")))  # type: ignore[arg-type]
        # A refused row leaves no ``invocations`` row behind (the RAISE rolls the statement
        # back, the trigger's insert with it).
        assert conn.execute("SELECT first_seq FROM invocations").fetchall() == (
            [(1,)] if before or answers[-1] == "inserted" else []
        ), schema
        conn.close()
    assert len(set(answers)) == 1
    assert answers[0] in ("inserted", _REFUSED, "NOT NULL constraint failed: events.prev_hash")


def _opcodes_per_insert(schema: str, rows: int = 210) -> float:
    """SQLite VM instructions per chained insert, the triggers' included (the progress handler
    counts those of a trigger's sub-program too): invocations of 7 events, as the writer
    appends them (ACTION_ACCEPTED first)."""
    conn = _db(schema)
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    prev = GENESIS
    conn.execute("BEGIN")
    conn.set_progress_handler(count, 1)
    for seq in range(1, rows + 1):
        kind = "ACTION_ACCEPTED" if seq % 7 == 1 else "REQUEST_SENT"
        conn.execute(_INSERT, _row(seq, prev, f"h{seq}", f"i{(seq - 1) // 7}", kind))
        prev = f"h{seq}"
    conn.set_progress_handler(None, 1)
    conn.execute("COMMIT")
    assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == rows
    assert conn.execute("SELECT count(*) FROM invocations").fetchone()[0] == rows // 7
    conn.close()
    return steps / rows


def test_the_insert_trigger_costs_fewer_vm_steps_per_row_than_the_ones_from_before() -> None:
    steps = {schema: _opcodes_per_insert(schema) for schema in _SCHEMAS}
    assert steps["8"] < steps["7"] < steps["before"], steps


def _trigger_sql(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        sql = "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = ?"
        return str(conn.execute(sql, ("events_extend_chain",)).fetchone()[0])
    finally:
        conn.close()


def test_a_writer_opening_a_journal_from_before_replaces_its_chain_trigger(tmp_path: Path) -> None:
    path = tmp_path / "j.db"

    async def write(events: int) -> None:
        async with Journal.open(path) as j:
            for event in happy(f"i{events}")[:events]:
                await j.append(event)

    trio.run(write, 3)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP TRIGGER events_extend_chain")
    conn.execute(_EXTEND_CHAIN_BEFORE)
    conn.close()
    assert _trigger_sql(path) == _EXTEND_CHAIN_BEFORE
    trio.run(write, 4)
    stored = EXTEND_CHAIN.replace(" IF NOT EXISTS", "", 1).rstrip(";")
    assert _trigger_sql(path) == stored
    with JournalReader.open(path) as r:
        report = r.verify()
    assert report.ok and report.count == 7


def test_a_trigger_someone_else_defined_is_left_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    other = (
        "CREATE TRIGGER events_extend_chain BEFORE INSERT ON events WHEN NEW.seq < 1 "
        "BEGIN SELECT RAISE(ABORT, 'no'); END"
    )

    async def write(iid: str) -> None:
        async with Journal.open(path) as j:
            await j.append(happy(iid)[0])

    trio.run(write, "a")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP TRIGGER events_extend_chain")
    conn.execute(other)
    conn.close()
    trio.run(write, "b")
    assert _trigger_sql(path) == other
