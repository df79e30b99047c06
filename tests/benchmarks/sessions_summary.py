"""The daemon's ``GET /v1/sessions`` body over a large journal, folded whole per request (before)
and from a ``SessionSummary`` brought up to date per request (now): the first request (the
summary's one full fold) and then requests each after one more invocation was appended, each
in a fresh process with its peak RSS; the summary's last body is checked against the full fold's.

    .venv/bin/python tests/benchmarks/sessions_summary.py --journal PATH [--rounds 5]

``PATH``: a journal built by ``tests/benchmarks/actions_view.py --build-only --journal PATH
--events 1000000``, copied (with its key files) to a temporary directory first: the copy is
appended to, ``PATH`` only read.  A script, not a test.

    .venv/bin/python tests/benchmarks/sessions_summary.py --sessions 50000 [--ab OLD_CHECKOUT]

``--sessions N``: a page of the sessions seen last (the console's 500, ``/v1/sessions``' 100)
from a kept summary over a journal of N invocations, each naming a session of its own (one
agent naming a new session per refused call, audit 49): the median page with nothing
appended since the last, and with one invocation appended before each.  ``--ab DIR``: the
same, in one run, from a checkout from before (``git archive main | tar -x -C DIR``: there the
page was cut from every session's entry, ``views.newest_sessions``), each in a process of its
own on a copy of one journal, with whether both answered the same pages before the appends.
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
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
if "--src" in sys.argv:  # an --ab child: the journal and views of another checkout
    import http_overhead

    http_overhead._use_source(Path(sys.argv[sys.argv.index("--src") + 1]))
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


async def _many_sessions(journal: str, n: int) -> None:
    from affidavit.journal import Journal
    from affidavit.statemachine import Event
    from affidavit.statemachine import EventKind as E

    op = {"target": "t", "protocol": "http", "fingerprint": "sha256:aa", "budget": 1}
    refused = {"code": "INVALID_TARGET", "field": "target"}
    async with Journal.open(journal) as w:
        for start in range(0, n, 5000):
            rows = []
            for i in range(start, min(n, start + 5000)):
                attrs = {"operation": op, "session": f"s{i:07d}-" + "x" * 100}
                rows += [(Event(E.ACTION_ACCEPTED, f"act_{i}", attrs), None)]
                rows += [(Event(E.PREFLIGHT_FAILED, f"act_{i}", refused), None)]
            await (await w.post_many(rows)).wait()


def page_child(journal: str, rounds: int) -> None:
    """A page from a kept summary, as this checkout's console and daemon cut it."""
    import hashlib

    import trio

    from affidavit.daemon.http import json_body
    from affidavit.journal import Journal, JournalReader, SessionSummary
    from affidavit.statemachine import Event
    from affidavit.statemachine import EventKind as E
    from affidavit.views import metrics_key, newest_sessions

    summary = SessionSummary(metrics_key)
    kept = hasattr(JournalReader, "summarized_session_page")

    def page(j: Any, limit: int) -> dict[str, Any]:
        if kept:
            return dict(j.summarized_session_page(summary, limit)[0])
        return dict(newest_sessions(j.summarized_sessions(summary)[0], limit))

    async def append(n: int) -> None:
        async with Journal.open(journal) as w:
            op = {"target": "t", "protocol": "http", "fingerprint": "sha256:aa", "budget": 1}
            attrs = {"operation": op, "session": f"later-{n}"}
            await w.append(Event(E.ACTION_ACCEPTED, f"act_later_{n}", attrs))

    out: dict[str, Any] = {}
    digest = hashlib.sha256()
    with JournalReader.open(journal) as j:
        page(j, 100)  # the first fold
        for limit in (500, 100):
            times = []
            for _ in range(rounds):
                t = time.perf_counter()
                body = json_body(page(j, limit))
                times.append(time.perf_counter() - t)
            out[f"idle_{limit}"] = statistics.median(times)
            digest.update(body)
    times = []
    for n in range(rounds):
        trio.run(append, n)
        with JournalReader.open(journal) as j:
            t = time.perf_counter()
            json_body(page(j, 100))  # (times of its own: not compared between checkouts)
            times.append(time.perf_counter() - t)
    out["appended_100"] = statistics.median(times)
    out["digest"] = digest.hexdigest()
    print(json.dumps(out))


def memory(n: int) -> None:
    """``--memory``: what the kept order of the sessions costs (``NewestSessions``' heap) beside
    the whole summary over ``n`` sessions, traced (``tracemalloc``): after the first fold, the
    fold's peak, the heap's own objects (list, entry tuples, their floats and ints), and the peak
    of making the heap again once stale entries outnumber the sessions (every session seen
    again three times, as later invocations naming them would).  With ``--src DIR``: that
    checkout's summary (from before the kept order: the first two alone)."""
    import sys as _sys
    import tracemalloc

    import trio

    from affidavit.journal import JournalReader, SessionSummary
    from affidavit.views import metrics_key

    with tempfile.TemporaryDirectory() as d:
        journal = str(Path(d) / "journal.db")
        trio.run(_many_sessions, journal, n)
        summary = SessionSummary(metrics_key)
        tracemalloc.start()
        with JournalReader.open(journal) as j:
            j.summarized_sessions(summary)  # the first fold (no entry kept: a list built)
        after, fold_peak = tracemalloc.get_traced_memory()
        mb = 1 / 2**20
        print(f"{n} sessions: summary traced {after * mb:.1f} MB after the first fold (its peak "
              f"{fold_peak * mb:.1f} MB)")  # fmt: skip
        state = summary._state
        if not hasattr(state, "newest"):  # (a checkout from before the kept order: --src)
            return
        heap = state.newest._heap
        own = _sys.getsizeof(heap) + sum(
            _sys.getsizeof(e) + _sys.getsizeof(e[0]) + _sys.getsizeof(e[1]) + _sys.getsizeof(e[2])
            for e in heap
        )
        entries = len(heap)
        del heap  # (not to keep the list the clean-up replaces)
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        sessions = list(state.sessions.values())
        for _ in range(3):
            for kept in sessions:
                kept.last_seen += 1.0
            state.newest.moved(sessions, len(sessions))
        rebuilt, rebuild_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    print(f"the heap's own objects {own * mb:.1f} MB ({entries} entries); three moves of every "
          f"session and the heap made again: traced {(rebuilt - base) * mb:+.1f} MB after, peak "
          f"{(rebuild_peak - base) * mb:+.1f} MB over before; "
          f"{len(state.newest._heap)} entries left")  # fmt: skip


def pages_ab(n: int, rounds: int, old: str | None) -> None:
    import trio

    with tempfile.TemporaryDirectory() as d:
        built = Path(d) / "built" / "journal.db"
        built.parent.mkdir()
        t = time.perf_counter()
        trio.run(_many_sessions, str(built), n)
        print(f"{n} invocations, each its own session, written in {time.perf_counter() - t:.0f} s")
        runs = {}
        for src in [None, old] if old else [None]:
            copy = Path(d) / ("old" if src else "new")
            shutil.copytree(built.parent, copy)
            cmd = [sys.executable, __file__, "--journal", str(copy / built.name),
                   "--page-child", "--rounds", str(rounds)]  # fmt: skip
            if src is not None:
                cmd += ["--src", src]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            runs["this tree" if src is None else "@" + Path(src).name] = json.loads(out)
    print(f"{'checkout':>14} {'page 500 ms':>12} {'page 100 ms':>12} {'after append':>13}")
    for name, r in runs.items():
        print(f"{name:>14} {r['idle_500'] * 1e3:>12.2f} {r['idle_100'] * 1e3:>12.2f} "
              f"{r['appended_100'] * 1e3:>13.2f}")  # fmt: skip
    if old:
        new, was = runs.values()
        print(f"old/new: page 500 {was['idle_500'] / new['idle_500']:.0f}x, page 100 "
              f"{was['idle_100'] / new['idle_100']:.0f}x, after an append "
              f"{was['appended_100'] / new['appended_100']:.0f}x; "
              f"same bodies: {was['digest'] == new['digest']}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--journal")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--how")
    parser.add_argument("--sessions", type=int, help="a journal of N sessions, built here")
    parser.add_argument("--ab", metavar="OLD_CHECKOUT", help="with --sessions: also OLD (A/B)")
    parser.add_argument(
        "--memory", action="store_true", help="with --sessions: traced sizes (--src: of SRC)"
    )
    parser.add_argument("--page-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.page_child:
        page_child(args.journal, args.rounds)
        return
    if args.sessions and args.memory:
        memory(args.sessions)
        return
    if args.sessions:
        pages_ab(args.sessions, args.rounds, args.ab)
        return
    if not args.journal:
        parser.error("--journal or --sessions is required")
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
