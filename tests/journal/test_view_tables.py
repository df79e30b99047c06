"""What the text tables of ``affidavit actions``, ``sessions`` and ``record`` show must read as
what the records say, no more: an action without a session is not shown as a session a caller
can name (``-`` is a valid name: printable ASCII, ``affidavit.session``); an outcome an operator
attested (``reconcile --attest``) is not shown as one the remote's answer proves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from affidavit.cli import main as cli_main
from affidavit.journal import Journal, JournalReader, SessionSummary
from affidavit.statemachine import Event, EventKind, EvidenceSource
from affidavit.text import ATTESTED

from .helpers import happy, interrupted

ATTEST = {"outcome": "committed", "note": "checked the ledger"}


async def _fill(db: Path) -> None:
    async with Journal.open(db) as j:
        for iid, session in (("inv-none", None), ("inv-dash", "-"), ("inv-empty", "")):
            for ev in interrupted(iid, session):
                await j.append(ev)
        # In session "ops": one committed by the remote's answer, one attested committed.
        for ev in [*happy("inv-proven", "ops"), *interrupted("inv-attested", "ops")]:
            await j.append(ev)
        await j.append(_attested("inv-attested"))


def _attested(iid: str) -> Event:
    return Event(
        EventKind.RECONCILED,
        iid,
        ATTEST,
        source=EvidenceSource.OPERATOR_ATTESTED,
        observer="ops",
        observer_seq=1,
    )


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
    assert firsts == ["-", '"-"', '""', "ops"]
    for iid, shown in (("inv-none", "-"), ("inv-dash", '"-"')):
        record = _lines(capsys, "record", iid, "--journal", str(db))
        assert record[0].split()[3] == shown, record[0]


def test_an_attested_outcome_is_marked_and_counted_apart(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert EvidenceSource.OPERATOR_ATTESTED.value == ATTESTED  # the thin client's copy
    actions = _lines(capsys, "actions", "--journal", str(db))
    assert actions[0].split()[3] == "OUTCOME"
    assert _row(actions, "inv-proven")[3:5] == ["committed", "fetch_result"]
    assert _row(actions, "inv-attested")[3:5] == ["committed", "(attested)"]
    record = _lines(capsys, "record", "inv-attested", "--journal", str(db))
    assert "outcome committed (attested)  retry" in record[1]
    record = _lines(capsys, "record", "inv-proven", "--journal", str(db))
    assert "outcome committed  retry" in record[1]
    sessions = _lines(capsys, "sessions", "--journal", str(db))
    assert _row(sessions, "ops")[-2:] == ["committed=1", "committed(attested)=1"]
    # --json: outcomes as before (every record), attested apart; the daemon's kept view too.
    assert cli_main(["sessions", "--journal", str(db), "--json"]) == 0
    (ops,) = [e for e in json.loads(capsys.readouterr().out) if e["session"] == "ops"]
    assert (ops["outcomes"], ops["attested"]) == ({"committed": 2}, {"committed": 1})
    with JournalReader.open(db) as r:
        kept, _ = r.summarized_sessions(SessionSummary())
        assert kept == r.sessions()
        assert [e["attested"] for e in kept] == [{}, {}, {}, {"committed": 1}]


async def test_the_kept_sessions_view_counts_an_attestation_made_after_it(
    tmp_path: Path,
) -> None:
    """The daemon's kept view (``SessionSummary``) re-folds an invocation attested since: the
    count moves to ``attested`` as a whole fold would move it."""
    db = tmp_path / "j.db"
    summary = SessionSummary()
    async with Journal.open(db) as j:
        for ev in interrupted("inv-1", "ops"):
            await j.append(ev)
        with JournalReader.open(db) as r:
            before, _ = r.summarized_sessions(summary)
        await j.append(_attested("inv-1"))
    with JournalReader.open(db) as r:
        after, _ = r.summarized_sessions(summary)
        assert after == r.sessions()
    assert (before[0]["outcomes"], before[0]["attested"]) == ({"unknown": 1}, {})
    assert (after[0]["outcomes"], after[0]["attested"]) == ({"committed": 1}, {"committed": 1})
