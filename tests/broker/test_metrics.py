"""`affidavit metrics`: phase and outcome are counted separately, never merged as "errors"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from affidavit.journal import Journal
from affidavit.statemachine import Event, EventKind, EvidenceSource
from affidavit.views import metrics

E = EventKind
OP = {"target": "t", "protocol": "http", "idempotent": False, "fingerprint": "sha256:x"}


async def _write(path: Path) -> None:
    async with Journal.open(path) as j:
        # connection_setup / not_attempted
        await j.append(Event(E.ACTION_ACCEPTED, "a1", {"operation": OP, "session": "s1"}))
        await j.append(Event(E.PREFLIGHT_VALIDATED, "a1", {}))
        await j.append(Event(E.CREDENTIAL_AUTHORIZED, "a1", {}))
        await j.append(
            Event(E.SETUP_FAILED, "a1", {"code": "CONNECTION_REFUSED", "stage": "tcp_connect"}),
            barrier=True,
        )
        # remote_execution / unknown
        for iid in ("a2", "a3"):
            await j.append(Event(E.ACTION_ACCEPTED, iid, {"operation": OP, "session": "s2"}))
            await j.append(Event(E.PREFLIGHT_VALIDATED, iid, {}))
            await j.append(Event(E.CREDENTIAL_AUTHORIZED, iid, {}))
            await j.append(Event(E.DISPATCH_STARTED, iid, {"generation": 0}))
            await j.append(
                Event(E.ATTEMPT_INTERRUPTED, iid, {"code": "REMOTE_OUTCOME_UNKNOWN"}), barrier=True
            )
        # remote_execution / committed with an error code (HTTP 500): known, not a success
        await j.append(Event(E.ACTION_ACCEPTED, "a4", {"operation": OP, "session": "s2"}))
        await j.append(Event(E.PREFLIGHT_VALIDATED, "a4", {}))
        await j.append(Event(E.CREDENTIAL_AUTHORIZED, "a4", {}))
        await j.append(Event(E.DISPATCH_STARTED, "a4", {"generation": 0}))
        await j.append(
            Event(
                E.REMOTE_RESPONSE_COMPLETE,
                "a4",
                {"outcome": "committed", "code": "REMOTE_ERROR", "status": 500},
                source=EvidenceSource.REMOTE_RESPONSE,
            ),
            barrier=True,
        )


async def test_metrics_count_phase_and_outcome_separately(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    await _write(db)
    with _reader(db) as j:
        data = metrics(j.list_actions())
    assert data["invocations"] == 4
    rows = {(r["phase"], r["outcome"]): r["count"] for r in data["by_phase_outcome"]}
    assert rows == {
        ("connection_setup", "not_attempted"): 1,
        ("remote_execution", "unknown"): 2,
        ("remote_execution", "committed"): 1,
    }
    codes = {(r["code"], r["outcome"]): r["count"] for r in data["by_code_outcome"]}
    assert codes[("REMOTE_ERROR", "committed")] == 1
    assert codes[("CONNECTION_REFUSED", "not_attempted")] == 1


def _reader(db: Path):  # type: ignore[no-untyped-def]
    from affidavit.journal import JournalReader

    return JournalReader.open(db)


async def test_metrics_cli_json_and_prometheus(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    await _write(db)
    base = [sys.executable, "-m", "affidavit", "metrics", "--journal", str(db)]
    out = subprocess.run(
        [*base, "--json", "--session", "s2"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["invocations"] == 3
    prom = subprocess.run([*base, "--prometheus"], capture_output=True, text=True, timeout=60)
    assert prom.returncode == 0, prom.stderr
    assert 'affidavit_invocations{phase="remote_execution",outcome="unknown"} 2' in prom.stdout
    assert (
        'affidavit_invocations{phase="connection_setup",outcome="not_attempted"} 1' in prom.stdout
    )


async def test_a_closed_reader_pipe_is_not_a_traceback(tmp_path: Path) -> None:
    """`affidavit actions | head -1`: the reader leaving early is not the broker's error."""
    db = tmp_path / "j.db"
    await _write(db)
    proc = subprocess.Popen(
        [sys.executable, "-m", "affidavit", "actions", "--journal", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line is written
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err


async def test_streamed_actions_json_is_the_whole_list_one_record_per_line(
    tmp_path: Path,
) -> None:
    """`affidavit actions --json` writes record by record (issue 15): one JSON array, one
    record per line, equal to the whole list; an empty journal is ``[]``."""
    from affidavit.journal import JournalReader
    from affidavit.views import record_to_json

    db = tmp_path / "j.db"
    for fill in (False, True):
        if fill:
            await _write(db)
        else:
            async with Journal.open(db):
                pass
        out = subprocess.run(
            [sys.executable, "-m", "affidavit", "actions", "--journal", str(db), "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        with JournalReader(db) as r:
            rows = [record_to_json(x, operator=True) for x in r.list_actions()]
        assert bool(rows) is fill
        assert json.loads(out.stdout) == rows
        lines = out.stdout.splitlines()
        if not fill:
            assert lines == ["[]"]
            continue
        assert (lines[0], lines[-1], len(lines)) == ("[", "]", len(rows) + 2)
        assert [json.loads(line.rstrip(",")) for line in lines[1:-1]] == rows


async def _write_many(path: Path, n: int) -> None:
    async with Journal.open(path) as j:
        for i in range(n):
            iid = f"many-{i:05d}"
            await j.append(Event(E.ACTION_ACCEPTED, iid, {"operation": OP, "session": "s"}))
            await j.append(
                Event(E.PREFLIGHT_FAILED, iid, {"code": "INVALID_FIELD", "message": "m"}),
                barrier=i == n - 1,
            )


@pytest.mark.parametrize("form", [[], ["--json"]])
async def test_a_reader_leaving_mid_stream_is_not_a_traceback(
    tmp_path: Path, form: list[str]
) -> None:
    """`affidavit actions | head -1` on a journal larger than a pipe holds: the reader leaves
    while the view is still being streamed.  The stream must be closed while the journal is
    open -- not found later by the collector, on a closed connection, as "Exception ignored
    ... Cannot operate on a closed database" on stderr."""
    db = tmp_path / "j.db"
    await _write_many(db, 1000)  # ~120 KiB of table, ~400 KiB of JSON: more than a pipe holds
    proc = subprocess.Popen(
        [sys.executable, "-m", "affidavit", "actions", "--journal", str(db), *form],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline()  # the view has begun ...
    proc.stdout.close()  # ... and its reader is gone while most of it is still to come
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err and "Exception ignored" not in err, err
