"""Asynchronous jobs end to end (issue 14, item 1), against the scripted HTTP server: a complete
202 is the committed acceptance of a job that is tracked as an operation of its own, polled by
linked invocations, and never submitted twice.

Seed: "A complete HTTP 202 response confirms that the job was accepted, not that the queued work
was completed.  Record the job identifier and its status resource returned by the service, and
then track the job as a separate operation.  If you retry the submission because the job is
still pending, it may be queued twice."
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.engine import OperationError
from affidavit.engine.readable import OTHER_ORIGIN, PARTIAL_BODY
from affidavit.statemachine import EventKind, EvidenceSource
from tests.http.hostile import HostileServer, Peer, Received, Reply, Script, scripts

from .helpers import (
    TOKEN_ENV,
    affidavit_cli,
    assert_error,
    assert_ok,
    event_kinds,
    http_target,
    open_broker,
    write_config,
)
from .http_rows import IDEM, LIMIT

E = EventKind
SUBMIT = {"target": "jobs", "method": "POST", "path": "/jobs", "body": '{"report":"q3"}'}
JOBS = {
    "operations": {"status": "json:/state", "succeeded": ["done"], "failed": ["error"]},
    "idempotency": IDEM,
}
ACCEPTED = Reply(202, headers=[("Location", "/v1/jobs/j123")], body=b'{"id":"j123"}')


def job_api(states: list[str]) -> Callable[[Received], Reply]:
    """POST /v1/jobs answers 202; each GET of /v1/jobs/j123 answers the next state (the last
    one repeats)."""
    polls = 0

    def reply(req: Received) -> Reply:
        nonlocal polls
        if req.method == "POST":
            return ACCEPTED
        if req.target == "/v1/jobs/j123":
            state = states[min(polls, len(states) - 1)]
            polls += 1
            return Reply(200, body=json.dumps({"state": state}).encode())
        return Reply(404, body=b"no such job")

    return reply


def _target(srv: HostileServer, **overrides: Any) -> dict[str, Any]:
    return http_target(srv.url + "/v1", **{**JOBS, **overrides})


async def _submit(broker: Broker, **extra: Any) -> dict[str, Any]:
    with trio.fail_after(LIMIT):
        return await broker.call({**SUBMIT, **extra})


async def _poll(broker: Broker, op_id: str) -> dict[str, Any]:
    with trio.fail_after(LIMIT):
        return await broker.poll_operation(op_id)


async def test_a_202_is_a_committed_acceptance_tracked_as_a_pending_operation(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(job_api(["running"]))) as srv:
        cfg = write_config(tmp_path, {"jobs": _target(srv)})
        async with open_broker(cfg) as broker:
            env = await _submit(broker)
            assert_ok(broker, env)  # the submission's outcome: the job was accepted
            iid = env["invocation_id"]
            op = env["operation"]
            assert op == {
                "id": "op_" + iid.removeprefix("act_"),
                "job_id": "j123",
                "status_url": srv.url + "/v1/jobs/j123",
                "state": "pending",
                "polls": 0,
                "last_poll": None,
            }
            assert env["result"]["status"] == 202
            kinds = event_kinds(broker, iid)
            # Recorded with the complete 202, in the transaction that stored it.
            assert kinds.index(E.REMOTE_RESPONSE_COMPLETE) < kinds.index(E.OPERATION_ACCEPTED)
            assert kinds.index(E.OPERATION_ACCEPTED) < kinds.index(E.RESULT_COMMITTED)
            accepted = next(e for e in broker.events(iid) if e.kind is E.OPERATION_ACCEPTED)
            assert accepted.source is EvidenceSource.REMOTE_RESPONSE
            assert accepted.attrs["status_path"] == "/jobs/j123"
            fetched = await broker.fetch_result(iid)
            assert fetched is not None and fetched["operation"] == op
            assert broker.operations() == [
                {
                    **op,
                    "invocation_id": iid,
                    "target": "jobs",
                    "session": None,
                    "accepted_seq": accepted.seq,
                }
            ]
    assert [r.method for r in srv.requests] == ["POST"]


async def test_polls_move_the_operation_to_succeeded_as_linked_invocations(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(job_api(["running", "done"]))) as srv:
        cfg = write_config(tmp_path, {"jobs": _target(srv)})
        async with open_broker(cfg) as broker:
            env = await _submit(broker, session="agent-7")
            iid, op_id = env["invocation_id"], env["operation"]["id"]
            first = await _poll(broker, op_id)
            assert first["operation"]["state"] == "pending"  # "running" is neither end
            second = await _poll(broker, op_id)
            assert second["operation"]["state"] == "succeeded"
            assert second["operation"]["polls"] == 2
            poll = second["poll"]
            assert_ok(broker, poll)  # the poll is an invocation of its own
            assert poll["invocation_id"] != iid
            assert second["operation"]["last_poll"] == {
                "invocation_id": poll["invocation_id"],
                "seq": second["operation"]["last_poll"]["seq"],
                "state": "succeeded",
                "remote_status": "done",
            }
            # Linked both ways, and the job's state is remote_query evidence.
            poll_accepted = broker.events(poll["invocation_id"])[0]
            assert poll_accepted.attrs["link"] == {"operation": op_id, "invocation": iid}
            assert poll_accepted.attrs["session"] == "agent-7"
            polled = [e for e in broker.events(iid) if e.kind is E.OPERATION_POLLED]
            assert [e.attrs["state"] for e in polled] == ["pending", "succeeded"]
            assert {e.source for e in polled} == {EvidenceSource.REMOTE_QUERY}
            assert polled[1].attrs["poll_invocation"] == poll["invocation_id"]
            # The submission's own record never moved: it is the job's acceptance.
            rec = broker.record(iid)
            assert rec is not None and rec.state == "delivered_committed"
            # An ended job is not queried again.
            again = await _poll(broker, op_id)
            assert again["poll"] is None and again["operation"]["state"] == "succeeded"
            fetched = await broker.fetch_result(iid)
            assert fetched is not None and fetched["operation"]["state"] == "succeeded"
    assert [(r.method, r.target) for r in srv.requests] == [
        ("POST", "/v1/jobs"),
        ("GET", "/v1/jobs/j123"),
        ("GET", "/v1/jobs/j123"),
    ]
    # Every poll carried the target's credential, injected like any call.
    assert {r.header("Authorization") for r in srv.requests} == {f"Bearer {token}"}


def _accept_then_drop_polls() -> Script:
    """202 to the POST; every later request (a poll) is read and the connection dropped."""

    async def script(peer: Peer) -> None:
        while True:
            req = await peer.read_request()
            if req is None:
                return
            if req.method != "POST":
                await peer.close()
                return
            await peer.respond(ACCEPTED)

    return script


async def test_a_poll_against_a_dropped_connection_keeps_the_job_pending(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(_accept_then_drop_polls()) as srv:
        cfg = write_config(tmp_path, {"jobs": _target(srv)})
        async with open_broker(cfg) as broker:
            env = await _submit(broker)
            op_id = env["operation"]["id"]
            answer = await _poll(broker, op_id)
            # The poll itself is unknown (GET is configured idempotent: backoff) ...
            assert_error(
                broker,
                answer["poll"],
                phase="remote_execution",
                outcome="unknown",
                retry="backoff",
                code="REMOTE_OUTCOME_UNKNOWN",
            )
            # ... and says nothing about the job: it stays pending.
            op = answer["operation"]
            assert (op["state"], op["polls"]) == ("pending", 1)
            assert op["last_poll"]["code"] == "REMOTE_OUTCOME_UNKNOWN"
            kinds = event_kinds(broker, env["invocation_id"])
            assert E.OPERATION_POLL_FAILED in kinds and E.OPERATION_POLLED not in kinds
    assert [r.method for r in srv.requests] == ["POST", "GET"]


async def test_a_status_resource_without_a_readable_state_keeps_the_job_pending(
    tmp_path: Path, token: str
) -> None:
    def reply(req: Received) -> Reply:
        return ACCEPTED if req.method == "POST" else Reply(200, body=b"<html>busy</html>")

    async with HostileServer.running(scripts.serve(reply)) as srv:
        cfg = write_config(tmp_path, {"jobs": _target(srv)})
        async with open_broker(cfg) as broker:
            op_id = (await _submit(broker))["operation"]["id"]
            answer = await _poll(broker, op_id)
    assert "error" not in answer["poll"]
    assert answer["operation"]["state"] == "pending"
    assert answer["operation"]["last_poll"]["reason"] == (
        "the status resource's answer names no state"
    )


def _cut_gzip(doc: Any) -> bytes:
    """``doc`` as JSON, gzipped, without the CRC32/ISIZE trailer: the prefix decodes."""
    return gzip.compress(json.dumps(doc).encode())[:-8]


async def test_a_poll_whose_gzip_body_is_cut_keeps_the_job_pending(
    tmp_path: Path, token: str
) -> None:
    # A complete 200 whose gzip lacks its trailer: body_withheld corrupt_encoding,
    # body_truncated -- yet the decoded prefix {"state": "done"} parses.  It moves nothing;
    # the next, whole answer does.
    polls = 0

    def reply(req: Received) -> Reply:
        nonlocal polls
        if req.method == "POST":
            return ACCEPTED
        polls += 1
        if polls == 1:
            return Reply(
                200, headers=[("Content-Encoding", "gzip")], body=_cut_gzip({"state": "done"})
            )
        return Reply(200, body=b'{"state": "done"}')

    async with HostileServer.running(scripts.serve(reply)) as srv:
        cfg = write_config(tmp_path, {"jobs": _target(srv)})
        async with open_broker(cfg) as broker:
            env = await _submit(broker)
            op_id = env["operation"]["id"]
            answer = await _poll(broker, op_id)
            assert "error" not in answer["poll"]  # the poll itself: a complete 200
            assert answer["poll"]["result"]["body_withheld"]["reason"] == "corrupt_encoding"
            op = answer["operation"]
            assert (op["state"], op["polls"]) == ("pending", 1)
            assert op["last_poll"]["reason"] == PARTIAL_BODY
            kinds = event_kinds(broker, env["invocation_id"])
            assert E.OPERATION_POLL_FAILED in kinds and E.OPERATION_POLLED not in kinds
            # Still open: polled again, a whole answer settles it.
            again = await _poll(broker, op_id)
            assert again["operation"]["state"] == "succeeded"
    assert [r.method for r in srv.requests] == ["POST", "GET", "GET"]


async def test_a_202_whose_gzip_body_is_cut_names_no_job(tmp_path: Path, token: str) -> None:
    # The job id is in the body, which was cut: none is taken from it.  The Location header
    # arrived whole and still names the status resource.
    cut = Reply(
        202,
        headers=[("Location", "/v1/jobs/j123"), ("Content-Encoding", "gzip")],
        body=_cut_gzip({"id": "j123"}),
    )
    async with HostileServer.running(scripts.serve(cut)) as srv:
        cfg = write_config(tmp_path, {"jobs": _target(srv)})
        async with open_broker(cfg) as broker:
            env = await _submit(broker)
            assert env["result"]["body_truncated"] is True
            op = env["operation"]
            assert (op["job_id"], op["status_url"]) == (None, srv.url + "/v1/jobs/j123")
            assert op["state"] == "pending"


async def test_a_poll_redirected_to_another_origin_keeps_the_job_pending(
    tmp_path: Path, token: str
) -> None:
    # follow_redirects with the other origin listed: the broker follows the status resource's
    # 302 there (without the credential), and that origin says "done".  It is not the
    # target's answer: the job stays pending.
    async with HostileServer.running(scripts.serve(Reply(200, body=b'{"state":"done"}'))) as other:

        def reply(req: Received) -> Reply:
            if req.method == "POST":
                return ACCEPTED
            return Reply(302, headers=[("Location", other.url + "/jobs/j123")])

        async with HostileServer.running(scripts.serve(reply)) as srv:
            target = _target(srv, follow_redirects=True, redirect_origins=[other.url])
            cfg = write_config(tmp_path, {"jobs": target})
            async with open_broker(cfg) as broker:
                env = await _submit(broker)
                answer = await _poll(broker, env["operation"]["id"])
                hops = answer["poll"]["result"]["hops"]
                assert [h["status"] for h in hops] == [302, 200]
                op = answer["operation"]
                assert (op["state"], op["polls"]) == ("pending", 1)
                assert op["last_poll"]["reason"] == OTHER_ORIGIN
                kinds = event_kinds(broker, env["invocation_id"])
                assert E.OPERATION_POLLED not in kinds
    assert [r.method for r in other.requests] == ["GET"]


async def test_resubmitting_the_same_key_while_pending_returns_the_operation_and_sends_nothing(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(job_api(["running"]))) as srv:
        cfg = write_config(tmp_path, {"jobs": _target(srv)})
        async with open_broker(cfg) as broker:
            first = await _submit(broker, idempotency_key="submit-q3")
            await _poll(broker, first["operation"]["id"])
            again = await _submit(broker, idempotency_key="submit-q3")
            assert again["invocation_id"] == first["invocation_id"]
            assert "error" not in again
            assert again["operation"]["state"] == "pending"
            assert again["operation"]["polls"] == 1
    # One submission and one poll: the retry was answered from the journal.
    assert [r.method for r in srv.requests] == ["POST", "GET"]


async def test_a_status_resource_on_another_origin_is_recorded_but_never_queried(
    tmp_path: Path, token: str
) -> None:
    elsewhere = Reply(202, headers=[("Location", "http://127.0.0.1:9/jobs/j1")], body=b"{}")
    async with HostileServer.running(scripts.serve(elsewhere)) as srv:
        cfg = write_config(tmp_path, {"jobs": _target(srv)})
        async with open_broker(cfg) as broker:
            env = await _submit(broker)
            op = env["operation"]
            assert (op["job_id"], op["status_url"]) == (None, "http://127.0.0.1:9/jobs/j1")
            with pytest.raises(OperationError, match="credential nowhere else"):
                await _poll(broker, op["id"])
            assert broker.operations()[0]["polls"] == 0
    assert len(srv.requests) == 1


async def test_a_202_on_a_target_without_operations_is_a_plain_committed_result(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(ACCEPTED)) as srv:
        cfg = write_config(tmp_path, {"jobs": http_target(srv.url + "/v1")})
        async with open_broker(cfg) as broker:
            env = await _submit(broker)
            assert_ok(broker, env)
            assert "operation" not in env
            assert broker.operations() == []
            with pytest.raises(OperationError, match="no operation"):
                await broker.poll_operation("op_" + env["invocation_id"][4:])
            with pytest.raises(OperationError, match="no operation"):
                await broker.poll_operation(env["invocation_id"])


@pytest.mark.parametrize("status", [200, 201])
async def test_only_a_202_accepts_a_job(tmp_path: Path, token: str, status: int) -> None:
    # A complete 200 or 201 is the work's own result, not an acceptance of queued work (seed:
    # "A complete HTTP 202 response confirms that the job was accepted"): even carrying a
    # Location and an id, it starts no operation to poll.
    done = Reply(status, headers=[("Location", "/v1/jobs/j123")], body=b'{"id":"j123"}')
    async with HostileServer.running(scripts.serve(done)) as srv:
        cfg = write_config(tmp_path, {"jobs": _target(srv)})
        async with open_broker(cfg) as broker:
            env = await _submit(broker)
            assert_ok(broker, env)
            assert "operation" not in env
            assert E.OPERATION_ACCEPTED not in event_kinds(broker, env["invocation_id"])
            assert broker.operations() == []


# -- the command line ----------------------------------------------------------------------------


async def _cli(*args: str, token: str) -> Any:
    return await affidavit_cli(*args, env={TOKEN_ENV: token})


async def test_the_cli_lists_and_polls_operations_with_exit_codes_by_evidence(
    tmp_path: Path, token: str
) -> None:
    states = ["running", "done"]
    async with HostileServer.running(scripts.serve(job_api(states))) as srv:
        cfg = write_config(tmp_path, {"jobs": _target(srv)})
        async with open_broker(cfg) as broker:
            op_id = (await _submit(broker))["operation"]["id"]
        listed = await _cli("operations", "--json", "--config", str(cfg), token=token)
        table = await _cli("operations", "--config", str(cfg), token=token)
        pending = await _cli("operation", "poll", op_id, "--config", str(cfg), token=token)
        done = await _cli("operation", "poll", op_id, "--config", str(cfg), token=token)
        ended = await _cli("operation", "poll", op_id, "--config", str(cfg), token=token)
        unknown = await _cli("operation", "poll", "op_nope", "--config", str(cfg), token=token)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert (row["id"], row["state"], row["job_id"]) == (op_id, "pending", "j123")
    assert op_id in table.stdout.decode() and "pending" in table.stdout.decode()
    head, line = table.stdout.decode().splitlines()  # STATE starts under its heading (ids: 29)
    assert line.index(" pending ") + 1 == head.index("STATE"), table.stdout
    assert pending.returncode == 0, pending.stderr
    assert json.loads(pending.stdout)["operation"]["state"] == "pending"
    answer = json.loads(done.stdout)
    assert done.returncode == 0 and answer["operation"]["state"] == "succeeded"
    assert "error" not in answer["poll"] and answer["poll"]["result"]["status"] == 200
    assert ended.returncode == 0 and json.loads(ended.stdout)["poll"] is None
    assert unknown.returncode == 2 and b"no operation op_nope" in unknown.stderr
    assert unknown.stderr.startswith(b"affidavit: OPERATION_ERROR: "), unknown.stderr
    for p in (listed, table, pending, done, ended, unknown):
        assert b"Traceback" not in p.stderr + p.stdout
    assert [r.method for r in srv.requests] == ["POST", "GET", "GET"]


async def test_a_failed_poll_exits_1_and_keeps_the_state(tmp_path: Path, token: str) -> None:
    async with HostileServer.running(_accept_then_drop_polls()) as srv:
        cfg = write_config(tmp_path, {"jobs": _target(srv)})
        async with open_broker(cfg) as broker:
            op_id = (await _submit(broker))["operation"]["id"]
        polled = await _cli("operation", "poll", op_id, "--config", str(cfg), token=token)
    assert polled.returncode == 1, polled.stderr
    answer = json.loads(polled.stdout)
    assert answer["operation"]["state"] == "pending"
    assert answer["poll"]["error"]["outcome"] == "unknown"


async def test_the_operations_table_escapes_a_job_id_the_remote_chose(
    tmp_path: Path, token: str
) -> None:
    """The job id comes from the remote's 202 (up to 256 characters): a line feed in it must
    not start a row of its own in ``affidavit operations``, an ESC drive the operator's
    terminal, nor its spaces forge the SUBMITTED BY column: it is quoted and cut at its
    column's width, in its middle."""
    forged = "j1\nx\x1b[2J " + "op_forged".rjust(30) + " act_forged".ljust(200)
    accepted = Reply(202, body=json.dumps({"id": forged}).encode())
    async with HostileServer.running(scripts.serve(lambda _req: accepted)) as srv:
        cfg = write_config(tmp_path, {"jobs": _target(srv)})
        async with open_broker(cfg) as broker:
            submitted = await _submit(broker)
        op_id = submitted["operation"]["id"]
        table = await _cli("operations", "--config", str(cfg), token=token)
        listed = await _cli("operations", "--json", "--config", str(cfg), token=token)
    assert table.returncode == 0, table.stderr
    head, line, *more = table.stdout.decode().splitlines()
    assert more == [] and line.startswith(op_id), (line, more)  # the header and one row
    job = head.index("JOB")
    cell = line[job : job + 25]  # the column's 24 characters and the space after it
    assert cell == '"j1\\nx\\u001...         " ', line  # both ends: its padding shows
    assert line[head.index("SUBMITTED BY") :] == submitted["invocation_id"], line
    assert "\x1b" not in line and "forged" not in line
    assert json.loads(listed.stdout)[0]["job_id"] == forged  # --json: the very value


async def test_a_poll_releases_what_the_recorder_kept_for_its_task(
    tmp_path: Path, token: str
) -> None:
    """The poll's own call is released when it ends; the operation's fold written after it
    must be too (the daemon runs each request in a task of its own: one entry per poll)."""
    async with HostileServer.running(scripts.serve(job_api(["running"]))) as srv:
        cfg = write_config(tmp_path, {"jobs": _target(srv)})
        async with open_broker(cfg) as broker:
            op_id = (await _submit(broker))["operation"]["id"]
            assert (await _poll(broker, op_id))["operation"]["state"] == "pending"
            assert broker._engine.recorder._writing == {}


async def test_a_202_answered_from_another_origin_names_no_job(tmp_path: Path, token: str) -> None:
    """POST -> 307 to an origin in redirect_origins (sent without the credential) -> 202 naming
    a job: that origin's word says nothing of what the target accepted -- neither its body's job
    id nor its Location, which resolved against the target's URL named a status resource on the
    target (polled with the credential) that the target never gave (engine/contracts.py)."""
    accepted = Reply(202, headers=[("Location", "/v1/jobs/j123")], body=b'{"id":"j123"}')
    async with HostileServer.running(scripts.serve(accepted)) as other:
        moved = scripts.redirect(other.url + "/v1/jobs", 307)
        async with HostileServer.running(moved) as srv:
            target = _target(srv, follow_redirects=True, redirect_origins=[other.url])
            cfg = write_config(tmp_path, {"jobs": target})
            async with open_broker(cfg) as broker:
                env = await _submit(broker)
                iid = env["invocation_id"]
                kinds = event_kinds(broker, iid)
                operations = broker.operations()
    assert len(other.requests) == 1 and env["result"]["status"] == 202
    assert "operation" not in env and operations == []
    assert E.OPERATION_ACCEPTED not in kinds and E.RESULT_COMMITTED in kinds


async def test_a_202_answered_outside_the_base_path_names_no_job(
    tmp_path: Path, token: str
) -> None:
    """POST /v1/jobs -> 308 to /legacy/jobs: the target's origin, but outside its base path, so
    sent without the credential -> 202 ``Location: status/j9``.  Read by its origin alone it
    named ``/status/j9`` a poll would have sent the credential to; the final hop's request
    carried no credential, so nothing of the answer is read (engine/readable.py)."""

    def reply(req: Received) -> Reply:
        if req.target == "/v1/jobs":
            return Reply(308, headers=[("Location", "/legacy/jobs")])
        return Reply(202, headers=[("Location", "status/j9")], body=b'{"id":"j9"}')

    async with HostileServer.running(scripts.serve(reply)) as srv:
        cfg = write_config(tmp_path, {"jobs": _target(srv, follow_redirects=True)})
        async with open_broker(cfg) as broker:
            env = await _submit(broker)
            kinds = event_kinds(broker, env["invocation_id"])
            operations = broker.operations()
    legacy = srv.requests[-1]
    assert [r.target for r in srv.requests] == ["/v1/jobs", "/legacy/jobs"]
    assert legacy.header("authorization") is None and srv.requests[0].header("authorization")
    hops = env["result"]["hops"]
    assert [(h["status"], h["credential_sent"]) for h in hops] == [(308, True), (202, False)]
    assert "operation" not in env and operations == []
    assert E.OPERATION_ACCEPTED not in kinds and E.RESULT_COMMITTED in kinds


@pytest.mark.parametrize(
    ("location", "status_path"),
    [("status/j9", None), ("/v1/v2/status/j9", "/v2/status/j9")],
    ids=["relative: its base is the last hop's URL, not kept", "from the root"],
)
async def test_a_202_after_a_redirect_names_only_a_status_resource_independent_of_its_path(
    tmp_path: Path, token: str, location: str, status_path: str | None
) -> None:
    """/v1/jobs -> 308 /v1/v2/jobs (in scope: the credential kept) -> 202.  A relative Location
    resolves against the last hop's URL (/v1/v2/status/j9); resolved against the caller's it
    named /v1/status/j9 -- another resource, polled with the credential.  The record keeps no
    hop URL, so such a reference names no status resource; one from the root does."""

    def reply(req: Received) -> Reply:
        if req.target == "/v1/jobs":
            return Reply(308, headers=[("Location", "/v1/v2/jobs")])
        return Reply(202, headers=[("Location", location)], body=b'{"id":"j9"}')

    async with HostileServer.running(scripts.serve(reply)) as srv:
        cfg = write_config(tmp_path, {"jobs": _target(srv, follow_redirects=True)})
        async with open_broker(cfg) as broker:
            env = await _submit(broker)
            accepted = next(
                e for e in broker.events(env["invocation_id"]) if e.kind is E.OPERATION_ACCEPTED
            )
    assert [r.header("authorization") is not None for r in srv.requests] == [True, True]
    assert [h["status"] for h in env["result"]["hops"]] == [308, 202]
    assert accepted.attrs["job_id"] == "j9"
    assert accepted.attrs["status_path"] == status_path
    expected_url = None if status_path is None else srv.url + "/v1" + status_path
    assert env["operation"]["status_url"] == expected_url


@pytest.mark.parametrize(
    "body",
    [b'{"state": "running", "state": "done"}', b'{"state": "done", "n": NaN}'],
    ids=["duplicate-field", "nan"],
)
async def test_a_poll_whose_json_readers_disagree_on_keeps_the_job_pending(
    tmp_path: Path, token: str, body: bytes
) -> None:
    # Python's parser keeps the last "state" (done), another reader the first (running): the
    # answer names no state anyone can vouch for.
    def reply(req: Received) -> Reply:
        return ACCEPTED if req.method == "POST" else Reply(200, body=body)

    async with HostileServer.running(scripts.serve(reply)) as srv:
        cfg = write_config(tmp_path, {"jobs": _target(srv)})
        async with open_broker(cfg) as broker:
            env = await _submit(broker)
            answer = await _poll(broker, env["operation"]["id"])
            kinds = event_kinds(broker, env["invocation_id"])
    assert "error" not in answer["poll"]
    op = answer["operation"]
    assert (op["state"], op["polls"]) == ("pending", 1)
    assert op["last_poll"]["reason"] == "the status resource's answer names no state"
    assert E.OPERATION_POLL_FAILED in kinds and E.OPERATION_POLLED not in kinds


async def test_a_202_whose_json_readers_disagree_on_names_no_job(
    tmp_path: Path, token: str
) -> None:
    dup = Reply(202, headers=[("Location", "/v1/jobs/j123")], body=b'{"id":"j1","id":"j123"}')
    async with HostileServer.running(scripts.serve(dup)) as srv:
        cfg = write_config(tmp_path, {"jobs": _target(srv)})
        async with open_broker(cfg) as broker:
            env = await _submit(broker)
            accepted = next(
                e for e in broker.events(env["invocation_id"]) if e.kind is E.OPERATION_ACCEPTED
            )
    assert env["operation"]["job_id"] is None and accepted.attrs["job_id"] is None
    assert env["operation"]["status_url"] == srv.url + "/v1/jobs/j123"  # the header is whole
