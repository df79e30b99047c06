"""`affidavit demo` is the README's first command: it must run offline and tell the truth."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from affidavit.cli.tour import explain, run_demo


@pytest.fixture
def demo_token(monkeypatch: pytest.MonkeyPatch) -> str:
    token = "demo-canary-7f3a9c1e5b"
    monkeypatch.setenv("AFFIDAVIT_DEMO_TOKEN", token)
    return token


async def test_demo_scenes_follow_the_evidence(tmp_path: Path, demo_token: str) -> None:
    out = io.StringIO()
    with trio.fail_after(30):
        envs = await run_demo(tmp_path, out)
    ok, rejected, dropped, timed_out, lost, retried = envs

    assert "error" not in ok and ok["result"]["status"] == 200
    assert rejected["error"]["outcome"] == "rejected"
    assert rejected["error"]["retry"] == "after_correction"

    # Dispatched POST without a contract, connection dropped: unknown, reconcile — never backoff.
    assert dropped["error"]["code"] == "REMOTE_OUTCOME_UNKNOWN"
    assert (dropped["error"]["outcome"], dropped["error"]["retry"]) == ("unknown", "reconcile")
    assert dropped["evidence"]["dispatch_started"] is True
    assert dropped["evidence"]["request_complete"] is True

    assert timed_out["error"]["code"] == "CALLER_CANCELLED"
    assert timed_out["error"]["outcome"] == "unknown"

    # Lost answer under a declared contract: retry with the same key; the retry resumes the same
    # invocation and the server applies the payment once.
    assert lost["error"]["retry"] == "same_idempotency_key"
    assert retried["invocation_id"] == lost["invocation_id"]
    assert "error" not in retried and retried["result"]["status"] == 201
    assert retried["evidence"]["budget"]["used"] == 2
    assert "applied 1 payment(s)" in out.getvalue()

    text = out.getvalue()
    assert demo_token not in text
    for env in envs:
        assert demo_token not in repr(env)
        assert explain(env).split(":", 1)[0] in {
            "committed",
            "rejected",
            "unknown",
            "not_attempted",
        }


def test_demo_cli_runs_offline(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "affidavit", "demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        # A desktop's usual umask: the demo's own config is not left group-writable (which the
        # broker would warn of as an exposure, on the README's first command).
        preexec_fn=lambda: os.umask(0o002),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("why:") == 6
    assert "Traceback" not in proc.stderr
    assert "config file" not in proc.stderr, proc.stderr
