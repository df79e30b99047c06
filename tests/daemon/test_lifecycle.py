"""The daemon's life: killed mid-call and restarted, stopped with SIGTERM inside and past its
grace, one writer per journal, one daemon per socket, too many calls at once.

Seed, "Dispatch shifts the burden of proof": a daemon killed after DISPATCH_STARTED leaves a
record that recovery closes as unknown -- never not_attempted -- with the retry hint the
target's contract allows.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.client import Client
from affidavit.api.wire import ApiError, DaemonUnavailable
from tests.http.hostile import HostileServer, Peer, Reply, scripts, unresponsive_listener

from .kit import (
    WAIT,
    action,
    action_bytes,
    api_target,
    cli,
    client_env,
    embedded,
    run,
    running_daemon,
    start_daemon,
    stop,
    wait_until,
    write_daemon_config,
)


def answers_after(delay: float, reply: Reply) -> Any:
    async def script(peer: Peer) -> None:
        if await peer.read_request() is not None:
            peer.server.event("received").set()
            await trio.sleep(delay)
            await peer.respond(reply)

    return script


async def _records(socket: Path) -> list[dict[str, Any]]:
    async with Client.open(socket) as client:
        return list((await client.actions())["actions"])


PAYMENTS = {"header": "Idempotency-Key", "scope": "payments.create", "retention": "24h"}


@pytest.mark.parametrize(
    ("contract", "retry"),
    [(None, "reconcile"), (PAYMENTS, "same_idempotency_key")],
    ids=["no-contract-reconcile", "key-contract-same-key"],
)
async def test_a_daemon_killed_after_dispatch_leaves_unknown_on_restart(
    tmp_path: Path, token: str, contract: dict[str, str] | None, retry: str
) -> None:
    async with HostileServer.running(scripts.held()) as srv:
        target = api_target(srv.url, idempotency=contract, timeout={"connect": 5, "total": 60})
        async with running_daemon(tmp_path, target, token=token) as daemon:
            async with trio.open_nursery() as nursery:

                async def caller() -> None:
                    async with Client.open(daemon.socket) as client:
                        with pytest.raises(Exception):  # noqa: B017 - the daemon dies mid-call
                            await client.call(action("/v1/pay", "POST", body="{}"))

                nursery.start_soon(caller)
                with trio.fail_after(WAIT):
                    await srv.event("received").wait()
                daemon.proc.kill()
                await daemon.wait()
            assert daemon.socket.exists()  # a killed daemon leaves its socket file behind
            restarted = await start_daemon(daemon.config, daemon.socket, daemon.log, token)
            try:
                records = await _records(daemon.socket)
            finally:
                stop(restarted)
    assert len(records) == 1
    rec = records[0]
    assert rec["evidence"]["dispatch_started"] is True
    assert (rec["state"], rec["code"], rec["outcome"], rec["retry"]) == (
        "interrupted",
        "REMOTE_OUTCOME_UNKNOWN",
        "unknown",
        retry,
    )
    assert "start-up recovery closed 1 record(s)" in daemon.log_text()
    assert "removed the stale socket" in daemon.log_text()
    assert len(srv.requests) == 1  # recovery re-sent nothing


async def test_sigterm_lets_a_slow_call_finish_inside_the_grace(tmp_path: Path, token: str) -> None:
    slow = answers_after(1.0, Reply(200, body=b'{"slow": "done"}'))
    async with (
        HostileServer.running(slow) as srv,
        running_daemon(
            tmp_path, api_target(srv.url), token=token, service={"shutdown_grace": 15}
        ) as daemon,
    ):
        async with (
            Client.open(daemon.socket) as late,
            Client.open(daemon.socket) as later,
            Client.open(daemon.socket) as client,
        ):
            await late.health()  # an idle keep-alive connection, open through the shutdown
            await later.health()  # another
            async with trio.open_nursery() as nursery:
                answers: list[dict[str, Any]] = []

                async def caller() -> None:
                    answers.append(await client.call(action("/v1/slow")))

                nursery.start_soon(caller)
                with trio.fail_after(WAIT):
                    await srv.event("received").wait()
                daemon.signal(signal.SIGTERM)
                await wait_until(lambda: not daemon.socket.exists(), "the socket is gone")
                # New calls are refused: on a fresh connection, and on an open one (503).
                with pytest.raises(DaemonUnavailable):
                    await Client(daemon.socket).call(action())
                with pytest.raises(ApiError) as refused:
                    await late.call(action())
                assert (refused.value.status, refused.value.code) == (503, "SHUTTING_DOWN")
                # So is a reconciliation query (a linked call to the remote): before anything.
                with pytest.raises(ApiError) as refused:
                    await later.reconcile("inv_none", query=True)
                assert (refused.value.status, refused.value.code) == (503, "SHUTTING_DOWN")
        assert await daemon.wait() == 0
    envelope = answers[0]
    assert "error" not in envelope
    assert json.loads(envelope["result"]["body"]) == {"slow": "done"}
    assert "shutting down: 1 call(s) in flight" in daemon.log_text()
    assert "grace ran out" not in daemon.log_text()
    assert len(srv.requests) == 1


async def test_sigterm_past_the_grace_records_what_the_evidence_proves(
    tmp_path: Path, token: str
) -> None:
    """After dispatch: BROKER_SHUTDOWN, unknown.  Before it (the connect hangs): BROKER_SHUTDOWN,
    not_attempted.  Each caller is answered with its envelope before the daemon exits."""
    async with (
        HostileServer.running(scripts.held()) as srv,
        unresponsive_listener() as port,
    ):
        targets = {
            "api": api_target(srv.url, timeout={"connect": 5, "total": 60})["api"],
            "stuck": api_target(f"http://127.0.0.1:{port}", timeout={"connect": 50, "total": 60})[
                "api"
            ],
        }
        async with running_daemon(
            tmp_path, targets, token=token, service={"shutdown_grace": 0.5}
        ) as daemon:
            answers: dict[str, dict[str, Any]] = {}
            async with Client.open(daemon.socket) as client, trio.open_nursery() as nursery:

                async def caller(target: str) -> None:
                    answers[target] = await client.call(
                        {**action("/v1/x", "POST"), "target": target}
                    )

                nursery.start_soon(caller, "api")
                nursery.start_soon(caller, "stuck")
                with trio.fail_after(WAIT):
                    await srv.event("received").wait()

                async def both_running() -> bool:
                    rows = (await client.actions())["actions"]
                    return sorted(r["state"] for r in rows) == ["authorized", "dispatched"]

                await wait_until(both_running, "one call dispatched, one connecting")
                daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
    after, before = answers["api"]["error"], answers["stuck"]["error"]
    assert (after["code"], after["phase"], after["outcome"], after["retry"]) == (
        "BROKER_SHUTDOWN",
        "remote_execution",
        "unknown",
        "reconcile",
    )
    assert (before["code"], before["phase"], before["outcome"], before["retry"]) == (
        "BROKER_SHUTDOWN",
        "connection_setup",
        "not_attempted",
        "backoff",
    )
    assert answers["stuck"]["evidence"]["dispatch_started"] is False
    assert "the grace ran out: 2 call(s) stopped (BROKER_SHUTDOWN)" in daemon.log_text()


async def test_one_writer_per_journal_and_one_daemon_per_socket(tmp_path: Path, token: str) -> None:
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        async with running_daemon(tmp_path, api_target(srv.url), token=token) as daemon:
            # Embedded use of the daemon's journal is refused, naming the socket.
            local = await embedded(
                "call", "-", "--config", str(daemon.config), stdin=action_bytes(), token=token
            )
            # A second daemon: on the same socket, refused; on another socket, the journal is.
            serve = [sys.executable, "-m", "affidavit", "serve", "--config", str(daemon.config)]
            again = await run(serve, env=client_env())
            other = await run([*serve, "--socket", str(tmp_path / "other.sock")], env=client_env())
            # Read-only views still open the journal.
            view = await embedded("actions", "--journal", str(daemon.journal))
            assert daemon.proc.poll() is None
        # The daemon gone, the journal is anyone's again.
        after = await embedded(
            "call", "-", "--config", str(daemon.config), stdin=action_bytes(), token=token
        )
    assert local.returncode == 2
    assert str(daemon.socket).encode() in local.stderr
    assert b"Traceback" not in local.stderr
    assert again.returncode == 2
    assert b"a daemon already listens on" in again.stderr
    assert other.returncode == 2
    assert b"is owned by affidavit serve" in other.stderr
    assert not (tmp_path / "other.sock").exists()
    assert view.returncode == 0
    assert after.returncode == 0, after.stderr
    assert len(srv.requests) == 1  # only the call made once the daemon had gone


async def test_one_call_over_max_calls_is_refused_503(tmp_path: Path, token: str) -> None:
    async with (
        HostileServer.running(scripts.held()) as srv,
        running_daemon(
            tmp_path,
            api_target(srv.url, timeout={"connect": 5, "total": 60}),
            token=token,
            service={"max_calls": 1, "shutdown_grace": 0.2},
        ) as daemon,
        trio.open_nursery() as nursery,
    ):

        async def first() -> None:
            async with Client.open(daemon.socket) as client:
                await client.call(action("/v1/hold"))

        nursery.start_soon(first)
        with trio.fail_after(WAIT):
            await srv.event("received").wait()
        over = await cli(daemon, "call", "-", stdin=action_bytes())
        daemon.signal(signal.SIGTERM)
    assert over.returncode == 2
    assert b"1 calls are running; call again later" in over.stderr
    assert len(srv.requests) == 1
    _ = subprocess  # (processes are started through kit.run)


_OPEN_FILES = """
import resource, sys
from affidavit.daemon import server
NOFILE = resource.RLIMIT_NOFILE
_, hard = resource.getrlimit(NOFILE)
resource.setrlimit(NOFILE, (256, hard if sys.argv[1] == "hard" else 300))
server._raise_open_files()
print(*resource.getrlimit(NOFILE), server.MAX_OPEN_FILES)
"""


@pytest.mark.parametrize("hard", ["hard", "300"])
async def test_serve_raises_the_soft_open_files_limit_to_the_hard_one(hard: str) -> None:
    """``affidavit serve`` starts by raising its soft RLIMIT_NOFILE to the hard limit (at most
    ``MAX_OPEN_FILES``): the usual 1024 is a default, not the daemon's need (its caps keep its
    own use far below it).  Run in a child, whose limits it may change."""
    done = await run([sys.executable, "-c", _OPEN_FILES, hard], env=client_env())
    assert done.returncode == 0, done.stderr
    soft, now_hard, most = map(int, done.stdout.split())
    expected = most if now_hard == -1 else min(now_hard, most)  # -1: RLIM_INFINITY
    assert soft == expected and soft > 256, done.stdout
    if hard == "300":
        assert (soft, now_hard) == (300, 300)


@pytest.mark.parametrize("where", ["too-long", "no-directory"])
async def test_a_socket_path_no_socket_can_have_is_refused_before_the_journal_is_opened(
    tmp_path: Path, where: str
) -> None:
    """``serve`` with a socket path longer than a Unix socket's (or in a directory that is not
    there) used to run start-up recovery -- writing the journal -- and only then fail to
    listen.  Now it stops first: exit 2, the reason, no journal written."""
    socket = (
        tmp_path / ("s" * 120) / "affidavit.sock"
        if where == "too-long"
        else tmp_path / "missing" / "affidavit.sock"
    )
    config = write_daemon_config(tmp_path, api_target("http://127.0.0.1:9"), socket=socket)
    if where == "too-long":
        socket.parent.mkdir()
    done = await run(
        [sys.executable, "-m", "affidavit", "serve", "--config", str(config)], env=client_env()
    )
    assert done.returncode == 2, done.stderr
    assert not any(tmp_path.glob("*.db")), sorted(p.name for p in tmp_path.iterdir())
    said = done.stderr.decode()
    assert "Traceback" not in said
    expected = (
        "at most 107 bytes"
        if where == "too-long"
        else f"{socket.parent} does not exist; create it, writable by the daemon's user only "
        f"(mkdir -m 0750 {socket.parent})"
    )
    assert expected in said, said


async def test_sigterm_stops_a_held_poll_at_the_grace_as_broker_shutdown(
    tmp_path: Path, token: str
) -> None:
    """A poll is a linked call to the remote, run by its request's handler: the grace waits for
    it and its end stops it where it is (BROKER_SHUTDOWN, unknown), and the poller is answered
    -- it is not cut off, unanswered, once the grace is over, as if its caller had gone."""

    async def jobs_then_held(peer: Peer) -> None:
        req = await peer.read_request()
        if req is None:
            return
        if req.method == "POST":  # the submission: a job with a status resource
            await peer.respond(Reply(202, headers=[("Location", "/v1/jobs/j1")], body=b"{}"))
            return
        peer.server.event("received").set()  # the poll: held for good
        await trio.sleep_forever()

    async with HostileServer.running(jobs_then_held) as srv:
        ops = {"status": "json:/state", "succeeded": ["done"], "failed": ["x"]}
        timeout = {"connect": 5, "total": 60}
        targets = api_target(srv.url, operations=ops, timeout=timeout)
        async with running_daemon(
            tmp_path, targets, token=token, service={"shutdown_grace": 1.0}
        ) as daemon:
            async with Client.open(daemon.socket) as client:
                submitted = await client.call(action("/v1/jobs", "POST"))
                op_id = submitted["operation"]["id"]
                answers: list[dict[str, Any]] = []

                async def poller() -> None:
                    answers.append(await client.poll_operation(op_id))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(poller)
                    with trio.fail_after(WAIT):
                        await srv.event("received").wait()
                    daemon.signal(signal.SIGTERM)
            assert await daemon.wait() == 0
    error = answers[0]["poll"]["error"]
    assert (error["code"], error["phase"], error["outcome"]) == (
        "BROKER_SHUTDOWN",
        "remote_execution",
        "unknown",
    ), answers
    assert "the grace ran out: 1 call(s) stopped (BROKER_SHUTDOWN)" in daemon.log_text()
