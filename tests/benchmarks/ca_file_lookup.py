"""What a connection pays to know its CA file's trust, in one run: the stat ``TrustStore.resolve``
made on the event loop when the last read is settled and unmoved (``held``, before rvfix50),
beside that stat in a thread of trio's default limiter (``to_thread.run_sync``, before rvfix50b),
beside ``resolve`` now -- that stat in a file thread (``adapters.filethread``: its own limiter,
one per path in flight; a stat on a hung network mount neither stalls the loop nor takes the
process's default threads) -- and beside a full read in a worker thread (a file just edited:
read, hash, parse).  Each the median of ``--rounds`` rounds of ``--calls`` lookups.

    .venv/bin/python tests/benchmarks/ca_file_lookup.py [--calls N] [--rounds R]

A script, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import trio
import trustme

from affidavit.adapters.http import trust


async def _round(store: trust.TrustStore, path: str, calls: int, how: str) -> float:
    began = time.perf_counter()
    for _ in range(calls):
        if how == "loop":
            store.held(path)
            await trio.lowlevel.checkpoint()
        elif how == "default":
            await trio.to_thread.run_sync(store.get, path, abandon_on_cancel=True)
        elif how == "thread":
            await store.resolve(path)
        else:
            await trio.to_thread.run_sync(trust.TrustStore().get, path)
    return (time.perf_counter() - began) / calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "ca.pem")
        trustme.CA().cert_pem.write_to_path(path)
        trust.SETTLED_NS = -(10**18)  # the file's read counts as settled: the steady state
        store = trust.TrustStore()
        store.get(path)
        times: dict[str, list[float]] = {"loop": [], "default": [], "thread": [], "read": []}

        async def run() -> None:
            for _ in range(args.rounds):
                for how in times:
                    calls = args.calls if how != "read" else max(1, args.calls // 10)
                    times[how].append(await _round(store, path, calls, how))

        trio.run(run)
    loop, default, thread, read = (
        statistics.median(times[k]) * 1e6 for k in ("loop", "default", "thread", "read")
    )
    print(
        f"{'stat on the loop (rvfix50)':>28} {'default thread':>18} {'resolve (now)':>18} "
        f"{'read in a thread':>18}"
    )
    print(f"{loop:>25.1f} us {default:>15.1f} us {thread:>15.1f} us {read:>15.1f} us")
    print(
        f"{'ratio to the loop':>28} {default / loop:>17.1f}x {thread / loop:>17.1f}x "
        f"{read / loop:>17.1f}x"
    )


if __name__ == "__main__":
    main()
