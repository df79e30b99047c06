"""What a connection pays on the event loop to know its CA file's trust, in one run: the stat
``TrustStore.resolve`` makes there when the last read is settled and unmoved (``held``, now),
beside the same stat sent through ``trio.to_thread.run_sync`` (the alternative: even the stat
off the loop), and beside a full read in a worker thread (a file just edited: read, hash,
parse).  Each the median of ``--rounds`` rounds of ``--calls`` lookups.

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
            await store.resolve(path)
        elif how == "thread":
            await trio.to_thread.run_sync(store.held, path)
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
        times: dict[str, list[float]] = {"loop": [], "thread": [], "read": []}

        async def run() -> None:
            for _ in range(args.rounds):
                for how in times:
                    calls = args.calls if how != "read" else max(1, args.calls // 10)
                    times[how].append(await _round(store, path, calls, how))

        trio.run(run)
    loop, thread, read = (statistics.median(times[k]) * 1e6 for k in ("loop", "thread", "read"))
    print(f"{'stat on the loop':>28} {'stat in a thread':>18} {'read in a thread':>18}")
    print(f"{loop:>25.1f} us {thread:>15.1f} us {read:>15.1f} us")
    print(f"{'ratio to the loop':>28} {thread / loop:>17.1f}x {read / loop:>17.1f}x")


if __name__ == "__main__":
    main()
