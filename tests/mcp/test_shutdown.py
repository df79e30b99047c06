"""``affidavit mcp`` ends as the daemon does: its input's end or SIGTERM stops the taking of
calls, the calls in flight get ``[service] shutdown_grace`` to finish, then the rest are stopped
and each records where it stood (BROKER_SHUTDOWN, unknown once dispatched) -- a remote holding a
call for its target's whole timeout (two minutes here) does not keep the process alive.

A real ``affidavit mcp`` process spoken to in raw JSON-RPC lines; the remote is a loopback
server that holds the request until it is released (never, here), or a real sshd running
``sleep 3600`` under an hour's exec timeout.  A signal while the grace runs stops at once."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from affidavit.mcp.backends import Daemon, Exchange
from affidavit.mcp.server import McpSession
from affidavit.mcp.transport import StdioTransport
from tests.broker.helpers import http_target, write_config
from tests.daemon.kit import running_daemon, wait_until
from tests.http.hostile import HostileServer, Peer, Reply
from tests.ssh.brokerkit import KEY_ENV, ssh_target
from tests.ssh.sshd import Sshd

from .conftest import Remotes, wait_for
from .kit import PYTHON, WAIT, connected, env_without_secrets, structured
from .test_delivery import the_call
from .test_protocol import FAST, HELD, INIT, Raw, call, session_of

GRACE = 1.0
SLOW = {"connect": 2, "total": 120}
"""The held target's timeout: far beyond every wait of these tests."""
HOUR = {"connect": 5, "total": 3600}


def config(tmp: Path, remotes: Remotes, grace: float = GRACE) -> Path:
    targets = remotes.targets()
    targets["holds"] = {**targets["holds"], "timeout": SLOW}
    path = write_config(tmp, targets)
    with path.open("a", encoding="utf-8") as out:
        out.write(f"[service]\nshutdown_grace = {grace}\n")
    return path


@asynccontextmanager
async def server(
    tmp: Path,
    cfg: Path | None,
    remotes: Remotes,
    token: str,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
) -> AsyncIterator[Raw]:
    """A real ``affidavit mcp`` process: embedded on ``cfg`` (None: ``args`` say where)."""
    log = tmp / "raw.log"
    where = () if cfg is None else ("--config", str(cfg))
    with log.open("ab") as errlog:
        proc = await trio.lowlevel.open_process(
            [PYTHON, "-m", "affidavit", "mcp", *where, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errlog,
            env=env if env is not None else remotes.env(token),
        )
    raw = Raw(proc, log)
    try:
        await raw.send(INIT)
        await raw.answer(0)
        await raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        yield raw
    finally:
        if proc.returncode is None:
            proc.kill()
        with trio.move_on_after(WAIT, shield=True):
            await proc.wait()


async def held_call(raw: Raw, remotes: Remotes) -> str:
    session = await session_of(raw)
    await raw.send(call(1, "http_request", HELD))
    await wait_for(remotes.holds.event("received"))
    return session


async def exits_within_grace(raw: Raw) -> int:
    """The exit code; the process must be gone well before the held call's own timeout."""
    with trio.fail_after(GRACE + 15):
        return await raw.proc.wait()


async def recorded(tmp: Path, cfg: Path, remotes: Remotes, token: str, session: str) -> Any:
    async with connected(["--config", str(cfg)], remotes.env(token), tmp / "mcp.log") as mcp:
        return await the_call(mcp, session)


async def test_input_end_waits_the_grace_then_stops_the_call_as_broker_shutdown(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    cfg = config(tmp_path, remotes)
    async with server(tmp_path, cfg, remotes, token) as raw:
        session = await held_call(raw, remotes)
        await raw.proc.stdin.aclose()  # type: ignore[union-attr]  # the agent is gone
        started = trio.current_time()
        assert await exits_within_grace(raw) == 0
        assert trio.current_time() - started >= GRACE * 0.9  # the grace was given
        assert "the grace ran out: 1 call(s) stopped (BROKER_SHUTDOWN)" in raw.stderr()

    record = await recorded(tmp_path, cfg, remotes, token, session)
    assert (record["code"], record["phase"], record["outcome"], record["retry"]) == (
        "BROKER_SHUTDOWN",
        "remote_execution",
        "unknown",
        "same_idempotency_key",  # the target takes an Idempotency-Key: resume it
    )
    assert "DISPATCH_STARTED" in record["kinds"]
    assert "RESULT_DELIVERED" not in record["kinds"]
    assert len(remotes.holds.requests) == 1


async def test_sigterm_refuses_new_calls_answers_the_stopped_one_and_exits(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    """After SIGTERM the connection stays open through the grace: a new call is refused with
    nothing run, and the stopped call's envelope still reaches the client."""
    cfg = config(tmp_path, remotes)
    async with server(tmp_path, cfg, remotes, token) as raw:
        session = await held_call(raw, remotes)
        raw.proc.send_signal(signal.SIGTERM)
        await wait_until(lambda: "signal 15: stopping" in raw.stderr(), "the signal is taken")
        await raw.send(call(2, "http_request", FAST))
        refused: dict[str, Any] = (await raw.answer(2))["result"]["structuredContent"]
        assert refused["api_error"]["code"] == "SHUTTING_DOWN", refused
        assert refused["api_error"]["outcome"] == "not_attempted", refused  # nothing ran
        stopped: dict[str, Any] = (await raw.answer(1))["result"]["structuredContent"]
        assert await exits_within_grace(raw) == 0

    error = stopped["error"]
    assert (error["code"], error["phase"], error["outcome"], error["retry"]) == (
        "BROKER_SHUTDOWN",
        "remote_execution",
        "unknown",
        "same_idempotency_key",  # the target takes an Idempotency-Key: resume it
    )
    record = await recorded(tmp_path, cfg, remotes, token, session)
    assert (record["code"], record["outcome"]) == ("BROKER_SHUTDOWN", "unknown")
    assert not remotes.ok.requests
    assert len(remotes.holds.requests) == 1


async def test_a_signal_while_the_grace_runs_stops_the_rest_at_once(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    """A host that closed the input and then signals (or a second signal) does not wait out a
    long grace: the calls are stopped now."""
    cfg = config(tmp_path, remotes, grace=120)
    async with server(tmp_path, cfg, remotes, token) as raw:
        session = await held_call(raw, remotes)
        await raw.proc.stdin.aclose()  # type: ignore[union-attr]
        await wait_until(lambda: "still running (grace 120s)" in raw.stderr(), "the grace runs")
        raw.proc.send_signal(signal.SIGTERM)
        assert await exits_within_grace(raw) == 0
    record = await recorded(tmp_path, cfg, remotes, token, session)
    assert (record["code"], record["outcome"]) == ("BROKER_SHUTDOWN", "unknown")


async def test_an_ssh_command_with_an_hour_s_timeout_is_stopped_at_the_grace(
    tmp_path: Path, remotes: Remotes, token: str, sshd: Sshd
) -> None:
    targets = {"box": ssh_target(sshd.port, sshd.user, sshd.host_pin, timeout=HOUR)}
    cfg = write_config(tmp_path, targets)
    with cfg.open("a", encoding="utf-8") as out:
        out.write(f"[service]\nshutdown_grace = {GRACE}\n")
    env = env_without_secrets(**{KEY_ENV: sshd.client_key.decode()})
    async with server(tmp_path, cfg, remotes, token, env=env) as raw:
        session = await session_of(raw)
        await raw.send(call(1, "ssh_exec", {"target": "box", "command": "sleep 3600"}))

        async def dispatched() -> bool:
            await raw.send(call("l", "list_actions", {}))
            rows = (await raw.answer("l"))["result"]["structuredContent"]["actions"]
            return [r["state"] for r in rows] == ["dispatched"]

        await wait_until(dispatched, "the command runs on the remote")
        await raw.proc.stdin.aclose()  # type: ignore[union-attr]
        assert await exits_within_grace(raw) == 0

    async with connected(["--config", str(cfg)], env, tmp_path / "mcp.log") as mcp:
        record = await the_call(mcp, session)
    assert (record["code"], record["phase"], record["outcome"]) == (
        "BROKER_SHUTDOWN",
        "remote_execution",
        "unknown",
    )
    assert "DISPATCH_STARTED" in record["kinds"]


async def test_the_proxy_stopped_at_the_grace_says_it_stopped_and_the_daemon_keeps_the_call(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    """Through the daemon, the grace's end hangs up on the daemon: the answer says the proxy
    stopped (not that the client left) and where the call is to be found; the daemon runs it on."""
    async with (
        running_daemon(tmp_path, remotes.targets(), token=token) as daemon,
        Daemon.open(str(daemon.socket)) as backend,
    ):
        answers: list[dict[str, Any]] = []

        async def one() -> None:
            answers.append(await backend.call({**HELD, "session": "s1"}, Exchange()))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            await wait_for(remotes.holds.event("received"))
            backend.stop()
        assert answers[0]["api_error"]["code"] == "SHUTTING_DOWN", answers
        # Sent, then hung up on: it may have run -- never resent blindly, found in its session.
        lost = answers[0]["api_error"]
        assert (lost["outcome"], lost["retry"]) == ("unknown", "reconcile"), lost
        assert "list_actions (session s1)" in lost["message"]
        remotes.holds.event("release").set()

        async def stored() -> bool:
            rows = (await backend.actions("s1", None, 10))["actions"]
            return [r["outcome"] for r in rows] == ["committed"]

        await wait_until(stored, "the daemon runs the call to its end")
    assert len(remotes.holds.requests) == 1


async def test_a_signal_just_after_the_input_ended_stops_at_once_before_the_grace_began() -> None:
    """The input's end is seen by the transport a moment before the session learns it; a
    signal in between (the host closed the input, then signalled) must not start a fresh grace:
    ``tests/mcp/test_delivery.py`` met that under load."""
    server_in, _ = trio.testing.memory_stream_one_way_pair()
    _, server_out = trio.testing.memory_stream_one_way_pair()
    transport = StdioTransport(server_in, server_out)  # type: ignore[arg-type]
    session = McpSession(None, transport, "mcp-x")  # type: ignore[arg-type]
    transport.hung_up.set()  # the transport saw the end of input ...
    assert not session.ending.is_set()  # ... the session not yet
    session.end()  # the signal
    assert session.ending.is_set() and session.grace.cancel_called


async def _jobs_then_held(peer: Peer) -> None:
    """A job's origin: its submission answered 202 with a status resource, every later
    request (the poll) held for good."""
    req = await peer.read_request()
    if req is None:
        return
    if req.method == "POST":  # the submission: a job with a status resource
        await peer.respond(Reply(202, headers=[("Location", "/v1/jobs/j1")], body=b"{}"))
        return
    peer.server.event("received").set()  # the poll: held for good
    await trio.sleep_forever()


OPS = {"status": "json:/state", "succeeded": ["done"], "failed": ["x"]}


async def test_a_poll_held_by_its_remote_is_stopped_at_the_grace_as_broker_shutdown(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    """``poll_operation`` sends a linked invocation to the remote as a call does: the grace's
    end stops it where it is (BROKER_SHUTDOWN), as it stops a call -- not left to run another
    grace and then cut off as if its caller had cancelled it.  The poll goes to the origin the
    submission went to (a target re-pointed elsewhere is refused before anything is sent)."""
    async with HostileServer.running(_jobs_then_held) as srv:
        targets = {
            **remotes.targets(),
            "jobs": http_target(srv.url + "/v1", operations=OPS, timeout=SLOW),
        }
        cfg = write_config(tmp_path, targets)
        with cfg.open("a", encoding="utf-8") as out:
            out.write(f"[service]\nshutdown_grace = {GRACE}\n")
        env = remotes.env(token)
        async with connected(["--config", str(cfg)], env, tmp_path / "mcp.log") as mcp:
            job = {"target": "jobs", "method": "POST", "path": "/"}
            got = await mcp.call("http_request", job)
            op_id = structured(got)["operation"]["id"]
        async with server(tmp_path, cfg, remotes, token) as raw:
            await raw.send(call(1, "poll_operation", {"operation_id": op_id}))
            await wait_for(srv.event("received"))
            raw.proc.send_signal(signal.SIGTERM)
            started = trio.current_time()
            reply = await raw.answer(1)  # answers are still written after a signal
            assert trio.current_time() - started < GRACE + 3  # not another grace and RECORD_WAIT
            assert await exits_within_grace(raw) == 0
    assert "result" in reply, reply
    polled: dict[str, Any] = reply["result"]["structuredContent"]
    error = polled["poll"]["error"]
    assert (error["code"], error["phase"], error["outcome"]) == (
        "BROKER_SHUTDOWN",
        "remote_execution",
        "unknown",
    ), polled


async def test_the_proxy_stopped_at_the_grace_hangs_up_a_held_poll_and_says_it_stopped(
    tmp_path: Path, token: str
) -> None:
    """Through the daemon, a poll held by its remote is hung up on at the grace's end as a call
    is, and answered that the proxy stopped -- not left running, to be cut off unanswered."""

    async with HostileServer.running(_jobs_then_held) as srv:
        targets = {"jobs": http_target(srv.url + "/v1", operations=OPS, timeout=SLOW)}
        async with (
            running_daemon(
                tmp_path, targets, token=token, service={"shutdown_grace": 0.5}
            ) as daemon,
            Daemon.open(str(daemon.socket)) as backend,
        ):
            job = {"target": "jobs", "method": "POST", "path": "/", "session": "s1"}
            op_id = (await backend.call(job, Exchange()))["operation"]["id"]
            answers: list[dict[str, Any]] = []

            async def one() -> None:
                answers.append(await backend.poll_operation(op_id))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(one)
                await wait_for(srv.event("received"))
                with trio.fail_after(5):  # at once, not after the daemon's own timeout
                    backend.stop()
                    while not answers:
                        await trio.sleep(0.01)
    assert answers[0]["api_error"]["code"] == "SHUTTING_DOWN", answers
    assert "affidavit mcp stopped before the daemon answered" in answers[0]["api_error"]["message"]


async def test_the_proxy_takes_its_grace_from_its_command_line(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    """The proxy reads no config: ``--shutdown-grace`` is how its grace is set (it was fixed
    at 30 s).  Stopped by SIGTERM with a call held, it answers SHUTTING_DOWN after that grace."""
    async with running_daemon(tmp_path, remotes.targets(), token=token) as daemon:
        args = ("--socket", str(daemon.socket), "--shutdown-grace", str(GRACE))
        async with server(tmp_path, None, remotes, token, env_without_secrets(), args) as raw:
            await held_call(raw, remotes)
            raw.proc.send_signal(signal.SIGTERM)
            started = trio.current_time()
            stopped: dict[str, Any] = (await raw.answer(1))["result"]["structuredContent"]
            waited = trio.current_time() - started
            assert await exits_within_grace(raw) == 0
        remotes.holds.event("release").set()  # the daemon runs it to its end
    assert f"still running (grace {GRACE:g}s)" in raw.stderr()
    assert GRACE * 0.9 <= waited < GRACE + 5, waited  # this grace, not the default 30 s
    assert stopped["api_error"]["code"] == "SHUTTING_DOWN", stopped


async def test_an_embedded_server_s_grace_on_its_command_line_beats_the_config_s(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    cfg = config(tmp_path, remotes, grace=120)
    args = ("--shutdown-grace", f"{GRACE:g}")
    async with server(tmp_path, cfg, remotes, token, args=args) as raw:
        session = await held_call(raw, remotes)
        await raw.proc.stdin.aclose()  # type: ignore[union-attr]  # the agent is gone
        assert await exits_within_grace(raw) == 0  # not after the config's 120 s
    assert f"still running (grace {GRACE:g}s)" in raw.stderr()
    record = await recorded(tmp_path, cfg, remotes, token, session)
    assert (record["code"], record["outcome"]) == ("BROKER_SHUTDOWN", "unknown")


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan", "inf", "1e400", ""])
async def test_a_grace_that_is_no_duration_is_refused_named(tmp_path: Path, value: str) -> None:
    argv = ["mcp", "--socket", str(tmp_path / "s"), "--shutdown-grace", value]
    done = await trio.run_process(
        [PYTHON, "-m", "affidavit", *argv],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=env_without_secrets(),
    )
    assert done.returncode == 2
    assert done.stderr.startswith(b"affidavit: INVALID_FIELD: --shutdown-grace: must "), done.stderr
    assert b"Traceback" not in done.stderr
    assert done.stdout == b""


async def test_a_call_awaiting_approval_at_the_grace_s_end_claims_nothing_it_did_not_do(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    """Embedded, a call waiting for an operator's yes when the grace runs out: nothing was
    sent and no DISPATCH_STARTED written, so neither the answer nor the record may say
    unknown or dispatched -- BROKER_SHUTDOWN (not attempted) or the approval's own outcome."""
    targets = remotes.targets()
    approval = {"methods": ["GET"], "ttl": "15m", "wait": "10m"}
    targets["ok"] = {**targets["ok"], "approval": approval}
    cfg = write_config(tmp_path, targets)
    with cfg.open("a", encoding="utf-8") as out:
        out.write(f"[service]\nshutdown_grace = {GRACE}\noperator_uids = [4242]\n")
    async with server(tmp_path, cfg, remotes, token) as raw:
        session = await session_of(raw)
        await raw.send(call(1, "http_request", FAST))

        async def awaiting() -> bool:
            await raw.send(call("a", "list_actions", {"session": session}))
            rows = (await raw.answer("a"))["result"]["structuredContent"]["actions"]
            return [r["state"] for r in rows] == ["awaiting_approval"]

        await wait_until(awaiting, "the call waits for an operator")
        raw.proc.send_signal(signal.SIGTERM)
        started = trio.current_time()
        answer: dict[str, Any] = (await raw.answer(1))["result"]["structuredContent"]
        waited = trio.current_time() - started
        assert await exits_within_grace(raw) == 0
    assert waited >= GRACE * 0.9  # stopped at the grace's end, not before
    assert "the grace ran out: 1 call(s) stopped (BROKER_SHUTDOWN)" in raw.stderr()
    record = await recorded(tmp_path, cfg, remotes, token, session)
    assert not remotes.ok.requests  # nothing sent
    # The approval's own outcome: it stays open (a daemon sends it once approved, or it
    # expires), nothing was sent, and the caller is told to fetch the result -- never unknown.
    error = answer["error"]
    assert (error["code"], error["phase"], error["outcome"], error["retry"]) == (
        "APPROVAL_PENDING",
        "credential_injection",
        "not_attempted",
        "fetch_result",
    )
    assert answer["evidence"]["dispatch_started"] is False
    assert (record["state"], record["code"], record["outcome"]) == (
        "awaiting_approval",
        "APPROVAL_PENDING",
        "not_attempted",
    )
    assert record["kinds"] == ["ACTION_ACCEPTED", "PREFLIGHT_VALIDATED", "APPROVAL_REQUESTED"]
