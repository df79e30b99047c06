"""No file descriptor left when the dispatch gate reads the config again (audit 53b F2): the
read failed, the file never changed -- the attempt ends SETUP_FAILED (connection_setup,
not_attempted, retry backoff, stage ``config_reread``), never CONFIG_CHANGED (validation,
after_correction: "correct the request"), and nothing is sent.  Its envelope is answered: a
record holding no result is rendered without reading the result tables, whose read under the
same limit failed the answer after the closing event was written (exit 2, no envelope).

A real limit, in a child process: once its broker is open, every descriptor number below the
current highest is taken (``/dev/null``) and ``RLIMIT_NOFILE`` leaves ``free`` more -- one is
the connection's socket, so the config's re-read is refused EMFILE.  Each level from 0 to 4 is
run; whichever stops the call, none may be CONFIG_CHANGED, and the level that reaches the gate
with no descriptor left must answer SETUP_FAILED as recorded."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import trio

from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import http_target, write_config

LIMIT = 60
CHILD = r"""
import json, os, resource, sys, trio
from affidavit.api.broker import Broker
from affidavit.config import load_config

async def main(free):
    async with Broker.open(config=load_config(sys.argv[1])) as broker:
        limit = max(int(f) for f in os.listdir("/proc/self/fd")) + 1
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
        held = []
        try:
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit + free, hard))
        try:
            env = await broker.call({"target": "api", "method": "POST", "path": "/x", "body": "{}"})
        finally:
            for fd in held:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        rec = broker.record(env["invocation_id"])
        events = broker.events(env["invocation_id"])
        kinds = [e.kind.value for e in events]
        stop = [e.attrs for e in events if e.kind.value == "SETUP_FAILED"]
        return {"error": env.get("error"), "state": rec.state, "code": rec.code and rec.code.value,
                "retry": rec.retry.value, "kinds": kinds, "stop": stop}

print(json.dumps([trio.run(main, free) for free in range(5)]))
"""


async def test_no_descriptor_left_for_the_config_reread_is_a_setup_failure(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        before = hashlib.sha256(cfg.read_bytes()).digest()
        with trio.fail_after(LIMIT):
            child = await trio.run_process(
                [sys.executable, "-c", CHILD, str(cfg)],
                capture_stdout=True,
                capture_stderr=True,
                env=dict(os.environ),
                check=False,
            )
        assert child.returncode == 0, child.stderr.decode()[-3000:]
        runs = json.loads(child.stdout)
        assert hashlib.sha256(cfg.read_bytes()).digest() == before  # it never changed
        assert not any(r["code"] == "CONFIG_CHANGED" for r in runs), runs
        sent = [r for r in runs if "DISPATCH_STARTED" in r["kinds"]]
        assert len(srv.requests) == len(sent)
        reread = [r for r in runs if any(s.get("stage") == "config_reread" for s in r["stop"])]
        assert reread, runs  # some level reached the gate with no descriptor left
        for r in reread:
            err = r["error"]
            assert (err["code"], err["phase"], err["outcome"], err["retry"]) == (
                "SETUP_FAILED",
                "connection_setup",
                "not_attempted",
                "backoff",
            ), r
            assert "EMFILE" in err["message"] and "sent nothing" in err["message"], err
            assert (r["state"], r["code"], r["retry"]) == (
                "setup_failed",
                "SETUP_FAILED",
                "backoff",
            )
            assert "DISPATCH_STARTED" not in r["kinds"] and "PREFLIGHT_FAILED" not in r["kinds"]
