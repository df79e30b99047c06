"""SQLite's ``events_extend_chain``: one lookup of the last row per insert (issue 15: it runs
once per row in the single writer), refusing exactly what the two-lookup trigger journals from
before hold refused -- and a writer opening such a journal replaces that one."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import trio

from affidavit.journal import Journal, JournalReader
from affidavit.journal.chain import GENESIS
from affidavit.journal.sqlite import _EXTEND_CHAIN_BEFORE, EXTEND_CHAIN, SCHEMA, _split_sql

from .helpers import happy

_INSERT = f"INSERT INTO events VALUES ({','.join('?' * 13)})"
_REFUSED = "journal rows must extend the hash chain by one"


def _db(legacy: bool) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    for stmt in _split_sql(SCHEMA):
        conn.execute(stmt)
    if legacy:
        conn.execute("DROP TRIGGER events_extend_chain")
        conn.execute(_EXTEND_CHAIN_BEFORE)
    return conn


def _row(seq: int | None, prev: str | None, h: str) -> tuple[object, ...]:
    return (seq, 1.7e9, "act_1", None, "ACTION_ACCEPTED", "broker", None, None, "{}", None, None,
            prev, h)  # fmt: skip


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
    for legacy in (True, False):
        conn = _db(legacy)
        for seq, prev, h in before:
            assert _try(conn, _row(seq, prev, h)) == "inserted"
        answers.append(_try(conn, _row(candidate[0], candidate[1], "new")))  # type: ignore[arg-type]
        conn.close()
    assert answers[0] == answers[1]
    assert answers[0] in ("inserted", _REFUSED, "NOT NULL constraint failed: events.prev_hash")


def _opcodes_per_insert(legacy: bool, rows: int = 200) -> float:
    """SQLite VM instructions per chained insert, the trigger's included (the progress handler
    counts those of the trigger's sub-program too)."""
    conn = _db(legacy)
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    prev = GENESIS
    conn.execute("BEGIN")
    conn.set_progress_handler(count, 1)
    for seq in range(1, rows + 1):
        conn.execute(_INSERT, _row(seq, prev, f"h{seq}"))
        prev = f"h{seq}"
    conn.set_progress_handler(None, 1)
    conn.execute("COMMIT")
    assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == rows
    conn.close()
    return steps / rows


def test_the_chain_trigger_costs_fewer_vm_steps_per_row_than_the_one_from_before() -> None:
    assert _opcodes_per_insert(legacy=False) < _opcodes_per_insert(legacy=True)


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
