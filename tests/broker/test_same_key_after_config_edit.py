"""A same-key call after the target's configuration changed is told apart from a modified request.

Seed, "Idempotency is defined by the remote contract": "A retry must use the same key and an
identical fingerprint.  Reusing the key with a modified body must fail locally with
``IDEMPOTENCY_MISMATCH``."  The fingerprint covers the target's snapshot, so a connect timeout
edited 2 -> 3 changed it, and the identical call was answered IDEMPOTENCY_MISMATCH ("a request
with a different fingerprint") in an invocation that did not name the original: the natural
reaction, a new key and a resend, makes a duplicate.  Now the request part is compared alone
(ACTION_ACCEPTED's ``request_fingerprint``): the same request is ``CONFIG_CHANGED`` naming the
invocation the key is bound to and what its record says, nothing sent; a modified one stays
``IDEMPOTENCY_MISMATCH``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import pytest
import trio

import affidavit.engine.invocation as invocation
from affidavit.api.broker import Broker
from affidavit.config import canonical_json, load_config, snapshot
from affidavit.engine import CallControl, EngineSettings
from affidavit.protocols.actions import fingerprint, parse_action, request_fingerprint
from affidavit.statemachine import EventKind as E
from tests.http.hostile import HostileServer, Peer, Reply, Script

from .approvalkit import approval_config, verify_ok
from .helpers import as_written_before, assert_error, http_target, open_broker, write_config
from .http_rows import IDEM, LIMIT

CHARGE = {
    "target": "api",
    "method": "POST",
    "path": "/v1/charges",
    "body": '{"amount": 5}',
    "idempotency_key": "charge-1",
}
EDITED = {"timeout": {"connect": 3, "total": 5}}  # http_target's connect timeout is 2


def _server(drop_first: bool) -> tuple[Script, list[bytes]]:
    """Answers each POST 201 (the first closed unanswered when ``drop_first``); records bodies."""
    received: list[bytes] = []

    async def script(peer: Peer) -> None:
        while True:
            req = await peer.read_request()
            if req is None:
                return
            received.append(req.body or b"")
            if drop_first and len(received) == 1:
                await peer.close()
                return
            await peer.respond(Reply(201, body=b'{"id": "ch_1"}'))

    return script, received


def _targets(url: str, **extra: Any) -> dict[str, Any]:
    return {"api": http_target(url, idempotency=IDEM, **extra)}


async def _first(tmp_path: Path, url: str) -> str:
    """The charge, by a broker with the target as first configured: its invocation id."""
    async with open_broker(write_config(tmp_path, _targets(url))) as b:
        with trio.fail_after(LIMIT):
            env = await b.call(CHARGE)
    return str(env["invocation_id"])


def _accepted(b: Broker, iid: str) -> dict[str, Any]:
    return dict(next(e.attrs for e in b.events(iid) if e.kind is E.ACTION_ACCEPTED))


@pytest.mark.parametrize(
    ("drop_first", "named"),
    [
        (False, "it completed (outcome committed, retry never): fetch its result"),
        (True, "its outcome is unknown (outcome unknown, retry same_idempotency_key): reconcile"),
    ],
    ids=["committed-original", "unknown-original"],
)
async def test_the_same_request_after_a_config_edit_is_config_changed_naming_the_original(
    tmp_path: Path, token: str, drop_first: bool, named: str
) -> None:
    """The review's reproduction: the call commits (or its connection drops: unknown), the
    connect timeout is edited 2 -> 3, the identical call comes again.  CONFIG_CHANGED at
    ``targets.api``, ``evidence.idempotency.bound_to`` naming the original (a field: the
    message is not to be parsed), the message advising by what its record says; nothing sent
    again, the original as it was."""
    script, received = _server(drop_first)
    async with HostileServer.running(script) as srv:
        iid = await _first(tmp_path, srv.url)
        async with open_broker(write_config(tmp_path, _targets(srv.url, **EDITED))) as b:
            before = b.record(iid)
            with trio.fail_after(LIMIT):
                env = await b.call(CHARGE)
            assert_error(
                b,
                env,
                phase="validation",
                outcome="not_attempted",
                retry="after_correction",
                code="CONFIG_CHANGED",
            )
            assert env["error"]["field"] == "targets.api"
            assert env["evidence"]["idempotency"] == {"bound_to": iid}
            message = env["error"]["message"]
            assert f"invocation {iid} for this same request" in message, message
            assert named in message and "a new key would send the request again" in message
            assert env["invocation_id"] != iid
            assert b.record(iid) == before  # the original, as it was
            verify_ok(b)
    assert len(received) == 1  # nothing sent again


@pytest.mark.parametrize("edited", [False, True], ids=["same-config", "config-edited"])
async def test_a_modified_body_under_the_same_key_is_idempotency_mismatch(
    tmp_path: Path, token: str, edited: bool
) -> None:
    """A different request under the key stays IDEMPOTENCY_MISMATCH at ``idempotency_key``,
    whether or not the configuration changed too; its message names no invocation."""
    script, received = _server(False)
    async with HostileServer.running(script) as srv:
        iid = await _first(tmp_path, srv.url)
        later = _targets(srv.url, **(EDITED if edited else {}))
        async with open_broker(write_config(tmp_path, later)) as b:
            with trio.fail_after(LIMIT):
                env = await b.call({**CHARGE, "body": '{"amount": 6}'})
            assert_error(
                b,
                env,
                phase="validation",
                outcome="not_attempted",
                retry="after_correction",
                code="IDEMPOTENCY_MISMATCH",
            )
            assert env["error"]["field"] == "idempotency_key"
            assert iid not in json.dumps(env)
    assert received == [b'{"amount": 5}']


async def test_a_record_from_before_the_request_fingerprint_is_recognized_by_its_config_hash(
    tmp_path: Path, token: str
) -> None:
    """A record written before ``request_fingerprint`` was recorded: its fingerprint,
    recomputed with the config hash its PREFLIGHT_VALIDATED holds, says it was this request --
    CONFIG_CHANGED, as for a new record.  (A modified body still is a mismatch: above.)"""
    script, received = _server(False)
    async with HostileServer.running(script) as srv:
        with pytest.MonkeyPatch.context() as mp:
            # As such a record holds it: no request_fingerprint at all (not None).
            old = as_written_before(E.ACTION_ACCEPTED, "operation", "request_fingerprint")
            mp.setattr(invocation, "Event", old)
            iid = await _first(tmp_path, srv.url)
        async with open_broker(write_config(tmp_path, _targets(srv.url, **EDITED))) as b:
            assert "request_fingerprint" not in _accepted(b, iid)["operation"]
            with trio.fail_after(LIMIT):
                env = await b.call(CHARGE)
            assert env["error"]["code"] == "CONFIG_CHANGED", env["error"]
            assert env["evidence"]["idempotency"] == {"bound_to": iid}
            assert "it completed (outcome committed" in env["error"]["message"]
    assert len(received) == 1


async def test_the_recorded_request_fingerprint_is_keyed(tmp_path: Path, token: str) -> None:
    """What ACTION_ACCEPTED records of the request alone is keyed by the journal's key, like
    the fingerprint: a plain digest of ``{"amount": 5}`` would confirm a guessed body."""
    script, _received = _server(False)
    async with (
        HostileServer.running(script) as srv,
        open_broker(write_config(tmp_path, _targets(srv.url))) as b,
    ):
        with trio.fail_after(LIMIT):
            env = await b.call(CHARGE)
        recorded = _accepted(b, env["invocation_id"])["operation"]["request_fingerprint"]
        action, target = parse_action(CHARGE, b.config), b.config.targets["api"]
        assert recorded == request_fingerprint(action, target, b.journal.keyed_digest)
    plain = request_fingerprint(action, target, lambda _label, data: _sha256(data))
    assert recorded.startswith("hmac-sha256:") and recorded != plain


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_brokers_of_a_shared_journal_with_different_configs_name_the_original(
    tmp_path: Path, pg_url: str, token: str
) -> None:
    """Two brokers on one PostgreSQL journal, their targets differing in a timeout: the same
    call through the second is CONFIG_CHANGED naming the first's invocation, nothing resent."""
    script, received = _server(True)
    async with HostileServer.running(script) as srv:
        cfg = []
        for n, extra in (("a.toml", {}), ("b.toml", EDITED)):
            journal = {
                "url": pg_url,
                "key_file": str(tmp_path / "k"),
                "signing_key": str(tmp_path / n),
            }
            path = write_config(
                tmp_path, _targets(srv.url, **extra), journal=journal, name=f"{n}.toml"
            )
            cfg.append(load_config(path))
        async with (
            Broker.open(config=cfg[0], holder="worker-A") as a,
            Broker.open(config=cfg[1], holder="worker-B") as b,
        ):
            with trio.fail_after(LIMIT):
                first = await a.call(CHARGE)
                assert first["error"]["outcome"] == "unknown", first
                second = await b.call(CHARGE)
            assert second["error"]["code"] == "CONFIG_CHANGED", second["error"]
            assert second["evidence"]["idempotency"] == {"bound_to": first["invocation_id"]}
            assert "its outcome is unknown" in second["error"]["message"]
    assert len(received) == 1


async def test_the_same_request_bound_by_another_target_of_the_scope_is_a_mismatch_naming_nothing(
    tmp_path: Path, token: str
) -> None:
    """prod and staging declare the same scope (one remote key space).  The charge commits on
    prod under key K; the same call on staging under K is IDEMPOTENCY_MISMATCH at
    ``idempotency_key`` naming nothing -- never CONFIG_CHANGED naming prod's invocation, whose
    "fetch it" would hand staging's caller prod's response for a request staging never sent."""
    script, received = _server(False)
    async with HostileServer.running(script) as srv:
        targets = {"prod": _targets(srv.url)["api"], "staging": _targets(srv.url)["api"]}
        async with open_broker(write_config(tmp_path, targets)) as b:
            with trio.fail_after(LIMIT):
                first = await b.call({**CHARGE, "target": "prod"})
                assert first.get("error") is None, first
                env = await b.call({**CHARGE, "target": "staging"})
            assert_error(
                b,
                env,
                phase="validation",
                outcome="not_attempted",
                retry="after_correction",
                code="IDEMPOTENCY_MISMATCH",
            )
            assert env["error"]["field"] == "idempotency_key"
            assert first["invocation_id"] not in json.dumps(env)
            verify_ok(b)
    assert len(received) == 1


async def test_a_different_request_waits_for_the_binder_s_record_and_never_names_it(
    tmp_path: Path, token: str
) -> None:
    """prod binds key K and has recorded nothing yet (its broker is between the binding and its
    first event) when staging -- another target declaring the same scope, in another broker of
    the journal -- calls under K.  The records prove neither "another request" nor "the same",
    and prod's invocation is not staging's to see: the call waits for prod's record, then
    answers from it -- IDEMPOTENCY_MISMATCH naming nothing -- never IN_PROGRESS naming prod's
    invocation (its id went to staging's caller before).  prod's request is sent once."""
    script, received = _server(False)
    async with HostileServer.running(script) as srv:
        targets = {"prod": _targets(srv.url)["api"], "staging": _targets(srv.url)["api"]}
        cfg = write_config(tmp_path, targets)
        async with open_broker(cfg) as prod_broker, open_broker(cfg) as staging_broker:
            bound, go = trio.Event(), trio.Event()
            bind = prod_broker.journal.bind_idempotency

            async def bind_then_stall(*args: Any, **kwargs: Any) -> Any:
                done = await bind(*args, **kwargs)
                bound.set()
                await go.wait()  # the binder's broker, between its binding and its first event
                return done

            prod_broker.journal.bind_idempotency = bind_then_stall  # type: ignore[method-assign]
            answers: dict[str, dict[str, Any]] = {}

            async def call(name: str, b: Broker) -> None:
                answers[name] = await b.call({**CHARGE, "target": name})

            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(call, "prod", prod_broker)
                    await bound.wait()
                    nursery.start_soon(call, "staging", staging_broker)
                    await trio.sleep(0.3)
                    assert "staging" not in answers, answers  # waits for the binder's record
                    go.set()
            prod, staging = answers["prod"], answers["staging"]
            assert prod.get("error") is None, prod
            assert_error(
                staging_broker,
                staging,
                phase="validation",
                outcome="not_attempted",
                retry="after_correction",
                code="IDEMPOTENCY_MISMATCH",
            )
            assert staging["error"]["field"] == "idempotency_key"
            assert prod["invocation_id"] not in json.dumps(staging)
            verify_ok(staging_broker)
    assert len(received) == 1


async def test_a_different_request_under_a_key_whose_binder_stopped_is_a_mismatch(
    tmp_path: Path, token: str
) -> None:
    """The key is bound (to another fingerprint) and its binder stopped before it recorded
    anything.  Nothing was sent under the key (DISPATCH_STARTED is durable before a byte is
    sent, and a binder past its window is refused it), so once that window -- the target's
    total timeout plus lease_margin from the binding -- is over, the call is
    IDEMPOTENCY_MISMATCH as usual, naming nothing, with why on record; not IN_PROGRESS for
    good.  The bound invocation is closed first; nothing is sent."""
    script, received = _server(False)
    async with HostileServer.running(script) as srv:
        cfg = write_config(tmp_path, _targets(srv.url, timeout={"connect": 1, "total": 1}))
        settings = EngineSettings(lease_margin=0.1)
        async with Broker.open(config=load_config(cfg), settings=settings) as b:
            other = "sha256:" + "0" * 64  # not this call's fingerprint
            with trio.fail_after(LIMIT):
                await b.journal.bind_idempotency(
                    IDEM["scope"], "charge-1", other, "act_bound", None
                )
                start = trio.current_time()
                env = await b.call(CHARGE)
            assert trio.current_time() - start >= 1.0  # the binder's window: 1 s + 0.1 s
            assert_error(
                b,
                env,
                phase="validation",
                outcome="not_attempted",
                retry="after_correction",
                code="IDEMPOTENCY_MISMATCH",
            )
            assert env["error"]["field"] == "idempotency_key"
            assert "nothing was sent under the key" in env["error"]["message"]
            assert "act_bound" not in json.dumps(env)
            refused = next(
                e for e in b.events(env["invocation_id"]) if e.kind is E.PREFLIGHT_FAILED
            )
            gone = refused.attrs["binder_gone"]
            assert (gone["why"], gone["recorded"], gone["window"]) == (
                "window_over",
                "nothing",
                1.1,
            )
            assert gone["judged_at"] >= gone["bound_at"] + 1.1
            # The bound invocation is closed (fenced) first, naming nothing of this call: a
            # binder that resumes now is refused its first event (test_binder_fence.py).
            fenced = b.events("act_bound")
            assert [e.kind for e in fenced] == [E.ACTION_ACCEPTED, E.PREFLIGHT_FAILED]
            assert env["invocation_id"] not in json.dumps([e.attrs for e in fenced])
            verify_ok(b)
    assert received == []


@pytest.mark.parametrize(
    ("stop", "code"),
    [("withdraw", "CALLER_CANCELLED"), ("stop", "BROKER_SHUTDOWN")],
    ids=["withdrawn", "stopped"],
)
async def test_a_withdrawn_call_stops_waiting_for_the_binder_s_record(
    tmp_path: Path, token: str, stop: str, code: str
) -> None:
    """The wait for a binder's record ends when the call's caller goes away (the daemon's
    withdrawal on a hang-up, its stop at the end of a shutdown's grace), not at the end of the
    binder's window (30 s here): the call ends with its own cause, not_attempted, nothing sent
    -- never answered IN_PROGRESS naming the bound invocation, which may be another target's
    (an embedded caller reads this answer; MCP's stop may hand it to a client)."""
    script, received = _server(False)
    async with HostileServer.running(script) as srv:
        cfg = write_config(tmp_path, _targets(srv.url, timeout={"connect": 1, "total": 30}))
        async with open_broker(cfg) as b:
            other = "sha256:" + "0" * 64  # not this call's fingerprint
            await b.journal.bind_idempotency(IDEM["scope"], "charge-1", other, "act_bound", None)
            control = CallControl()
            answers: list[dict[str, Any]] = []

            async def call() -> None:
                answers.append(await b.call(CHARGE, control=control))

            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(call)
                    await trio.sleep(0.3)
                    assert answers == []  # waiting for the binder's record
                    if stop == "withdraw":
                        assert control.withdraw()
                    else:
                        control.stop()
            env = answers[0]
            assert_error(
                b,
                env,
                phase="connection_setup",
                outcome="not_attempted",
                retry="backoff",
                code=code,
            )
            assert "act_bound" not in json.dumps(env)
            assert b.events("act_bound") == []  # nothing written into the bound invocation
    assert received == []


async def _rejected_then_edited(tmp_path: Path, url: str) -> Path:
    async with open_broker(write_config(tmp_path, _targets(url))) as b:
        with trio.fail_after(LIMIT):
            env = await b.call({**CHARGE, "path": "/v1/refused"})
        assert env["error"]["outcome"] == "rejected", env
    return write_config(tmp_path, _targets(url, **EDITED))


async def _unsent_then_edited(tmp_path: Path, url: str) -> Path:
    async with open_broker(write_config(tmp_path, _targets(url, credential="env:NO_SUCH"))) as b:
        with trio.fail_after(LIMIT):
            env = await b.call({**CHARGE, "path": "/v1/refused"})
        assert env["error"]["code"] == "CREDENTIAL_MISSING", env
    return write_config(tmp_path, _targets(url))


async def _pending_then_edited(tmp_path: Path, url: str) -> Path:
    target = {"idempotency": IDEM}
    async with open_broker(approval_config(tmp_path, url, **target)) as b:
        with trio.fail_after(LIMIT):
            env = await b.call({**CHARGE, "path": "/v1/refused"})
        assert env["error"]["code"] == "APPROVAL_PENDING", env
    return approval_config(tmp_path, url, **target, **EDITED)


@pytest.mark.parametrize(
    ("original", "advice"),
    [
        (_rejected_then_edited, "the remote rejected it (outcome rejected"),
        (_unsent_then_edited, "it was never sent (outcome not_attempted"),
        (_pending_then_edited, "it has not finished (awaiting_approval): fetch its result later"),
    ],
    ids=["rejected", "never-sent", "pending"],
)
async def test_the_advice_follows_what_the_original_s_record_says(
    tmp_path: Path, token: str, original: Any, advice: str
) -> None:
    """CONFIG_CHANGED advises by the original's record: a new key only where its record says
    nothing took effect (rejected, never sent); "fetch it later" while it has not finished."""

    async def script(peer: Peer) -> None:
        while await peer.read_request() is not None:
            await peer.respond(Reply(422, body=b'{"error": "refused"}'))

    async with HostileServer.running(script) as srv:
        cfg = await original(tmp_path, srv.url)
        sent = len(srv.requests)
        async with open_broker(cfg) as b:
            with trio.fail_after(LIMIT):
                env = await b.call({**CHARGE, "path": "/v1/refused"})
            assert env["error"]["code"] == "CONFIG_CHANGED", env
            assert advice in env["error"]["message"], env["error"]["message"]
            assert "bound_to" in env["evidence"]["idempotency"]
        assert len(srv.requests) == sent


def _keyed(label: str, data: bytes) -> str:
    return hmac.new(b"journal-key", label.encode() + b"\0" + data, hashlib.sha256).hexdigest()


_BOX = {"kind": "ssh", "host": "127.0.0.1", "user": "bob", "credential": "env:T"}
_BOX["host_key"] = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEB"
)
_RUN = {"target": "box", "command": "deploy r7", "stdin": "a", "idempotency_key": "r7"}


@pytest.mark.parametrize(
    ("target_edit", "call_edit", "same"),
    [
        ({"timeout": {"connect": 3, "total": 5}}, {}, True),
        ({"credential": "env:OTHER"}, {}, True),
        ({}, {"body": '{"amount": 6}'}, False),
        ({}, {"path": "/v1/refunds"}, False),
        ({}, {"headers": {"X-Trace": "1"}}, False),
        ({"url": "http://127.0.0.1:9/v2"}, {}, False),
        ({"kind": "ssh", "timeout": {"connect": 3, "total": 5}}, {}, True),
        ({"kind": "ssh"}, {"stdin": "b"}, False),
        ({"kind": "ssh"}, {"command": "deploy r8"}, False),
    ],
    ids=[
        "timeout",
        "credential",
        "body",
        "path",
        "header",
        "base-path",
        "ssh-timeout",
        "ssh-stdin",
        "ssh-command",
    ],
)
def test_the_recorded_request_fingerprint_and_the_recomputed_fingerprint_agree(
    tmp_path: Path, target_edit: dict[str, Any], call_edit: dict[str, Any], same: bool
) -> None:
    """Two ways to tell the same request under an edited target: the recorded
    ``request_fingerprint``, and the fingerprint recomputed with the config hash the record's
    PREFLIGHT_VALIDATED holds (how a record without the field is judged).  They give one
    verdict, so the field is kept as a shortcut that needs no PREFLIGHT_VALIDATED (a taker
    that stopped between its ACTION_ACCEPTED and that event), not a second rule."""
    ssh = target_edit.get("kind") == "ssh"
    first_call = _RUN if ssh else CHARGE
    first_target = dict(_BOX) if ssh else _targets("http://127.0.0.1:9")["api"]
    name = "box" if ssh else "api"
    later = {**first_target, **{k: v for k, v in target_edit.items() if k != "kind"}}
    (a1, t1), (a2, t2) = (
        (parse_action(call, cfg), cfg.targets[name])
        for call, cfg in (
            (first_call, load_config(write_config(tmp_path, {name: first_target}))),
            ({**first_call, **call_edit}, load_config(write_config(tmp_path, {name: later}))),
        )
    )
    h1 = "hmac-sha256:" + _keyed("config-snapshot", canonical_json(snapshot(t1)))
    by_field = request_fingerprint(a2, t2, _keyed) == request_fingerprint(a1, t1, _keyed)
    by_recompute = fingerprint(a2, t2, h1) == fingerprint(a1, t1, h1)
    assert by_field is by_recompute is same
