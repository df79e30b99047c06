"""``affidavit actions --json`` over a large journal: wall time and peak RSS of the command.

    .venv/bin/python tests/benchmarks/actions_view.py [--events N] [--journal PATH]
                                                      [--rounds R] [--ab OLD_CHECKOUT]...
                                                      [--src NEW_CHECKOUT]

Builds (or reuses, with ``--journal``) a journal of about ``--events`` events: invocations of
the durable happy path and interrupted ones, written by 64 concurrent tasks so their events
interleave as concurrent calls' do.  Then runs ``affidavit actions --json --journal PATH`` as a
new process, output to /dev/null, ``--rounds`` times (interleaved with each ``--ab`` checkout's
command when given; ``--src`` runs that checkout instead of this tree, so that editing the tree
during a long A/B run changes neither side), and prints the median wall time, CPU time (user +
system: steadier than wall time on a shared machine) and peak RSS of the command (``ru_maxrss``
of the child).  Targets (issue 15): 1M events in <= 10 s and <= 100 MB.  A script, not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

from tests.journal.helpers import happy, interrupted  # noqa: E402


async def build(path: Path, events: int) -> int:
    from affidavit.journal import Journal

    written = 0
    n = 0

    async def worker(w: int) -> None:
        nonlocal written, n
        while written < events:
            n += 1
            iid = f"act_bench_{n:09d}"
            run = interrupted(iid, f"s{w % 7}") if n % 5 == 0 else happy(iid, f"s{w % 7}")
            for ev in run:
                await j.append(ev)
            written += len(run)

    async with Journal.open(path) as j, trio.open_nursery() as nursery:
        for w in range(64):
            nursery.start_soon(worker, w)
    return written


def run_cli(path: Path, src: str | None) -> tuple[float, float, float]:
    """(seconds, peak RSS MB, CPU seconds) of ``affidavit actions --json`` in a new process."""
    code = "import sys\n"
    if src:
        code += (
            f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            "import http_overhead\n"
            f"http_overhead._use_source(__import__('pathlib').Path({src!r}))\n"
        )
    code += "from affidavit.cli import main\nsys.exit(main())\n"
    cmd = [sys.executable, "-c", code, "actions", "--json", "--journal", str(path)]
    t0 = time.perf_counter()
    with open(os.devnull, "w") as null:
        proc = subprocess.Popen(cmd, stdout=null)
        _, status, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"actions --json failed ({status})")
    return took, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--journal", type=Path, help="reuse (or build and keep) this journal")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--ab", metavar="SRC", action="append", default=[], help="also run it from SRC (A/B)"
    )
    parser.add_argument("--src", metavar="SRC", help="run the main command from SRC")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="affidavit-bench-") as d:
        path = args.journal or Path(d) / "big.db"
        if not path.exists():
            t0 = time.perf_counter()
            written = trio.run(build, path, args.events)
            print(f"built {path}: {written:,} events in {time.perf_counter() - t0:.1f} s")
        main_label = f"actions --json @ {Path(args.src).name}" if args.src else "actions --json"
        clients: list[tuple[str, str | None]] = [(main_label, args.src)]
        for src in args.ab:
            clients.append((f"actions --json @ {Path(src).name}", src))
        got: dict[str, list[tuple[float, float, float]]] = {c[0]: [] for c in clients}
        loads = [os.getloadavg()[0]]
        for r in range(args.rounds):
            for label, src in clients[r % len(clients) :] + clients[: r % len(clients)]:
                got[label].append(run_cli(path, src))
            loads.append(os.getloadavg()[0])
        size = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
        print(
            f"journal {size / 1e6:.0f} MB; {args.rounds} rounds (medians), 1-min load average "
            f"{min(loads):.2f}..{max(loads):.2f} on {os.cpu_count()} cores"
        )
        for label, _ in clients:
            s = statistics.median(x[0] for x in got[label])
            rss = statistics.median(x[1] for x in got[label])
            cpu = statistics.median(x[2] for x in got[label])
            verdict = "MET" if s <= 10 and rss <= 100 else "MISSED"
            print(
                f"{label:40} {s:7.2f} s  CPU {cpu:6.2f} s  peak RSS {rss:4.0f} MB  "
                f"(<= 10 s, 100 MB: {verdict})"
            )


if __name__ == "__main__":
    main()
