"""No answer on the socket names where the journal lives (``Api._unplaced``), and none tells a
caller whether it guessed where: the journal's location is taken out of the journal's own
words only, never out of text the caller sent and the daemon echoes (an unknown path, an
unknown id) -- else a guess echoed back as ``the journal`` would confirm it."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import trio

from affidavit.api.wire import blocking_request
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import api_target, running_daemon


async def test_a_guess_of_the_journal_s_path_is_echoed_as_sent_right_or_wrong(
    tmp_path: Path, token: str
) -> None:
    async with (
        HostileServer.running(scripts.serve(Reply(200))) as srv,
        running_daemon(tmp_path, api_target(srv.url), token=token) as daemon,
    ):
        right, wrong = str(daemon.journal), str(daemon.journal) + "x"
        for guess in (right, wrong):
            for target in (
                "/v1/nope" + guess,  # NOT_FOUND names the path
                "/v1/invocations/" + quote(guess, safe=""),  # NO_SUCH_INVOCATION names the id
            ):
                answer = await trio.to_thread.run_sync(
                    blocking_request, str(daemon.socket), "GET", target
                )
                message = json.loads(answer.body)["api_error"]["message"]
                assert guess in message, (target, message)  # echoed as sent: no oracle
                assert "the journal" not in message.replace("in the journal", ""), message
            # OPERATION_ERROR names the operation id asked for: echoed as sent too.
            target = "/v1/operations/" + quote(guess, safe="") + "/poll"
            answer = await trio.to_thread.run_sync(
                blocking_request, str(daemon.socket), "POST", target, b""
            )
            problem = json.loads(answer.body)["api_error"]
            assert (answer.status, problem["code"]) == (422, "OPERATION_ERROR"), problem
            assert problem["message"] == f"no operation {guess} in the journal", problem
