"""A key whose binder was killed before it recorded anything, called again through the daemon.

Seed, "Idempotency is defined by the remote contract": the key is persisted before dispatch, and
DISPATCH_STARTED is durable before a byte is sent -- so a binding with nothing recorded under it,
whose binder is provably gone, has sent nothing.  A real broker process (``crashkit``) binds the
key and SIGKILLs itself at that commit; then ``affidavit serve`` opens the journal as its only
writer (every other writer is gone) and a caller on its socket calls under the key.  It used to
answer IN_PROGRESS for good, naming the dead binder's invocation whatever the request.  Now the
same request takes the invocation over at once, runs it (sent once), and records why
(``took_over``); a different request closes it first (``fenced``) and is IDEMPOTENCY_MISMATCH
naming nothing.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.statemachine import FENCE_RULES
from tests.broker.http_rows import IDEM, POST
from tests.broker.server_process import REPO
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import HUNG, api_target, ask, daemon_env, start_daemon, stop, write_daemon_config

ACTION = {**POST, "idempotency_key": "orphan"}


async def _call(socket: Path, action: dict[str, Any]) -> dict[str, Any]:
    status, _headers, body = await ask(socket, "POST", "/v1/calls", json.dumps(action).encode())
    assert status == 200, body
    answer: dict[str, Any] = json.loads(body)
    return answer


async def _killed_after_binding(cfg: Path, tmp: Path, token: str) -> str:
    """A broker process binds ``ACTION``'s key and is SIGKILLed at that commit: the orphan's
    invocation id, read from the journal (one binding, no event)."""
    action = tmp / "action.json"
    action.write_text(json.dumps(ACTION), encoding="utf-8")
    argv = [sys.executable, "-m", "tests.broker.crashkit", str(cfg), str(action), "0", "after"]
    with trio.fail_after(HUNG):
        done = await trio.run_process(
            [*argv, "1"],
            stdin=b"-\n",
            capture_stdout=True,
            capture_stderr=True,
            env=daemon_env(token),
            cwd=REPO,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.splitlines()[0])
    assert said["returncode"] == -signal.SIGKILL, said
    db = sqlite3.connect(f"file:{tmp / 'journal.db'}?mode=ro", uri=True)
    try:
        assert db.execute("SELECT count(*) FROM events").fetchone()[0] == 0
        rows = db.execute("SELECT key, invocation_id FROM idempotency").fetchall()
    finally:
        db.close()
    assert [key for key, _ in rows] == ["orphan"], rows
    return str(rows[0][1])


@pytest.mark.parametrize("other_first", [False, True], ids=["same-first", "other-first"])
async def test_a_key_whose_binder_was_killed_before_recording_is_taken_over_or_a_mismatch(
    tmp_path: Path, token: str, other_first: bool
) -> None:
    """The same request first takes the orphan over and runs it; a different request first is
    IDEMPOTENCY_MISMATCH naming nothing, having closed the orphan (``binder.fence``): the same
    request after it is answered from that closed record, nothing sent."""
    async with HostileServer.running(scripts.serve(Reply(201))) as srv:
        socket = tmp_path / "affidavit.sock"
        # A long total timeout: the binder's window (60 s) is nowhere near over -- only the
        # daemon being the journal's only writer proves the binder gone.
        target = api_target(srv.url, idempotency=IDEM, timeout={"connect": 2, "total": 60})
        cfg = write_daemon_config(tmp_path, target, socket=socket)
        orphan = await _killed_after_binding(cfg, tmp_path, token)
        daemon = await start_daemon(cfg, socket, tmp_path / "daemon.log", token)
        try:
            with trio.fail_after(HUNG):
                if other_first:
                    other = await _call(socket, {**ACTION, "body": '{"amount":999}'})
                    error = other["error"]
                    assert error["code"] == "IDEMPOTENCY_MISMATCH", other
                    assert error["field"] == "idempotency_key", other
                    assert error["outcome"] == "not_attempted", other
                    assert orphan not in json.dumps(other)
                same = await _call(socket, ACTION)
                assert same["invocation_id"] == orphan, same
                status, _h, body = await ask(socket, "GET", f"/v1/invocations/{orphan}")
            assert status == 200, body
            events = json.loads(body)["events"]
            assert [e["kind"] for e in events].count("ACTION_ACCEPTED") == 1
            if other_first:
                assert same["error"]["code"] == "IDEMPOTENCY_MISMATCH", same
                assert same["error"]["outcome"] == "not_attempted", same
                fenced = events[0]["attrs"]["fenced"]
                assert (fenced["why"], fenced["recorded"]) == ("only_writer", "nothing"), fenced
                # Under the strict rules (``FENCE_RULES``), its close built from these facts.
                assert fenced.pop("rules") == FENCE_RULES, fenced
                assert events[1]["kind"] == "PREFLIGHT_FAILED", events
                assert events[1]["attrs"]["binder_gone"] == fenced, events
            else:
                assert "error" not in same and same["result"]["status"] == 201, same
                took = events[0]["attrs"]["took_over"]
                assert (took["why"], took["recorded"]) == ("only_writer", "nothing"), took
        finally:
            stop(daemon)
    sent = [] if other_first else [POST["body"].encode()]
    assert [r.body for r in srv.requests] == sent
