"""Same-key races between processes: 3 concurrent ``affidavit call`` processes on one key, 50
rounds -- zero tracebacks, one dispatch per key, every envelope for the same invocation, and
``affidavit journal verify`` intact (issue 9, item 5).

Interpreter start-up costs ~0.5 s of CPU (trio and cryptography imports), so 150 fresh
interpreters would take minutes on CI's two cores.  The rounds therefore fork children of this
(already importing) process, each running the ``affidavit`` entry point -- ``cli.main(["call",
...])`` with its own stdin, stdout and stderr, its own journal connection and writer -- exactly
what the console script runs after its imports.  Two more rounds use fresh ``python -m
affidavit`` interpreters, so the real thing is covered as well.  The scripted server runs in
its own process (no thread is alive in this one when it forks).
"""

from __future__ import annotations

import faulthandler
import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import pytest

import affidavit.cli

from .helpers import TOKEN_ENV, http_target, write_config
from .http_rows import IDEM, POST
from .server_process import server_process, stop_and_read

PROCESSES = 3
ROUNDS = 50
DEADLINE = 120.0
ROUND_LIMIT = 60.0
"""Seconds a round's children have to answer."""
SERVER = r"""
import json, sys, trio
from tests.http.hostile import HostileServer, Reply, scripts

async def main():
    reply = Reply(201, body=b'{"ok":1}', delay=0.05)
    async with HostileServer.running(scripts.serve(reply)) as srv:
        print(srv.url, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)
        print(json.dumps([r.header("Idempotency-Key") for r in srv.requests]), flush=True)

trio.run(main)
"""


def _fork_call(cfg: Path, action: bytes) -> tuple[int, int, int]:
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
        raise AssertionError(f"{len(late)} child(ren) did not finish in time; stderr:\n{stacks}")
    results = []
    for pid, out, err in children:
        _, status = os.waitpid(pid, 0)
        results.append((os.waitstatus_to_exitcode(status), bufs[out], bufs[err]))
    return results


def _spawn_call(cfg: Path, action: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "affidavit", "call", str(action), "--config", str(cfg)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


def _check_round(results: list[tuple[int, bytes, bytes]]) -> str:
    ids = set()
    for code, out, err in results:
        assert b"Traceback" not in err and b"Traceback" not in out, err.decode()
        assert code in (0, 1), (code, err.decode())
        env: dict[str, Any] = json.loads(out)
        ids.add(env["invocation_id"])
        error = env.get("error")
        assert error is None or (error["code"], error["retry"]) == (
            "IN_PROGRESS",
            "fetch_result",
        ), env
    assert len(ids) == 1, ids
    return ids.pop()


@pytest.mark.slow
def test_concurrent_call_processes_on_one_key_end_cleanly(tmp_path: Path) -> None:
    started = time.monotonic()
    env = {**os.environ, TOKEN_ENV: "tok-race-" + "r" * 12}
    os.environ[TOKEN_ENV] = env[TOKEN_ENV]  # the forked children read it here
    try:
        with server_process(SERVER) as (url, server):
            cfg = write_config(tmp_path, {"api": http_target(url, idempotency=IDEM)})
            keys = []
            for n in range(ROUNDS):
                key = f"proc-race-{n}"
                keys.append(key)
                action = json.dumps({**POST, "idempotency_key": key}).encode()
                children = [_fork_call(cfg, action) for _ in range(PROCESSES)]
                _check_round(_collect(children))
                assert time.monotonic() - started < DEADLINE
            for n in range(2):  # fresh interpreters: the console entry point itself
                key = f"proc-race-real-{n}"
                keys.append(key)
                file = tmp_path / f"{key}.json"
                file.write_text(json.dumps({**POST, "idempotency_key": key}))
                procs = [_spawn_call(cfg, file, env) for _ in range(PROCESSES)]
                results = []
                for p in procs:
                    out, err = p.communicate(timeout=60)
                    results.append((p.returncode, out, err))
                _check_round(results)
            seen = json.loads(stop_and_read(server))
    finally:
        os.environ.pop(TOKEN_ENV, None)
    assert sorted(seen) == sorted(keys), "exactly one dispatch per key"
    verify = subprocess.run(
        [sys.executable, "-m", "affidavit", "journal", "verify", "--config", str(cfg)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert verify.returncode == 0 and b"journal intact" in verify.stdout, verify
