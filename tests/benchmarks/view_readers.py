"""Per-view latency of a record view (``GET /v1/invocations/{id}``'s read: the record and its
events) with a reader opened per view (before: ``JournalReader.open`` each time) and with the
broker's idle readers (now: ``ViewReaders``), on PostgreSQL and on SQLite, side by side in one
run.

    .venv/bin/python tests/benchmarks/view_readers.py [--views N] [--rounds R]

One PostgreSQL server started for the run (``tests/postgres.py``) on loopback, one SQLite file;
each journal holds 50 invocations.  Each round times ``--views`` sequential views per setup,
the order alternated so drift hits both alike.  Printed: the median and p90 per view in ms and
the ratio.  A script, not a test: it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from affidavit.api.readers import ViewReaders  # noqa: E402
from affidavit.journal import Journal, JournalReader  # noqa: E402
from tests.journal.helpers import happy  # noqa: E402
from tests.postgres import running_cluster  # noqa: E402

INVOCATIONS = 50


async def _fill(location: str, tmp: Path) -> None:
    async with Journal.open(location, key_file=tmp / "k.key", signing_key=tmp / "k.sk") as j:
        for n in range(INVOCATIONS):
            for ev in happy(f"act_{n}"):
                await j.append(ev)


def _view(reader: JournalReader, n: int) -> None:
    iid = f"act_{n % INVOCATIONS}"
    assert reader.record(iid) is not None and reader.events(iid)


def _opened(location: str, key: Path) -> Callable[[int], None]:
    def one(n: int) -> None:
        with JournalReader.open(location, key_file=key) as reader:
            _view(reader, n)

    return one


def _pooled(readers: ViewReaders) -> Callable[[int], None]:
    def one(n: int) -> None:
        reader = readers.take()
        _view(reader, n)
        readers.give_back(reader, 4)

    return one


def _time(one: Callable[[int], None], views: int) -> list[float]:
    out = []
    for n in range(views):
        start = time.perf_counter()
        one(n)
        out.append(time.perf_counter() - start)
    return out


def _bench(name: str, location: str, tmp: Path, views: int, rounds: int) -> None:
    trio.run(_fill, location, tmp)
    readers = ViewReaders(location, tmp / "k.key")
    setups = {"opened per view": _opened(location, tmp / "k.key"), "reused": _pooled(readers)}
    got: dict[str, list[float]] = {k: [] for k in setups}
    for r in range(rounds):
        order = list(setups) if r % 2 == 0 else list(reversed(setups))
        for key in order:
            got[key] += _time(setups[key], views)
    readers.close()
    print(f"{name}: {views * rounds} record views each")
    med = {}
    for key, times in got.items():
        ms = sorted(t * 1000 for t in times)
        med[key] = statistics.median(ms)
        print(f"  {key:16} median {med[key]:7.3f} ms   p90 {ms[int(len(ms) * 0.9)]:7.3f} ms")
    print(f"  opened/reused: {med['opened per view'] / med['reused']:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--views", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "pg").mkdir()
        (tmp / "lite").mkdir()
        with running_cluster() as pg:
            _bench("PostgreSQL", pg.database(), tmp / "pg", args.views, args.rounds)
        _bench("SQLite", str(tmp / "lite" / "j.db"), tmp / "lite", args.views, args.rounds)


if __name__ == "__main__":
    main()
