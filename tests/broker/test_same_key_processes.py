"""Same-key races between processes: 3 concurrent ``affidavit call`` processes on one key, 20
rounds -- zero tracebacks, one dispatch per key, every envelope for the same invocation, and
``affidavit journal verify`` intact (issue 9, item 5).  Issue 9 ran 50 rounds; each round is
the same race on a fresh key, and 50 forked rounds took 36-73 s of a whole-suite run, so the
suite samples 20 and ``AFFIDAVIT_SAME_KEY_ROUNDS=50`` (or more) runs the longer soak.

Interpreter start-up costs ~0.5 s of CPU (trio and cryptography imports), so 150 fresh
interpreters would take minutes on CI's two cores.  The rounds therefore fork children of one
(already importing) process, tests/broker/same_key_rounds.py, each running the ``affidavit``
entry point -- ``cli.main(["call", ...])`` with its own stdin, stdout and stderr, its own
journal connection and writer -- exactly what the console script runs after its imports.  That
process is not this one: a pytest worker has threads when the test starts, and a fork copies
their locks (same_key_rounds says more).  Two more rounds use fresh ``python -m affidavit``
interpreters, so the real thing is covered as well.  The scripted server runs in its own
process too.

Each round has ``ROUND_LIMIT`` (60 s) to answer -- a hang's bound: a round takes ~0.3 s, 2.8 s
at most under three CPU burners -- and the whole is bounded by the count of rounds times that,
never by a total speed budget (it once asserted 120 s for the 50 rounds: 74 s under three
burners).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .helpers import TOKEN_ENV, http_target, write_config
from .http_rows import IDEM, POST
from .same_key_rounds import ROUND_LIMIT
from .server_process import REPO, server_process, stop_and_read

PROCESSES = 3
ROUNDS = int(os.environ.get("AFFIDAVIT_SAME_KEY_ROUNDS", "20"))
"""Forked rounds, each the race on a key of its own (``AFFIDAVIT_SAME_KEY_ROUNDS=50``: issue 9's
count)."""
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


def _forked_rounds(cfg: Path, env: dict[str, str]) -> list[list[tuple[int, bytes, bytes]]]:
    """The ``ROUNDS`` forked rounds (tests/broker/same_key_rounds.py): each child's exit code,
    stdout and stderr, round by round."""
    argv = ["-m", "tests.broker.same_key_rounds", str(cfg), str(ROUNDS), str(PROCESSES)]
    runner = subprocess.run(
        [sys.executable, *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=ROUNDS * (ROUND_LIMIT + 5),  # a bound on a hang only: the rounds count it
        check=False,
    )
    assert runner.returncode == 0, runner.stderr.decode(errors="replace")
    rounds = []
    for line in runner.stdout.decode().splitlines():
        said = json.loads(line)
        assert not isinstance(said, dict), said["overran"]
        rounds.append([(code, out.encode(), err.encode()) for code, out, err in said])
    assert len(rounds) == ROUNDS, runner.stderr.decode(errors="replace")
    return rounds


@pytest.mark.slow
def test_concurrent_call_processes_on_one_key_end_cleanly(tmp_path: Path) -> None:
    env = {**os.environ, TOKEN_ENV: "tok-race-" + "r" * 12}
    with server_process(SERVER) as (url, server):
        cfg = write_config(tmp_path, {"api": http_target(url, idempotency=IDEM)})
        keys = [f"proc-race-{n}" for n in range(ROUNDS)]  # same_key_rounds' keys
        for results in _forked_rounds(cfg, env):
            _check_round(results)
        for n in range(2):  # fresh interpreters: the console entry point itself
            key = f"proc-race-real-{n}"
            keys.append(key)
            file = tmp_path / f"{key}.json"
            file.write_text(json.dumps({**POST, "idempotency_key": key}))
            procs = [_spawn_call(cfg, file, env) for _ in range(PROCESSES)]
            results = []
            for p in procs:
                out, err = p.communicate(timeout=ROUND_LIMIT)
                results.append((p.returncode, out, err))
            _check_round(results)
        seen = json.loads(stop_and_read(server))
    assert sorted(seen) == sorted(keys), "exactly one dispatch per key"
    verify = subprocess.run(
        [sys.executable, "-m", "affidavit", "journal", "verify", "--config", str(cfg)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert verify.returncode == 0 and b"journal intact" in verify.stdout, verify
