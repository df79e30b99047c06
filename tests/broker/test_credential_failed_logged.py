"""The operator's CREDENTIAL_FAILED line (the call's id, the credential's detail) of a call that
is not linked is logged before its rows are written (``engine/credential.py``): it is not lost
when the journal fails the write, when the row is refused on the call's own record (a stale
worker's: the invocation is on record), nor when the process ends while the write is in
flight.  Only a linked call's line waits for its write (its claim refused, nothing of it is on
record: ``test_claim_refused_closed``) -- and is logged once the write lands, or the journal
failed it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.engine import credential
from affidavit.journal.errors import JournalWriteError
from affidavit.secrets.credentials import CredentialError
from affidavit.statemachine import Code, EventKind, ImpossibleEvent

from .helpers import write_config
from .http_rows import LIMIT
from .test_reconcile_approval import _payments

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


@pytest.mark.parametrize("how", ["written", "journal-failed"])
async def test_a_linked_calls_credential_failure_is_logged_once_its_first_write_is_taken_on(
    tmp_path: Path,
    token: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    how: str,
) -> None:
    # A reconciliation query the approval covers (its claim heads its first write): its line
    # waits for that write, and is logged once it lands -- or once the journal failed it (its
    # claim was not refused: the call may be on record) -- never skipped, never twice.
    queries: list[str] = []

    def prepare(*args: Any, **kwargs: Any) -> Any:  # patched once the payment was made
        raise CredentialError(Code.CREDENTIAL_MISSING, "no credential", detail=DETAIL)

    async with _payments(tmp_path) as (srv, broker, iid):
        recorder = broker._engine.recorder
        real_write = recorder.write

        async def write(event: Any, *args: Any, **kwargs: Any) -> None:
            if event.kind is EventKind.CREDENTIAL_FAILED:
                queries.append(event.invocation_id)
                if how == "journal-failed":
                    raise JournalWriteError("disk I/O error")
            await real_write(event, *args, **kwargs)

        monkeypatch.setattr(credential, "prepare_request", prepare)
        monkeypatch.setattr(recorder, "write", write)
        caplog.set_level(logging.WARNING)
        with trio.fail_after(LIMIT):
            if how == "written":
                answer = await broker.reconcile(iid, query=True)
                assert answer["query"]["error"]["code"] == "CREDENTIAL_MISSING"
                assert broker.events(queries[0])  # its first write landed
            else:
                with pytest.raises(JournalWriteError):
                    await broker.reconcile(iid, query=True)
        monkeypatch.setattr(recorder, "write", real_write)
    assert len(queries) == 1
    assert len(_line(caplog, queries[0])) == 1, [r.getMessage() for r in caplog.records]
    assert not any(r.method == "GET" for r in srv.requests)  # nothing sent
