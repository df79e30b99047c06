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
system: steadier than wall time on a shared machine) and peak RSS of the command.  Targets
(issue 15): 1M events in <= 10 s and <= 100 MB.  A script, not a test.

What is measured, per run of the command:
- wall: from spawning the command to its exit;
- CPU: user + system time of the command and of the child it waited for (``os.wait4``; over a
  large journal ``actions --json`` folds half the invocations in a second process);
- peak RSS: each process's own high-water mark (``VmHWM`` in /proc/PID/status), polled every
  20 ms while it runs, for the command and its children.  Printed: the largest of them (the
  target) and their sum (an upper bound of the command's total at any moment).  Not
  ``ru_maxrss``: a child made by vfork reports the parent's RSS at the spawn (the kernel keeps
  the high-water mark of the memory it shared until exec), so it showed this script's own ~135
  MB after building a journal in-process while each process of the command peaked at ~43 MB.
  The journal is built in a child process all the same, so this one stays small.

A checkout given by ``--ab``/``--src`` is imported by every process of its command, the
``fold_span`` child included (before, the child imported this virtualenv's install whatever the
side): a ``sitecustomize`` on ``PYTHONPATH`` puts that checkout's packages ahead of the editable
install (``-P``, as the child is started, leaves ``PYTHONPATH`` alone).  Before the runs, each
side prints where its processes import ``affidavit`` from.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
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


_SITECUSTOMIZE = """\
# Written by tests/benchmarks/actions_view.py: import affidavit from $AFFIDAVIT_BENCH_SRC (as
# http_overhead._use_source does, without importing that script's dependencies).
import importlib.util, os, sys

_src = os.environ.get("AFFIDAVIT_BENCH_SRC")
if _src:
    _roots = {
        "affidavit": "affidavit",
        "affidavit.adapters": "adapters",
        "affidavit.journal": "journal",
        "affidavit.statemachine": "statemachine",
    }

    class _Finder:
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if name not in _roots:
                return None
            root = os.path.join(_src, _roots[name])
            return importlib.util.spec_from_file_location(
                name, os.path.join(root, "__init__.py"), submodule_search_locations=[root]
            )

    sys.meta_path.insert(0, _Finder)
"""


def _peak_rss(pid: int, peaks: dict[int, int], done: threading.Event) -> None:
    """Poll ``VmHWM`` (kB) of ``pid`` and its children into ``peaks`` until ``done``."""
    while not done.is_set():
        for p in [pid, *_children(pid)]:
            try:
                with open(f"/proc/{p}/status", "rb") as f:
                    for line in f:
                        if line.startswith(b"VmHWM:"):
                            peaks[p] = max(peaks.get(p, 0), int(line.split()[1]))
                            break
            except (FileNotFoundError, ProcessLookupError, ValueError):
                pass  # it has just exited (or is a zombie, whose status has no VmHWM)
        done.wait(0.02)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return [int(c) for c in f.read().split()]
    except (FileNotFoundError, ProcessLookupError):
        return []


def command_env(site: Path, src: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("AFFIDAVIT_BENCH_SRC", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # its bytecode cached, as an install has it
    if src:
        env["AFFIDAVIT_BENCH_SRC"] = str(Path(src).resolve())
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return env


def run_cli(path: Path, env: dict[str, str], cwd: Path) -> tuple[float, float, float, float]:
    """(seconds, largest peak RSS MB of one process, sum of the processes' peaks MB, CPU
    seconds) of ``affidavit actions --json`` in a new process."""
    code = "import sys\nfrom affidavit.cli import main\nsys.exit(main())\n"
    cmd = [sys.executable, "-c", code, "actions", "--json", "--journal", str(path)]
    peaks: dict[int, int] = {}
    done = threading.Event()
    t0 = time.perf_counter()
    with open(os.devnull, "w") as null:
        proc = subprocess.Popen(cmd, stdout=null, env=env, cwd=cwd)
        poll = threading.Thread(target=_peak_rss, args=(proc.pid, peaks, done))
        poll.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            done.set()
            poll.join()
    took = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"actions --json failed ({status})")
    if not peaks:
        raise RuntimeError("no VmHWM read: is /proc/PID/status readable here?")
    largest, total = max(peaks.values()) / 1024, sum(peaks.values()) / 1024
    return took, largest, total, usage.ru_utime + usage.ru_stime


def imported_from(env: dict[str, str], cwd: Path) -> str:
    """Where the command's processes import the broker from (``-P`` as the child runs) --
    after compiling that checkout's modules to bytecode, as installing the broker does: a
    checkout whose every process compiles the broker from source (``PYTHONDONTWRITEBYTECODE``
    set, no ``__pycache__``) adds ~0.2 s of CPU a process, which no installed broker pays."""
    code = (
        "import compileall, os, affidavit, affidavit.journal as j, affidavit.views as v\n"
        "ok = True\n"
        "for m in (affidavit, j):\n"
        "    root = os.path.dirname(os.path.dirname(m.__file__))\n"
        "    for d in ('affidavit', 'journal', 'adapters', 'statemachine'):\n"
        "        ok = compileall.compile_dir(os.path.join(root, d), quiet=2) and ok\n"
        "print('(compiled)' if ok else '(NOT all compiled: figures include compiling)', "
        "j.__file__, v.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", code], env=env, cwd=cwd, capture_output=True, text=True
    )
    return out.stdout.strip() or out.stderr.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--journal", type=Path, help="reuse (or build and keep) this journal")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--ab", metavar="SRC", action="append", default=[], help="also run it from SRC (A/B)"
    )
    parser.add_argument("--src", metavar="SRC", help="run the main command from SRC")
    parser.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_only:
        written = trio.run(build, args.journal, args.events)
        print(f"{written:,}")
        return
    with tempfile.TemporaryDirectory(prefix="affidavit-bench-") as d:
        path = (args.journal or Path(d) / "big.db").resolve()
        if not path.exists():
            t0 = time.perf_counter()
            build_cmd = [sys.executable, __file__, "--build-only", "--journal", str(path)]
            out = subprocess.run(
                [*build_cmd, "--events", str(args.events)],
                check=True,
                capture_output=True,
                text=True,
            )
            written = int(out.stdout.split()[-1].replace(",", ""))
            print(f"built {path}: {written:,} events in {time.perf_counter() - t0:.1f} s")
        site = Path(d)
        (site / "sitecustomize.py").write_text(_SITECUSTOMIZE, encoding="utf-8")
        main_label = f"actions --json @ {Path(args.src).name}" if args.src else "actions --json"
        clients: list[tuple[str, dict[str, str]]] = [(main_label, command_env(site, args.src))]
        for src in args.ab:
            clients.append((f"actions --json @ {Path(src).name}", command_env(site, src)))
        for label, env in clients:
            print(f"{label}: imports {imported_from(env, site)}")
        got: dict[str, list[tuple[float, float, float, float]]] = {c[0]: [] for c in clients}
        loads = [os.getloadavg()[0]]
        for r in range(args.rounds):
            for label, env in clients[r % len(clients) :] + clients[: r % len(clients)]:
                got[label].append(run_cli(path, env, site))
            loads.append(os.getloadavg()[0])
        size = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
        print(
            f"journal {size / 1e6:.0f} MB; {args.rounds} rounds (medians), 1-min load average "
            f"{min(loads):.2f}..{max(loads):.2f} on {os.cpu_count()} cores"
        )
        for label, _ in clients:
            s = statistics.median(x[0] for x in got[label])
            rss = statistics.median(x[1] for x in got[label])
            rss_sum = statistics.median(x[2] for x in got[label])
            cpu = statistics.median(x[3] for x in got[label])
            verdict = "MET" if s <= 10 and rss <= 100 else "MISSED"
            print(
                f"{label:40} {s:7.2f} s  CPU {cpu:6.2f} s  peak RSS {rss:4.0f} MB a process, "
                f"{rss_sum:4.0f} MB summed  (<= 10 s, 100 MB: {verdict})"
            )
            print(
                f"{'':40} wall {' '.join(f'{x[0]:.2f}' for x in got[label])}  "
                f"CPU {' '.join(f'{x[3]:.2f}' for x in got[label])}"
            )


if __name__ == "__main__":
    main()
