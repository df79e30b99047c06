"""`affidavit demo` is the README's first command: it must run offline and tell the truth."""

from __future__ import annotations

import io
import os
import signal
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


@pytest.mark.parametrize("keep", [True, False])
async def test_demo_stopped_by_sigterm_closes_its_records_and_exits_143(
    tmp_path: Path, keep: bool
) -> None:
    """SIGTERM mid-tour, as every other command writing a journal takes it (``run_journal``):
    the call under way is closed where it stood (CALLER_CANCELLED), exit 143, one line, no
    traceback; without ``--keep`` the temporary directory goes, as after a whole tour.  Its
    default action killed the process at once: the record left open (until a daemon's
    recovery), the temporary directory left behind even without ``--keep``."""
    from affidavit.journal import JournalReader
    from tests.broker.helpers import signalled

    env = {**os.environ, "HOME": str(tmp_path), "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "affidavit", "demo", *(["--keep"] if keep else [])],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        seen = b""
        with trio.fail_after(30):
            # Scene 3 told: scene 4 (a call held 0.5 s by its caller's timeout) is under way.
            while seen.count(b"why:") < 3:
                chunk = await proc.stdout.receive_some(65536)
                assert chunk, seen
                seen += chunk
        code, said = await signalled(proc, signal.SIGTERM, 30)
    finally:
        if proc.returncode is None:
            proc.kill()
    lines = [ln for ln in said.decode().splitlines() if not ln.startswith("affidavit: warning:")]
    assert code == 143, said
    assert len(lines) == 1 and lines[0].startswith("affidavit: stopped by SIGTERM; "), said
    assert "Traceback" not in said.decode()
    kept = list(tmp_path.glob("affidavit-demo-*/demo.db"))
    if not keep:
        assert kept == [] and list(tmp_path.glob("affidavit-demo-*")) == []
        assert lines[0].endswith("the demo's temporary config and journal are removed"), lines
        return
    [journal] = kept
    assert lines[0].endswith(f"is recorded in {journal}, kept"), lines
    with JournalReader.open(journal) as reader:
        records = reader.list_actions()
    assert len(records) >= 3, records
    assert all(r.final for r in records), [(r.invocation_id, r.state) for r in records]
