"""The config hash and the request fingerprint a caller reads back do not confirm a guessed
credential reference.

``config_hash`` (PREFLIGHT_VALIDATED, APPROVAL_REQUESTED) and ``operation.fingerprint``
(ACTION_ACCEPTED) cover the target's snapshot, which holds the credential *reference*
(``env:NAME``, ``file:/path``) the caller is not told; the rest of a simple HTTP target's
snapshot is defaults and what the catalog shows.  As a plain SHA-256 a caller could try guesses
offline until one matched the recorded hash.  Both are built on a digest keyed by the journal's
key instead -- the same on every broker of a shared journal -- and a record written with the
plain hash before the upgrade is refused honestly, never matched: nothing is sent.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import affidavit.engine.approval as approval
import affidavit.engine.invocation as invocation
from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.docgen.contract import member_docs
from affidavit.engine.snapshot import ConfigSnapshot
from affidavit.protocols.actions import fingerprint, legacy_fingerprint, parse_action
from affidavit.schema import snapshot_hash
from affidavit.statemachine import EventKind as E
from tests.http.hostile import HostileServer, Peer, Reply, Script, scripts

from .approvalkit import OPS, approval_config, verify_ok
from .helpers import TOKEN_ENV, assert_error, http_target, open_broker, write_config
from .http_rows import IDEM

LIMIT = 20
CHARGE = {"target": "api", "method": "POST", "path": "/v1/x", "idempotency_key": "charge"}


def _attrs(broker: Broker, iid: str, kind: E) -> dict[str, Any]:
    return next(dict(e.attrs) for e in broker.events(iid) if e.kind is kind)


def _dropping_first() -> tuple[Script, list[str]]:
    """The first request closed unanswered (unknown outcome), each later one answered 201."""
    received: list[str] = []

    async def script(peer: Peer) -> None:
        while True:
            req = await peer.read_request()
            if req is None:
                return
            received.append(req.target)
            if peer.index == 0:
                await peer.close()
                return
            await peer.respond(Reply(201, body=b'{"ok": true}'))

    return script, received


@asynccontextmanager
async def _as_before_the_upgrade() -> AsyncIterator[None]:
    """The engine as it hashed before the config hash was keyed: the plain ``snapshot_hash``
    as ``config_hash`` (and in the dispatch gate's re-check), the v1 request fingerprint built
    on it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ConfigSnapshot, "hash", lambda _self, target: snapshot_hash(target))
        mp.setattr(ConfigSnapshot, "hash_of", lambda _self, target: snapshot_hash(target))
        for module in (invocation, approval):
            mp.setattr(module, "fingerprint", lambda a, t, _h: legacy_fingerprint(a, t))
        yield


async def test_the_config_hash_and_fingerprint_do_not_confirm_a_guessed_reference(
    tmp_path: Path, token: str
) -> None:
    """The reviewer's demonstration: the snapshot with the right reference guessed, hashed
    plainly, is neither the recorded ``config_hash`` nor reproduces the fingerprint."""
    async with HostileServer.running(scripts.serve(Reply(201))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, idempotency=IDEM)})
        async with open_broker(cfg) as b:
            with trio.fail_after(LIMIT):
                env = await b.call(CHARGE)
            assert env.get("error") is None, env
            iid = env["invocation_id"]
            recorded = _attrs(b, iid, E.PREFLIGHT_VALIDATED)["config_hash"]
            recorded_fp = _attrs(b, iid, E.ACTION_ACCEPTED)["operation"]["fingerprint"]
            target = b.config.targets["api"]
            action = parse_action(CHARGE, b.config)
            engine_hash = b._engine.snapshot.hash_of
            # The binding still holds: another reference is another hash.
            other = dataclasses.replace(target, credential="env:OTHER_TOKEN")
            assert engine_hash(target) == recorded
            assert engine_hash(other) != recorded
    assert recorded.startswith("hmac-sha256:")
    for guess in (f"env:{TOKEN_ENV}", "env:OTHER_TOKEN"):
        guessed = dataclasses.replace(target, credential=guess)
        plain = snapshot_hash(guessed)
        assert plain != recorded
        assert recorded_fp not in (
            legacy_fingerprint(action, guessed),
            fingerprint(action, guessed, plain),
        )
    assert len(srv.requests) == 1


async def test_a_same_key_retry_of_a_record_bound_before_the_upgrade_is_config_changed(
    tmp_path: Path, token: str
) -> None:
    """A key bound with the plain hash names the same request, but its binding cannot be
    matched with the keyed one: CONFIG_CHANGED (not IDEMPOTENCY_MISMATCH, not a resend)."""
    script, received = _dropping_first()
    async with HostileServer.running(script) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, idempotency=IDEM)})
        async with _as_before_the_upgrade(), open_broker(cfg) as b:
            with trio.fail_after(LIMIT):
                first = await b.call(CHARGE)
            assert first["error"]["retry"] == "same_idempotency_key", first
            iid = first["invocation_id"]
            old_fp = _attrs(b, iid, E.ACTION_ACCEPTED)["operation"]["fingerprint"]
            target = b.config.targets["api"]
            assert old_fp == legacy_fingerprint(parse_action(CHARGE, b.config), target)
            before = b.record(iid)
        async with open_broker(cfg) as b:
            with trio.fail_after(LIMIT):
                second = await b.call(CHARGE)
            assert_error(
                b,
                second,
                phase="validation",
                outcome="not_attempted",
                retry="after_correction",
                code="CONFIG_CHANGED",
            )
            assert second["error"]["field"] == "targets.api"
            assert second["invocation_id"] != iid
            # The original named as a field; its outcome unknown, the advice is to reconcile
            # it -- never "start a new one with a new key" (a duplicate if it took effect).
            assert second["evidence"]["idempotency"] == {"bound_to": iid}
            message = second["error"]["message"]
            assert "by an earlier broker version" in message and "reconcile it first" in message
            assert "a new key would send the request again" in message, message
            after = b.record(iid)  # the earlier invocation is left as it was
            assert before is not None and after is not None and after.state == before.state
            verify_ok(b)
    assert received == ["/v1/x"]  # the first attempt only: nothing sent again


async def test_an_approval_granted_before_the_upgrade_is_approval_stale(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        cfg = approval_config(tmp_path, srv.url)
        action = {"target": "api", "method": "POST", "path": "/v1/charges", "body": "{}"}
        async with _as_before_the_upgrade(), open_broker(cfg) as b:
            env = await b.call(action)
            assert env["error"]["code"] == "APPROVAL_PENDING"
            iid = env["invocation_id"]
            assert _attrs(b, iid, E.APPROVAL_REQUESTED)["config_hash"].startswith("sha256:")
            await b.approve(iid, operator=OPS)
        async with open_broker(cfg) as b:
            with trio.fail_after(LIMIT):
                await b.dispatch_approved(iid)
            fetched = await b.fetch_result(iid)
            assert fetched is not None
            assert_error(
                b,
                fetched,
                phase="validation",
                outcome="not_attempted",
                retry="after_correction",
                code="APPROVAL_STALE",
            )
            assert E.DISPATCH_STARTED not in [e.kind for e in b.events(iid)]
            verify_ok(b)
    assert srv.requests == []


async def test_two_brokers_of_a_shared_journal_hash_alike_and_retry_each_others_keys(
    tmp_path: Path, pg_url: str, token: str
) -> None:
    """The keyed hash is the journal's, not a process's: a same-key retry on the other broker
    of a shared PostgreSQL journal matches the fingerprint the first bound, and is sent."""
    script, received = _dropping_first()
    async with HostileServer.running(script) as srv:
        target = http_target(srv.url, idempotency={**IDEM, "retention": "1d"})
        cfg = []
        for n in "ab":
            journal = {
                "url": pg_url,
                "key_file": str(tmp_path / "k"),
                "signing_key": str(tmp_path / n),
            }
            cfg.append(
                load_config(
                    write_config(tmp_path, {"api": target}, journal=journal, name=f"{n}.toml")
                )
            )
        async with (
            Broker.open(config=cfg[0], holder="worker-A") as a,
            Broker.open(config=cfg[1], holder="worker-B") as b,
        ):
            ta, tb = a.config.targets["api"], b.config.targets["api"]
            assert a._engine.snapshot.hash(ta) == b._engine.snapshot.hash(tb)
            with trio.fail_after(LIMIT):
                first = await a.call(CHARGE)
                assert first["error"]["retry"] == "same_idempotency_key", first
                second = await b.call(CHARGE)
            assert second.get("error") is None, second
            assert second["invocation_id"] == first["invocation_id"]
    assert received == ["/v1/x", "/v1/x"]


async def test_approval_requested_carries_exactly_the_attrs_its_contract_names(
    tmp_path: Path, token: str
) -> None:
    """docs/contract.md (generated from ``EventKind``'s docs) lists the attrs a caller reads
    back; it named the credential reference among them after the reference had left them for
    the sealed payload -- a contract telling a caller it would read what it must never."""
    doc = member_docs(E)[E.APPROVAL_REQUESTED.name]
    listed = re.sub(r"\([^)]*\)", "", doc.split("attrs:", 1)[1]).split(";", 1)[0]
    documented = {part.strip().split(" ", 1)[0] for part in listed.split(",")}
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        cfg = approval_config(tmp_path, srv.url)
        action = {"target": "api", "method": "POST", "path": "/v1/charges", "body": "{}"}
        async with open_broker(cfg) as b:
            env = await b.call(action)
            assert env["error"]["code"] == "APPROVAL_PENDING", env
            attrs = _attrs(b, env["invocation_id"], E.APPROVAL_REQUESTED)
    assert "credential" not in attrs
    assert documented == set(attrs), (documented, sorted(attrs))
    assert srv.requests == []


async def test_an_edited_config_is_parsed_once_per_edit_not_once_per_dispatch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an edit that leaves the target as bound (another target added), every dispatch
    gate asks ``changed``: the file is parsed and the target hashed once for that edit; a second
    edit that changes the target, and one that breaks the file, are each still seen."""
    import os

    import affidavit.engine.snapshot as snapshot_module

    url = "http://127.0.0.1:9/"
    path = write_config(tmp_path, {"api": http_target(url)})
    snap = ConfigSnapshot(load_config(path), lambda purpose, data: f"{purpose}:{data.hex()}")
    bound = snap.hash(snap.config.targets["api"])
    reads: list[Path] = []
    real_parse = snapshot_module.parse_config

    def counting_parse(raw: bytes, p: Path) -> Any:
        reads.append(p)
        return real_parse(raw, p)

    monkeypatch.setattr(snapshot_module, "parse_config", counting_parse)

    def edit(targets: dict[str, Any], step: int) -> None:
        write_config(tmp_path, targets)
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + step * 1_000_000_000))

    edit({"api": http_target(url), "other": http_target(url)}, 1)
    assert [await snap.changed("api", bound) for _ in range(5)] == [False] * 5
    assert len(reads) == 1
    edit({"api": http_target(url, methods=["GET"])}, 2)
    assert [await snap.changed("api", bound) for _ in range(3)] == [True] * 3
    assert len(reads) == 2
    path.write_text("[not toml")
    edit_st = os.stat(path)
    os.utime(path, ns=(edit_st.st_atime_ns, edit_st.st_mtime_ns + 3_000_000_000))
    assert await snap.changed("api", bound) and await snap.changed("api", bound)
    assert len(reads) == 3
