"""A caller's id in the daemon's log when the journal cannot answer: the daemon logs one line
naming what it could not read or do (``app._journal_problem``, ``operators.act_problem``), and
that names the id from the request path -- decoded, so ``%0A`` was a line break and the rest a
line of the caller's own making in the operator's log (and ``%1B`` a terminal escape).  The
id is shown escaped (``affidavit.text.printable``), as the console shows a path."""

from __future__ import annotations

from pathlib import Path

import trio

from affidavit.api.wire import blocking_request
from tests.daemon.kit import WAIT
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster

from .awaykit import clean, daemon_on, database_stopped

FORGED = "2026-01-01 00:00:00,000 affidavit serve[1] WARNING approved act_x by uid 0"
FORGED_ID = "act_x%0A" + FORGED.replace(" ", "%20") + "%0D%1B[2J"


async def test_an_id_holding_a_line_break_writes_no_line_of_its_own_when_the_journal_is_away(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    async with (
        HostileServer.running(scripts.serve(Reply(201))) as srv,
        daemon_on(tmp_path, srv.url, pg_url, token) as (socket, daemon),
    ):
        asks = (
            ("GET", f"/v1/invocations/{FORGED_ID}", None),  # app._journal_problem
            ("POST", f"/v1/invocations/{FORGED_ID}/reconcile", b'{"query": true}'),  # act_problem
        )
        with trio.fail_after(WAIT * 2):
            async with database_stopped(pg):
                for method, path, body in asks:
                    answer = await trio.to_thread.run_sync(
                        blocking_request, str(socket), method, path, body
                    )
                    assert answer.status == 503, (path, answer)
                    assert answer.error().code == "JOURNAL_UNAVAILABLE", (path, answer)
        log = daemon.log_text()
    clean(log, pg.password)
    assert not any(line.startswith(FORGED) for line in log.splitlines()), log[-3000:]
    assert "\x1b" not in log and "\r" not in log, log[-3000:]
    assert log.count("act_x\\n2026-01-01") >= 2, log[-3000:]  # both lines, escaped
