"""No answer on the socket names where the journal lives (``Api._unplaced``), and none tells a
caller whether it guessed where: the journal's location is taken out of the journal's own
words only, never out of text the caller sent and the daemon echoes (an unknown path, an
unknown id) -- else a guess echoed back as ``the journal`` would confirm it."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pytest
import trio

from affidavit.api.wire import blocking_request
from affidavit.config import load_config
from affidavit.daemon.http import echoed
from affidavit.daemon.server import Daemon
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import HostileServer, Reply, scripts
from tests.journal.helpers import decline_every_record

from .kit import WAIT, api_target, running_daemon, write_daemon_config


async def test_a_guess_of_the_journal_s_path_is_echoed_as_sent_right_or_wrong(
    tmp_path: Path, token: str
) -> None:
    async with (
        HostileServer.running(scripts.serve(Reply(200))) as srv,
        running_daemon(tmp_path, api_target(srv.url), token=token) as daemon,
    ):
        right, wrong = str(daemon.journal), str(daemon.journal) + "x"
        for guess in (right, wrong):
            for target, sent in (
                ("/v1/nope" + guess, "/v1/nope" + guess),  # NOT_FOUND names the path
                # NO_SUCH_INVOCATION names the id
                ("/v1/invocations/" + quote(guess, safe=""), guess),
            ):
                answer = await trio.to_thread.run_sync(
                    blocking_request, str(daemon.socket), "GET", target
                )
                message = json.loads(answer.body)["api_error"]["message"]
                # Echoed as sent (cut to ``ECHO`` characters, as every id): no oracle.
                assert echoed(sent) in message, (target, message)
                assert "the journal" not in message.replace("in the journal", ""), message
            # OPERATION_ERROR names the operation id asked for: echoed as sent too.
            target = "/v1/operations/" + quote(guess, safe="") + "/poll"
            answer = await trio.to_thread.run_sync(
                blocking_request, str(daemon.socket), "POST", target, b""
            )
            problem = json.loads(answer.body)["api_error"]
            assert (answer.status, problem["code"]) == (422, "OPERATION_ERROR"), problem
            assert problem["message"] == f"no operation {echoed(guess)} in the journal", problem


async def test_a_guess_is_no_oracle_when_the_journal_declines_the_read(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read the journal declines (JOURNAL_READ_DECLINED) is answered in the journal's words,
    which name the location -- and the id the caller sent.  Taking the location out must not
    take it out of the caller's own text: a guess of the path sent as the id came back as
    ``the journal`` when right and as sent when wrong, telling the caller it guessed right."""
    monkeypatch.setenv(TOKEN_ENV, token)
    socket = tmp_path / "affidavit.sock"
    async with (
        HostileServer.running(scripts.serve(Reply(200))) as srv,
        trio.open_nursery() as nursery,
    ):
        config = write_daemon_config(tmp_path, api_target(srv.url), socket=socket)
        loaded = load_config(config)
        daemon = Daemon(loaded)
        await nursery.start(daemon.run)
        decline_every_record(monkeypatch)
        right = str(loaded.journal.location)
        answers = {}
        with trio.fail_after(WAIT):
            for guess in (right, right + "x", "journal " + right, "journal " + right + "x"):
                for suffix in ("", "/result"):
                    target = "/v1/invocations/" + quote(guess, safe="") + suffix
                    answer = await trio.to_thread.run_sync(
                        blocking_request, str(socket), "GET", target
                    )
                    error = json.loads(answer.body)["api_error"]
                    assert error["code"] == "JOURNAL_READ_DECLINED", error
                    answers[guess, suffix] = error["message"].replace(echoed(guess), "<GUESS>")
        daemon.shutdown.set()
    for suffix in ("", "/result"):
        for guess in (right, "journal " + right):
            said = answers[guess, suffix]
            assert said == answers[guess + "x", suffix], (said, answers[guess + "x", suffix])
            assert "<GUESS>" in said, said  # echoed as sent
