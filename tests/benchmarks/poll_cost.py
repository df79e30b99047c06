"""What a poll of an operation costs as its polls pile up: an embedded broker submits a job to
the scripted HTTP server (a 202), then polls it ``--polls`` times (the job stays running); the
mean latency of the first and the last ``--window`` polls, and their ratio.  Every poll adds a
row to the submission's record; a poll that re-reads that whole record (as one did before it
read the submission only through the job's ``accepted_seq``) grows with them.  Then a row
naming another asker's poll as open (as an approval-covered poll's claim does) is appended,
and ``--window`` more polls each take that poll up -- POLL_PENDING, nothing asked: their mean
("pending"), which found the claim by reading the record (before ``events_naming``).

    python tests/benchmarks/poll_cost.py [--polls 4000] [--window 100] [--ab OLD_CHECKOUT]

``--ab DIR``: the same in a checkout from before (``git archive main | tar -x -C DIR``), each
in a process of its own, and both printed side by side from one run.  A script, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
if "--src" in sys.argv:  # an --ab child: the broker of another checkout, before importing it
    import http_overhead

    http_overhead._use_source(Path(sys.argv[sys.argv.index("--src") + 1]))
sys.path.insert(0, str(ROOT))


async def _measure(polls: int, window: int) -> dict[str, float]:
    from affidavit.engine import OperationError
    from affidavit.engine.operations import ASKING
    from affidavit.statemachine import Event, EventKind
    from tests.broker.helpers import TOKEN_ENV, http_target, open_broker, write_config
    from tests.broker.test_operations import JOBS, SUBMIT, job_api
    from tests.http.hostile import HostileServer, scripts

    os.environ[TOKEN_ENV] = "bench-token"
    with tempfile.TemporaryDirectory() as d:
        async with HostileServer.running(scripts.serve(job_api(["running"]))) as srv:
            cfg = write_config(Path(d), {"jobs": http_target(srv.url + "/v1", **JOBS)})
            async with open_broker(cfg) as broker:
                env = await broker.call(dict(SUBMIT))
                op = env["operation"]["id"]
                took = []
                for _ in range(polls):
                    start = time.perf_counter()
                    answer = await broker.poll_operation(op)
                    took.append(time.perf_counter() - start)
                    assert answer["poll"] is not None, answer
                iid = env["invocation_id"]
                rows = len(broker.events(iid))
                claim = {"operation_id": op, "poll_invocation": "act_claimed", "code": None}
                claim |= {"reason": ASKING, "open": True, "expires_at": time.time() + 3600}
                event = Event(EventKind.OPERATION_POLL_FAILED, iid, claim)
                await broker.journal.append(event, barrier=True)
                pending = []
                for _ in range(window):
                    start = time.perf_counter()
                    try:
                        await broker.poll_operation(op)
                    except OperationError as exc:
                        assert exc.code == "POLL_PENDING", exc
                    else:
                        raise AssertionError("the open poll was not taken up")
                    pending.append(time.perf_counter() - start)
    first = sum(took[:window]) / window
    last = sum(took[-window:]) / window
    return {"first": first, "last": last, "rows": rows, "pending": sum(pending) / window}


def _child(polls: int, window: int, src: str | None) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", "--polls", str(polls), "--window", str(window)]
    if src is not None:
        cmd += ["--src", src]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    import trio

    parser = argparse.ArgumentParser()
    parser.add_argument("--polls", type=int, default=4000)
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--ab", metavar="OLD_CHECKOUT", help="also measure checkout OLD (A/B)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    args = parser.parse_args()
    window = min(args.window, args.polls // 2)
    if args.child:
        print(json.dumps(trio.run(_measure, args.polls, window)))
        return
    runs = {"this tree": _child(args.polls, window, None)}
    if args.ab:
        runs["@" + Path(args.ab).name] = _child(args.polls, window, args.ab)
    print(f"{args.polls} polls of one job; mean poll latency of the first and last {window}")
    print(f"{'checkout':>16} {'first ms':>9} {'last ms':>9} {'last/first':>11} {'rows':>6} "
          f"{'pending ms':>11}")  # fmt: skip
    for name, got in runs.items():
        print(f"{name:>16} {got['first'] * 1e3:>9.2f} {got['last'] * 1e3:>9.2f} "
              f"{got['last'] / got['first']:>11.1f} {int(got['rows']):>6} "
              f"{got['pending'] * 1e3:>11.2f}")  # fmt: skip
    if args.ab:
        new, old = runs["this tree"], runs["@" + Path(args.ab).name]
        print(f"last {window} polls: old/new {old['last'] / new['last']:.1f}x; pending: "
              f"{old['pending'] / new['pending']:.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
