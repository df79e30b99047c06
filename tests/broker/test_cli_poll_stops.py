"""``affidavit operation poll`` stopped or refused as every embedded journal command is
(``call.run_journal``): SIGTERM while the status resource holds the query closes the poll's own
record (CALLER_CANCELLED, ``unknown`` once sent) and exits 143 with one line -- its default
action ended the process at once, the record left open until a daemon's start-up recovery --
and a journal the daemon owns is JOURNAL_LOCKED naming it, as ``call`` says, not a read the
journal could not answer (JOURNAL_UNREADABLE).  Never a traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from affidavit.config import load_config
from affidavit.journal import JournalReader
from affidavit.journal.lock import WriterLock
from tests.http.hostile import HostileServer, Peer, Script

from .helpers import (
    TOKEN_ENV,
    affidavit_cli,
    http_target,
    open_broker,
    signalled,
    write_config,
)
from .test_operations import ACCEPTED, JOBS, SUBMIT

LIMIT = 30


def _accept_then_hold_polls() -> Script:
    """202 to the POST; a later request (a poll) is read, ``srv.event("received")`` set, and
    never answered."""

    async def script(peer: Peer) -> None:
        while (req := await peer.read_request()) is not None:
            if req.method != "POST":
                peer.server.event("received").set()
                await trio.sleep_forever()
            await peer.respond(ACCEPTED)

    return script


async def _submitted(tmp_path: Path, srv: HostileServer, **target: object) -> tuple[Path, str]:
    cfg = write_config(tmp_path, {"jobs": http_target(srv.url + "/v1", **JOBS, **target)})
    async with open_broker(cfg) as broker:
        with trio.fail_after(LIMIT):
            env = await broker.call(dict(SUBMIT))
    return cfg, env["operation"]["id"]


async def test_sigterm_during_a_poll_records_where_it_stood_and_exits_143(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(_accept_then_hold_polls()) as srv:
        cfg, op_id = await _submitted(tmp_path, srv, timeout={"total": 60})
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "affidavit", "operation", "poll", op_id, "--config", str(cfg)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, TOKEN_ENV: token},
        )
        try:
            assert proc.stderr is not None
            with trio.fail_after(LIMIT):
                await srv.event("received").wait()
            code, said = await signalled(proc, signal.SIGTERM, LIMIT)
        finally:
            if proc.returncode is None:
                proc.kill()
    assert code == 143, said
    # Only what the records hold: a poll stopped before its broker opened recorded nothing.
    assert said.startswith(
        b"affidavit: stopped by SIGTERM; if the call had begun, where it stood is recorded "
    ), said
    assert b"Traceback" not in said
    with JournalReader.open(load_config(cfg).journal.path) as r:
        poll = [rec for rec in r.list_actions() if rec.operation is None]
    (rec,) = poll  # the poll's own invocation, closed where it stood
    assert (rec.outcome.value, rec.phase.value) == ("unknown", "remote_execution")
    assert rec.code is not None and rec.code.value == "CALLER_CANCELLED"


async def test_a_poll_of_a_journal_the_daemon_owns_is_journal_locked(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(_accept_then_hold_polls()) as srv:
        cfg, op_id = await _submitted(tmp_path, srv)
        lock = WriterLock.acquire(load_config(cfg).journal.path, "affidavit serve on /run/a.sock")
        try:
            p = await affidavit_cli(
                "operation", "poll", op_id, "--config", str(cfg), env={TOKEN_ENV: token}
            )
        finally:
            lock.release()
    err = p.stderr.decode()
    assert p.returncode == 2, err
    assert err.startswith("affidavit: JOURNAL_LOCKED: "), err
    assert "affidavit serve on /run/a.sock" in err and "Traceback" not in err
    assert [r.method for r in srv.requests] == ["POST"]  # nothing was queried


async def test_a_poll_of_a_journal_that_cannot_be_opened_is_journal_unusable(
    tmp_path: Path, token: str
) -> None:
    """As ``call`` says it: the file is the operator's to mend (not a read that failed)."""
    (tmp_path / "journal.db").mkdir()  # a directory where the journal should be
    cfg = write_config(tmp_path, {"jobs": http_target("http://127.0.0.1:9/v1", **JOBS)})
    p = await affidavit_cli(
        "operation", "poll", "op_x", "--config", str(cfg), env={TOKEN_ENV: token}
    )
    err = p.stderr.decode()
    assert p.returncode == 2, err
    assert err == (
        f"affidavit: JOURNAL_UNUSABLE: cannot open journal {tmp_path}/journal.db: it is a "
        "directory (fix that, or name another journal with [journal] path or --journal)\n"
    ), err


def test_sigterm_words_claim_no_call_for_a_command_without_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``init`` stopped as its journal opens (SIGTERM inside ``run_journal``): it has no call,
    and was told "if the call had begun, where it stood is recorded"."""
    from affidavit import cli
    from affidavit.cli import call

    def stopped(main: object) -> None:
        raise cli.Terminated

    monkeypatch.setattr(call, "run_journal", stopped)
    assert cli.main(["init", "--config", str(tmp_path / "affidavit.toml")]) == 143
    said = capsys.readouterr().err
    assert said == (
        "affidavit: stopped by SIGTERM; what `affidavit init` had written to the journal is kept\n"
    ), said
