"""The operator's CREDENTIAL_FAILED line (the call's id, the credential's detail) of a call that
is not linked is logged before its rows are written (``engine/credential.py``): it is not lost
when the journal fails the write, when the row is refused on the call's own record (a stale
worker's: the invocation is on record), nor when the process ends while the write is in
flight.  Only a linked call's line waits for its write (its claim refused, nothing of it is on
record: ``test_claim_refused_closed``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.journal.errors import JournalWriteError
from affidavit.statemachine import EventKind, ImpossibleEvent

from .helpers import write_config

UNSET = "AFF_CF_LOGGED_UNSET"
DETAIL = f"env:{UNSET}"


class Killed(BaseException):
    """The process ending while the write is in flight (as a hard kill: no handler runs)."""


RAISED = {
    "journal-failed": JournalWriteError,
    "refused-on-its-record": ImpossibleEvent,
    "killed": Killed,
}


def _fail(how: str, event: Any) -> BaseException:
    if how == "journal-failed":
        return JournalWriteError("disk I/O error")
    if how == "refused-on-its-record":
        return ImpossibleEvent(event, "failed", "generation 0 is stale: the lease was taken over")
    return Killed()


def _line(caplog: pytest.LogCaptureFixture, iid: str) -> list[str]:
    lines = (r.getMessage() for r in caplog.records)
    return [x for x in lines if iid in x and "CREDENTIAL_MISSING" in x and DETAIL in x]


@pytest.mark.parametrize("how", ["journal-failed", "refused-on-its-record", "killed"])
async def test_the_credential_failure_is_logged_whatever_becomes_of_its_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    monkeypatch.delenv(UNSET, raising=False)
    target = {
        "kind": "http",
        "url": "http://127.0.0.1:9",
        "methods": ["GET"],
        "credential": DETAIL,
        "inject": "bearer",
    }
    cfg = write_config(tmp_path, {"api": target})
    caplog.set_level(logging.WARNING)
    written: list[str] = []
    ahead: list[list[str]] = []
    with trio.fail_after(15):
        async with Broker.open(config=load_config(cfg)) as broker:
            recorder = broker._engine.recorder
            real = recorder.write

            async def write(event: Any, *args: Any, **kwargs: Any) -> None:
                if event.kind is EventKind.CREDENTIAL_FAILED:
                    written.append(event.invocation_id)
                    # Already logged as the write begins: a hard kill now (no handler, no
                    # ``finally``) would not lose it.
                    ahead.append(_line(caplog, event.invocation_id))
                    raise _fail(how, event)
                await real(event, *args, **kwargs)

            monkeypatch.setattr(recorder, "write", write)
            with pytest.raises(BaseException) as raised:
                await broker.call({"target": "api", "method": "GET", "path": "/"})
            monkeypatch.setattr(recorder, "write", real)
    assert len(written) == 1
    assert type(raised.value) is RAISED[how]  # the write's failure, passed on as it was
    assert ahead[0], "not logged before the write"
    assert _line(caplog, written[0]) == ahead[0]  # once
