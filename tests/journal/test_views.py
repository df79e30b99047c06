"""Views on the command line (issue 3, item 7): `affidavit actions`, `affidavit record ID`,
`affidavit sessions` with `--json` (the Python API's views are in the conformance suite)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from affidavit.cli import main as cli_main
from affidavit.journal import Journal

from .helpers import Ticking, fill_views


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("views") / "j.db"

    async def fill() -> None:
        async with Journal.open(path, clock=Ticking()) as j:
            await fill_views(j)

    trio.run(fill)
    return path


def test_cli_views_json(journal: Path, capsys: pytest.CaptureFixture[str]) -> None:
    j = ["--journal", str(journal), "--json"]
    assert cli_main(["actions", *j, "--outcome", "unknown"]) == 0
    actions = json.loads(capsys.readouterr().out)
    assert [(a["invocation_id"], a["outcome"], a["retry"]) for a in actions] == [
        ("lost-1", "unknown", "reconcile")
    ]
    assert cli_main(["actions", *j, "--session", "alice", "--since", "2023-11-14T22:13:00Z"]) == 0
    assert [a["invocation_id"] for a in json.loads(capsys.readouterr().out)] == ["ok-1", "lost-1"]
    assert cli_main(["record", "bad-1", *j]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["record"]["code"] == "INVALID_TARGET"
    assert [e["kind"] for e in shown["events"]] == ["ACTION_ACCEPTED", "PREFLIGHT_FAILED"]
    assert cli_main(["sessions", *j]) == 0
    assert {s["session"] for s in json.loads(capsys.readouterr().out)} == {"alice", "bob", None}


def test_cli_views_text_and_usage_errors(
    journal: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    j = ["--journal", str(journal)]
    assert cli_main(["actions", *j]) == 0
    assert "lost-1" in capsys.readouterr().out
    assert cli_main(["record", "ok-1", *j]) == 0
    assert "RESPONSE_COMPLETE" in capsys.readouterr().out
    assert cli_main(["sessions", *j]) == 0
    assert "alice" in capsys.readouterr().out
    assert cli_main(["record", "nope", *j]) == 2
    assert "no invocation nope" in capsys.readouterr().err
    assert cli_main(["actions", *j, "--since", "yesterday"]) == 2
    assert "--since" in capsys.readouterr().err
    assert cli_main(["sessions", "--journal", str(tmp_path / "absent.db")]) == 2
    assert "no journal" in capsys.readouterr().err


def test_cli_finds_the_journal_through_the_config(
    journal: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cfg = tmp_path / "broker.toml"
    cfg.write_text(f'[journal]\npath = "{journal}"\n')
    assert cli_main(["journal", "verify", "--config", str(cfg)]) == 0
    assert "intact" in capsys.readouterr().out
    monkeypatch.setenv("AFFIDAVIT_CONFIG", str(cfg))
    assert cli_main(["sessions", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 3
    monkeypatch.setenv("AFFIDAVIT_CONFIG", str(tmp_path / "missing.toml"))
    assert cli_main(["sessions"]) == 2
    assert "missing.toml" in capsys.readouterr().err
