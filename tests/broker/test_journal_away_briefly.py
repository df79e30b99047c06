"""A shared journal away for less than ``[journal] reconnect`` is invisible to a read, as it is
to a write (docs/journal.md: "a database restart inside that window is invisible to a call,
reads included"): a fetch started while PostgreSQL is down waits for it -- on trio, never
blocking the event loop -- and answers the stored result once it is back."""

from __future__ import annotations

from pathlib import Path

import trio

from affidavit.api.broker import Broker
from affidavit.config import load_config
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster

from .helpers import http_target, write_config
from .test_journal_away_mid_call import ACTION, journal_table

BODY = b'{"id": "ch_1"}'
LIMIT = 60


async def test_a_fetch_waits_out_a_database_restart_within_the_reconnect_window(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(201, body=BODY))) as srv:
        journal = {**journal_table(tmp_path, pg_url), "reconnect": 20}
        cfg = load_config(write_config(tmp_path, {"api": http_target(srv.url)}, journal=journal))
        with trio.fail_after(LIMIT):
            async with Broker.open(config=cfg) as b:
                env = await b.call(ACTION)
                assert env["result"]["body"] == BODY.decode(), env
                iid = env["invocation_id"]
                await trio.to_thread.run_sync(pg.stop)
                ticks = 0
                fetched: list[dict | None] = []

                async def fetch() -> None:
                    fetched.append(await b.fetch_result(iid))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(fetch)
                    for _ in range(10):  # the loop runs while the fetch waits
                        await trio.sleep(0.05)
                        ticks += 1
                    assert not fetched  # still waiting for the database
                    await trio.to_thread.run_sync(pg.start)
    assert ticks == 10
    (again,) = fetched
    assert again is not None and again["result"]["body"] == BODY.decode(), again
    assert again["invocation_id"] == iid
