"""A result commit that landed while its answer was lost is answered from the record: the stored
result, never RESULT_STORE_FAILED and never a traceback.

On a shared journal the connection can go while the result's COMMIT is in flight.  When no new
connection comes within ``[journal] reconnect``, the writer cannot read whether it landed and
fails the commit with ``ResultStoreFailed`` (the rows posted with it: ``CommitUnknown``) --
"whether the write is durable is unknown until the journal is read again".  The engine must
read it again: when the record holds RESULT_COMMITTED, the result is stored, and no failure
event may be appended over it.

The network is cut by ``tests.postgres.Proxy`` between the broker and PostgreSQL: the COMMIT
reaches the server, its answer is dropped with the connection, and new connections are refused
until the writer gave up -- then let through again (``around_transaction`` is left in the writer
thread right after the batch failed, before the engine hears of it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from affidavit.journal import Batch, Journal
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster, Proxy

from .helpers import assert_ok, event_kinds, http_target, open_broker, write_config

E = EventKind
LIMIT = 60
POST = {"target": "api", "method": "POST", "path": "/charge", "body": "{}"}


class LoseTheCommitsAnswer:
    """``before_commit`` and ``around_transaction`` together: in the transaction that carries
    RESULT_COMMITTED, the COMMIT's answer is lost and the network stays cut; once that batch
    has ended (failed: no reconnect in time), the network is back.  Once only."""

    def __init__(self, journal: Journal, proxy: Proxy) -> None:
        self.journal = journal
        self.proxy = proxy
        self.lost = False
        self.restored = False

    def before_commit(self, batch: Batch) -> None:
        if self.lost or not batch.barrier:
            return
        # Inside the transaction: its own rows count (the database holds no other result).
        (n,) = self.journal.write_connection.execute(
            "SELECT count(*) FROM events WHERE kind = 'RESULT_COMMITTED'"
        ).fetchone()
        if n:
            self.proxy.lose_next_answer(then_cut=True)
            self.lost = True

    @contextlib.contextmanager
    def around(self, batch: Batch) -> Iterator[None]:
        try:
            yield
        finally:
            if self.lost and not self.restored:
                self.proxy.restore()
                self.restored = True


@pytest.mark.parametrize("size", [300 * 1024, 2 * 1024 * 1024 + 5], ids=["inline", "by_reference"])
async def test_a_result_commit_whose_answer_was_lost_is_the_stored_result(
    pg: Cluster, pg_url: str, tmp_path: Path, token: str, size: int
) -> None:
    proxy = Proxy(pg.port)
    try:
        journal = {
            "url": proxy.url(pg, pg_url),
            "key_file": str(tmp_path / "shared.key"),
            "signing_key": str(tmp_path / "a.signing.key"),
            "reconnect": 1,
        }
        body = b"p" * size
        async with HostileServer.running(scripts.serve(Reply(201, body=body))) as srv:
            cfg = write_config(tmp_path, {"api": http_target(srv.url)}, journal=journal)
            with trio.fail_after(LIMIT):
                async with open_broker(cfg) as broker:
                    lose = LoseTheCommitsAnswer(broker.journal, proxy)
                    broker.journal.before_commit = lose.before_commit
                    broker.journal.around_transaction = lose.around
                    env = await broker.call(POST)
                    broker.journal.before_commit = None
                    broker.journal.around_transaction = None
                    assert lose.restored and proxy.lost_answers == 1
                    await broker.settled()  # its delivery, queued (for the sync reads)
                    rec = assert_ok(broker, env)
                    iid = env["invocation_id"]
                    kinds = event_kinds(broker, iid)
                    assert kinds.count(E.REMOTE_RESPONSE_COMPLETE) == 1
                    assert kinds.count(E.RESULT_COMMITTED) == 1
                    assert E.RESULT_STORE_FAILED not in kinds
                    # An answer by reference transferred none of the result: no delivery recorded.
                    by_ref = "by_reference" in env["result"]
                    assert rec.state == ("stored_committed" if by_ref else "delivered_committed")
                    stored = broker.journal.read_result(iid)
                    assert stored is not None and stored.streams == {"body": body}
                    assert env["result"]["sha256"] == stored.sha256
                    fetched = await broker.fetch_result(iid)
                    assert fetched is not None and "error" not in fetched
            assert len(srv.requests) == 1
    finally:
        proxy.close()
