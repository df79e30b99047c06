"""A reconciliation query or an operation's poll speaks for a record only if it reaches the remote
account the record's dispatch reached.

Seed, "Idempotency is defined by the remote contract": "Query the remote state by a stable
identifier, reconcile it, and decide whether a new action is needed."  The query runs against the
target as configured *now*.  Re-pointed at another origin (or given another credential, or
another idempotency scope), it observes another account: a 404 there would settle as
``rejected`` -- hint ``after_correction``, "send it again" -- a charge the first origin holds.
So PREFLIGHT_VALIDATED records ``account_hash`` and the query is refused (``CONFIG_CHANGED``,
nothing sent) when the target's account differs; any other change (a timeout, the ``reconcile``
setting itself) leaves the query as it was.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme

import affidavit.engine.invocation as invocation
import affidavit.engine.snapshot as engine_snapshot
from affidavit.approvals import OperatorError
from affidavit.config import account, canonical_json, load_config, snapshot
from affidavit.engine import OperationError
from affidavit.statemachine import CODES, Code, Event, ImpossibleEvent
from affidavit.statemachine import EventKind as E
from tests.http.hostile import HostileServer, Received, Reply, make_tls, scripts

from .approvalkit import PaymentsApi, reconcile_target, verify_ok
from .helpers import (
    FakeResolver,
    as_written_before,
    custom_resolver,
    event_kinds,
    http_target,
    open_broker,
    write_config,
)
from .http_rows import IDEM, LIMIT

CHARGE = {
    "target": "api",
    "method": "POST",
    "path": "/v1/charges",
    "body": json.dumps({"drop": True}),
    "idempotency_key": "pay-1",
}
CHARGES = reconcile_target("http://127.0.0.1:9")["api"]["idempotency"]


async def _unknown_at(tmp_path: Path, targets: dict[str, Any]) -> str:
    """A charge the origin applied and dropped unanswered: unknown, by a broker of its own."""
    cfg = write_config(tmp_path, targets)
    async with open_broker(cfg) as b:
        with trio.fail_after(LIMIT):
            env = await b.call(CHARGE)
        assert env["error"]["outcome"] == "unknown", env
        iid = str(env["invocation_id"])
        validated = next(e for e in b.events(iid) if e.kind is E.PREFLIGHT_VALIDATED)
        assert "account_hash" in validated.attrs
    return iid


def _moved_origin(a: HostileServer, b: HostileServer) -> dict[str, Any]:
    return reconcile_target(b.url)


def _other_credential(a: HostileServer, b: HostileServer) -> dict[str, Any]:
    return reconcile_target(a.url, credential="env:OTHER_TOKEN")


def _other_scope(a: HostileServer, b: HostileServer) -> dict[str, Any]:
    targets = reconcile_target(a.url)
    targets["api"]["idempotency"] = {**CHARGES, "scope": "refunds"}
    return targets


def _other_base_path(a: HostileServer, b: HostileServer) -> dict[str, Any]:
    # The tenant in the base path (Twilio's /Accounts/AC..., Jira's /ex/jira/<cloudId>).
    return reconcile_target(a.url + "/accounts/acctB")


@pytest.mark.parametrize(
    "changed",
    [_moved_origin, _other_credential, _other_scope, _other_base_path],
    ids=lambda f: f.__name__[1:],
)
async def test_a_query_of_a_target_that_reaches_another_account_is_refused_unsent(
    tmp_path: Path,
    token: str,
    monkeypatch: pytest.MonkeyPatch,
    changed: Callable[[HostileServer, HostileServer], dict[str, Any]],
) -> None:
    """The review's reproduction: origin A applied the charge and dropped the connection; the
    target now names origin B (which never saw it: 404), another credential or another scope.
    The query is refused CONFIG_CHANGED at ``targets.api``; nothing reaches either origin and
    the invocation stays unknown -- never ``reconciled_rejected`` while A holds the charge."""
    monkeypatch.setenv("OTHER_TOKEN", "tok-other")
    a_api, b_api = PaymentsApi(), PaymentsApi()
    async with HostileServer.running(a_api.script) as a, HostileServer.running(b_api.script) as b:
        iid = await _unknown_at(tmp_path, reconcile_target(a.url))
        assert a_api.applied == ["pay-1"]
        cfg = write_config(tmp_path, changed(a, b))
        async with open_broker(cfg) as broker:
            with pytest.raises(OperatorError) as refused, trio.fail_after(LIMIT):
                await broker.reconcile(iid, query=True)
            assert (refused.value.code, refused.value.field) == ("CONFIG_CHANGED", "targets.api")
            assert "nothing was queried" in refused.value.message
            rec = broker.record(iid)
            assert rec is not None and rec.outcome.value == "unknown"
            assert E.RECONCILED not in event_kinds(broker, iid)
            assert E.RECONCILE_INCONCLUSIVE not in event_kinds(broker, iid)
            verify_ok(broker)
    assert [r.method for r in a.requests] == ["POST"]
    assert b.requests == []


async def test_a_record_binds_the_account_of_its_one_preflight_validated(
    tmp_path: Path, token: str
) -> None:
    """The account a query must reach is the one PREFLIGHT_VALIDATED recorded before the
    dispatch, and a record holds one: the lifecycle admits it only from ``accepted``, so the
    journal refuses a second -- here one binding the account origin B is now (what would let
    the query reach B and settle ``rejected`` on its 404 while A holds the charge).  Nothing is
    written; the query is refused CONFIG_CHANGED and neither origin is asked.  (The engine
    writes one per record; ``first_validated`` reads the first, the last being the same.)"""
    a_api, b_api = PaymentsApi(), PaymentsApi()
    async with HostileServer.running(a_api.script) as a, HostileServer.running(b_api.script) as b:
        iid = await _unknown_at(tmp_path, reconcile_target(a.url))
        async with open_broker(write_config(tmp_path, _moved_origin(a, b))) as broker:
            now = broker.config.targets["api"]
            snapshot_now = broker._engine.snapshot
            rebound = {
                "config_hash": snapshot_now.hash(now),
                "account_hash": await snapshot_now.account_hash_async(now),
            }
            with pytest.raises(ImpossibleEvent, match=r"PREFLIGHT_VALIDATED \(seq \d+\) is impos"):
                await broker.journal.append(Event(E.PREFLIGHT_VALIDATED, iid, rebound))
            kinds = event_kinds(broker, iid)
            assert kinds.count(E.PREFLIGHT_VALIDATED) == 1, kinds
            with pytest.raises(OperatorError) as refused, trio.fail_after(LIMIT):
                await broker.reconcile(iid, query=True)
            assert (refused.value.code, refused.value.field) == ("CONFIG_CHANGED", "targets.api")
            verify_ok(broker)
    assert [r.method for r in a.requests] == ["POST"]
    assert b.requests == []


@pytest.mark.parametrize(
    "later",
    [
        {},
        {"timeout": {"connect": 3, "total": 5}},
    ],
    ids=["unchanged", "timeout-changed"],
)
async def test_a_query_of_a_target_changed_only_elsewhere_still_reconciles(
    tmp_path: Path, token: str, later: dict[str, Any]
) -> None:
    """The account is what must match, not the whole snapshot: the charge was sent before the
    ``reconcile`` setting existed (its config hash differs from the target's now) and, in one
    row, with another connect timeout -- the query still runs, and settles it committed."""
    api = PaymentsApi()
    async with HostileServer.running(api.script) as srv:
        first = http_target(srv.url, idempotency=CHARGES)
        iid = await _unknown_at(tmp_path, {"api": first})
        cfg = write_config(tmp_path, reconcile_target(srv.url, **later))
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                answer = await broker.reconcile(iid, query=True)
            assert answer["reconciled"] is True, answer
            assert answer["envelope"]["evidence"]["state"] == "reconciled_committed"
            verify_ok(broker)
    assert [r.method for r in srv.requests] == ["POST", "GET"]


@pytest.mark.parametrize(
    ("later", "reconciled"),
    [({}, True), ({"timeout": {"connect": 3, "total": 5}}, False)],
    ids=["unchanged-reconciles", "changed-is-refused"],
)
async def test_a_record_from_before_the_account_was_recorded_is_judged_by_its_whole_snapshot(
    tmp_path: Path, token: str, later: dict[str, Any], reconciled: bool
) -> None:
    """An older record holds no ``account_hash``: only its ``config_hash`` says what it was sent
    to, and that covers the account only while the whole snapshot is the same.  Unchanged, the
    query runs; changed at all, it is refused -- nothing says the account did not change."""
    api = PaymentsApi()
    async with HostileServer.running(api.script) as srv:
        with pytest.MonkeyPatch.context() as mp:
            # As such a record holds it: no account_hash at all (not None).
            mp.setattr(
                invocation, "Event", as_written_before(E.PREFLIGHT_VALIDATED, "account_hash")
            )
            cfg = write_config(tmp_path, reconcile_target(srv.url))
            async with open_broker(cfg) as b:
                with trio.fail_after(LIMIT):
                    env = await b.call(CHARGE)
                iid = env["invocation_id"]
                validated = next(e for e in b.events(iid) if e.kind is E.PREFLIGHT_VALIDATED)
                assert "account_hash" not in validated.attrs
        cfg = write_config(tmp_path, reconcile_target(srv.url, **later))
        async with open_broker(cfg) as broker:
            if reconciled:
                with trio.fail_after(LIMIT):
                    answer = await broker.reconcile(iid, query=True)
                assert answer["envelope"]["evidence"]["state"] == "reconciled_committed"
            else:
                with pytest.raises(OperatorError) as refused:
                    await broker.reconcile(iid, query=True)
                assert refused.value.code == "CONFIG_CHANGED"
                assert "written before the account was recorded" in refused.value.message
    assert [r.method for r in srv.requests] == ["POST", "GET"] if reconciled else ["POST"]


def _jobs(url: str, **overrides: Any) -> dict[str, Any]:
    ops = {"status": "json:/state", "succeeded": ["done"], "failed": ["error"]}
    return {"jobs": http_target(url + "/v1", operations=ops, idempotency=IDEM, **overrides)}


def _job_api(req: Received) -> Reply:
    if req.method == "POST":
        return Reply(202, headers=[("Location", "/v1/jobs/j1")], body=b'{"id":"j1"}')
    return Reply(200, body=b'{"state": "done"}')


@pytest.mark.parametrize(
    ("moved", "polled"), [(True, False), (False, True)], ids=["moved-origin", "timeout-changed"]
)
async def test_a_poll_of_a_target_that_reaches_another_account_is_refused_unsent(
    tmp_path: Path, token: str, moved: bool, polled: bool
) -> None:
    """The poll path has the same hazard: a job submitted to origin A, its status read from
    origin B.  Refused (OPERATION_ERROR at ``targets.jobs``), nothing sent; a target changed
    only in its timeout is polled as before."""
    async with (
        HostileServer.running(scripts.serve(_job_api)) as a,
        HostileServer.running(scripts.serve(_job_api)) as b,
    ):
        async with open_broker(write_config(tmp_path, _jobs(a.url))) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(
                    {"target": "jobs", "method": "POST", "path": "/jobs", "body": "{}"}
                )
            op_id = env["operation"]["id"]
        later = _jobs(b.url) if moved else _jobs(a.url, timeout={"connect": 3, "total": 5})
        async with open_broker(write_config(tmp_path, later)) as broker:
            if polled:
                with trio.fail_after(LIMIT):
                    answer = await broker.poll_operation(op_id)
                assert answer["operation"]["state"] == "succeeded"
            else:
                with pytest.raises(OperationError) as refused:
                    await broker.poll_operation(op_id)
                assert refused.value.field == "targets.jobs"
                assert "nothing was polled" in str(refused.value)
                [op] = broker.operations()
                assert (op["id"], op["state"]) == (op_id, "pending")
    assert [r.method for r in a.requests] == (["POST", "GET"] if polled else ["POST"])
    assert b.requests == []


_PIN = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEB"


@pytest.mark.parametrize(
    ("change", "same"),
    [
        ({"host": "127.0.0.2"}, False),
        ({"port": 2222}, False),
        ({"user": "carol"}, False),
        ({"credential": "env:OTHER"}, False),
        ({"host_key": _PIN.replace("AEBAQEB", "AEBAQEC")}, False),
        ({"timeout": {"connect": 3, "total": 10}}, True),
        ({"max_result": 4096}, True),
    ],
    ids=["host", "port", "user", "credential", "host_key", "timeout", "max_result"],
)
def test_an_ssh_targets_account_is_its_host_port_user_credential_and_pinned_keys(
    tmp_path: Path, change: dict[str, Any], same: bool
) -> None:
    """SSH's account: which host, port and user the command runs as, with which credential,
    and which host keys it trusts to be that host (another pin set may be another machine)."""
    box = {"kind": "ssh", "host": "127.0.0.1", "user": "bob", "credential": "env:T"}
    box |= {"host_key": _PIN}
    before = load_config(write_config(tmp_path, {"box": box})).targets["box"]
    after = load_config(write_config(tmp_path, {"box": box | change})).targets["box"]
    assert snapshot(before) != snapshot(after)
    assert (account(before) == account(after)) is same


def _https(tmp_path: Path, url: str = "https://127.0.0.1:8443", **extra: Any) -> Any:
    api = http_target(url, **extra)
    return load_config(write_config(tmp_path, {"api": api})).targets["api"]


def test_an_http_targets_account_covers_whom_it_trusts_to_answer(tmp_path: Path) -> None:
    """What decides who answers for the account is in it: the CA bundle's content (edited in
    place under the same path, it trusts other peers), and the proxy -- a trusted forward
    proxy's 2xx counts as the origin's.  A timeout is not."""
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    before = account(_https(tmp_path, ca_file=str(ca)))
    assert account(_https(tmp_path, ca_file=str(ca), timeout={"connect": 3, "total": 9})) == (
        before
    )
    ca.write_text("-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----\n")
    assert account(_https(tmp_path, ca_file=str(ca))) != before  # same path, other content
    ca.unlink()
    unreadable = dataclasses.replace(_https(tmp_path), ca_file=ca)
    assert account(unreadable) != account(unreadable)  # proves nothing: never the same
    plain = {"url": "http://127.0.0.1:8080", "trust_forward_proxy": True}
    via_a = account(_https(tmp_path, **plain, proxy="http://127.0.0.1:3128"))
    via_b = account(_https(tmp_path, **plain, proxy="http://127.0.0.1:3129"))
    assert via_a != via_b


async def test_the_recorded_account_hash_is_keyed(tmp_path: Path, token: str) -> None:
    """The account hash is keyed by the journal's key, like the config hash: a plain SHA-256 of
    the account (the credential reference among it) would confirm a guessed reference."""
    api = PaymentsApi()
    async with (
        HostileServer.running(api.script) as srv,
        open_broker(write_config(tmp_path, reconcile_target(srv.url))) as b,
    ):
        with trio.fail_after(LIMIT):
            env = await b.call(CHARGE)
        iid = env["invocation_id"]
        validated = next(e for e in b.events(iid) if e.kind is E.PREFLIGHT_VALIDATED)
        target = b.config.targets["api"]
        recorded = validated.attrs["account_hash"]
        assert recorded == b._engine.snapshot.account_hash(target)
    plain = hashlib.sha256(canonical_json(account(target))).hexdigest()
    assert recorded.startswith("hmac-sha256:") and plain not in recorded


@pytest.mark.parametrize("settled", [False, True], ids=["fresh_file", "settled_file"])
async def test_a_ca_file_edited_in_place_is_recorded_as_the_account_it_trusts(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, settled: bool
) -> None:
    """The driver trusts a CA file as it holds it at the handshake (adapters/http/trust.py), so
    the account a call records is the file's content at that call, not at the target's first:
    edited in place under one config, the next call records another ``account_hash`` -- and
    its dispatch the digest of the bytes TLS verified with (``peer.ca_sha256``).  Whether the
    file's stat vouched for the first read (``settled``: as if its ctime lay 2 s back) or not."""
    if settled:
        monkeypatch.setattr(engine_snapshot, "SETTLED_NS", -(10**18))
    tls = make_tls(tmp_path)
    ca = Path(tls.ca_file)
    get = {"target": "api", "method": "GET", "path": "/x"}
    async with (
        HostileServer.running(scripts.serve(Reply(200)), tls=tls.good) as srv,
        open_broker(write_config(tmp_path, {"api": http_target(srv.url, ca_file=str(ca))})) as b,
    ):
        seen = []
        for _ in range(2):
            digest = "sha256:" + hashlib.sha256(ca.read_bytes()).hexdigest()
            with trio.fail_after(LIMIT):
                env = await b.call(get)
            events = b.events(env["invocation_id"])
            validated = next(e for e in events if e.kind is E.PREFLIGHT_VALIDATED)
            started = next(e for e in events if e.kind is E.DISPATCH_STARTED)
            assert started.attrs["peer"]["ca_sha256"] == digest
            seen.append(validated.attrs["account_hash"])
            # the same CA, and one more beside it: the server still verifies, the content moved
            ca.write_bytes(ca.read_bytes() + trustme.CA().cert_pem.bytes())
    assert seen[0] != seen[1]


async def test_a_ca_file_edited_between_validation_and_the_handshake_refuses_the_call(
    tmp_path: Path, token: str
) -> None:
    """What is recorded is what is used: the CA file replaced after PREFLIGHT_VALIDATED recorded
    the account of its old content (here: while the origin's name is looked up) is not trusted
    at the handshake -- even though its new content vouches for the server -- the call refused
    CONFIG_CHANGED naming ``ca_file`` (no handshake was made: not a certificate the peer got
    wrong), not attempted, nothing sent.  The next call records and uses the new content."""
    old, new = trustme.CA(), trustme.CA()
    ca = tmp_path / "ca.pem"
    old.cert_pem.write_to_path(str(ca))

    async def replace(name: str) -> None:
        new.cert_pem.write_to_path(str(ca))

    get = {"target": "api", "method": "GET", "path": "/x"}
    async with HostileServer.running(
        scripts.serve(Reply(200)), tls=new.issue_cert("api.test")
    ) as srv:
        url = f"https://api.test:{srv.port}"
        cfg = write_config(tmp_path, {"api": http_target(url, ca_file=str(ca))})
        resolver = FakeResolver({"api.test": "127.0.0.1"}, on_lookup=replace)
        with custom_resolver(resolver):
            async with open_broker(cfg) as b:
                with trio.fail_after(LIMIT):
                    refused = await b.call(get)
                refused_rows = b.events(refused["invocation_id"])
                assert srv.requests == []
                resolver.on_lookup = None
                with trio.fail_after(LIMIT):
                    done = await b.call(get)
                events = b.events(done["invocation_id"])
    error = refused["error"]
    assert error["code"] == "CONFIG_CHANGED", refused
    assert (error["phase"], error["outcome"]) == ("validation", "not_attempted")
    assert error["retry"] == CODES[Code.CONFIG_CHANGED].retry.value
    assert error["message"] == CODES[Code.CONFIG_CHANGED].meaning
    assert error["field"] == "targets.api.ca_file"
    assert refused["evidence"]["dispatch_started"] is False
    # Stopped at the CA file, before the TCP connect: never at a handshake not made.
    assert refused["evidence"]["http"]["stage"] == "ca_file", refused
    [observed] = [e for e in refused_rows if e.kind is E.PROTOCOL_OBSERVED]
    assert observed.attrs["facts"]["stage"] == "ca_file", refused_rows
    assert "tls_handshake" not in json.dumps([e.attrs for e in refused_rows])
    assert "error" not in done, done
    started = next(e for e in events if e.kind is E.DISPATCH_STARTED)
    assert (
        started.attrs["peer"]["ca_sha256"]
        == "sha256:" + hashlib.sha256(ca.read_bytes()).hexdigest()
    )


def test_the_account_reads_a_ca_file_bounded_and_never_waits_on_a_fifo(tmp_path: Path) -> None:
    """``account_hash`` reads the CA file as the driver does (``read_regular``): a FIFO put in
    its place is unreadable at once (it never waits for a writer, which froze the broker), and
    a file past 16 MiB is unreadable, never read whole."""
    tls = make_tls(tmp_path)
    ca = Path(tls.ca_file)
    target = _https(tmp_path, ca_file=str(ca))
    assert account(target)["ca_file"].startswith("sha256:")
    ca.unlink()
    os.mkfifo(ca)
    answers: list[str] = []
    reader = threading.Thread(
        target=lambda: answers.append(account(target)["ca_file"]), daemon=True
    )
    reader.start()
    reader.join(5)
    assert not reader.is_alive(), "blocked on the FIFO"
    assert answers[0].startswith("unreadable:")
    ca.unlink()
    with ca.open("wb") as f:
        f.truncate((16 << 20) + 1)  # sparse: no 16 MiB written
    assert account(target)["ca_file"].startswith("unreadable:")


async def test_the_account_reads_its_ca_file_off_the_event_loop(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CA file is read for the recorded account in a worker thread, never on the event loop
    every call shares (a slow disk or network file system would stall them all) -- at a call,
    and at the account check of a query or poll.  (The file was just written: its stat does
    not vouch for a read yet, so each use reads it.)"""
    import affidavit.schema.fields as fields

    threads: list[int] = []
    real = fields.read_regular

    def watched(path: Any, *args: Any) -> Any:
        threads.append(threading.get_ident())
        return real(path, *args)

    monkeypatch.setattr(fields, "read_regular", watched)
    tls = make_tls(tmp_path)
    async with (
        HostileServer.running(scripts.serve(Reply(200)), tls=tls.good) as srv,
        open_broker(
            write_config(tmp_path, {"api": http_target(srv.url, ca_file=tls.ca_file)})
        ) as b,
    ):
        with trio.fail_after(LIMIT):
            env = await b.call({"target": "api", "method": "GET", "path": "/x"})
        assert "error" not in env, env
        assert threads and threading.get_ident() not in threads
        # and so does the check a reconciliation query or a poll makes first (``moved``)
        threads.clear()
        snap, target = b._engine.snapshot, b._engine.config.targets["api"]
        assert await snap.moved(b.events(env["invocation_id"]), target) is None
    assert threads and threading.get_ident() not in threads


async def test_a_call_trusts_the_ca_bytes_of_its_own_recorded_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ConfigSnapshot.trusted``: the digests a call's request pins are those of the account
    *it* recorded -- not of whichever call read the file last (call A validated, the file
    edited, call B validated: A still pins A's bytes, and is refused at its handshake) -- and
    for a record another process made, the file as it is now when the account is the same,
    else ``CHANGED`` (no bytes match: refused unsent)."""
    from affidavit.engine.snapshot import CHANGED, ConfigSnapshot

    tls = make_tls(tmp_path)
    ca = Path(tls.ca_file)
    cfg = load_config(
        write_config(tmp_path, {"api": http_target("https://127.0.0.1:8443", ca_file=str(ca))})
    )
    target = cfg.targets["api"]

    def keyed(label: str, data: bytes) -> str:
        return hashlib.sha256(label.encode() + data).hexdigest()

    def digest() -> str:
        return "sha256:" + hashlib.sha256(ca.read_bytes()).hexdigest()

    snap = ConfigSnapshot(cfg, keyed)
    first, first_digest = snap.account_hash(target), digest()
    ca.write_bytes(ca.read_bytes() + trustme.CA().cert_pem.bytes())
    second = snap.account_hash(target)
    assert first != second
    assert await snap.trusted(target, first) == {str(ca): first_digest}
    assert await snap.trusted(target, second) == {str(ca): digest()}
    elsewhere = ConfigSnapshot(cfg, keyed)  # another process, or a record long forgotten
    import affidavit.schema.fields as fields

    threads: list[int] = []
    real = fields.read_regular

    def watched(path: Any, *args: Any) -> Any:
        threads.append(threading.get_ident())
        return real(path, *args)

    monkeypatch.setattr(fields, "read_regular", watched)
    assert await elsewhere.trusted(target, first) == {str(ca): CHANGED}
    # read for the comparison in a worker thread, never on the event loop (review 2 #3)
    assert threads and threading.get_ident() not in threads
    assert await elsewhere.trusted(target, second) == {str(ca): digest()}
    assert await elsewhere.trusted(target, None) == {str(ca): digest()}


async def test_a_known_hosts_file_pins_nothing_at_the_handshake(tmp_path: Path) -> None:
    """An SSH target's ``known_hosts`` is a trust anchor read once, at load, its keys bound as
    ``host_keys``: its account holds no digest of it, so no call pins its bytes (``trusted``
    names only files whose content the account holds) -- such a target's calls prepare."""
    from affidavit.engine.snapshot import ConfigSnapshot

    (tmp_path / "known_hosts").write_text(f"127.0.0.1 {_PIN}\n")
    box = {"kind": "ssh", "host": "127.0.0.1", "user": "bob", "credential": "env:T"}
    cfg = load_config(write_config(tmp_path, {"box": box | {"known_hosts": "known_hosts"}}))
    snap = ConfigSnapshot(cfg, lambda label, data: hashlib.sha256(data).hexdigest())
    target = cfg.targets["box"]
    assert await snap.trusted(target, snap.account_hash(target)) == {}
