"""A quiet daemon closes its idle view readers: the pool prunes a reader idle past its bound only
when a view takes or gives one back, so a daemon no view comes to kept them open for its life
(PostgreSQL sessions; on SQLite descriptors keeping a replaced or removed journal file alive).
The daemon's upkeep prunes them every half bound (``server._prune_view_readers``).

The daemon runs in this process (``Daemon.run``) with the bound lowered; the caller is on its
real socket."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import affidavit.api.readers
from affidavit.api.client import Client
from affidavit.api.readers import ViewReaders
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import Reply, scripts

from .kit import WAIT, in_process
from .test_view_threads import _get

GET = {"target": "api", "method": "GET", "path": "/r"}


async def test_a_quiet_daemon_closes_its_idle_view_readers(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    monkeypatch.setattr(affidavit.api.readers, "IDLE_FOR", 0.2)
    pools: list[ViewReaders] = []
    real_init = ViewReaders.__init__

    def kept(self: ViewReaders, *a: object, **k: object) -> None:
        real_init(self, *a, **k)  # type: ignore[arg-type]
        pools.append(self)

    monkeypatch.setattr(ViewReaders, "__init__", kept)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"ok"))) as (_, socket):
        [pool] = pools
        with trio.fail_after(WAIT):
            async with Client.open(socket) as client:
                iid = str((await client.call(GET))["invocation_id"])
            status, body = await _get(socket, f"/v1/invocations/{iid}")
            assert status == 200, body
            assert pool.opened == 1
            # No view comes: the reader the view gave back is closed all the same.
            while pool.idle():
                await trio.sleep(0.05)
