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
import os
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
        pytest.param("a" * 20, 8, "aaa...aa", id="cut_at_the_width"),
        pytest.param("a b c d e f", 8, '"a ...f"', id="quoted_then_cut"),
        pytest.param("a" * 10 + "b" * 10, 9, "aaa...bbb", id="cut_in_the_middle"),
        pytest.param("\x1b[2J", 12, '"\\u001b[2J" ', id="escaped_and_quoted"),
        pytest.param("x\u00a0y", 12, '"x\\u00a0y"  ', id="a_no_break_space_escaped"),
        pytest.param("x\\u00a0y", 12, '"x\\\\u00a0y" ', id="its_six_characters_apart"),
        pytest.param("0\u0338", 12, '"0\\u0338"   ', id="an_overlay_mark"),
        pytest.param("a b" * 40, 0, '"' + "a b" * 40 + '"', id="the_last_column_uncut"),
    ],
)
def test_a_cell_is_escaped_quoted_and_cut_to_its_width(
    value: object, width: int, shown: str
) -> None:
    assert cell(value, width) == shown
    assert len(cell(value, width)) == max(width, len(shown))


@pytest.mark.parametrize(
    "value",
    [
        'a\x1b "b" \\ \u202e c',
        "a b\U000e0001",  # beyond the BMP: a JSON string spells it as its surrogate pair
        "tag\U000e0041\U000f0000",
        "x\u00a0y",
        "x\\u00a0y",
        "=\u0338 0\u20dd e\u0301\u0301\u0301",
    ],
)
def test_a_quoted_cell_reads_back_as_json(value: str) -> None:
    shown = cell(value, 0)
    assert shown.startswith('"') and json.loads(shown) == value, shown
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
    # quoted and cut in the middle at its 24 columns: both ends show (its padding, here)
    assert session == '"nightly-ba...         " ', row
    assert row[head.index("PHASE") :].split() == [
        "validation",
        "not_attempted",
        "after_correction",
        "INVALID_TARGET",
    ]
    assert "committed " not in row and len(row) < 136, row  # (OUTCOME fits "(attested)")

    sessions = await affidavit_cli("sessions", "--config", str(cfg))
    assert sessions.returncode == 0, sessions.stderr
    head, row = sessions.stdout.decode().splitlines()
    assert row[: head.index("ACTIONS")].startswith('"nightly-ba...')
    assert row[head.index("ACTIONS") - 1 :].split()[0] == "1", row
    assert row.endswith("not_attempted=1") and "committed " not in row, row

    as_json = await affidavit_cli("actions", "--json", "--config", str(cfg))
    assert [r["session"] for r in json.loads(as_json.stdout)] == [FORGED]
    record = await affidavit_cli("record", iid, "--config", str(cfg))
    first = record.stdout.decode().splitlines()[0]
    assert first.endswith(f"session {json.dumps(FORGED)}  state validation_failed"), first


async def test_approvals_list_cuts_names_in_the_middle_so_two_stay_two(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A target name has up to 64 characters, a credential's up to 128: cut at the end to 12 and
    # 24, payments-production and payments-prod-eu both showed as payments-...; the credential
    # is what the operator approves, and its -v2 and -v3 collided too.
    targets = {}
    for name, version in (("payments-production", "V2"), ("payments-prod-eu", "V3")):
        monkeypatch.setenv(f"STRIPE_LIVE_RESTRICTED_KEY_{version}", "sk-test")
        targets[name] = http_target(
            "http://127.0.0.1:9",
            credential=f"env:STRIPE_LIVE_RESTRICTED_KEY_{version}",
            approval={"methods": ["POST"], "wait": "0s"},
        )
    cfg = write_config(tmp_path, targets)
    with cfg.open("a") as f:
        f.write(f"[service]\noperator_uids = [{os.getuid()}]\n")
    async with open_broker(cfg) as b:
        for name in targets:
            envelope = await b.call({"target": name, "method": "POST", "path": "/x"})
            assert envelope["error"]["code"] == "APPROVAL_PENDING", envelope

    listed = await affidavit_cli("approvals", "--config", str(cfg))
    assert listed.returncode == 0, listed.stderr
    head, *rows = listed.stdout.decode().splitlines()
    columns = {
        row[head.index("TARGET") : head.index("EXPIRES IN")].strip(): row[
            head.index("CREDENTIAL") : head.index("WHAT")
        ].strip()
        for row in rows
    }
    assert columns == {
        "payme...tion": "env:STRIPE_...TED_KEY_V2",
        "payme...d-eu": "env:STRIPE_...TED_KEY_V3",
    }, listed.stdout


def test_metrics_cells_are_cut_in_the_middle(capsys: pytest.CaptureFixture[str]) -> None:
    from affidavit.cli.journal import _print_metrics

    _print_metrics(
        {
            "invocations": 1,
            "by_phase_outcome": [{"phase": "p" * 30 + "-end", "outcome": "a b", "count": 1}],
            "by_code_outcome": [{"code": "REMOTE_" + "X" * 30 + "_V3", "outcome": "x", "count": 2}],
            "batch_items": [],
            "operations": [],
        }
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == 'pppppppppp...ppppp-end "a b"          1', lines
    assert lines[5] == "REMOTE_XXXXX...XXXXXXXX_V3 x              2", lines
