"""``affidavit actions --json`` folded by two processes over a large journal (issue 15): the
same text as one process writes; and when the child fails, its half is folded here -- the same
output, and for a journal whose fold fails part-way, the same records before the same error."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import pytest
import trio

from affidavit.cli import actions_json
from affidavit.cli import main as cli_main
from affidavit.journal import Journal, JournalReader

from .helpers import Ticking, append_interleaved, happy, interrupted

# (arguments, records listed, whether the child's half holds any of them)
ARGS = (
    (["--json"], 12, True),
    (["--json", "--outcome", "unknown"], 4, True),
    (["--json", "--since", "1700000012"], 6, True),  # only invocations in the child's half
    (["--json", "--until", "1700000010"], 5, False),  # none
)


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("split") / "j.db"
    runs = [interrupted(f"i{n}") if n % 3 == 0 else happy(f"i{n}") for n in range(12)]

    async def fill() -> None:
        async with Journal.open(path, clock=Ticking()) as j:
            await append_interleaved(j, runs)

    trio.run(fill)
    return path


def _run(
    db: Path, args: list[str], split: bool, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> str:
    monkeypatch.setattr(actions_json, "SPLIT_MIN_EVENTS", 1 if split else 10**9)
    assert cli_main(["actions", *args, "--journal", str(db)]) == 0
    out: str = capsys.readouterr().out
    return out


def test_two_processes_write_what_one_writes(
    journal: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    joined: list[int] = []
    real = actions_json._Array.joined

    def spy(self: Any, spool: IO[bytes]) -> None:
        joined.append(spool.seek(0, 2))  # how much the child wrote
        real(self, spool)

    monkeypatch.setattr(actions_json._Array, "joined", spy)
    for args, listed, theirs in ARGS:
        one = _run(journal, args, False, monkeypatch, capsys)
        assert not joined
        two = _run(journal, args, True, monkeypatch, capsys)
        assert len(joined) == 1 and (joined.pop() > 0) == theirs, args  # the child's text
        assert two == one and one.count("\n{") == listed, args


def test_a_failed_child_has_its_half_folded_here(
    journal: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    one = _run(journal, ["--json"], False, monkeypatch, capsys)

    def failing(spool: IO[bytes]) -> subprocess.Popen[bytes]:
        code = "import sys; sys.stdin.readline(); sys.stdout.write('{\"half\": 1}'); sys.exit(3)"
        return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=spool)

    def gone(spool: IO[bytes]) -> subprocess.Popen[bytes]:
        """A child that has exited before it is told its half (``_send`` finds no reader)."""
        child = subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.PIPE)
        child.wait()
        return child

    monkeypatch.setattr(actions_json, "_start", failing)
    assert _run(journal, ["--json"], True, monkeypatch, capsys) == one
    monkeypatch.setattr(actions_json, "_start", gone)
    assert _run(journal, ["--json"], True, monkeypatch, capsys) == one
    monkeypatch.setattr(actions_json, "_start", lambda *a: None)  # could not start at all
    assert _run(journal, ["--json"], True, monkeypatch, capsys) == one


def test_the_child_starts_before_the_journal_is_cut_and_is_stopped_if_it_is_not(
    journal: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The child's start-up overlaps the check of the index (``action_spans``); a journal that
    cannot be cut after all is folded here, and the child that was waiting is stopped."""
    one = _run(journal, ["--json"], False, monkeypatch, capsys)
    started: list[subprocess.Popen[bytes] | None] = []
    real_start, real_spans = actions_json._start, JournalReader.action_spans

    def start(spool: IO[bytes]) -> subprocess.Popen[bytes] | None:
        started.append(real_start(spool))
        return started[-1]

    def spans(self: JournalReader, parts: int, min_events: int) -> Any:
        assert len(started) == 1, "the child must be started before the journal is cut"
        return real_spans(self, parts, min_events)

    monkeypatch.setattr(actions_json, "_start", start)
    monkeypatch.setattr(JournalReader, "action_spans", spans)
    assert _run(journal, ["--json"], True, monkeypatch, capsys) == one
    monkeypatch.setattr(JournalReader, "action_spans", lambda *a: None)
    started.clear()
    assert _run(journal, ["--json"], True, monkeypatch, capsys) == one
    child = started[0]
    assert child is not None and child.poll() is not None  # stopped, not left waiting


def test_a_child_told_nothing_writes_nothing_and_fails() -> None:
    code = "from affidavit.cli.actions_json import fold_span; fold_span()"
    done = subprocess.run(
        [sys.executable, "-P", "-c", code], stdin=subprocess.DEVNULL, capture_output=True
    )
    assert done.returncode == 1 and done.stdout == b""


def test_a_fold_that_fails_in_the_childs_half_fails_as_one_process_does(
    journal: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Someone rewrote a row of the last invocation into an event its state cannot take (the
    journal no longer verifies): the records before it are written, then the fold's error --
    one line naming the row as altered, not a traceback -- and the child's failure is not what
    is reported."""
    db = tmp_path / "edited.db"
    db.write_bytes(journal.read_bytes())
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute(
        "UPDATE events SET kind = 'ACTION_ACCEPTED' WHERE seq = (SELECT max(seq) FROM events "
        "WHERE invocation_id = 'i11')"
    )
    conn.close()
    outs = []
    for split in (False, True):
        monkeypatch.setattr(actions_json, "SPLIT_MIN_EVENTS", 1 if split else 10**9)
        assert cli_main(["actions", "--json", "--journal", str(db)]) == 2
        out, err = capsys.readouterr()
        assert "record of invocation i11" in err and "a row was altered" in err, err
        assert err.count("\n") == 1
        outs.append(out)
    assert outs[0] == outs[1]
    assert outs[0].count("\n{") == 11 and not outs[0].endswith("]\n")
