"""Approvals and reconciliation through a real daemon: the socket peer's uid is the identity
(issue 12).

The agent is another user (``nobody``, ``kit.as_user``, as in test_boundary.py): it may call,
fetch and run a reconciliation query, but an approval or an attestation from it is refused --
"An agent can never approve".  The operator is this test's own uid, listed in ``[service]
operator_uids``.  The daemon records every decision and sends an approved request once, also
one approved while it was down.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from affidavit.api.client import Client
from affidavit.api.wire import ApiError
from tests.broker.approvalkit import PaymentsApi, reconcile_target
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import (
    HUNG,
    NOBODY,
    DaemonProc,
    Run,
    api_target,
    as_user,
    cli,
    client_env,
    embedded,
    run,
    running_daemon,
    start_daemon,
    stop,
    wait_until,
)

CHARGE = {"target": "api", "method": "POST", "path": "/v1/charges", "body": '{"amount": 5}'}
OK = Reply(200, body=b'{"charged": true}')


async def as_nobody(daemon: DaemonProc, *args: str, stdin: bytes = b"") -> Run:
    """``affidavit ARGS`` as uid nobody: holds only the socket (its group's), no file of the
    broker's, no credential."""
    env = client_env(daemon.socket)
    env["HOME"] = "/nonexistent"
    return await run(as_user(NOBODY, "-m", "affidavit", *args), stdin=stdin, env=env)


async def _state(daemon: DaemonProc, iid: str, *states: str) -> dict[str, Any]:
    async with Client.open(daemon.socket) as client:

        async def reached() -> dict[str, Any] | None:
            record = await client.record(iid)
            return record if record is not None and record["state"] in states else None

        found: dict[str, Any] = await wait_until(reached, f"{iid} reaches {states}")
        return found


def _verified(daemon: DaemonProc) -> None:
    """``affidavit journal verify`` beside the running daemon: readers need no lock."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "affidavit", "journal", "verify", "--config", str(daemon.config)],
        capture_output=True,
        env=client_env(),
        timeout=HUNG,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


async def test_an_agent_asks_an_operator_approves_and_the_daemon_sends_once(
    tmp_path: Path, token: str, shared_socket_dir: Path
) -> None:
    me = os.geteuid()
    service = {"allow_gids": [NOBODY], "operator_uids": [me]}
    async with (
        HostileServer.running(scripts.serve(OK)) as srv,
        running_daemon(
            tmp_path,
            api_target(srv.url, approval={"methods": ["POST"]}),
            token=token,
            service=service,
            socket_dir=shared_socket_dir,
        ) as daemon,
    ):
        asked = await as_nobody(daemon, "call", "-", stdin=json.dumps(CHARGE).encode())
        assert asked.returncode == 1, asked.stderr
        envelope = asked.json()
        assert envelope["error"]["code"] == "APPROVAL_PENDING"
        iid = envelope["invocation_id"]
        # The agent cannot approve, list or attest: not an operator.
        for args in (
            ("approvals", "approve", iid, "--note", "self-service"),
            ("approvals", "--json"),
            ("reconcile", iid, "--attest", "committed", "--note", "trust me"),
        ):
            refused = await as_nobody(daemon, *args)
            assert refused.returncode == 2, args
            # Under --json the refusal itself, in the daemon's API error shape; nothing else.
            assert refused.stdout == b"" or list(json.loads(refused.stdout)) == ["api_error"]
            assert (refused.stdout == b"") == ("--json" not in args), refused
            assert f"uid {NOBODY} may not".encode() in refused.stderr, refused.stderr
        assert srv.requests == []

        listed = await cli(daemon, "approvals", "--json")
        assert listed.returncode == 0, listed.stderr
        [waiting] = listed.json()
        assert waiting["invocation_id"] == iid
        assert waiting["requester"] == {"uid": NOBODY}
        assert waiting["credential"] == "env:AFFIDAVIT_TEST_TOKEN"
        assert waiting["request"]["url"] == f"{srv.url}/v1/charges"
        assert token.encode() not in listed.stdout  # a credential's name, never its value

        decided = await cli(daemon, "approvals", "approve", iid, "--note", "amount ok")
        assert decided.returncode == 0, decided.stderr
        admitted = {"admitted": {"uid": me}}  # what admitted it, for the gate to re-check
        assert decided.json()["operator"] == {
            "uid": me,
            "name": "root",
            "via": "socket",
            **admitted,
        }
        await _state(daemon, iid, "stored_committed")  # sent by the daemon's dispatcher

        fetched = await as_nobody(daemon, "result", iid)
        assert fetched.returncode == 0, fetched.stderr
        assert json.loads(fetched.json()["result"]["body"]) == {"charged": True}
        _verified(daemon)
    assert [r.header("authorization") for r in srv.requests] == [f"Bearer {token}"]


async def test_the_requester_cannot_approve_its_own_request(tmp_path: Path, token: str) -> None:
    me = os.geteuid()
    async with (
        HostileServer.running(scripts.serve(OK)) as srv,
        running_daemon(
            tmp_path,
            api_target(srv.url, approval="always"),
            token=token,
            service={"operator_uids": [me]},
        ) as daemon,
    ):
        asked = await cli(daemon, "call", "-", stdin=json.dumps(CHARGE).encode())
        iid = asked.json()["invocation_id"]
        refused = await cli(daemon, "approvals", "approve", iid)
        assert refused.returncode == 2
        assert b"made this request" in refused.stderr, refused.stderr
        async with Client.open(daemon.socket) as client:
            try:
                await client.deny(iid, note="my own")
            except ApiError as exc:
                assert (exc.status, exc.code) == (403, "SELF_APPROVAL")
            else:
                raise AssertionError("the requester denied its own request")
            assert (await client.approval(iid))["approval"] == "pending"
    assert srv.requests == []


async def test_a_deny_through_the_client_is_never_sent(tmp_path: Path, token: str) -> None:
    me = os.geteuid()
    service = {"operator_uids": [me], "allow_self_approval": True}
    async with (
        HostileServer.running(scripts.serve(OK)) as srv,
        running_daemon(
            tmp_path, api_target(srv.url, approval="always"), token=token, service=service
        ) as daemon,
        Client.open(daemon.socket) as client,
    ):
        envelope = await client.call(CHARGE)
        iid = envelope["invocation_id"]
        assert [a["invocation_id"] for a in await client.approvals()] == [iid]
        view = await client.deny(iid, note="not this week")
        assert (view["approval"], view["note"]) == ("denied", "not this week")
        fetched = await client.fetch_result(iid)
        assert fetched is not None
        err = fetched["error"]
        assert (err["code"], err["phase"], err["outcome"], err["retry"]) == (
            "APPROVAL_DENIED",
            "credential_injection",
            "not_attempted",
            "never",
        )
        assert await client.approvals() == []
    assert srv.requests == []


@asynccontextmanager
async def _approved_while_down(
    tmp_path: Path, token: str, srv: HostileServer
) -> AsyncIterator[tuple[DaemonProc, str]]:
    """A request made through a daemon that then stops, approved embedded while it is down:
    the journal is free, and the operator is this process's user."""
    me = os.geteuid()
    service = {"operator_uids": [me], "allow_self_approval": True}
    async with running_daemon(
        tmp_path, api_target(srv.url, approval="always"), token=token, service=service
    ) as daemon:
        asked = await cli(daemon, "call", "-", stdin=json.dumps(CHARGE).encode())
        assert asked.json()["error"]["code"] == "APPROVAL_PENDING"
        stop(daemon)
        iid = asked.json()["invocation_id"]
        approved = await embedded("approvals", "approve", iid, "--config", str(daemon.config))
        assert approved.returncode == 0, approved.stderr
        assert approved.json()["operator"]["via"] == "embedded"
        assert srv.requests == []
        yield daemon, iid


@asynccontextmanager
async def _restarted(down: DaemonProc, token: str) -> AsyncIterator[DaemonProc]:
    daemon = await start_daemon(down.config, down.socket, down.log, token)
    try:
        yield daemon
    finally:
        stop(daemon)


async def test_an_approval_given_while_the_daemon_was_down_is_sent_when_it_starts(
    tmp_path: Path, token: str
) -> None:
    async with (
        HostileServer.running(scripts.serve(OK)) as srv,
        _approved_while_down(tmp_path, token, srv) as (down, iid),
        _restarted(down, token) as daemon,
    ):
        await _state(daemon, iid, "stored_committed")
        fetched = await cli(daemon, "result", iid)
        assert fetched.returncode == 0
        assert json.loads(fetched.json()["result"]["body"]) == {"charged": True}
    assert len(srv.requests) == 1


async def test_a_config_edited_after_approval_is_not_sent_under_the_old_approval(
    tmp_path: Path, token: str
) -> None:
    async with (
        HostileServer.running(scripts.serve(OK)) as srv,
        _approved_while_down(tmp_path, token, srv) as (down, iid),
    ):
        # The target is reloaded with another timeout: not what the operator approved.
        down.config.write_text(down.config.read_text().replace("total = 5", "total = 9"))
        async with _restarted(down, token) as daemon:
            # Its dispatcher cannot send it as approved, and on SQLite (one writer) no other
            # daemon can: APPROVAL_STALE at once, naming the target's settings, no lease taken
            # (apprfix50c #1: it stayed approved until its expiry, then "window ran out").
            record = await _state(daemon, iid, "validation_failed")
            async with Client.open(daemon.socket) as c:
                kinds = [e["kind"] for e in await c.events(iid)]
            assert (record["code"], record["field"]) == ("APPROVAL_STALE", "targets.api"), record
            assert "DISPATCH_LEASE_ACQUIRED" not in kinds, record
    assert srv.requests == []


async def test_a_caller_waiting_through_the_daemon_gets_the_result_once_approved(
    tmp_path: Path, token: str
) -> None:
    me = os.geteuid()
    service = {"operator_uids": [me], "allow_self_approval": True}
    async with (
        HostileServer.running(scripts.serve(OK)) as srv,
        running_daemon(
            tmp_path,
            api_target(srv.url, approval={"wait": "15s"}),
            token=token,
            service=service,
        ) as daemon,
        Client.open(daemon.socket) as client,
    ):
        got: dict[str, Any] = {}

        async def caller() -> None:
            got["run"] = await cli(daemon, "call", "-", stdin=json.dumps(CHARGE).encode())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller)
            waiting = await wait_until(client.approvals, "the request waits for a decision")
            await client.approve(waiting[0]["invocation_id"], note="go")
        done = got["run"]
        assert done.returncode == 0, done.stdout
        assert json.loads(done.json()["result"]["body"]) == {"charged": True}
    assert len(srv.requests) == 1


async def test_reconcile_through_the_daemon_query_by_anyone_attest_by_operators(
    tmp_path: Path, token: str, shared_socket_dir: Path
) -> None:
    me = os.geteuid()
    api = PaymentsApi()
    service = {"allow_gids": [NOBODY], "operator_uids": [me]}
    drop = {"target": "api", "method": "POST", "path": "/v1/charges", "body": '{"drop": true}'}
    async with (
        HostileServer.running(api.script) as srv,
        running_daemon(
            tmp_path,
            reconcile_target(srv.url),
            token=token,
            service=service,
            socket_dir=shared_socket_dir,
        ) as daemon,
    ):
        ids = []
        for key in ("k-query", "k-attest"):
            body = json.dumps({**drop, "idempotency_key": key}).encode()
            asked = await as_nobody(daemon, "call", "-", stdin=body)
            assert asked.json()["error"]["outcome"] == "unknown"
            ids.append(asked.json()["invocation_id"])
        # A query is a read: the agent may run it.
        queried = await as_nobody(daemon, "reconcile", ids[0], "--query")
        assert queried.returncode == 0, queried.stderr
        assert queried.json()["envelope"]["evidence"]["source"] == "remote_query"
        _verified(daemon)
        refused = await as_nobody(
            daemon, "reconcile", ids[1], "--attest", "rejected", "--note", "x"
        )
        assert refused.returncode == 2
        attested = await cli(
            daemon, "reconcile", ids[1], "--attest", "rejected", "--note", "no charge in ledger"
        )
        assert attested.returncode == 0, attested.stderr
        rc = attested.json()["envelope"]["evidence"]["reconciliation"]
        assert (rc["source"], rc["observer"], rc["note"]) == (
            "operator_attested",
            f"operator:uid={me}(root)",
            "no charge in ledger",
        )
        _verified(daemon)
    assert [r.method for r in srv.requests] == ["POST", "POST", "GET"]


async def test_an_agent_past_max_pending_approvals_is_refused_and_nothing_is_asked(
    tmp_path: Path, token: str, shared_socket_dir: Path
) -> None:
    """The bound is the socket peer's uid's: nobody's third request is APPROVAL_LIMIT (nothing
    asked, nothing sent), while another uid still asks."""
    me = os.geteuid()
    service = {"allow_gids": [NOBODY], "operator_uids": [me], "max_pending_approvals": 2}
    async with (
        HostileServer.running(scripts.serve(OK)) as srv,
        running_daemon(
            tmp_path,
            api_target(srv.url, approval="always"),
            token=token,
            service=service,
            socket_dir=shared_socket_dir,
        ) as daemon,
    ):
        codes = []
        for _ in range(3):
            asked = await as_nobody(daemon, "call", "-", stdin=json.dumps(CHARGE).encode())
            assert asked.returncode == 1, asked.stderr
            codes.append(asked.json()["error"])
        assert [e["code"] for e in codes] == ["APPROVAL_PENDING"] * 2 + ["APPROVAL_LIMIT"]
        limit = codes[2]
        assert (limit["phase"], limit["outcome"], limit["retry"]) == (
            "credential_injection",
            "not_attempted",
            "backoff",
        )
        assert f"uid {NOBODY}" in limit["message"]
        async with Client.open(daemon.socket) as client:
            mine = await client.call(CHARGE)
            assert mine["error"]["code"] == "APPROVAL_PENDING", mine
            waiting = await client.approvals()
        assert sorted(w["requester"]["uid"] for w in waiting) == sorted([NOBODY, NOBODY, me])
        _verified(daemon)
    assert srv.requests == []


async def test_an_agent_refused_at_the_bound_asks_again_with_the_same_key_through_the_daemon(
    tmp_path: Path, token: str, shared_socket_dir: Path
) -> None:
    """APPROVAL_LIMIT hints ``backoff``; the agent follows it with the same idempotency key
    through the daemon: at the bound the retry is refused again (the same invocation, nothing
    asked), and once a slot is free it asks the operator for that invocation."""
    me = os.geteuid()
    service = {"allow_gids": [NOBODY], "operator_uids": [me], "max_pending_approvals": 1}
    keyed = json.dumps({**CHARGE, "idempotency_key": "charge-7"}).encode()
    idem = {"header": "Idempotency-Key", "scope": "charges", "retention": "24h"}
    async with (
        HostileServer.running(scripts.serve(OK)) as srv,
        running_daemon(
            tmp_path,
            api_target(srv.url, approval="always", idempotency=idem),
            token=token,
            service=service,
            socket_dir=shared_socket_dir,
        ) as daemon,
    ):
        first = await as_nobody(daemon, "call", "-", stdin=json.dumps(CHARGE).encode())
        assert first.json()["error"]["code"] == "APPROVAL_PENDING", first.stderr
        refused = (await as_nobody(daemon, "call", "-", stdin=keyed)).json()
        error = refused["error"]
        assert (error["code"], error["outcome"], error["retry"]) == (
            "APPROVAL_LIMIT",
            "not_attempted",
            "backoff",
        )
        iid = refused["invocation_id"]
        still = (await as_nobody(daemon, "call", "-", stdin=keyed)).json()
        assert still["invocation_id"] == iid and still["error"]["code"] == "APPROVAL_LIMIT"
        async with Client.open(daemon.socket) as client:
            await client.deny(first.json()["invocation_id"], note="no")
        again = (await as_nobody(daemon, "call", "-", stdin=keyed)).json()
        assert again["invocation_id"] == iid, again
        assert again["error"]["code"] == "APPROVAL_PENDING", again
        async with Client.open(daemon.socket) as client:
            waiting = await client.approvals()
        assert [(w["invocation_id"], w["requester"]["uid"]) for w in waiting] == [(iid, NOBODY)]
        _verified(daemon)
    assert srv.requests == []
