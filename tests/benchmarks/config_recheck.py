"""What the dispatch gate's re-check of the config file (``ConfigSnapshot.changed``) costs a call,
its last read settled, in one run: the stat on the event loop (before rvfix50b F3), the stat in
a file thread at every gate (``RESTAT_NS`` 0), and now -- the stat in a file thread at most once
per ``RESTAT_NS`` (20 ms).  Each the median of ``--rounds`` rounds of ``--calls`` gates, back to
back and -- as calls at concurrency 1 come, about a millisecond apart -- with ``--gap`` ms
between gates (only the gate's own time counted).

    .venv/bin/python tests/benchmarks/config_recheck.py [--calls N] [--rounds R] [--gap MS]

A script, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).parents[2]))
import affidavit.engine.snapshot as snapshot
from affidavit.config import load_config
from tests.broker.helpers import http_target, write_config

HOW = ("loop", "every", "now")


async def _gate(snap: snapshot.ConfigSnapshot, bound: str, how: str) -> None:
    if how == "loop":  # as before: the stat on the loop, the thread only for a read
        seen = snap._seen
        assert seen is not None and seen.settled
        assert seen.key == snapshot._stat_key(snap.config.path)  # type: ignore[arg-type]
        return
    snapshot.RESTAT_NS = 0 if how == "every" else RESTAT_NS
    await snap.changed("api", bound)


async def _round(
    snap: snapshot.ConfigSnapshot, bound: str, calls: int, how: str, gap: float
) -> float:
    spent = 0.0
    for _ in range(calls):
        began = time.perf_counter()
        await _gate(snap, bound, how)
        spent += time.perf_counter() - began
        if gap:
            await trio.sleep(gap)
    return spent / calls


RESTAT_NS = snapshot.RESTAT_NS


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gap", type=float, default=1.0, help="ms between gates (0: back to back)")
    args = ap.parse_args()
    snapshot.SETTLED_NS = -(10**18)  # the file's read counts as settled: the steady state
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(write_config(Path(tmp), {"api": http_target("http://127.0.0.1:9/")}))
        snap = snapshot.ConfigSnapshot(cfg, lambda label, data: label + data.hex())
        bound = snap.hash(cfg.targets["api"])
        times: dict[tuple[str, float], list[float]] = {}

        async def run() -> None:
            await snap.changed("api", bound)  # read and kept
            for _ in range(args.rounds):
                for gap in (0.0, args.gap / 1000):
                    calls = args.calls if not gap else max(1, args.calls // 10)
                    for how in HOW:
                        t = await _round(snap, bound, calls, how, gap)
                        times.setdefault((how, gap), []).append(t)

        trio.run(run)
    print(f"{'':>16} {'stat on the loop':>18} {'thread every gate':>18} {'now (RESTAT_NS)':>18}")
    for gap in sorted({g for _h, g in times}):
        row = [statistics.median(times[(how, gap)]) * 1e6 for how in HOW]
        label = "back to back" if not gap else f"{gap * 1000:g} ms apart"
        print(f"{label:>16} " + " ".join(f"{v:>15.1f} us" for v in row))
        print(f"{'ratio':>16} " + " ".join(f"{v / row[0]:>17.1f}x" for v in row))


if __name__ == "__main__":
    main()
