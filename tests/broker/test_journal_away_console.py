"""The operator console (served by the daemon) on a shared journal whose database is away
(beyond ``[journal] reconnect``): every page and every act answers the operator with the error
page -- 503 and JOURNAL_UNAVAILABLE, naming what could not be read, as the daemon's API does
(a read page with ``Retry-After: 5``, an act without) --
and nothing is decided or recorded; never the "the console failed" 500 with a traceback in the
daemon's log (which approve, deny and reconcile used to give), never a 500 "the journal could
not be read" (the pages) or "the stored result does not verify" (the result's download), never
a password.  The console
and the daemon keep running: once the database is back the same session approves, and the
daemon sends the request once.
"""

from __future__ import annotations

import os
from pathlib import Path

import trio

from affidavit.engine import UNAVAILABLE_RETRY_AFTER, unread
from tests.console.kit import csrf_of, get, post
from tests.daemon.kit import (
    WAIT,
    DaemonProc,
    cli,
    start_daemon,
    stop,
    wait_until,
    write_daemon_config,
)
from tests.external import on_free_port_async
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster

from .awaykit import clean, database_stopped, state_of
from .helpers import http_target
from .test_journal_away_mid_call import ACTION, journal_table

LIMIT = 20
"""Seconds any one request may take: a refused connection fails at once."""


async def test_the_console_answers_503_on_every_page_and_act_and_decides_nothing(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(201, body=b"{}"))) as srv:
        socket = tmp_path / "affidavit.sock"
        journal = journal_table(tmp_path, pg_url)

        async def daemon_on(port: int) -> DaemonProc:
            cfg = write_daemon_config(
                tmp_path,
                {"api": http_target(srv.url, approval={"methods": ["POST"]})},
                socket=socket,
                service={
                    "operator_uids": [os.geteuid()],
                    "allow_self_approval": True,
                    "console": f"127.0.0.1:{port}",
                },
                journal=journal,
            )
            return await start_daemon(cfg, socket, tmp_path / "daemon.log", token)

        daemon, port = await on_free_port_async(daemon_on)
        origin = f"http://127.0.0.1:{port}"
        try:
            with trio.fail_after(WAIT * 3):
                done = await cli(daemon, "call", "-", stdin=_json(ACTION))
                iid = str(done.json()["invocation_id"])
                assert done.json()["error"]["code"] == "APPROVAL_PENDING", done.stdout
                done = await cli(daemon, "console-url")
                assert done.returncode == 0, done.stderr
                login = done.stdout.decode().strip()
                status, headers, _ = await post(
                    f"{origin}/login", {"token": login.split("=", 1)[1]}, {"Origin": origin}
                )
                assert status == 200, status
                cookie = headers["set-cookie"].split(";")[0]
                csrf = await csrf_of(origin, cookie)
                form = {"csrf": csrf, "note": "ok"}
                send = {"Cookie": cookie, "Origin": origin}

                async with database_stopped(pg):
                    answers = {
                        f"the approval of {iid}": [
                            await post(f"{origin}/approvals/{iid}/approve", form, send),
                            await post(f"{origin}/approvals/{iid}/deny", form, send),
                        ],
                        f"the record of {iid}": [
                            await post(
                                f"{origin}/invocations/{iid}/reconcile",
                                {**form, "how": "committed"},
                                send,
                            ),
                            await get(f"{origin}/invocations/{iid}", cookie=cookie),
                        ],
                        f"the result of {iid}": [
                            await get(f"{origin}/invocations/{iid}/result.json", cookie=cookie)
                        ],
                        "the pending approvals": [await get(f"{origin}/approvals", cookie=cookie)],
                        "the actions view": [await get(f"{origin}/actions", cookie=cookie)],
                        "the journal view": [await get(f"{origin}/journal", cookie=cookie)],
                    }
                    for what, pages in answers.items():
                        for n, (status, headers, page) in enumerate(pages):
                            text = page.decode()
                            assert status == 503, (what, status, text)
                            # A read page says when to read again, as the daemon's reads
                            # (READ_RETRY); an act (approve, deny, reconcile) never does.
                            act = what.startswith("the approval of") or (
                                what.startswith("the record of") and n == 0
                            )
                            after = None if act else str(UNAVAILABLE_RETRY_AFTER)
                            assert headers.get("retry-after") == after, (what, n, headers)
                            shown = f"<code>JOURNAL_UNAVAILABLE</code>: {unread(what)}</p>"
                            assert shown in text, (what, text)
                            clean(text, pg.password, "the console failed")
                    assert daemon.proc.poll() is None, daemon.log_text()
                assert state_of(pg_url, iid) == "awaiting_approval"  # nothing was decided

                # The console lives on: the same session approves once the database is back.
                status, _, page = await get(f"{origin}/approvals", cookie=cookie)
                assert status == 200 and iid.encode() in page, (status, page)
                status, headers, _ = await post(f"{origin}/approvals/{iid}/approve", form, send)
                assert status == 303, status
                await wait_until(lambda: state_of(pg_url, iid) == "stored_committed", "sent")
            log = daemon.log_text()
            clean(log, pg.password, "the console failed")
            # One line for each refusal: what could not be read, then the journal's own words.
            assert log.count(f"console: {unread(f'the approval of {iid}')}: ") == 2, log
            assert log.count(f"console: {unread('the pending approvals')}: ") == 1, log
        finally:
            stop(daemon)
    assert len(srv.requests) == 1  # sent once, by the daemon, once approved


def _json(value: object) -> bytes:
    import json

    return json.dumps(value).encode()
