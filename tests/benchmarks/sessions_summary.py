"""The daemon's ``GET /v1/sessions`` body over a large journal, folded whole per request (before)
and from a ``SessionSummary`` brought up to date per request (now): the first request (the
summary's one full fold) and then requests each after one more invocation was appended, each
in a fresh process with its peak RSS; the summary's last body is checked against the full fold's.

    .venv/bin/python tests/benchmarks/sessions_summary.py --journal PATH [--rounds 5]

``PATH``: a journal built by ``tests/benchmarks/actions_view.py --build-only --journal PATH
--events 1000000``, copied (with its key files) to a temporary directory first: the copy is
appended to, ``PATH`` only read.  A script, not a test.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def one(journal: str, how: str, rounds: int) -> None:
    import trio

    from affidavit.daemon.http import json_body
    from affidavit.journal import Journal, JournalReader, SessionSummary
    from affidavit.statemachine import Event
    from affidavit.statemachine import EventKind as E
    from affidavit.views import metrics, metrics_key, metrics_of, newest_sessions

    summary = SessionSummary(metrics_key)
    metrics_too = False

    def request() -> tuple[float, bytes]:
        t = time.perf_counter()
        with JournalReader.open(journal) as j:
            got = j.sessions() if how == "full" else j.summarized_sessions(summary)[0]
            body = json_body(newest_sessions(got, 100))
            if metrics_too:
                counts = (
                    metrics(j.iter_actions())
                    if how == "full"
                    else metrics_of(j.summarized_tallies(summary)[0])
                )
                body += json_body(counts)
        return time.perf_counter() - t, body

    async def append(n: int) -> None:
        async with Journal.open(journal) as w:
            iid = f"bench-{how}-{n}"
            op = {"target": "t", "protocol": "http", "fingerprint": "sha256:aa", "budget": 1}
            await w.append(Event(E.ACTION_ACCEPTED, iid, {"operation": op, "session": "s3"}))
            refused = {"code": "INVALID_TARGET", "field": "target"}
            await w.append(Event(E.PREFLIGHT_FAILED, iid, refused))

    first, body = request()
    times = []
    for n in range(rounds):
        trio.run(append, n)
        dt, body = request()
        times.append(dt)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    out = {"first_s": first, "median_s": statistics.median(times), "rss_mb": rss}
    if how == "summary":  # the last bodies, against the full fold's of the same journal
        metrics_too = True
        _, body = request()
        how = "full"
        out["same"] = request()[1] == body
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--journal", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--how")
    args = parser.parse_args()
    if args.how:
        one(args.journal, args.how, args.rounds)
        return
    for how in ("full", "summary"):
        with tempfile.TemporaryDirectory() as d:
            src = Path(args.journal)
            for f in src.parent.glob(src.name + "*"):
                if not f.name.endswith(".lock"):
                    shutil.copy(f, Path(d) / f.name)
            copy = str(Path(d) / src.name)
            out = subprocess.run(
                [sys.executable, __file__, "--journal", copy, "--how", how,
                 "--rounds", str(args.rounds)],
                check=True, capture_output=True, text=True,
            ).stdout  # fmt: skip
        r = json.loads(out)
        print(
            f"{how:8} first request {r['first_s'] * 1000:9.1f} ms, then (one invocation "
            f"appended before each) {r['median_s'] * 1000:9.1f} ms; peak RSS {r['rss_mb']} MB"
        )
        if "same" in r:
            print("  its last body is the full fold's:", r["same"])


if __name__ == "__main__":
    main()
