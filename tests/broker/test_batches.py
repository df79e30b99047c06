"""Batches end to end (issue 14, item 2), against the scripted HTTP server: the parent's
transport outcome and one outcome per item, from the complete response only.

Seed: "If the broker sends five changes in one HTTP request and receives a complete response for
only four of them, a single retry hint cannot safely be assigned to the whole batch.  Record the
parent transport outcome and five child outcomes.  Retry only the item for which the records and
the remote contract permit it, or reconcile the batch as a whole if the remote API applies
changes atomically."
"""

from __future__ import annotations

import contextlib
import gzip
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.approvals import OperatorError
from affidavit.statemachine import EventKind, EvidenceSource
from affidavit.views import metrics
from tests.http.hostile import HostileServer, Peer, Reply, Script, scripts

from .approvalkit import OPS, OPS_UID
from .helpers import (
    affidavit_cli,
    assert_error,
    assert_ok,
    event_kinds,
    http_target,
    open_broker,
    write_config,
)
from .http_rows import LIMIT

E = EventKind
ITEMS = [{"id": n, "op": "set", "value": n * 10} for n in range(1, 6)]
BATCH_CALL = {
    "target": "bulk",
    "method": "POST",
    "path": "/batch",
    "body": json.dumps({"items": ITEMS}),
}
BATCH = {
    "items": "json:/results",
    "request_items": "json:/items",
    "item_id": "json:/id",
    "item_status": "json:/status",
    "ok": [200, 201],
}


def _results(statuses: dict[int, Any]) -> bytes:
    return json.dumps({"results": [{"id": i, "status": s} for i, s in statuses.items()]}).encode()


async def _run(
    tmp_path: Path,
    script: Script,
    batch: dict[str, Any] | None = None,
    call: dict[str, Any] = BATCH_CALL,
    **target_extra: Any,
) -> tuple[dict[str, Any], list[EventKind], dict[str, Any]]:
    """One batch ``call`` on a fresh config and journal in ``tmp_path``; (envelope, the
    invocation's event kinds, the metrics), read while the broker is open."""
    tmp_path.mkdir(exist_ok=True)
    async with HostileServer.running(script) as srv:
        # (a setting given None is left out: its default)
        given = {k: v for k, v in {**BATCH, **(batch or {})}.items() if v is not None}
        target = http_target(srv.url, batch=given, **target_extra)
        cfg = write_config(tmp_path, {"bulk": target})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(call)
            kinds = event_kinds(broker, env["invocation_id"])
            if "error" in env:
                rec = broker.record(env["invocation_id"])
                assert rec is not None and rec.items is not None
            else:
                assert_ok(broker, env)
            events = broker.events(env["invocation_id"])
            for e in (e for e in events if e.kind is E.BATCH_ITEMS_RECORDED):
                assert e.source is EvidenceSource.REMOTE_RESPONSE
                # As recorded -- but a throttled item's hint is the record's (items_view):
                # recorded ``reconcile``, the response alone never making a resend safe.
                recorded = [dict(i) for i in e.attrs["items"]]
                for i in recorded:
                    if i["code"] == "REMOTE_THROTTLED":
                        assert i["retry"] == "reconcile"
                        i["retry"] = next(j for j in env["items"] if j["id"] == i["id"])["retry"]
                assert recorded == env["items"]
            m = metrics(broker.journal.list_actions())
    assert len(srv.requests) == 1  # nothing was retried on its own
    return env, kinds, m


def _outcomes(env: dict[str, Any]) -> list[tuple[Any, str, str | None, str]]:
    return [(i["id"], i["outcome"], i["code"], i["retry"]) for i in env["items"]]


async def test_a_207_gives_each_item_its_own_outcome_and_retry_hint(
    tmp_path: Path, token: str
) -> None:
    body = _results({1: 200, 2: 201, 3: 409, 4: 200, 5: 500})
    env, kinds, m = await _run(tmp_path, scripts.serve(Reply(207, body=body)))
    # The parent: a complete 207 is a committed transport outcome ...
    assert env["evidence"]["outcome"] == "committed" and env["result"]["status"] == 207
    # ... and five child outcomes: only item 3 may be corrected and resent; item 5 answered
    # with a server error and may have been applied.
    assert _outcomes(env) == [
        (1, "committed", None, "never"),
        (2, "committed", None, "never"),
        (3, "rejected", "REMOTE_REJECTED", "after_correction"),
        (4, "committed", None, "never"),
        (5, "committed", "REMOTE_ERROR", "reconcile"),
    ]
    assert [i["status"] for i in env["items"]] == [200, 201, 409, 200, 500]
    assert kinds.index(E.BATCH_ITEMS_RECORDED) < kinds.index(E.RESULT_COMMITTED)
    # Metrics count the items apart from the invocation.
    assert m["invocations"] == 1
    assert m["batch_items"] == [
        {"outcome": "committed", "code": "OK", "count": 3},
        {"outcome": "committed", "code": "REMOTE_ERROR", "count": 1},
        {"outcome": "rejected", "code": "REMOTE_REJECTED", "count": 1},
    ]


async def test_a_200_with_item_errors_in_the_json_is_not_a_batch_success(
    tmp_path: Path, token: str
) -> None:
    body = json.dumps(
        {
            "results": [
                {"id": 1, "status": "ok"},
                {"id": 2, "status": "ok"},
                {"id": 3, "status": "invalid"},
                {"id": 4, "status": "throttled"},
                # item 5 is not in the response at all
            ]
        }
    ).encode()
    batch = {"ok": ["ok"], "rejected": ["invalid"]}
    env, _kinds, _m = await _run(tmp_path, scripts.serve(Reply(200, body=body)), batch)
    assert "error" not in env  # the parent answered completely
    assert _outcomes(env) == [
        (1, "committed", None, "never"),
        (2, "committed", None, "never"),
        (3, "rejected", "REMOTE_REJECTED", "after_correction"),
        (4, "committed", "REMOTE_ERROR", "reconcile"),  # an unknown status: may be applied
        (5, "unknown", "REMOTE_RESULT_INCOMPLETE", "reconcile"),  # the response is silent
    ]


async def test_throttled_items_of_a_post_batch_are_reconciled_not_resent(
    tmp_path: Path, token: str
) -> None:
    # The rule a whole POST answered 429/503 gets (docs/contract.md, rule 7): a POST is not
    # idempotent here and carries no idempotency key, so resending an item is not known to be
    # safe -- even with the server's Retry-After.
    body = _results({1: 200, 2: 429, 3: 503, 4: 200, 5: 200})
    reply = Reply(207, headers=[("Retry-After", "1")], body=body)
    env, _k, _m = await _run(tmp_path, scripts.serve(reply))
    assert [(i["code"], i["retry"]) for i in env["items"]] == [
        (None, "never"),
        ("REMOTE_THROTTLED", "reconcile"),
        ("REMOTE_THROTTLED", "reconcile"),
        (None, "never"),
        (None, "never"),
    ]


async def test_throttled_items_of_an_idempotent_batch_back_off_only_with_retry_after(
    tmp_path: Path, token: str
) -> None:
    body = _results({1: 200, 2: 429, 3: 503, 4: 200, 5: 200})
    idempotent = {"idempotent": ["GET", "POST", "PUT"]}
    timed = Reply(207, headers=[("Retry-After", "1")], body=body)
    env, _k, _m = await _run(tmp_path / "timed", scripts.serve(timed), **idempotent)
    assert [i["retry"] for i in env["items"]] == ["never", "backoff", "backoff", "never", "never"]
    # No Retry-After: the response specified no time (seed), so no backoff.
    untimed = Reply(207, body=body)
    env, _k, _m = await _run(tmp_path / "untimed", scripts.serve(untimed), **idempotent)
    assert [i["retry"] for i in env["items"]] == [
        "never",
        "reconcile",
        "reconcile",
        "never",
        "never",
    ]


async def test_a_whole_batch_rejection_rejects_each(tmp_path: Path, token: str) -> None:
    refused = Reply(400, body=b'{"error":"malformed batch"}')
    env, _k, _m = await _run(tmp_path / "whole", scripts.serve(refused))
    assert env["error"]["code"] == "REMOTE_REJECTED"
    assert {(o, c, r) for _i, o, c, r in _outcomes(env)} == {
        ("rejected", "REMOTE_REJECTED", "after_correction")
    }


def _cut_mid_body() -> Script:
    """Read the batch, start a 207 whose body promises more than it sends, then close."""

    async def script(peer: Peer) -> None:
        await peer.read_request()
        partial = _results({1: 200, 2: 200, 3: 409, 4: 200})[:-30]
        head = b"HTTP/1.1 207 Multi-Status\r\nContent-Length: 400\r\n\r\n"
        await peer.send_raw(head + partial)
        await peer.close()

    return script


async def test_a_batch_response_cut_in_the_middle_leaves_every_item_unknown(
    tmp_path: Path, token: str
) -> None:
    env, kinds, m = await _run(tmp_path, _cut_mid_body())
    err = env["error"]
    assert (err["outcome"], err["code"], err["retry"]) == (
        "unknown",
        "REMOTE_RESULT_INCOMPLETE",
        "reconcile",
    )
    # Four results arrived before the cut, yet none is a complete result: no item is known.
    assert _outcomes(env) == [
        (n, "unknown", "REMOTE_RESULT_INCOMPLETE", "reconcile") for n in range(1, 6)
    ]
    assert E.BATCH_ITEMS_RECORDED not in kinds
    assert m["batch_items"] == [
        {"outcome": "unknown", "code": "REMOTE_RESULT_INCOMPLETE", "count": 5}
    ]


async def test_a_207_whose_gzip_body_is_cut_classifies_no_item(tmp_path: Path, token: str) -> None:
    # The 207 is framed whole (Content-Length), but its gzip lacks the CRC/length trailer:
    # body_withheld corrupt_encoding, body_truncated.  The decoded prefix parses and names
    # item 3 rejected -- what the rest (and the trailer that would have proved it) said was
    # never seen, so no item is classified from it (engine/readable.py).
    body = gzip.compress(_results({1: 200, 2: 200, 3: 409, 4: 200, 5: 200}))[:-8]
    reply = Reply(207, headers=[("Content-Encoding", "gzip")], body=body)
    env, kinds, m = await _run(tmp_path, scripts.serve(reply))
    assert env["result"]["body_withheld"]["reason"] == "corrupt_encoding"
    assert env["result"]["body_truncated"] is True
    assert _outcomes(env) == [
        (n, "unknown", "REMOTE_RESULT_INCOMPLETE", "reconcile") for n in range(1, 6)
    ]
    assert E.BATCH_ITEMS_RECORDED in kinds  # recorded as unknown (checked in ``_run``)
    assert m["batch_items"] == [
        {"outcome": "unknown", "code": "REMOTE_RESULT_INCOMPLETE", "count": 5}
    ]


async def test_an_atomic_batch_with_mixed_answers_is_reconciled_as_a_whole(
    tmp_path: Path, token: str
) -> None:
    body = _results({1: 200, 2: 200, 3: 409, 4: 200, 5: 200})
    env, _k, _m = await _run(tmp_path, scripts.serve(Reply(207, body=body)), {"atomic": True})
    assert [i["outcome"] for i in env["items"]] == ["committed"] * 2 + ["rejected"] + [
        "committed"
    ] * 2
    assert {i["retry"] for i in env["items"]} == {"reconcile"}
    ok = _results(dict.fromkeys(range(1, 6), 200))
    env, _k, _m = await _run(tmp_path / "ok", scripts.serve(Reply(200, body=ok)), {"atomic": True})
    assert {i["retry"] for i in env["items"]} == {"never"}


async def test_an_atomic_batch_with_a_throttled_item_backs_off_no_item(
    tmp_path: Path, token: str
) -> None:
    # An idempotent batch answered 429 for one item with a Retry-After would back that item
    # off (above) -- unless the batch is atomic: then a mixed answer is reconciled as a whole
    # (seed), the throttled item included.  The record's view (statemachine/batch.py), not
    # only the recorded items, must keep it so.
    body = _results({1: 200, 2: 429, 3: 200, 4: 200, 5: 200})
    reply = Reply(207, headers=[("Retry-After", "1")], body=body)
    idempotent = {"idempotent": ["GET", "POST", "PUT"]}
    env, _k, _m = await _run(tmp_path, scripts.serve(reply), {"atomic": True}, **idempotent)
    assert env["items"][1]["code"] == "REMOTE_THROTTLED"
    assert {i["retry"] for i in env["items"]} == {"reconcile"}


async def test_a_5xx_naming_no_item_leaves_every_item_unknown(tmp_path: Path, token: str) -> None:
    # A complete 500 proves the request was processed to some point, not which item was
    # applied: never "rejected" (nothing applied) for an item the response did not name.
    reply = Reply(500, body=b'{"error":"internal"}')
    env, kinds, _m = await _run(tmp_path, scripts.serve(reply))
    assert (env["error"]["outcome"], env["error"]["code"]) == ("committed", "REMOTE_ERROR")
    assert _outcomes(env) == [
        (n, "unknown", "REMOTE_RESULT_INCOMPLETE", "reconcile") for n in range(1, 6)
    ]
    assert E.BATCH_ITEMS_RECORDED in kinds


async def test_items_before_dispatch_are_not_attempted(tmp_path: Path, token: str) -> None:
    from .helpers import closed_port

    target = http_target(f"http://127.0.0.1:{closed_port()}", batch=BATCH)
    async with open_broker(write_config(tmp_path, {"bulk": target})) as broker:
        with trio.fail_after(LIMIT):
            env = await broker.call(BATCH_CALL)
        assert_error(
            broker,
            env,
            phase="connection_setup",
            outcome="not_attempted",
            retry="backoff",
            code="CONNECTION_REFUSED",
        )
    assert _outcomes(env) == [
        (n, "not_attempted", "CONNECTION_REFUSED", "backoff") for n in range(1, 6)
    ]


async def test_metrics_on_the_command_line_count_items_apart(tmp_path: Path, token: str) -> None:
    body = _results({1: 200, 2: 201, 3: 409, 4: 200, 5: 500})
    await _run(tmp_path, scripts.serve(Reply(207, body=body)))
    p = await affidavit_cli("metrics", "--prometheus", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.decode().splitlines()
    assert 'affidavit_invocations{phase="remote_execution",outcome="committed"} 1' in lines
    assert 'affidavit_batch_items{outcome="committed",code="OK"} 3' in lines
    assert 'affidavit_batch_items{outcome="rejected",code="REMOTE_REJECTED"} 1' in lines
    assert 'affidavit_batch_items{outcome="committed",code="REMOTE_ERROR"} 1' in lines


# --- reconciling a batch as a whole: only when the remote applies it atomically ---------------

RECONCILE = {
    "method": "GET",
    "path": "/changes/{invocation_id}",
    "committed_if": "status:200",
    "rejected_if": ["status:404", "json:/error=no such change"],
    "settle": "0s",
}


def _cut_then_absent(seen: list[str]) -> Script:
    """The batch's 207 cut mid-body (every item unknown); every later request -- a
    reconciliation query -- answered 404, "no such change"."""
    cut = _cut_mid_body()

    async def script(peer: Peer) -> None:
        if not seen:
            seen.append("POST")
            await cut(peer)
            return
        req = await peer.read_request()
        if req is not None:
            seen.append(req.method)
            await peer.respond(Reply(404, body=b'{"error": "no such change"}'))

    return script


@contextlib.asynccontextmanager
async def _cut_batch(tmp_path: Path, atomic: bool) -> AsyncIterator[tuple[Broker, str, list[str]]]:
    """A broker whose batch of five was cut mid-response (unknown), its invocation id, and the
    methods the server received so far."""
    seen: list[str] = []
    async with HostileServer.running(_cut_then_absent(seen)) as srv:
        batch = {**BATCH, "atomic": atomic}
        target = http_target(srv.url, batch=batch, reconcile=RECONCILE)
        path = write_config(tmp_path, {"bulk": target})
        with path.open("a") as f:
            f.write(f"[service]\noperator_uids = [{OPS_UID}]\n")
        async with open_broker(path) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(BATCH_CALL)
            assert env["error"]["code"] == "REMOTE_RESULT_INCOMPLETE"
            yield broker, env["invocation_id"], seen


def _still_unknown(broker: Broker, iid: str) -> None:
    record = broker.record(iid)
    assert record is not None and record.outcome.value == "unknown"
    assert record.items is not None
    assert {(i["outcome"], i["retry"]) for i in record.items} == {("unknown", "reconcile")}
    assert not {E.RECONCILED, E.RECONCILE_INCONCLUSIVE} & set(event_kinds(broker, iid))


async def test_a_batch_applied_item_by_item_is_never_reconciled_as_a_whole(
    tmp_path: Path, token: str
) -> None:
    # Seed: "reconcile the batch as a whole if the remote API applies changes atomically" --
    # only then.  One query about "the effect" cannot say which of five items applied one by
    # one: settled as a whole, the parent said rejected / after_correction (send them again)
    # under items still unknown.  Refused before anything is sent or recorded.
    async with _cut_batch(tmp_path, atomic=False) as (broker, iid, seen):
        with trio.fail_after(LIMIT):
            with pytest.raises(OperatorError) as queried:
                await broker.reconcile(iid, query=True)
            with pytest.raises(OperatorError) as attested:
                await broker.reconcile(iid, attest="rejected", note="looked", operator=OPS)
        for refused in (queried.value, attested.value):
            assert (refused.code, refused.status, refused.field) == (
                "BATCH_NOT_ATOMIC",
                409,
                None,  # the id is right: no field to correct (MCP would say INVALID_FIELD)
            )
            assert "item" in refused.message and "nothing was queried" in refused.message
        _still_unknown(broker, iid)
        assert seen == ["POST"]  # no query reached the remote


@pytest.mark.parametrize(
    ("how", "outcome", "code", "retry", "source"),
    [
        ("attest", "committed", None, "never", "operator_attested"),
        ("query", "rejected", "REMOTE_REJECTED", "after_correction", "remote_query"),
    ],
)
async def test_an_atomic_batch_reconciled_as_a_whole_settles_every_item(
    tmp_path: Path, token: str, how: str, outcome: str, code: str | None, retry: str, source: str
) -> None:
    # All or none applied: what the second observer found of the effect is each item's fate,
    # and the items say so -- never ``unknown`` / ``reconcile`` under a settled parent.
    async with _cut_batch(tmp_path, atomic=True) as (broker, iid, seen):
        with trio.fail_after(LIMIT):
            if how == "attest":
                answer = await broker.reconcile(iid, attest=outcome, note="ok", operator=OPS)
            else:
                answer = await broker.reconcile(iid, query=True)
        assert answer["reconciled"] is True
        env = answer["envelope"]
        assert env["evidence"]["outcome"] == outcome
        assert env["items"] == [
            {"id": n, "outcome": outcome, "code": code, "retry": retry, "source": source}
            for n in range(1, 6)
        ]
        assert seen == (["POST"] if how == "attest" else ["POST", "GET"])
