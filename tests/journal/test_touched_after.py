"""``Tables.touched_after`` (the invocations another writer touched, and the sessions view's
update: ``journal/summary.py``) reads the rows after the seq -- not, as a DISTINCT made SQLite
do, every entry of ``events_invocation`` (O(journal) per request, issue 15)."""

from __future__ import annotations

from pathlib import Path

import trio

from affidavit.journal import Journal, JournalReader

from .helpers import Ticking, happy


def test_the_invocations_touched_after_a_seq_are_read_from_that_seq_on(tmp_path: Path) -> None:
    # (SQLite's plan: DISTINCT made it scan the whole of events_invocation, O(journal) per
    # request.)
    db = tmp_path / "j.db"

    async def fill() -> None:
        async with Journal.open(db, clock=Ticking()) as j:
            for ev in happy("inv-1", "alice"):
                await j.append(ev)

    trio.run(fill)
    with JournalReader.open(db) as r:
        statement = r.tables.SQL["touched_after"]
        plan = " ".join(
            str(row) for row in r.tables.conn.execute(f"EXPLAIN QUERY PLAN {statement}", (3,))
        )
        assert "SCAN" not in plan and "PRIMARY KEY" in plan, plan
        assert r.tables.touched_after(3) == {"inv-1"}
        assert r.tables.touched_after(7) == set()
