"""Instructions per appended event on the 64-task group-commit path, counted by callgrind.

    .venv/bin/python tests/benchmarks/append_instructions.py [--src CHECKOUT] [--per-task N]
                                                             [--mode full|handoff]

64 trio tasks each append ``N`` and then ``3N`` invocations of 7 barrier events (the events of
``journal_append.py``, invocations named ``w<task>-<n>``) to a fresh journal on ``/dev/shm``,
each run in a process of its own under ``valgrind --tool=callgrind``; the difference of the two
totals over the difference of the event counts is what one more event costs -- the trio thread
and the writer thread together, start-up and the journal's opening subtracted.  Instruction
counts do not depend on the machine's load (wall-clock rates here do, by 2x: issue 15), so they
compare two commits on a shared machine; callgrind runs the threads one at a time, so every
transaction takes the 64 queued rows.  ``--mode handoff`` replaces the writer thread's
transaction by nothing (as ``journal_append.py``'s hand-off): the trio side alone.  ``--src``
imports the journal of another checkout (``git archive main | tar -x -C DIR``) ahead of this
environment's editable install (``http_overhead._use_source``); each run prints where it
imported the journal from.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


def _child(per_task: int, mode: str, src: str | None) -> None:
    import shutil

    import trio

    sys.path.insert(0, str(HERE.parent))
    if src is not None:  # before the broker is imported: another checkout's journal
        import http_overhead

        http_overhead._use_source(Path(src).resolve())
    import journal_append as ja

    import affidavit.journal
    from affidavit.journal import Journal

    print(f"journal from {affidavit.journal.__file__}")

    if mode == "handoff":
        from affidavit.journal import writer

        def nothing(self: writer.Writer, batch: list[writer.Req[Any]]) -> None:
            for r in batch:
                r.result = None

        writer.Writer._run_batch = nothing  # type: ignore[method-assign]
    d = Path(tempfile.mkdtemp(dir="/dev/shm" if Path("/dev/shm").is_dir() else None))

    async def run() -> None:
        async with Journal.open(d / "j.db") as j:

            async def worker(w: int) -> None:
                for n in range(per_task):
                    for ev in ja._happy(ja.worker_id(w, n)):
                        await j.append(ev, barrier=True)

            async with trio.open_nursery() as nursery:
                for w in range(64):
                    nursery.start_soon(worker, w)

    try:
        trio.run(run)
    finally:
        shutil.rmtree(d)


def _count(per_task: int, mode: str, src: str | None) -> int:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "callgrind.out"
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable]
        cmd += [str(HERE), "--child", str(per_task), "--mode", mode]
        if src is not None:
            cmd += ["--src", src]
        done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the counted run failed ({done.returncode}):\n{done.stderr[-4000:]}")
    print(done.stdout.strip())
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"no callgrind total in:\n{done.stderr}")
    return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--src", help="the checkout whose journal to measure (default: this one)")
    ap.add_argument("--per-task", type=int, default=2, help="invocations per task (N)")
    ap.add_argument("--mode", choices=("full", "handoff"), default="full")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        _child(args.child, args.mode, args.src)
        return
    n = args.per_task
    one, three = _count(n, args.mode, args.src), _count(3 * n, args.mode, args.src)
    events = 64 * 7 * 2 * n
    print(f"{args.mode}: {(three - one) / events:,.0f} instructions per appended event "
          f"({one:,} for {64 * 7 * n} events, {three:,} for {64 * 7 * 3 * n})")  # fmt: skip


if __name__ == "__main__":
    main()
