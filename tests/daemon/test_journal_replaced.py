"""A SQLite journal file replaced under a running daemon (renamed over, or removed): the daemon's
writer holds the file it opened, and its view readers would open the one now at the path -- a
view answered from a file the writer is not writing, a call's record in a file nobody reads.
Each call and each view is refused instead, and ``GET /v1/health`` says so: 503
``JOURNAL_REPLACED`` with no ``Retry-After`` (trying again will not mend it: the daemon must be
restarted), nothing sent to the target; the
daemon restarted on the file now at the path calls and reads it as any journal.

The daemon runs in this process (``Daemon.run``); the caller is on its real socket."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio

from affidavit.api.readers import FRESH_FOR
from affidavit.config import load_config
from affidavit.daemon.server import Daemon
from affidavit.journal import Journal
from tests.broker.helpers import TOKEN_ENV, http_target
from tests.http.hostile import HostileServer, Reply, scripts
from tests.journal.helpers import happy

from .kit import WAIT, api_target, ask, write_daemon_config

ACTION = json.dumps({"target": "api", "method": "GET", "path": "/r"}).encode()


def _refused(answer: tuple[int, dict[str, str], bytes], journal: Path) -> None:
    status, headers, body = answer
    assert status == 503, answer
    assert "retry-after" not in headers, headers
    error = json.loads(body)["api_error"]
    assert error["code"] == "JOURNAL_REPLACED", error
    assert "not the one this broker has been writing" in error["message"], error
    assert str(journal) not in error["message"]  # (a caller is never told where it lives)


@pytest.mark.parametrize("how", ["renamed-over", "removed"])
async def test_a_journal_replaced_under_the_daemon_is_refused_then_restarted_on(
    tmp_path: Path,
    token: str,
    monkeypatch: pytest.MonkeyPatch,
    how: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    socket = tmp_path / "affidavit.sock"
    journal, other = tmp_path / "journal.db", tmp_path / "other.db"
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        # ``payments`` too: the other file's invocation is on it, and a caller's list shows
        # only invocations on a target the daemon's configuration names.
        targets = {**api_target(srv.url), "payments": http_target(srv.url)}
        config = load_config(write_daemon_config(tmp_path, targets, socket=socket))
        async with trio.open_nursery() as nursery:
            daemon = Daemon(config)
            await nursery.start(daemon.run)
            with trio.fail_after(WAIT):
                assert (await ask(socket, "POST", "/v1/calls", ACTION))[0] == 200
                assert (await ask(socket, "GET", "/v1/actions"))[0] == 200
                healthy = await ask(socket, "GET", "/v1/health")
                keys = {
                    "key_file": config.journal.key_file,
                    "signing_key": config.journal.signing_key,
                }
                async with Journal.open(other, **keys) as j:
                    for ev in happy("act_other"):
                        await j.append(ev)
                if how == "renamed-over":
                    os.replace(other, journal)
                else:
                    journal.unlink()
                call = await ask(socket, "POST", "/v1/calls", ACTION)
                await trio.sleep(FRESH_FOR)  # the idle view reader's check is due again
                view = await ask(socket, "GET", "/v1/actions")
                health = await ask(socket, "GET", "/v1/health")
                again = await ask(socket, "GET", "/v1/health")  # (a monitor probes on)
            daemon.shutdown.set()
        _refused(call, journal)
        _refused(view, journal)
        # Health says so too, never "ok" while every call and view is refused.
        assert healthy[0] == 200 and json.loads(healthy[2])["ok"] is True, healthy
        _refused(health, journal)
        _refused(again, journal)
        said = [r for r in caplog.records if r.getMessage().startswith("the journal's health")]
        assert len(said) == 1, said  # logged once, not at every probe
        assert len(srv.requests) == 1  # the refused call sent nothing
        if how == "removed":
            return
        # Restarted on the file now at the path: it calls, and reads that file.
        async with trio.open_nursery() as nursery:
            daemon = Daemon(config)
            await nursery.start(daemon.run)
            with trio.fail_after(WAIT):
                status, _, body = await ask(socket, "POST", "/v1/calls", ACTION)
                assert status == 200, body
                status, _, body = await ask(socket, "GET", "/v1/actions?limit=10")
            daemon.shutdown.set()
        assert status == 200, body
        shown = {a["invocation_id"] for a in json.loads(body)["actions"]}
        assert "act_other" in shown and len(shown) == 2, shown
        assert len(srv.requests) == 2
