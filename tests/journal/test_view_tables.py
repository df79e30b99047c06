"""What the text tables of ``affidavit actions``, ``sessions`` and ``record`` show must read as
what the records say, no more: an action without a session is not shown as a session a caller
can name (``-`` is a valid name: printable ASCII, ``affidavit.session``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from affidavit.cli import main as cli_main
from affidavit.journal import Journal

from .helpers import interrupted


async def _fill(db: Path) -> None:
    async with Journal.open(db) as j:
        for iid, session in (("inv-none", None), ("inv-dash", "-"), ("inv-empty", "")):
            for ev in interrupted(iid, session):
                await j.append(ev)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tables") / "j.db"
    trio.run(_fill, path)
    return path


def _lines(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    assert cli_main(list(argv)) == 0
    return capsys.readouterr().out.splitlines()


def _row(lines: list[str], start: str) -> list[str]:
    (line,) = [x for x in lines if x.startswith(start)]
    return line.split()


def test_no_session_and_a_session_named_dash_look_different(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    actions = _lines(capsys, "actions", "--journal", str(db))
    assert _row(actions, "inv-none")[1] == "-"
    assert _row(actions, "inv-dash")[1] == '"-"'
    assert _row(actions, "inv-empty")[1] == '""'  # (an altered row's: no caller gives one)
    sessions = _lines(capsys, "sessions", "--journal", str(db))
    firsts = [line.split()[0] for line in sessions[1:]]
    assert firsts == ["-", '"-"', '""']
    for iid, shown in (("inv-none", "-"), ("inv-dash", '"-"')):
        record = _lines(capsys, "record", iid, "--journal", str(db))
        assert record[0].split()[3] == shown, record[0]
