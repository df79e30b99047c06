"""``affidavit actions --json`` writes, byte for byte, what encoding each record of
``list_actions`` with ``record_to_json`` and sorted keys writes -- the path the command took
before its encoder, its fold and its copy of the child's half were made cheaper (issue 15) --
for a record in every lifecycle state (approvals, leases, retries, batches' parents, unknown and
interrupted outcomes), split over two processes or not, filtered or not, and whether standard
output has a binary buffer or not."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.cli import actions_json
from affidavit.cli import main as cli_main
from affidavit.journal import Journal, JournalReader
from affidavit.statemachine import STATES, Event, Projector
from affidavit.views import record_to_json
from tests.statemachine.lifecycle_helpers import make_event, path_to

from .helpers import Ticking, append_interleaved

NOW = 1_700_000_500.0
"""The moment every hint is computed for, on both sides (the reader's clock, fixed)."""


def _runs() -> list[list[Event]]:
    runs = []
    for n, state in enumerate(sorted(set(STATES) - {"new"})):  # (no event: no record)
        p = Projector(f"act_{n:02d}_{state}")
        run = []
        for kind, dest in path_to(state):
            event = make_event(p, kind, dest, None)
            if n % 3 and kind.value == "ACTION_ACCEPTED":  # three sessions
                event = Event(
                    event.kind, event.invocation_id, {**event.attrs, "session": f"s{n % 3}"}
                )
            p.apply(event)
            run.append(event)
        runs.append(run)
    return runs


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bytes") / "j.db"

    async def fill() -> None:
        async with Journal.open(path, clock=Ticking()) as j:
            await append_interleaved(j, _runs())

    trio.run(fill)
    return path


def _expected(db: Path, filters: dict[str, Any]) -> str:
    with JournalReader.open(db) as j:
        records = j.list_actions(**filters, now=NOW)
    encode = json.JSONEncoder(sort_keys=True).encode
    texts = [encode(record_to_json(r, operator=True)) for r in records]
    return "[]\n" if not texts else "[\n" + ",\n".join(texts) + "\n]\n"


FILTERS = (
    ([], {}),
    (["--outcome", "unknown"], {"outcome": "unknown"}),
    (["--outcome", "not_attempted"], {"outcome": "not_attempted"}),
    (["--session", "s1"], {"session": "s1"}),
    (["--phase", "remote_execution"], {"phase": "remote_execution"}),
    (["--since", "1700000040"], {"since": 1_700_000_040.0}),
)


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize(("args", "filters"), FILTERS)
def test_the_command_writes_what_record_to_json_encodes(
    journal: Path,
    split: bool,
    args: list[str],
    filters: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    want = _expected(journal, filters)
    monkeypatch.setattr(JournalReader, "now", lambda self, purpose=None: NOW)
    monkeypatch.setattr(actions_json, "SPLIT_MIN_EVENTS", 1 if split else 10**9)
    assert cli_main(["actions", "--json", *args, "--journal", str(journal)]) == 0
    got = capsys.readouterr().out
    assert got == want
    if not filters:  # every state with an event is there: the view is not a trivial one
        assert {json.loads(line.rstrip(","))["state"] for line in got.splitlines()[1:-1]} == set(
            STATES
        ) - {"new"}


def test_without_a_binary_buffer_the_childs_half_is_copied_as_text(
    journal: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    want = _expected(journal, {})
    monkeypatch.setattr(JournalReader, "now", lambda self, purpose=None: NOW)
    monkeypatch.setattr(actions_json, "SPLIT_MIN_EVENTS", 1)
    out = io.StringIO()  # no ``buffer``
    monkeypatch.setattr(actions_json, "ascii_json_stdout", lambda: out)
    joined: list[int] = []
    real = actions_json._Array.joined

    def spy(self: Any, spool: Any) -> None:
        joined.append(spool.seek(0, 2))
        real(self, spool)

    monkeypatch.setattr(actions_json._Array, "joined", spy)
    assert cli_main(["actions", "--json", "--journal", str(journal)]) == 0
    assert joined and joined[0] > 0  # the child's half was copied
    assert out.getvalue() == want
    assert capsys.readouterr().out == ""


def test_a_buffered_standard_output_gets_the_childs_half_after_the_first(journal: Path) -> None:
    """A real process whose stdout is a pipe (block-buffered text, unlike pytest's capture,
    which writes through): the text written before the child's bytes goes first."""
    code = (
        "import sys\n"
        "from affidavit.cli import actions_json, main\n"
        "from affidavit.journal import JournalReader\n"
        "actions_json.SPLIT_MIN_EVENTS = 1\n"
        f"JournalReader.now = lambda self, purpose=None: {NOW!r}\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "actions", "--json", "--journal", str(journal)],
        capture_output=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode("ascii") == _expected(journal, {})


@pytest.mark.parametrize("split", [True, False])
def test_a_raw_standard_output_that_takes_part_of_a_write_gets_all_of_it(
    journal: Path, monkeypatch: pytest.MonkeyPatch, split: bool
) -> None:
    """Under ``python -u`` standard output's ``buffer`` is a raw ``FileIO``, whose ``write`` may
    take part of the bytes (a pipe's reader stopped and continued) and says how many -- and the
    text layer over it drops the rest.  Every part of the view (this process's records, the
    child's half, the closing bracket) is written whole."""
    want = _expected(journal, {})
    monkeypatch.setattr(JournalReader, "now", lambda self, purpose=None: NOW)
    if split:
        monkeypatch.setattr(actions_json, "SPLIT_MIN_EVENTS", 1)
    got = io.BytesIO()
    calls: list[int] = []

    class Raw(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, data: Any) -> int:
            n = max(1, len(data) // 3)  # a third at most, each time
            calls.append(n)
            return got.write(bytes(data[:n]))

    raw = Raw()

    class Text(io.StringIO):
        buffer = raw

        def write(self, s: str) -> int:  # as the text layer over a raw file: the rest dropped
            raw.write(s.encode("ascii"))
            return len(s)

    text = Text()
    monkeypatch.setattr(actions_json, "ascii_json_stdout", lambda: text)
    assert cli_main(["actions", "--json", "--journal", str(journal)]) == 0
    assert len(calls) > 3  # written in parts
    assert got.getvalue().decode("ascii") == want
