"""The SSH driver's collect loop on bulk streams, this tree against another checkout, side by
side in one run against one sshd on 127.0.0.1: ``perform()`` of each workload, every call a
fresh connection, each (checkout, workload) cell a process of its own, rounds interleaved so
drift hits both alike:

  cat       ``cat`` with 8 MiB of stdin: stdin written while the same amount comes back
  out       ``head -c 32M /dev/zero``: output only
  wc        ``wc -c`` with 8 MiB of stdin: stdin only
  progress  a line of progress every 0.2 ms while ``head`` reads 8 MiB of stdin: output that
            never pauses while the remote needs stdin (``python3`` on the server)
  both      a line on stdout and one on stderr every 0.2 ms while ``head`` reads 4 MiB of stdin
            0.3 s after they began: both streams busy while stdin waits (the starvation guard)

A script, not a test (it asserts nothing about time):

    .venv/bin/python tests/benchmarks/ssh_streams.py --ab OLD_CHECKOUT [--calls N] [--rounds R]
        [--sink-delay SECONDS] [--exec SECONDS] [--work NAME ...]

``--sink-delay``: each chunk handed to the sink takes that long (the engine's sink journals
every chunk); 0 by default.  ``--exec``: the exec timeout (3600 s by default); a call it ends
counts its time to the end and is reported as failed beside the row.

``OLD_CHECKOUT`` is a source tree (``git archive <rev> | tar -x -C DIR``); its packages are
imported instead of this tree's through ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
PROGRESS = (
    "python3 -c 'import sys, time\n"
    "while True:\n"
    '    sys.stdout.write("progress\\n"); sys.stdout.flush(); time.sleep(0.0002)\' & '
    f"p=$!; head -c {8 * MIB} >/dev/null; kill $p; echo done"
)
"""Background jobs of a non-interactive shell read /dev/null: ``head`` gets the stdin."""
BOTH = (
    "python3 -c 'import sys, time\n"
    "while True:\n"
    '    print("progress", flush=True); print("progress", file=sys.stderr, flush=True)\n'
    "    time.sleep(0.0002)' & "
    f"p=$!; sleep 0.3; head -c {4 * MIB} >/dev/null; kill $p; echo done"
)
WORKLOADS = {
    "cat": ("cat", 8 * MIB),
    "out": (f"head -c {32 * MIB} /dev/zero", 0),
    "wc": ("wc -c", 8 * MIB),
    "progress": (PROGRESS, 8 * MIB),
    "both": (BOTH, 4 * MIB),
}


def _client(
    spec: dict[str, Any], work: str, calls: int, sink_delay: float, exec_timeout: float
) -> None:
    """In the cell's process: ``calls`` sequential ``perform()`` calls; prints ms/call, CPU s."""
    from affidavit.adapters.base import AttemptContext, AttemptInterrupted
    from affidavit.adapters.ssh import (
        SSH_TABLE,
        SshTarget,
        SshTimeouts,
        perform,
        prepare_credential,
    )
    from affidavit.statemachine import ProtocolMachine, Step

    async def gate(facts: Mapping[str, Any]) -> None:
        return None

    def observe(step: Step, facts: Mapping[str, Any]) -> None:
        return None

    async def sink(stream: str, data: bytes) -> None:
        if sink_delay:
            await trio.sleep(sink_delay)

    command, size = WORKLOADS[work]
    stdin = bytes(size) if size else None
    timeouts = SshTimeouts(exec=exec_timeout)
    target = SshTarget("127.0.0.1", spec["port"], spec["user"], (spec["pin"],), timeouts)
    cred = prepare_credential(Path(spec["key"]).read_bytes())

    failed = 0

    async def run() -> float:
        nonlocal failed
        t0 = time.perf_counter()
        for _ in range(calls):
            ctx = AttemptContext(ProtocolMachine(SSH_TABLE), gate, observe, sink)
            try:
                res = await perform(target, cred, command, stdin, ctx)
            except AttemptInterrupted:
                failed += 1  # the exec timeout: its time counts
                continue
            assert res.code is None, res
        return (time.perf_counter() - t0) * 1000 / calls

    cpu = time.process_time()
    ms = trio.run(run)
    print(json.dumps({"ms": ms, "cpu": (time.process_time() - cpu) / calls, "failed": failed}))


def main(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(HERE))  # run as a script from anywhere
    from tests.ssh.sshd import start_sshd

    trees = {"this": str(HERE), "ab": str(Path(args.ab).resolve())}
    with tempfile.TemporaryDirectory() as d, start_sshd(Path(d)) as server:
        spec = Path(d) / "spec.json"
        spec.write_text(
            json.dumps(
                {"port": server.port, "user": server.user, "pin": server.host_pin,
                 "key": str(server.client_key_path)}
            )
        )  # fmt: skip
        cells: dict[tuple[str, str], list[dict[str, float]]] = {}
        loads = [os.getloadavg()[0]]
        for r in range(args.rounds):
            for work in args.work:
                order = list(trees.items()) if r % 2 == 0 else list(reversed(trees.items()))
                for name, src in order:
                    cmd = [sys.executable, __file__, "--client", work, "--spec", str(spec)]
                    cmd += ["--calls", str(args.calls), "--sink-delay", str(args.sink_delay)]
                    cmd += ["--exec", str(args.exec)]
                    env = {**os.environ, "PYTHONPATH": src}
                    out = subprocess.run(
                        cmd, check=True, stdout=subprocess.PIPE, text=True, env=env
                    ).stdout
                    cells.setdefault((work, name), []).append(json.loads(out.splitlines()[-1]))
            loads.append(os.getloadavg()[0])
    print(
        f"{args.calls} calls per cell, medians of {args.rounds} interleaved rounds, 1-min load "
        f"average {min(loads):.2f}..{max(loads):.2f} on {os.cpu_count()} cores; ab = {args.ab}; "
        f"sink delay {args.sink_delay * 1000:g} ms a chunk; exec timeout {args.exec:g} s"
    )
    print(f"{'work':>9}{'this ms':>10}{'ab ms':>10}{'ratio':>8}{'per-round':>11}"
          f"{'this CPU':>10}{'ab CPU':>9}")  # fmt: skip
    for work in args.work:
        this, ab = cells[(work, "this")], cells[(work, "ab")]
        ms = [statistics.median(c["ms"] for c in cell) for cell in (this, ab)]
        cpu = [statistics.median(c["cpu"] for c in cell) for cell in (this, ab)]
        paired = statistics.median(t["ms"] / a["ms"] for t, a in zip(this, ab, strict=True))
        failed = [sum(c.get("failed", 0) for c in cell) for cell in (this, ab)]
        note = f"  failed (exec timeout): this {failed[0]}, ab {failed[1]}" if any(failed) else ""
        print(
            f"{work:>9}{ms[0]:>10.1f}{ms[1]:>10.1f}{ms[0] / ms[1]:>8.2f}{paired:>11.2f}"
            f"{cpu[0]:>10.3f}{cpu[1]:>9.3f}{note}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ab", help="the other checkout (a source tree)")
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sink-delay", type=float, default=0.0)
    parser.add_argument("--exec", type=float, default=3600.0)
    normal = [w for w in WORKLOADS if w != "both"]  # "both" holds an older tree an exec timeout
    parser.add_argument("--work", nargs="+", choices=WORKLOADS, default=normal)
    parser.add_argument("--client", choices=WORKLOADS, help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        spec = json.loads(Path(args.spec).read_text())
        _client(spec, args.client, args.calls, args.sink_delay, args.exec)
    elif not args.ab:
        parser.error("--ab OLD_CHECKOUT is required")
    else:
        main(args)
