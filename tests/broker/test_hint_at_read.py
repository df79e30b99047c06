"""Every answer that shows a retry hint computes it when it answers, never at the record's last
event (docs/contract.md, "When the hint is computed").

An unanswered POST under an idempotency contract is unknown / ``same_idempotency_key`` while
the key is usable.  Once the remote may forget the key (``RETENTION_MARGIN_S`` before its
retention ends) a same-key resend is no longer safe: every read of that record -- ``fetch_result``,
``Broker.record``, the actions view, the MCP ``record`` and ``list_actions`` tools, the CLI's
``record`` and ``actions`` -- must say ``reconcile`` then, as a same-key call does.  The hint
at the record's last event still said ``same_idempotency_key``.

The key is configured with a retention of ``RETENTION_MARGIN_S`` + the send window (the lease
a retry takes with the target's 5 s timeout and ``lease_margin``: it may send until then) + 2
s: usable for the first 2 s after the call is accepted, which is waited out (real time: the
CLI reads in a process of its own, on its own clock).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import trio

from affidavit.engine.settings import EngineSettings
from affidavit.mcp.backends import Embedded
from affidavit.statemachine.retry import RETENTION_MARGIN_S
from tests.http.hostile import HostileServer, Peer, Reply, scripts

from .helpers import affidavit_cli, http_target, open_broker, write_config

WINDOW = 5 + EngineSettings().lease_margin  # http_target's timeout.total, and the lease's margin
RETENTION = RETENTION_MARGIN_S + WINDOW + 2  # a key usable for 2 s after the call is accepted

HELD = 120  # timeout.total of a target whose request the test holds, then releases

POST = {"target": "api", "method": "POST", "path": "/charge", "body": "{}"}


async def _applied_unanswered(peer: Peer) -> None:
    await peer.read_request()
    await peer.close()  # applied, never answered: unknown


async def test_every_read_computes_the_hint_now_not_at_the_last_event(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(_applied_unanswered) as srv:
        target = http_target(
            srv.url,
            idempotency={"header": "Idempotency-Key", "scope": "pay", "retention": RETENTION},
        )
        cfg = write_config(tmp_path, {"api": target})
        async with open_broker(cfg) as broker:
            with trio.fail_after(10):
                first = await broker.call(POST)
            iid = first["invocation_id"]
            # When the call answered, the key was usable: a same-key resend was safe then.
            assert first["error"]["outcome"] == "unknown", first
            assert first["error"]["retry"] == "same_idempotency_key", first
            record = broker.record(iid)
            assert record is not None and record.idempotency is not None
            assert record.idempotency["send_window"] == WINDOW
            expires = float(record.idempotency["expires_at"])
            usable_until = expires - RETENTION_MARGIN_S - WINDOW
            await trio.sleep(max(0.0, usable_until - time.time()) + 0.1)

            fetched = await broker.fetch_result(iid)
            assert fetched is not None
            assert fetched["error"]["retry"] == "reconcile", fetched
            record = broker.record(iid)
            assert record is not None and record.retry == "reconcile"
            (listed,) = broker.journal.list_actions()
            assert listed.retry == "reconcile"
            (streamed,) = broker.journal.iter_actions()
            assert streamed.retry == "reconcile"

            mcp = Embedded(broker)
            shown = await mcp.record(iid)
            assert shown["record"]["retry"] == "reconcile", shown
            rows = (await mcp.actions(None, None, 50))["actions"]
            assert [r["retry"] for r in rows] == ["reconcile"]

            # What a same-key call decides now: the reads agree with it.
            key = first["evidence"]["idempotency"]["key"]
            with trio.fail_after(10):
                again = await broker.call({**POST, "idempotency_key": key})
            assert again["error"]["retry"] == "reconcile", again
            assert len(srv.requests) == 1  # nothing resent

    # The CLI reads the journal in its own process, on its own (unshifted) clock.
    got = await affidavit_cli("record", iid, "--json", "--config", str(cfg))
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["record"]["retry"] == "reconcile"
    text = await affidavit_cli("record", iid, "--config", str(cfg))
    assert b"retry reconcile" in text.stdout, text.stdout
    listing = await affidavit_cli("actions", "--json", "--config", str(cfg))
    assert listing.returncode == 0, listing.stderr
    assert [r["retry"] for r in json.loads(listing.stdout)] == ["reconcile"]


async def test_a_record_whose_attempt_runs_is_shown_fetch_result_as_a_same_key_call_answers(
    tmp_path: Path, token: str
) -> None:
    """While the POST is in flight its record is unknown and its key usable, so the hint the
    projection computes is ``same_idempotency_key``; but a same-key call answers IN_PROGRESS
    (the attempt holds the lease) and a new call would be a second active attempt.  Every view
    -- ``record`` and ``list_actions`` (MCP and daemon), ``affidavit actions --json`` and
    ``record`` -- shows ``fetch_result`` then, as the envelope does; once the answer is
    recorded, the record's own hint."""
    async with HostileServer.running(scripts.held(Reply(200, body=b"{}"))) as srv:
        idem = {"header": "Idempotency-Key", "scope": "pay", "retention": "24h"}
        # The test releases the held request itself: a target timeout longer than the CLI
        # processes take to start under load, or the broker ends the attempt meanwhile.
        target = http_target(srv.url, idempotency=idem, timeout={"connect": 2, "total": HELD})
        cfg = write_config(tmp_path, {"api": target})
        keyed = {**POST, "idempotency_key": "charge-live"}
        async with open_broker(cfg) as broker, trio.open_nursery() as nursery:
            answered: list[dict] = []

            async def first() -> None:
                answered.append(await broker.call(keyed))

            nursery.start_soon(first)
            with trio.fail_after(10):
                await srv.event("received").wait()
            (listed,) = broker.journal.list_actions()
            iid = listed.invocation_id
            assert not listed.final and listed.outcome == "unknown"
            with trio.fail_after(10):
                again = await broker.call(keyed)
            assert (again["error"]["code"], again["error"]["retry"]) == (
                "IN_PROGRESS",
                "fetch_result",
            ), again
            # ... and until when the live attempt holds it: its lease's deadline.
            lease = again["evidence"]["lease"]
            assert lease["generation"] == 0 and lease["expires_at"] > time.time(), lease
            mcp = Embedded(broker)
            shown = (await mcp.record(iid))["record"]
            assert shown["retry"] == "fetch_result"
            assert shown["evidence"]["lease"] == lease
            rows = (await mcp.actions(None, None, 50))["actions"]
            assert [r["retry"] for r in rows] == ["fetch_result"]
            listing = await affidavit_cli("actions", "--json", "--config", str(cfg))
            assert [r["retry"] for r in json.loads(listing.stdout)] == ["fetch_result"]
            text = await affidavit_cli("record", iid, "--config", str(cfg))
            assert b"retry fetch_result" in text.stdout, text.stdout
            srv.event("release").set()
            with trio.fail_after(10):
                while not answered:
                    await trio.sleep(0.01)
            assert "error" not in answered[0], answered
            rows = (await mcp.actions(None, None, 50))["actions"]
            assert [r["retry"] for r in rows] == ["never"]
    assert len(srv.requests) == 1


def test_the_contract_says_by_which_clock_evidence_lease_expires_at_is() -> None:
    """``evidence.lease.expires_at`` is in the clock leases are judged by (on a shared
    PostgreSQL journal the database's, ``Txn.lease_offset``), not the caller's: the contract
    says so where it names the field, and that only a call or ``fetch_result`` -- never a view
    -- closes an attempt whose lease ran out."""
    doc = (Path(__file__).parents[2] / "docs" / "contract.md").read_text()
    (para,) = [p for p in doc.split("\n\n") if "`evidence.lease`" in p and "expires_at" in p]
    assert "the database's on a shared PostgreSQL journal" in para, para
    assert "not the caller's" in para and "a view does not" in para, para
