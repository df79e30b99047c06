"""Diagrams of a protocol that is not the repository's own (audit 51f, item 1): the committed
set -- and ``affidavit diagrams --check`` -- is the repository's protocols alone, whatever plugin
is installed or registered; ``--all-protocols --root DIR`` draws a plugin's table and its rows
in ``docs/contract.md`` exactly as HTTP's and SSH's are, installed (entry point) or registered
in-process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from affidavit import docgen as dg
from affidavit.cli import main

from . import PROTOCOL
from .conftest import ROOT


def _affidavit(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "affidavit", "diagrams", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


def _drawn(root: Path) -> None:
    mmd = root / "diagrams" / "protocol-toy.mmd"
    assert mmd.read_text(encoding="utf-8") == dg.mermaid_source(dg.protocol_graph(PROTOCOL.table))
    assert (root / "diagrams" / "protocol-toy.dot").is_file()
    assert "(../diagrams/protocol-toy.mmd)" in (root / "docs" / "contract.md").read_text()
    assert (root / "diagrams" / "protocol-http.mmd").is_file()  # beside the built-ins


def test_an_installed_plugin_is_drawn_on_request_and_never_judged_by_the_repositorys_check(
    plugin_env: dict[str, str], tmp_path: Path
) -> None:
    checked = _affidavit(plugin_env, "--check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    out = tmp_path / "out"
    out.mkdir()
    drawn = _affidavit(plugin_env, "--all-protocols", "--root", str(out))
    assert drawn.returncode == 0, drawn.stderr
    _drawn(out)
    again = _affidavit(plugin_env, "--all-protocols", "--check", "--root", str(out))
    assert again.returncode == 0, again.stdout + again.stderr


@pytest.mark.usefixtures("toy_registered")
def test_a_protocol_registered_in_process_is_drawn_on_request_only(tmp_path: Path) -> None:
    assert "diagrams/protocol-toy.mmd" not in dg.generated_files()
    assert main(["diagrams", "--all-protocols", "--root", str(tmp_path)]) == 0
    _drawn(tmp_path)


def test_all_protocols_into_the_checkout_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["diagrams", "--all-protocols"]) == 2
    assert "INVALID_FIELD: --root: --all-protocols" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["dot", "path"])
def test_all_protocols_with_the_checkout_as_root_is_refused(
    where: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--root .`` inside the checkout (or its path) would write plugin files into the
    repository, "extra" to every later --check (review 51 round 2, item 2)."""
    monkeypatch.chdir(ROOT)
    root = "." if where == "dot" else str(ROOT)
    before = sorted(p.name for p in (ROOT / "diagrams").iterdir())
    assert main(["diagrams", "--all-protocols", "--root", root]) == 2
    assert f"INVALID_FIELD: --root: {root} is an affidavit checkout" in capsys.readouterr().err
    assert sorted(p.name for p in (ROOT / "diagrams").iterdir()) == before
