"""The forked rounds of tests/broker/test_same_key_processes.py, in a process of their own:
``python -m tests.broker.same_key_rounds CONFIG ROUNDS PROCESSES`` from the repository root.

Each round forks PROCESSES children running ``affidavit call`` on one idempotency key
(``proc-race-<n>``) and prints one JSON line: ``[[exit code, stdout, stderr], ...]`` -- or,
when a child overran ``ROUND_LIMIT``, ``{"overran": its stacks}`` and stops.

Why a process of its own (as tests/broker/crashkit.py): a fork copies every lock of the parent
and none of its threads.  The pytest worker that runs the test is not free of threads -- the
``pytest_timeout`` timer, and trio's cached worker threads left by the test files before it on
that worker (seen: five, at the first fork) -- and a thread inside SQLite, the allocator or any
C library at the instant of the fork leaves its mutex held forever in the child, which then
hangs at its first use of it (a whole-suite run once saw two children of a round overrun 60 s;
an unloaded round takes ~0.3 s, one under three CPU burners 2.8 s at most).  Here, imports
done, no thread or event loop has started when the children fork.
"""

from __future__ import annotations

import faulthandler
import json
import os
import select
import signal
import sys
import time
import traceback

import affidavit.cli

from .http_rows import POST

__all__ = ["ROUND_LIMIT", "main"]

ROUND_LIMIT = 60.0
"""Seconds a round's children have to answer: a hang's bound, not a speed claim (above)."""


class Overran(Exception):
    """A round's children did not all finish within ``ROUND_LIMIT``."""


def _fork_call(cfg: str, action: bytes) -> tuple[int, int, int]:
    """Fork a child running ``affidavit call``; return (pid, stdout fd, stderr fd)."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the CLI entry point on its own stdio, then exit
        status = 70
        try:
            for fd, target in ((in_r, 0), (out_w, 1), (err_w, 2)):
                os.dup2(fd, target)
            for fd in (in_r, in_w, out_r, out_w, err_r, err_w):
                os.close(fd)  # its own stdin's write end would keep it from ever ending
            sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
            sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
            # Where a child that overruns its round waits: its stacks, on the parent's signal.
            faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
            status = affidavit.cli.main(["call", "-", "--config", str(cfg)])
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    os.write(in_w, action)
    for fd in (in_r, in_w, out_w, err_w):
        os.close(fd)
    return pid, out_r, err_r


def _drain(bufs: dict[int, bytes], open_fds: set[int], end: float) -> None:
    """Read the open descriptors into ``bufs`` until each is at EOF or ``end`` comes."""
    while open_fds and time.monotonic() < end:
        ready, _, _ = select.select(list(open_fds), [], [], 0.5)
        for fd in ready:
            data = os.read(fd, 65536)
            if data:
                bufs[fd] += data
            else:
                open_fds.discard(fd)
                os.close(fd)


def _collect(children: list[tuple[int, int, int]]) -> list[tuple[int, bytes, bytes]]:
    """Read every child's output to EOF (concurrently: no pipe may fill up), then reap it."""
    bufs = {fd: b"" for _, out, err in children for fd in (out, err)}
    open_fds = set(bufs)
    _drain(bufs, open_fds, time.monotonic() + ROUND_LIMIT)
    if open_fds:  # overran: each such child's stacks (``faulthandler``), then it is stopped
        late = [(pid, err) for pid, out, err in children if {out, err} & open_fds]
        for pid, _ in late:
            os.kill(pid, signal.SIGUSR1)
        _drain(bufs, open_fds, time.monotonic() + 3)
        for pid, _ in late:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        for fd in open_fds:
            os.close(fd)
        stacks = "\n".join(bufs[err].decode(errors="replace")[-6000:] for _, err in late)
        raise Overran(f"{len(late)} child(ren) did not finish in time; stderr:\n{stacks}")
    results = []
    for pid, out, err in children:
        _, status = os.waitpid(pid, 0)
        results.append((os.waitstatus_to_exitcode(status), bufs[out], bufs[err]))
    return results


def main(argv: list[str]) -> None:
    cfg, rounds, processes = argv[0], int(argv[1]), int(argv[2])
    for n in range(rounds):
        action = json.dumps({**POST, "idempotency_key": f"proc-race-{n}"}).encode()
        children = [_fork_call(cfg, action) for _ in range(processes)]
        try:
            results = _collect(children)
        except Overran as exc:
            print(json.dumps({"overran": str(exc)}), flush=True)
            return
        said = [[code, out.decode(errors="replace"), err.decode(errors="replace")]
                for code, out, err in results]  # fmt: skip
        print(json.dumps(said), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
