"""A record written before the config hash was keyed shows a caller none of its plain hashes.

Such a record holds the plain ``sha256:`` config hash, the v1 request fingerprint and the v2
approval fingerprint over it: each confirms a guessed credential reference offline.  The journal
keeps them (it is never rewritten) and an operator's view shows them; every caller-facing
rendering -- the envelope, the record and actions views (daemon, MCP, ``--socket`` CLI), the
events' attrs -- shows ``WITHHELD`` instead.  A record written since shows its keyed hashes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import trio

from affidavit.api.broker import Broker
from affidavit.mcp.backends import Embedded, Exchange
from affidavit.statemachine import WITHHELD, envelope_schema, hashes_withheld
from affidavit.views import record_json_encoder, record_to_json, record_view
from tests.daemon.kit import cli, embedded, start_daemon, stop, write_daemon_config
from tests.http.hostile import HostileServer, Reply, scripts

from .approvalkit import OPS, approval_config
from .helpers import http_target, open_broker
from .http_rows import IDEM
from .test_keyed_config_hash import CHARGE, _as_before_the_upgrade

LIMIT = 20


def _plain_hashes(broker: Broker, iid: str) -> list[str]:
    """The hashes the operator's view of an old record shows: the canaries."""
    rec = broker.record(iid)
    assert rec is not None
    view = record_view(rec, broker.events(iid), operator=True)
    evidence = view["record"]["evidence"]
    found = [
        evidence["config_hash"],
        view["record"]["fingerprint"],
        view["record"]["idempotency"]["fingerprint"],
    ]
    if "approval" in evidence:
        found.append(evidence["approval"]["fingerprint"])
    assert evidence["config_hash"].startswith("sha256:"), evidence
    assert all(type(h) is str and h.startswith("sha256:") for h in found), found
    return found


def _shows_none(text: str, plain: list[str]) -> None:
    assert WITHHELD in text, text
    for value in plain:
        assert value not in text, (value, text)
        assert value.split(":", 1)[1] not in text, (value, text)  # nor its bare hex


async def test_an_old_records_plain_hashes_reach_no_caller_and_a_new_one_shows_keyed(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(201))) as srv:
        cfg = approval_config(tmp_path, srv.url, idempotency=IDEM)
        action = {**CHARGE, "body": "{}"}
        async with _as_before_the_upgrade(), open_broker(cfg) as b:
            with trio.fail_after(LIMIT):
                env = await b.call(action)
            assert env["error"]["code"] == "APPROVAL_PENDING", env
            iid = env["invocation_id"]
            await b.approve(iid, operator=OPS)
        async with open_broker(cfg) as b:
            plain = _plain_hashes(b, iid)
            assert len(plain) == 4
            rec = b.record(iid)
            assert rec is not None and hashes_withheld(rec)
            events = b.events(iid)
            # The operator's views show what was recorded.
            operator_text = json.dumps(record_view(rec, events, operator=True))
            operator_text += record_json_encoder(operator=True)(rec)
            assert all(value in operator_text for value in plain)
            assert WITHHELD not in operator_text
            mcp = Embedded(b)
            with trio.fail_after(LIMIT):
                pending = await b.fetch_result(iid)
                await b.dispatch_approved(iid)
                fetched = await b.fetch_result(iid)
                by_mcp = await mcp.fetch_result(iid, None, None, Exchange())
            assert fetched is not None and fetched["error"]["code"] == "APPROVAL_STALE"
            rec = b.record(iid)
            assert rec is not None
            caller = [
                pending,
                fetched,
                by_mcp,
                record_to_json(rec),
                record_view(rec, b.events(iid)),
                await mcp.record(iid),
                await mcp.actions(None, None, 10),
            ]
            texts = [json.dumps(c) for c in caller]
            texts.append(record_json_encoder()(rec))
            # The fast encoder writes what ``record_to_json`` does, withheld or not.
            assert texts[-1] == json.dumps(record_to_json(rec), sort_keys=True)
            for text in texts:
                _shows_none(text, plain)
            assert fetched["evidence"]["config_hash"] == WITHHELD
            assert fetched["evidence"]["idempotency"]["fingerprint"] == WITHHELD
            assert fetched["evidence"]["approval"]["fingerprint"] == WITHHELD
            for envelope in (pending, fetched, by_mcp):  # still the contract's envelope
                jsonschema.Draft202012Validator(envelope_schema()).validate(envelope)
            # A record written since keeps its keyed hashes, in every view alike.
            with trio.fail_after(LIMIT):
                new = await b.call({**action, "idempotency_key": "another"})
            new_rec = b.record(new["invocation_id"])
            assert new_rec is not None and not hashes_withheld(new_rec)
            shown = record_to_json(new_rec, holder=b.journal.holder_tag)
            recorded = record_to_json(new_rec, operator=True)
            # Alike but for the lease holder, which a caller is shown tagged (test_holder_shown).
            lease = recorded["evidence"]["lease"]
            tag = b.journal.holder_tag(new_rec.invocation_id, lease["holder"])
            assert shown["evidence"]["lease"]["holder"] == tag
            assert shown == {**recorded, "evidence": {**recorded["evidence"], "lease": {
                **lease, "holder": tag}}}  # fmt: skip
            assert shown["evidence"]["config_hash"].startswith("hmac-sha256:")
            assert shown["fingerprint"].startswith("sha256:")
            assert new["evidence"]["config_hash"] == shown["evidence"]["config_hash"]
            assert WITHHELD not in json.dumps(record_view(new_rec, b.events(new_rec.invocation_id)))
    assert srv.requests == []


async def test_the_daemon_and_the_socket_cli_withhold_an_old_records_plain_hashes(
    tmp_path: Path, token: str
) -> None:
    """Through the daemon (``record``, ``actions``, ``result`` with ``--socket``) a caller sees
    no plain hash; the operator's embedded ``record`` still shows them."""
    socket = tmp_path / "affidavit.sock"
    async with HostileServer.running(scripts.serve(Reply(201))) as srv:
        cfg = write_daemon_config(
            tmp_path, {"api": http_target(srv.url, idempotency=IDEM)}, socket=socket
        )
        async with _as_before_the_upgrade(), open_broker(cfg) as b:
            with trio.fail_after(LIMIT):
                env = await b.call(CHARGE)
            assert env.get("error") is None, env
            iid = env["invocation_id"]
            plain = _plain_hashes(b, iid)
        daemon = await start_daemon(cfg, socket, tmp_path / "daemon.log", token)
        try:
            outputs: list[Any] = []
            for args in (("record", iid, "--json"), ("actions", "--json"), ("result", iid)):
                done = await cli(daemon, *args)
                assert done.returncode == 0, (args, done.stderr)
                outputs.append(done.stdout.decode() + done.stderr.decode())
        finally:
            stop(daemon)
        operator = await embedded("record", iid, "--json", "--config", str(cfg), token=token)
    for text in outputs:
        _shows_none(text, plain)
    assert operator.returncode == 0, operator.stderr
    assert all(value in operator.stdout.decode() for value in plain)
