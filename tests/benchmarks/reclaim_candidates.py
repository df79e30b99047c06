"""The reclaim's candidate read (``Tables.unmarked_chunk_owners``, ``journal/reclaim.py``) over
a journal holding many committed chunk rows and a few uncommitted ones, the old way and the new,
each the median of ``--rounds``: the scan of every chunk row (``result_chunks`` and
``result_audit``, each against ``results``) before; the read of ``chunk_owners`` now.  Both must
answer the same invocations.

    .venv/bin/python tests/benchmarks/reclaim_candidates.py [--chunks N] [--size B] [--pg]

The rows are written directly (committed: a marker row per invocation, ten chunks each; five
invocations with two uncommitted chunks each and their ``chunk_owners`` row): the read is what
is measured, not how the rows came.  ``--pg``: on a PostgreSQL cluster made for the run
(``tests/postgres.py``).  A script, not a test.

``--segments`` (SQLite): the segment compaction's read instead (``SEGMENT_REFS``, one group of
``compact._GROUP`` segment names) over ``--chunks`` reference rows in ``result_segments``,
through its index (schema 7) and, the index dropped, by the scan it replaced -- timed, and
counted in SQLite VM steps (a progress handler called every step: load-independent).  Both
must answer the same rows.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402

from affidavit.journal import Journal  # noqa: E402
from affidavit.journal.backend import open_backend  # noqa: E402

OLD = (
    " UNION ".join(
        f"SELECT DISTINCT c.invocation_id FROM {t} c WHERE NOT EXISTS "
        "(SELECT 1 FROM results r WHERE r.invocation_id = c.invocation_id)"
        for t in ("result_chunks", "result_audit")
    )
    + " ORDER BY 1"
)
PER = 10
OPEN = [f"open-{n}" for n in range(5)]


def fill(conn: Any, chunks: int, size: int, ph: str) -> None:
    blob = bytes(size)
    rows = [(f"inv-{n:08d}", "body", i, blob) for n in range(chunks // PER) for i in range(PER)] + [
        (iid, "body", i, blob) for iid in OPEN for i in range(2)
    ]
    results = [(f"inv-{n:08d}", n + 1, "x", "{}", b"") for n in range(chunks // PER)]
    cur = conn.cursor()
    cur.executemany(f"INSERT INTO result_chunks VALUES ({ph},{ph},{ph},{ph})", rows)
    cur.executemany(f"INSERT INTO results VALUES ({ph},{ph},{ph},{ph},{ph})", results)
    cur.executemany(f"INSERT INTO chunk_owners VALUES ({ph})", [(i,) for i in OPEN])
    cur.close()


def timed(run: Any, rounds: int) -> tuple[float, list[str]]:
    times, answer = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        answer = run()
        times.append(time.perf_counter() - started)
    return statistics.median(times), answer


@contextlib.contextmanager
def place(pg: bool, tmp: Path) -> Iterator[str]:
    if not pg:
        yield str(tmp / "j.db")
        return
    from tests.postgres import running_cluster

    with running_cluster() as cluster:
        yield cluster.database()


def segment_refs(location: str, chunks: int, rounds: int) -> None:
    import sqlite3

    from affidavit.journal.compact import _GROUP
    from affidavit.journal.segment_tables import SEGMENT_REFS

    per = 100  # reference rows per segment (~6 MiB of 64 KiB chunks)
    names = [f"{n:032x}.seg" for n in range(chunks // per)]
    rows = [(f"inv-{n:08d}", 0, "body", n, names[n // per], n % per * 65552, 65552)
            for n in range(len(names) * per)]  # fmt: skip
    conn = sqlite3.connect(location, isolation_level=None)
    conn.execute("BEGIN")  # (autocommit: one transaction, not one fsync per row)
    conn.executemany("INSERT INTO result_segments VALUES (?,?,?,?,?,?,?)", rows)
    conn.execute("COMMIT")
    group = names[len(names) // 2 :][:_GROUP]
    sql, args = SEGMENT_REFS.format(",".join("?" * len(group))), tuple(group)

    def measured() -> tuple[float, int, list[Any]]:
        steps = [0]

        def step() -> int:
            steps[0] += 1
            return 0

        took, got = timed(lambda: sorted(conn.execute(sql, args).fetchall()), rounds)
        conn.set_progress_handler(step, 1)  # once, untimed: a call per step
        conn.execute(sql, args).fetchall()
        conn.set_progress_handler(None, 1)
        return took, steps[0], got

    after, after_steps, new = measured()
    plan = " ".join(str(r[-1]) for r in conn.execute("EXPLAIN QUERY PLAN " + sql, args))
    conn.execute("DROP INDEX result_segments_segment")
    before, before_steps, old = measured()
    conn.close()
    assert old == new and len(new) == len(group) * per, (len(old), len(new))
    print(
        f"sqlite: {len(rows)} reference rows in {len(names)} segments, the rows of {len(group)}: "
        f"scan {before * 1000:.2f} ms / {before_steps} VM steps, index {after * 1000:.2f} ms / "
        f"{after_steps} VM steps (median of {rounds}; plan: {plan})"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=256, help="bytes per chunk row")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pg", action="store_true")
    ap.add_argument("--segments", action="store_true", help="the segment compaction's read")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d, place(args.pg, Path(d)) as location:

        async def create() -> None:
            async with Journal.open(location, key_file=Path(d) / "k", signing_key=Path(d) / "s"):
                pass

        trio.run(create)
        if args.segments:
            segment_refs(location, args.chunks, args.rounds)
            return
        backend = open_backend(location)
        conn = backend.connect("tool")
        if args.pg:
            conn.execute("SET session_replication_role = replica")  # no FK to events here
            fill(conn, args.chunks, args.size, "%s")
            conn.execute("ANALYZE")
        else:
            import sqlite3

            w = sqlite3.connect(location)
            fill(w, args.chunks, args.size, "?")
            w.commit()
            w.close()
        tables = backend.tables(conn)
        before, old = timed(lambda: [r[0] for r in conn.execute(OLD)], args.rounds)
        after, new = timed(tables.unmarked_chunk_owners, args.rounds)
        backend.close(conn)
        assert old == new == OPEN, (old, new)
        print(
            f"{backend.kind}: {args.chunks} committed chunk rows ({args.size} B), "
            f"{len(OPEN)} uncommitted invocations: scan {before * 1000:.1f} ms, "
            f"chunk_owners {after * 1000:.3f} ms (median of {args.rounds})"
        )


if __name__ == "__main__":
    main()
