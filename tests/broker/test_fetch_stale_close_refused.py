"""A fetch is a read: when the journal refuses the close it writes for a stale record (its
holder's lease ran out) the fetch still answers with the record as the journal holds it -- open,
IN_PROGRESS, fetch again -- never a ``JournalError``, which every surface answers as
RESULT_UNVERIFIED ("the stored result failed verification": a claim about a record nobody found
wrong).  Nor does it render a close in memory: on a shared journal the close is judged by the
database's clock, and a close the journal did not take may be one it would have refused (the
lease still live there)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.cli.tour import demo_config
from affidavit.config import load_config
from affidavit.journal import CommitUnknown, JournalWriteError
from affidavit.statemachine import EventKind

from .test_fetch_stale import _crashed_record

E = EventKind


@pytest.mark.parametrize("error", [JournalWriteError, CommitUnknown])
async def test_a_fetch_whose_recovery_close_is_refused_answers_the_record_as_it_stands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: type[Exception]
) -> None:
    monkeypatch.setenv("AFFIDAVIT_DEMO_TOKEN", "unused-token")
    cfg = tmp_path / "affidavit.toml"
    cfg.write_text(demo_config(tmp_path, 9), encoding="utf-8")
    config = load_config(cfg)
    await _crashed_record(config.journal.path, "act_crashed", time.time() - 60)
    with trio.fail_after(10):
        async with Broker.open(config=config) as broker:
            journal = broker.journal
            real_append = journal.append
            refused: list[Any] = []

            async def append(event: Any, *args: Any, **kwargs: Any) -> Any:
                if event.kind is E.ATTEMPT_INTERRUPTED:
                    refused.append(event)
                    raise error("journal: write not committed: disk full")
                return await real_append(event, *args, **kwargs)

            monkeypatch.setattr(journal, "append", append)
            env = await broker.fetch_result("act_crashed")
            monkeypatch.undo()
            assert refused and env is not None
            assert env["error"]["outcome"] == "unknown", env
            assert (env["error"]["code"], env["error"]["retry"]) == ("IN_PROGRESS", "fetch_result")
            assert env["evidence"]["dispatch_started"] is True
            # Read again with the journal taking writes: recovery closes it then.
            again = await broker.fetch_result("act_crashed")
            assert again is not None
            assert (again["error"]["code"], again["error"]["retry"]) == (
                "REMOTE_OUTCOME_UNKNOWN",
                "reconcile",
            )
