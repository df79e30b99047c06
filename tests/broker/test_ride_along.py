"""A call's diagnostic events ride along with its barriers (DESIGN, "Durability barriers"): a
successful HTTP call costs three journal transactions -- DISPATCH_STARTED with everything before
it, RESULT_COMMITTED with the response events and the (short) result, then RESULT_DELIVERED --
two of them fsynced barriers, on the caller's path; the third is queued as ``call`` returns
(issue 15) and every read of the broker waits for it (tests/broker/test_deferred_delivery.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from affidavit.journal import Batch, Journal
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import assert_ok, event_kinds, http_target, open_broker, raw_kinds, write_config

E = EventKind
LIMIT = 10
GET = {"target": "api", "method": "GET", "path": "/thing"}

# Steady-state transaction counts (the gate does not reread a just-written config file).
pytestmark = pytest.mark.usefixtures("settled_config")


def _count_transactions(journal: Journal) -> list[tuple[int, bool]]:
    """(writes, barrier?) per writer transaction, from the journal's ``before_commit`` hook."""
    seen: list[tuple[int, bool]] = []

    def counted(batch: Batch) -> None:
        seen.append((batch.writes, batch.barrier))

    journal.before_commit = counted
    return seen


async def test_a_successful_call_commits_in_three_transactions_two_of_them_barriers(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                await broker.call(GET)  # warm: the connection is pooled
                await broker.settled()  # (its delivery committed: not counted below)
                seen = _count_transactions(broker.journal)
                env = await broker.call(GET)
                assert [barrier for _, barrier in seen] == [True, True]  # the caller's path
                await broker.settled()
            assert_ok(broker, env)
            iid = env["invocation_id"]
            kinds = event_kinds(broker, iid)
            assert [barrier for _, barrier in seen] == [True, True, False]
            # Every event and the result were written, in those three transactions, as five
            # queued writes (issue 15: one per section, not one per event): the preamble with
            # CREDENTIAL_AUTHORIZED; DISPATCH_STARTED; the milestones, protocol summary and
            # REMOTE_RESPONSE_COMPLETE; RESULT_COMMITTED, which seals and stores the short
            # result itself (held in memory until then: journal/segments.py); RESULT_DELIVERED.
            assert len(kinds) == 10
            assert [writes for writes, _ in seen] == [2, 2, 1]
            assert kinds[0] is E.ACTION_ACCEPTED
            assert kinds[-1] is E.RESULT_DELIVERED
            # Another connection sees the delivery once it is committed (``settled``).
            assert raw_kinds(tmp_path / "journal.db", iid)[-1] == E.RESULT_DELIVERED.value
