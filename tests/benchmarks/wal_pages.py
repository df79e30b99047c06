"""WAL frames per journal commit, by B-tree: what each barrier of a sequential call writes.

    .venv/bin/python tests/benchmarks/wal_pages.py [--calls N] [--dir DIR] [--ab SRC]

The broker (``Broker.open``, SQLite journal on disk) calls the loopback h11 server of
``http_overhead.py`` ``--calls`` times, one after the other.  Around each writer ``COMMIT`` the
script reads, inside the transaction, the event kinds it adds and which B-tree owns each page
(the ``dbstat`` virtual table; page 1 is ``sqlite_schema``, a page no B-tree owns is counted as
``(free)``), and after it the frame headers SQLite appended to the ``-wal`` for it (page
number, and the commit frame's database size).  A commit is named by its event kinds; per name
the table gives the median over the calls of its frames per B-tree, and of its total.  Frame
counts do not depend on the machine's load: a change's before and after compare exactly
(``--ab SRC``: the broker imported from another checkout, ``http_overhead.py --ab``).

It wraps private functions of this tree (the SQLite backend's ``begin`` and ``commit``): a
script to read figures from, not a test (issue 15).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).parent))
import http_overhead
from http_clients import PATH

_WAL_HEADER = 32
_FRAME_HEADER = 24


class WalFrames:
    """The frames SQLite appended to one ``-wal`` since the last look: a WAL started over (new
    salts) is read from its start again; a frame with other salts ends the valid ones."""

    def __init__(self, wal: Path) -> None:
        self.wal = wal
        self.salts = b""
        self.end = _WAL_HEADER

    def committed(self) -> list[tuple[int, int]]:
        """Each valid frame appended since the last call, as (page number, commit size)."""
        with open(self.wal, "rb") as f:
            head = f.read(_WAL_HEADER)
            if len(head) < _WAL_HEADER:
                return []
            page_size = struct.unpack(">I", head[8:12])[0]
            salts = head[16:24]
            if salts != self.salts:
                self.salts, self.end = salts, _WAL_HEADER
            f.seek(self.end)
            data = f.read()
        frames = []
        step = _FRAME_HEADER + page_size
        pos = 0
        while pos + step <= len(data):
            pgno, size = struct.unpack(">II", data[pos : pos + 8])
            if data[pos + 8 : pos + 16] != salts:
                break
            frames.append((pgno, size))
            pos += step
        self.end += pos
        return frames


class Recorder:
    """Per commit: its event kinds, whether it was a barrier, and its frames' B-trees."""

    def __init__(self) -> None:
        self.on = False
        self.barrier = False
        self.seq = 0
        self.kinds: list[str] = []
        self.owners: dict[int, str] = {}
        self.wal: WalFrames | None = None
        self.calls: list[list[tuple[str, collections.Counter[str]]]] = []

    def install(self) -> None:
        from affidavit.journal import sqlite

        begin, commit = sqlite.SqliteBackend.begin, sqlite.SqliteBackend.commit
        rec = self

        def begin_marked(self: Any, conn: Any, *, barrier: bool, **k: Any) -> str:
            rec.barrier = barrier
            return begin(self, conn, barrier=barrier, **k)

        def commit_marked(self: Any, conn: Any) -> None:
            if rec.on:
                rec.before(conn, self.file)
            commit(self, conn)
            if rec.on:
                rec.after()

        sqlite.SqliteBackend.begin = begin_marked  # type: ignore[method-assign]
        sqlite.SqliteBackend.commit = commit_marked  # type: ignore[method-assign]

    def start(self, conn_file: Path) -> None:
        self.on = True
        self.wal = WalFrames(Path(f"{conn_file}-wal"))
        self.wal.committed()  # (what the warm-up wrote)

    def before(self, conn: Any, path: Path) -> None:
        rows = conn.execute("SELECT seq, kind FROM events WHERE seq > ? ORDER BY seq", (self.seq,))
        self.kinds = []
        for seq, kind in rows.fetchall():
            self.seq = seq
            self.kinds.append(kind)
        self.owners = dict(conn.execute("SELECT pageno, name FROM dbstat").fetchall())

    def after(self) -> None:
        assert self.wal is not None
        frames = self.wal.committed()
        by_tree = collections.Counter(self.owners.get(p, "(free)") for p, _ in frames)
        name = "+".join(dict.fromkeys(self.kinds)) or "(no event)"
        if not self.barrier:
            name += " [no barrier]"
        self.calls[-1].append((name, by_tree))


def report(calls: list[list[tuple[str, collections.Counter[str]]]]) -> None:
    shapes = collections.Counter(tuple(name for name, _ in c) for c in calls)
    usual = shapes.most_common(1)[0][0]
    kept = [c for c in calls if tuple(name for name, _ in c) == usual]
    print(f"{len(kept)}/{len(calls)} calls committed the usual way: {len(usual)} commits")
    total = [sum(sum(t.values()) for _, t in c) for c in kept]
    print(f"frames per call: median {statistics.median(total)}, mean {statistics.mean(total):.2f}")
    for i, name in enumerate(usual):
        trees = sorted({tree for c in kept for tree in c[i][1]})
        sums = [sum(c[i][1].values()) for c in kept]
        print(f"\n### commit {i + 1}: {name}")
        print(f"frames: median {statistics.median(sums)}, mean {statistics.mean(sums):.2f}")
        print("| B-tree | median | mean | max |")
        print("|---|---|---|---|")
        for tree in trees:
            n = [c[i][1][tree] for c in kept]
            print(f"| {tree} | {statistics.median(n)} | {statistics.mean(n):.2f} | {max(n)} |")


async def run(port: int, tmp: Path, calls: int, rec: Recorder) -> None:
    from affidavit.api.broker import Broker
    from affidavit.config import load_config

    cfg = tmp / "affidavit.toml"
    cfg.write_text(http_overhead._config(tmp, port), encoding="utf-8")
    action = {"target": "api", "method": "GET", "path": PATH}
    async with Broker.open(config=load_config(cfg)) as broker:
        for _ in range(http_overhead.WARM_UP):
            await broker.call(action)
        rec.start(tmp / "bench.db")
        for _ in range(calls):
            rec.calls.append([])
            env = await broker.call(action)
            if "error" in env:
                raise RuntimeError(f"broker call failed: {env['error']}")
        rec.on = False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=200, help="sequential calls measured")
    parser.add_argument("--dir", type=Path, help="where the journal goes (default: a temp dir)")
    parser.add_argument("--ab", metavar="SRC", help="measure the broker of another checkout")
    args = parser.parse_args()
    if not 1 <= args.calls <= 100_000:
        parser.error("--calls must be within 1..100000")
    os.environ.setdefault(http_overhead.TOKEN_ENV, "bench-" + os.urandom(12).hex())
    if args.ab:
        http_overhead._use_source(Path(args.ab))
    rec = Recorder()
    rec.install()
    with (
        tempfile.TemporaryDirectory(prefix="affidavit-bench-", dir=args.dir) as d,
        http_overhead._server() as port,
    ):
        trio.run(run, port, Path(d), args.calls, rec)
    report(rec.calls)


if __name__ == "__main__":
    main()
