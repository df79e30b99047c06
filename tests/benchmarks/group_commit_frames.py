"""WAL frames per group commit, by B-tree: what one 64-row barrier transaction writes.

    .venv/bin/python tests/benchmarks/group_commit_frames.py [--tasks N] [--sessions 8,1,0]
                                                             [--seconds S] [--dir DIR] [--probe]

``journal_append.py``'s workload -- ``--tasks`` trio tasks each appending the 7 barrier events of
one invocation after another -- once per ``--sessions`` count: the invocations' ACTION_ACCEPTED
names one of that many sessions (``journal_append.py`` names 8; 0: no session, as a CLI, daemon
or library call), so every row of a session's invocation is an ``events_session`` entry.  After
each transaction the frames SQLite appended to the ``-wal`` for it are read from their headers
(``wal_pages.WalFrames``) and, at the end, each page's B-tree from ``dbstat`` (the journal only
appends: no page changes hands).  Frames do not depend on the machine's load, unlike the
COMMIT's fsync they make longer (``journal_append.py --ab`` shows that COMMIT's wall time), so a
change's before and after compare exactly.  ``--variants`` runs the 8-session workload again
on journals whose ``events_session`` is redefined before the writer opens them (``VARIANTS``:
what other definitions of that index would write; the queries are not changed, so only the
frames mean anything).  ``--probe`` then prices each median frame count on
this disk: raw ``sqlite3`` WAL ``synchronous=FULL`` commits of about that many pages, the counts
alternating in blocks (the disk's noise spread over all), median COMMIT wall time.  Issue 15.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).parent))
import journal_append as ja
from wal_pages import WalFrames

from affidavit.journal import Batch, Journal
from affidavit.statemachine import Event

VARIANTS = {
    "first events only": "CREATE INDEX events_session ON events (session_id, seq, "
    "invocation_id) WHERE session_id IS NOT NULL AND kind = 'ACTION_ACCEPTED'",
    "(session_id, seq)": "CREATE INDEX events_session ON events (session_id, seq) "
    "WHERE session_id IS NOT NULL",
}
"""Other definitions of ``events_session`` (``--variants``), measured for their frames only."""


async def _create(path: Path) -> None:
    async with Journal.open(path):
        pass


def _redefined(path: Path, ddl: str) -> None:
    """A new journal at ``path`` whose ``events_session`` is ``ddl``."""
    trio.run(_create, path)
    conn = sqlite3.connect(path)
    try:
        conn.execute("DROP INDEX events_session")
        conn.execute(ddl)
        conn.commit()
    finally:
        conn.close()


def _events(iid: str, sessions: int, n: int) -> list[Event]:
    """``journal_append._happy``'s events, the first naming session ``n % sessions`` (or none)."""
    events: list[Event] = ja._happy(iid)
    attrs = dict(events[0].attrs)
    attrs.pop("session")
    if sessions:
        attrs["session"] = f"s{n % sessions}"
    events[0] = Event(events[0].kind, iid, attrs)
    return events


async def _run(
    path: Path, tasks: int, sessions: int, seconds: float
) -> list[tuple[int, list[int]]]:
    """Each barrier transaction's writes and the pages of its frames, in commit order."""
    commits: list[tuple[int, list[int]]] = []
    async with Journal.open(path) as j:
        wal = WalFrames(Path(f"{path}-wal"))
        wal.committed()  # (what opening the journal wrote)

        @contextlib.contextmanager
        def frames(batch: Batch) -> Iterator[None]:
            try:
                yield
            finally:
                pages = [page for page, _ in wal.committed()]
                if batch.barrier and pages:
                    commits.append((batch.writes, pages))

        j.around_transaction = frames

        async def worker(w: int) -> None:
            n = 0
            deadline = trio.current_time() + seconds
            while trio.current_time() < deadline:
                for ev in _events(ja.engine_id(w, n), sessions, w * 100_003 + n):
                    await j.append(ev, barrier=True)
                n += 1

        async with trio.open_nursery() as nursery:
            for w in range(tasks):
                nursery.start_soon(worker, w)
    return commits


def _probe(base: Path, counts: list[int], blocks: int = 30, per_block: int = 10) -> None:
    """Median wall time of a raw WAL ``synchronous=FULL`` COMMIT of ~``n`` pages (one row of
    ``n - 2`` pages of blob: its overflow pages, its leaf, page 1), for each ``n``."""
    conn = sqlite3.connect(base / "probe.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, b BLOB)")
    took: dict[int, list[float]] = {n: [] for n in counts}
    for block in range(blocks):
        for n in counts if block % 2 == 0 else counts[::-1]:
            for _ in range(per_block):
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("INSERT INTO t (b) VALUES (?)", (os.urandom(max(n - 2, 0) * 4000),))
                t0 = time.perf_counter()
                conn.execute("COMMIT")
                took[n].append(time.perf_counter() - t0)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    conn.close()
    print(f"\nraw WAL FULL commits on this disk, {blocks * per_block} each, alternating:")
    for n in counts:
        q = statistics.quantiles(took[n])
        print(
            f"  ~{n:3} pages: COMMIT median {statistics.median(took[n]) * 1e3:.3f} ms "
            f"(quartiles {q[0] * 1e3:.3f}-{q[2] * 1e3:.3f})"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--sessions", default="8,1,0", help="session counts to measure, in turn")
    ap.add_argument("--seconds", type=float, default=2.0, help="per session count")
    ap.add_argument("--dir", default=None, help="where the journals go (default: tmp)")
    ap.add_argument("--variants", action="store_true", help="other events_session definitions")
    ap.add_argument("--probe", action="store_true", help="price the frame counts on this disk")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="affidavit-frames-", dir=args.dir))
    print(f"{args.tasks} tasks, 7 barrier appends an invocation; frames per barrier commit")
    medians = []
    runs: list[tuple[str, int, str | None]] = [
        (f"{n} session(s)", n, None) for n in (int(s) for s in args.sessions.split(","))
    ]
    if args.variants:
        runs += [(f"8 sessions, events_session {name}", 8, ddl) for name, ddl in VARIANTS.items()]
    for i, (label, sessions, ddl) in enumerate(runs):
        path = base / f"run{i}.db"
        if ddl is not None:
            _redefined(path, ddl)
        commits = trio.run(_run, path, args.tasks, sessions, args.seconds)
        with sqlite3.connect(path) as conn:
            owner = dict(conn.execute("SELECT pageno, name FROM dbstat").fetchall())
        owner[1] = "page 1 (sqlite_schema)"
        totals = [len(pages) for _, pages in commits]
        medians.append(round(statistics.median(totals)))
        trees: collections.Counter[str] = collections.Counter()
        for _, pages in commits:
            trees.update(owner.get(p, "(free)") for p in pages)
        print(
            f"\n{label}: {len(commits)} commits of "
            f"{statistics.mean(w for w, _ in commits):.1f} appends, frames median "
            f"{statistics.median(totals)}, mean {statistics.mean(totals):.2f}"
        )
        for tree, n in trees.most_common():
            print(f"  {tree:24} {n / len(commits):6.2f} a commit")
    if args.probe:
        _probe(base, sorted(set(medians)))


if __name__ == "__main__":
    main()
