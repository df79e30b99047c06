"""Instructions per sequential broker ``call()`` (issue 15, c=1), counted by callgrind.

    .venv/bin/python tests/benchmarks/call_instructions.py [--src CHECKOUT] [--calls N]

The broker (``Broker.open``, journal on ``/dev/shm``) makes ``http_overhead.WARM_UP`` calls to
the loopback h11 server of ``http_overhead.py`` (a process of its own, not counted), then ``N``
and, in a second run, ``3N`` sequential GET calls, each run in a process of its own under
``valgrind --tool=callgrind --separate-threads=yes``; the difference of the two totals over
``2N`` is what one more call costs, start-up, warm-up and the journal's opening subtracted.
Printed apart: the main thread (trio's loop: everything a call does before, around and after
its two barrier transactions) and the other threads (the journal's writer thread, trio's
worker threads).  Instruction counts do not move with the machine's load, so they compare two
commits on a shared machine where wall-clock A/Bs (``http_overhead.py --ab``,
``call_timeline.py``) swing by more than a small cut.  ``--src`` imports the broker of another
checkout (``git archive main | tar -x -C DIR``) ahead of this environment's editable install.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()


def _child(calls: int, src: str | None) -> None:
    import trio

    sys.path.insert(0, str(HERE.parent))
    import http_overhead

    if src is not None:  # before the broker is imported: another checkout's
        http_overhead._use_source(Path(src).resolve())
    from http_clients import PATH

    import affidavit

    print(f"broker from {affidavit.__file__}")

    async def run(port: int, tmp: Path) -> None:
        from affidavit.api.broker import Broker
        from affidavit.config import load_config

        cfg = tmp / "affidavit.toml"
        cfg.write_text(http_overhead._config(tmp, port), encoding="utf-8")
        # Steady state: a config file changed within SETTLED_NS is read again at every dispatch.
        await trio.sleep(http_overhead.CONFIG_SETTLED_S)  # (as http_overhead.measure_broker)
        action = {"target": "api", "method": "GET", "path": PATH}
        async with Broker.open(config=load_config(cfg)) as broker:
            for _ in range(http_overhead.WARM_UP + calls):
                env = await broker.call(action)
                if "error" in env:
                    raise RuntimeError(f"broker call failed: {env['error']}")

    os.environ.setdefault(http_overhead.TOKEN_ENV, "bench-" + os.urandom(12).hex())
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(dir=shm) as d, http_overhead._server() as port:
        trio.run(run, port, Path(d))


def _count(calls: int, src: str | None) -> tuple[int, int]:
    """(main thread, other threads) instructions of one run of ``calls`` calls."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "callgrind.out"
        cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes"]
        cmd += [f"--callgrind-out-file={out}", sys.executable, str(HERE), "--child", str(calls)]
        if src is not None:
            cmd += ["--src", src]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"the counted run failed ({done.returncode}):\n{done.stderr[-4000:]}")
        print(done.stdout.strip().splitlines()[0])
        main = other = 0
        for f in Path(d).glob("callgrind.out-*"):  # one a thread
            text = f.read_text(errors="replace")
            found = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
            thread = re.search(r"^thread: (\d+)", text, re.M)
            if found is None or thread is None:
                raise SystemExit(f"no callgrind total in {f.name}")
            if thread.group(1) == "1":
                main += int(found.group(1))
            else:
                other += int(found.group(1))
    return main, other


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--src", help="the checkout whose broker to measure (default: this one)")
    ap.add_argument("--calls", type=int, default=100, help="calls of the first run (N)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        _child(args.child, args.src)
        return
    n = args.calls
    (m1, o1), (m3, o3) = _count(n, args.src), _count(3 * n, args.src)
    per = 2 * n
    print(
        f"per call: {(m3 + o3 - m1 - o1) / per:,.0f} instructions -- main thread (the loop) "
        f"{(m3 - m1) / per:,.0f}, other threads (the writer) {(o3 - o1) / per:,.0f}"
    )


if __name__ == "__main__":
    main()
