"""An approval whose window runs out while its DISPATCH_STARTED waits to be written (a shared
journal's wait for the chain head, up to ``[journal] reconnect``; a busy writer) must not be
sent: the gate's check of the expiry reads the clock *before* that write, and the request leaves
only after it commits.  The expiry is checked again in the transaction that writes
DISPATCH_STARTED, by the clock it is recorded in (``Journal.append(valid_until=)``): past it,
nothing is written or sent, and the call ends APPROVAL_EXPIRED (not_attempted).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from affidavit.approvals import OperatorError
from affidavit.journal.postgres import _LOCK
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Reply, scripts

from .approvalkit import OPS, OPS_UID, approval_config
from .helpers import assert_error, event_kinds, http_target, open_broker, pg_journal, write_config

E = EventKind
LIMIT = 15
TTL = 2.0
CHARGE = {"target": "api", "method": "POST", "path": "/v1/charges", "body": '{"amount": 5}'}


async def test_an_approval_expiring_while_its_dispatch_barrier_waits_is_not_sent(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv:
        cfg = approval_config(tmp_path, srv.url, approval={"ttl": f"{TTL:g}s", "wait": f"{TTL:g}s"})
        async with open_broker(cfg) as b:
            real_append = b.journal.append
            waited: list[float] = []

            async def append(event: Any, *args: Any, **kwargs: Any) -> Any:
                if event.kind is E.DISPATCH_STARTED and not waited:
                    # The gate checked the expiry; the write then waits past it.
                    waited.append(TTL + 0.3)
                    await trio.sleep(waited[0])
                return await real_append(event, *args, **kwargs)

            monkeypatch.setattr(b.journal, "append", append)
            got: dict[str, Any] = {}

            async def caller() -> None:
                got["env"] = await b.call(CHARGE)

            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(caller)
                    while not b.approvals():
                        await trio.sleep(0.02)
                    await b.approve(b.approvals()[0]["invocation_id"], operator=OPS)
            monkeypatch.undo()
            env = got["env"]
            assert waited, "the dispatch barrier was never written"
            iid = env["invocation_id"]
            assert E.DISPATCH_STARTED not in event_kinds(b, iid), env
            assert_error(b, env, phase="validation", outcome="not_attempted",
                         retry="after_correction", code="APPROVAL_EXPIRED")  # fmt: skip
    assert srv.requests == []


async def test_a_grant_whose_write_waits_past_the_expiry_is_refused_and_recorded_expired(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for the decision: ``approve`` checks the expiry, then APPROVAL_GRANTED waits to
    be written past it.  The grant is refused in its transaction (409 APPROVAL_EXPIRED) and
    the request closed APPROVAL_EXPIRED -- never a grant recorded after its window."""
    async with HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv:
        cfg = approval_config(tmp_path, srv.url, approval={"ttl": f"{TTL:g}s"})
        async with open_broker(cfg) as b:
            env = await b.call(CHARGE)
            iid = env["invocation_id"]
            real_append = b.journal.append

            async def append(event: Any, *args: Any, **kwargs: Any) -> Any:
                if event.kind is E.APPROVAL_GRANTED:
                    await trio.sleep(TTL + 0.3)  # checked; the write waits past the expiry
                return await real_append(event, *args, **kwargs)

            monkeypatch.setattr(b.journal, "append", append)
            with trio.fail_after(LIMIT), pytest.raises(OperatorError) as info:
                await b.approve(iid, operator=OPS)
            monkeypatch.undo()
            assert (info.value.code, info.value.status) == ("APPROVAL_EXPIRED", 409)
            kinds = event_kinds(b, iid)
            assert E.APPROVAL_GRANTED not in kinds, kinds
            fetched = await b.fetch_result(iid)
            assert fetched is not None
            assert_error(b, fetched, phase="validation", outcome="not_attempted",
                         retry="after_correction", code="APPROVAL_EXPIRED")  # fmt: skip
    assert srv.requests == []


async def test_on_postgresql_a_held_chain_head_past_the_expiry_sends_nothing(
    tmp_path: Path, pg_url: str, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same on a shared journal, with no write faked: another session holds the chain head
    when DISPATCH_STARTED is written (a broker's lost session) and frees it after the approval
    expired, well within ``[journal] reconnect``.  The write then takes the head -- and is
    refused by the database's clock in its transaction."""
    journal = pg_journal(tmp_path, pg_url, reconnect=10)
    async with HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv:
        window = {"ttl": f"{TTL:g}s", "wait": f"{TTL:g}s"}
        cfg = write_config(
            tmp_path, {"api": http_target(srv.url, approval=window)}, journal=journal
        )
        with cfg.open("a", encoding="utf-8") as f:
            f.write(f"[service]\noperator_uids = [{OPS_UID}]\n")
        with psycopg.connect(pg_url, autocommit=True) as other:
            async with open_broker(cfg) as b:
                real_append = b.journal.append
                taken: list[float] = []

                async def append(event: Any, *args: Any, **kwargs: Any) -> Any:
                    if event.kind is E.DISPATCH_STARTED and not taken:
                        other.execute("BEGIN")
                        other.execute(
                            "SELECT pg_advisory_xact_lock(%s, hashtext(current_schema()))",
                            (_LOCK,),
                        )
                        taken.append(trio.current_time())
                    return await real_append(event, *args, **kwargs)

                async def release() -> None:
                    while not taken:
                        await trio.sleep(0.02)
                    await trio.sleep(TTL + 0.5)  # past the expiry, within reconnect
                    other.execute("ROLLBACK")

                monkeypatch.setattr(b.journal, "append", append)
                got: dict[str, Any] = {}

                async def caller() -> None:
                    got["env"] = await b.call(CHARGE)

                with trio.fail_after(LIMIT):
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(release)
                        nursery.start_soon(caller)
                        while not b.approvals():
                            await trio.sleep(0.02)
                        await b.approve(b.approvals()[0]["invocation_id"], operator=OPS)
                monkeypatch.undo()
                env = got["env"]
                assert taken, "the dispatch barrier was never written"
                iid = env["invocation_id"]
                assert E.DISPATCH_STARTED not in event_kinds(b, iid), env
                assert_error(b, env, phase="validation", outcome="not_attempted",
                             retry="after_correction", code="APPROVAL_EXPIRED")  # fmt: skip
    assert srv.requests == []
