"""``affidavit approvals approve/deny`` and ``affidavit reconcile`` run embedded meet a journal
they cannot open as ``call`` meets it: the same code and the same words, one line, exit 2.  A
journal a daemon owns (its writer lock held) is JOURNAL_LOCKED naming the daemon to ask -- it
was JOURNAL_UNREADABLE, as if the approval had been read and found wanting, when the
decision's own failure mapping (``decision_failure``) answered a refusal of the open.  Never a
traceback, and nothing decided.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import trio

from affidavit.config import load_config
from affidavit.journal import JournalReader
from affidavit.journal.lock import WriterLock
from tests.http.hostile import HostileServer, Reply, scripts

from .approvalkit import approval_config
from .helpers import affidavit_cli, open_broker

CHARGE = {"target": "api", "method": "POST", "path": "/v1/charges", "body": '{"amount": 5}'}
SERVE = "affidavit serve on /run/a.sock"
ACTS = {
    "approve": ("approvals", "approve"),
    "deny": ("approvals", "deny"),
    "reconcile": ("reconcile",),
}


async def _refused(cfg: Path, act: str, iid: str) -> tuple[bytes, bytes]:
    """The act's stderr and ``call``'s (the credential in the environment: the ``token``
    fixture's), each checked to be exit 2 with nothing on stdout."""
    extra = ("--query",) if act == "reconcile" else ()
    acted = await affidavit_cli(*ACTS[act], iid, *extra, "--config", str(cfg))
    with trio.fail_after(60):
        called = await trio.run_process(
            [sys.executable, "-m", "affidavit", "call", "-", "--config", str(cfg)],
            stdin=json.dumps(CHARGE).encode(),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    for p in (acted, called):
        assert (p.returncode, p.stdout) == (2, b""), p
    return acted.stderr, called.stderr


@pytest.mark.parametrize("act", sorted(ACTS))
async def test_an_act_on_a_journal_the_daemon_owns_is_journal_locked_as_call_says(
    tmp_path: Path, act: str, token: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(201, body=b"{}"))) as srv:
        cfg = approval_config(tmp_path, srv.url)
        async with open_broker(cfg) as broker:
            with trio.fail_after(30):
                env = await broker.call(CHARGE)
        assert env["error"]["code"] == "APPROVAL_PENDING", env
        iid = env["invocation_id"]
        path = load_config(cfg).journal.path
        lock = WriterLock.acquire(path, SERVE)
        try:
            said, call_said = await _refused(cfg, act, iid)
        finally:
            lock.release()
    assert said == call_said, (said, call_said)
    assert said.startswith(b"affidavit: JOURNAL_LOCKED: "), said
    assert SERVE.encode() in said and b"ask the daemon on its socket" in said, said
    assert said.count(b"\n") == 1 and b"Traceback" not in said, said
    with JournalReader.open(path) as reader:
        record = reader.record(iid)
    assert record is not None and record.state == "awaiting_approval", record  # nothing decided
    assert srv.requests == []


@pytest.mark.parametrize("act", sorted(ACTS))
async def test_an_act_on_a_journal_that_cannot_be_opened_is_journal_unusable_as_call_says(
    tmp_path: Path, act: str, token: str
) -> None:
    """The file is the operator's to mend (not a read that failed: JOURNAL_UNREADABLE)."""
    (tmp_path / "journal.db").mkdir()  # a directory where the journal should be
    cfg = approval_config(tmp_path, "http://127.0.0.1:9")
    said, call_said = await _refused(cfg, act, "act_01HZZZZZZZZZZZZZZZZZZZZZZZ")
    assert said == call_said, (said, call_said)
    assert said.startswith(b"affidavit: JOURNAL_UNUSABLE: cannot open journal "), said
    assert b"it is a directory" in said and b"Traceback" not in said, said
