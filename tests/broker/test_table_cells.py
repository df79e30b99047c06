"""A cell of a text table never looks like more than one cell (docs/approvals.md, "What the
terminal shows").

A caller names its session (1 to 255 printable ASCII characters, spaces allowed); a remote names
its job.  Printed as they are, a session padded with spaces forged the PHASE, OUTCOME and RETRY
columns of ``affidavit actions`` and pushed the real ones out past column 250.  Every cell is
written by ``affidavit.text.cell``: escaped, quoted when it holds a space or a quote, cut at its
column's width with ``...``.  ``--json`` keeps the very value.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from affidavit.text import cell

from .helpers import affidavit_cli, http_target, open_broker, write_config

FORGED = ("nightly-batch " + f"{'delivered_committed':20} {'committed':14} {'never':20} -").ljust(
    255
)
"""A session name that, printed raw in the SESSION column, reads as a committed action."""


@pytest.mark.parametrize(
    ("value", "width", "shown"),
    [
        pytest.param("plain", 8, "plain   ", id="padded"),
        pytest.param(7, 4, "7   ", id="a_number"),
        pytest.param("a b", 8, '"a b"   ', id="a_space_is_quoted"),
        pytest.param('say "hi"', 12, '"say \\"hi\\""', id="a_quote_is_escaped"),
        pytest.param("back\\slash x", 16, '"back\\\\slash x" ', id="a_backslash_too"),
        pytest.param("a" * 20, 8, "aaaaa...", id="cut_at_the_width"),
        pytest.param("a b c d e f", 8, '"a b ...', id="quoted_then_cut"),
        pytest.param("\x1b[2J", 12, "\\u001b[2J   ", id="escaped"),
        pytest.param("x\u00a0y", 12, "x\\u00a0y    ", id="a_no_break_space_escaped"),
        pytest.param("a b" * 40, 0, '"' + "a b" * 40 + '"', id="the_last_column_uncut"),
    ],
)
def test_a_cell_is_escaped_quoted_and_cut_to_its_width(
    value: object, width: int, shown: str
) -> None:
    assert cell(value, width) == shown
    assert len(cell(value, width)) == max(width, len(shown))


def test_a_quoted_cell_reads_back_as_json() -> None:
    value = 'a\x1b "b" \\ \u202e c'
    assert json.loads(cell(value, 0)) == value
    assert cell(5, 8, right=True) == "       5"


async def test_a_session_name_forges_no_column_of_actions_or_sessions(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"api": http_target("http://127.0.0.1:9")})
    async with open_broker(cfg) as b:
        envelope = await b.call({"target": "no-such", "session": FORGED})
    assert (envelope["error"]["code"], envelope["error"]["outcome"]) == (
        "INVALID_TARGET",
        "not_attempted",
    )
    iid = envelope["invocation_id"]

    actions = await affidavit_cli("actions", "--config", str(cfg))
    assert actions.returncode == 0, actions.stderr
    head, row = actions.stdout.decode().splitlines()
    assert row.startswith(iid)
    session = row[head.index("SESSION") : head.index("PHASE")]
    assert session == '"nightly-batch delive... ', row  # quoted and cut at its 24 columns
    assert row[head.index("PHASE") :].split() == [
        "validation",
        "not_attempted",
        "after_correction",
        "INVALID_TARGET",
    ]
    assert "committed " not in row and len(row) < 130, row

    sessions = await affidavit_cli("sessions", "--config", str(cfg))
    assert sessions.returncode == 0, sessions.stderr
    head, row = sessions.stdout.decode().splitlines()
    assert row[: head.index("ACTIONS")].startswith('"nightly-batch')
    assert row[head.index("ACTIONS") - 1 :].split()[0] == "1", row
    assert row.endswith("not_attempted=1") and "committed " not in row, row

    as_json = await affidavit_cli("actions", "--json", "--config", str(cfg))
    assert [r["session"] for r in json.loads(as_json.stdout)] == [FORGED]
    record = await affidavit_cli("record", iid, "--config", str(cfg))
    first = record.stdout.decode().splitlines()[0]
    assert first.endswith(f"session {json.dumps(FORGED)}  state validation_failed"), first
