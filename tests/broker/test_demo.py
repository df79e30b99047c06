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


async def _stopped_at(tmp_path: Path, hold: str, keep: bool) -> tuple[int, list[str]]:
    """Run the demo held at ``hold`` (``demo_child.py``), SIGTERM it once it is there: its
    exit status and stderr's lines (warnings aside)."""
    from tests.broker.helpers import signalled

    env = {**os.environ, "HOME": str(tmp_path), "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    child = Path(__file__).with_name("demo_child.py")
    proc = await trio.lowlevel.open_process(
        [sys.executable, str(child), hold, *(["--keep"] if keep else [])],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    marker = {"slow": b"demo-child: /slow received", "open": b"demo-child: opening"}[hold]
    try:
        assert proc.stdout is not None
        seen = b""
        with trio.fail_after(30):
            while marker not in seen:
                chunk = await proc.stdout.receive_some(65536)
                assert chunk, seen
                seen += chunk
        code, said = await signalled(proc, signal.SIGTERM, 30)
    finally:
        if proc.returncode is None:
            proc.kill()
    assert "Traceback" not in said.decode(), said
    lines = [ln for ln in said.decode().splitlines() if not ln.startswith("affidavit: warning:")]
    assert len(lines) == 1 and lines[0].startswith("affidavit: stopped by SIGTERM; "), said
    return code, lines


@pytest.mark.parametrize("keep", [True, False])
async def test_demo_stopped_by_sigterm_closes_the_call_under_way_and_exits_143(
    tmp_path: Path, keep: bool
) -> None:
    """SIGTERM mid-tour, as every other command writing a journal takes it (``run_journal``):
    the call under way -- its request received whole by the tour's server, which holds it
    (its own 0.5 s timeout lifted: only the signal ends it) -- is closed where it stood,
    CALLER_CANCELLED and unknown once dispatched; exit 143, one line, no traceback; without
    ``--keep`` the temporary directory goes, as after a whole tour.  Its default action killed
    the process at once: the record left open (until a daemon's recovery), the temporary
    directory left behind even without ``--keep``."""
    from affidavit.journal import JournalReader
    from affidavit.statemachine import Code

    code, lines = await _stopped_at(tmp_path, "slow", keep)
    assert code == 143, lines
    kept = list(tmp_path.glob("affidavit-demo-*/demo.db"))
    if not keep:
        assert kept == [] and list(tmp_path.glob("affidavit-demo-*")) == []
        assert lines[0].endswith("the demo's temporary directory is removed"), lines
        return
    [journal] = kept
    assert lines[0].endswith(f"`affidavit actions --journal {journal}` lists its calls"), lines
    with JournalReader.open(journal) as reader:
        records = reader.list_actions()
    assert len(records) == 4, records  # three scenes told, the fourth under way; no fifth
    assert all(r.final for r in records), [(r.invocation_id, r.state) for r in records]
    [cancelled] = [r for r in records if r.code is Code.CALLER_CANCELLED]
    assert cancelled.outcome.value == "unknown", cancelled
    assert cancelled.evidence.get("dispatch_started") is True, cancelled


@pytest.mark.parametrize("keep", [True, False])
async def test_demo_stopped_before_its_broker_opened_names_no_journal(
    tmp_path: Path, keep: bool
) -> None:
    """SIGTERM before the broker opened its journal: nothing was recorded, so the line names
    no journal (it said "where a call under way stood is recorded in .../demo.db", a file that
    was never written, of a call never begun)."""
    code, lines = await _stopped_at(tmp_path, "open", keep)
    assert code == 143, lines
    assert list(tmp_path.glob("affidavit-demo-*/demo.db")) == []
    assert "demo.db" not in lines[0] and "call" not in lines[0], lines
    if keep:
        [tmp] = list(tmp_path.glob("affidavit-demo-*"))
        assert lines[0].endswith(f"it had not opened its journal; {tmp} is kept"), lines
    else:
        assert list(tmp_path.glob("affidavit-demo-*")) == []
        assert lines[0].endswith("the demo's temporary directory is removed"), lines
