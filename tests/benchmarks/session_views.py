"""The journal views a session filter or a page total reads, each in a fresh process: its
time (median of ``--rounds``) and the process's peak RSS -- before and after an index, run
against copies of one journal.

    .venv/bin/python tests/benchmarks/session_views.py --journal PATH [--session s3] [--rounds 3]

``PATH``: a journal built by ``tests/benchmarks/actions_view.py --build-only --journal PATH
--events 1000000`` (read only here).  A script, not a test.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CASES: dict[str, Callable[[Any, str], object]] = {
    "session page (limit 1000)": lambda j, s: j.newest_actions(1000, session=s),
    "absent session page (limit 1000)": lambda j, s: j.newest_actions(1000, session="no-such"),
    "session page total": lambda j, s: j.tables.invocation_count(s),
    "page total (no filter)": lambda j, s: j.tables.invocation_count(None),
    "sessions list": lambda j, s: j.sessions(),
}


def one(journal: str, case: str, session: str, rounds: int) -> None:
    from affidavit.journal import JournalReader

    times = []
    with JournalReader.open(journal) as j:
        for _ in range(rounds):
            t = time.perf_counter()
            CASES[case](j, session)
            times.append(time.perf_counter() - t)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(json.dumps({"case": case, "median_s": statistics.median(times), "rss_mb": rss}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--journal", required=True)
    parser.add_argument("--session", default="s3")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--case")
    args = parser.parse_args()
    if args.case:
        one(args.journal, args.case, args.session, args.rounds)
        return
    for case in CASES:
        out = subprocess.run(
            [sys.executable, __file__, "--journal", args.journal, "--session", args.session,
             "--rounds", str(args.rounds), "--case", case],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        r = json.loads(out)
        print(f"{case:36} {r['median_s'] * 1000:10.1f} ms  peak RSS {r['rss_mb']:5d} MB")


if __name__ == "__main__":
    main()
