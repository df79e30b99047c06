"""The client killed after the server received its request (seed, "A result delivery error must
not repeat execution").  An MCP client is a process of its own (``client_process.py``) running
the real SDK client, which spawns ``affidavit mcp``; the remote holds the request until the test
releases it; the test kills the client with SIGKILL.

* Embedded, and the host then stops the server (SIGTERM, as MCP hosts do): the record says
  unknown -- BROKER_SHUTDOWN after dispatch, never not_attempted.
* Embedded, and the remote answers after the kill: the result is stored, the lost answer is
  RESULT_DELIVERY_FAILED, and a new connection's ``fetch_result`` returns it (a read).
* Through the daemon: the proxy hangs up on the daemon, which runs the call to its end, stores
  the result and records the failed delivery; a new connection's ``fetch_result`` (the same
  uid: the requester) returns it and records it delivered.

In every case the remote saw exactly one request.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import trio

from tests.broker.helpers import write_config
from tests.daemon.kit import running_daemon, wait_until
from tests.mcp.kit import PYTHON, WAIT, Connected, connected, env_without_secrets, structured

from .conftest import Remotes, wait_for

ROOT = Path(__file__).resolve().parents[2]
HELD = {"target": "holds", "method": "POST", "path": "/h", "body": "{}"}
HOLD = {"connect": 2, "total": 120}
"""The held target's timeout: each test releases (or stops) the held call itself, after
processes start and end (a client, ``affidavit mcp``, the daemon's proxy): longer than a
loaded machine takes, or the target's timeout (``http_target``'s 5 s) ends the attempt first."""


def targets(remotes: Remotes) -> dict[str, Any]:
    found = remotes.targets()
    found["holds"] = {**found["holds"], "timeout": HOLD}
    return found


def config(remotes: Remotes, tmp: Path) -> Path:
    return write_config(tmp, targets(remotes))


class Client:
    def __init__(self, proc: trio.Process, log: Path) -> None:
        self.proc = proc
        self.log = log
        self._buffer = b""

    async def line(self) -> Any:
        assert self.proc.stdout is not None
        with trio.fail_after(WAIT):
            while b"\n" not in self._buffer:
                data = await self.proc.stdout.receive_some(4096)
                assert data, f"the client ended early:\n{self.log.read_text()}"
                self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def server_pid(self) -> int:
        found = re.search(r"affidavit mcp\[(\d+)\]", self.log.read_text())
        assert found, self.log.read_text()
        return int(found.group(1))

    async def kill(self) -> None:
        self.proc.kill()
        with trio.fail_after(WAIT):
            await self.proc.wait()


async def start_client(args: list[str], env: dict[str, str], log: Path) -> tuple[Client, str]:
    spec = {"args": args, "log": str(log), "call": HELD}
    proc = await trio.lowlevel.open_process(
        [PYTHON, "-m", "tests.mcp.client_process", json.dumps(spec)],
        stdout=subprocess.PIPE,
        env={**env, "PYTHONPATH": str(ROOT)},
        cwd=str(ROOT),
    )
    client = Client(proc, log)
    return client, (await client.line())["session"]


async def killed_mid_call(
    args: list[str], env: dict[str, str], log: Path, remotes: Remotes
) -> tuple[int, str]:
    """A client process makes the held call; once the remote has it, the client is killed.
    Returns the server's pid and the connection's session."""
    client, session = await start_client(args, env, log)
    await wait_for(remotes.holds.event("received"))
    server = client.server_pid()
    await client.kill()
    return server, session


def read(tmp: Path) -> str:
    return (tmp / "client.log").read_text()


def alive(pid: int) -> bool:
    """Running (a zombie nobody reaps counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


async def ended(pid: int) -> bool:
    await wait_until(lambda: not alive(pid), f"affidavit mcp (pid {pid}) exits", WAIT)
    return True


async def the_call(mcp: Connected, session: str) -> dict[str, Any]:
    """The one call the killed client made, found by its session; its record and events."""
    rows = structured(await mcp.call("list_actions", {"session": session}))["actions"]
    assert len(rows) == 1, rows
    answer = structured(await mcp.call("get_record", {"invocation_id": rows[0]["invocation_id"]}))
    record: dict[str, Any] = answer["record"]
    record["kinds"] = [e["kind"] for e in answer["events"]]
    return record


async def test_embedded_client_killed_then_server_stopped_records_unknown(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    args, env = ["--config", str(config(remotes, tmp_path))], remotes.env(token)
    server, session = await killed_mid_call(args, env, tmp_path / "client.log", remotes)
    await wait_until(lambda: "the client closed its end" in read(tmp_path), "EOF seen")
    assert alive(server)  # the call runs on: nobody stopped it yet
    os.kill(server, signal.SIGTERM)  # the host stops its server
    await ended(server)

    async with connected(args, env, tmp_path / "mcp.log") as mcp:
        record = await the_call(mcp, session)
        assert (record["code"], record["phase"], record["outcome"]) == (
            "BROKER_SHUTDOWN",
            "remote_execution",
            "unknown",
        )
        assert "DISPATCH_STARTED" in record["kinds"]
        fetched = await mcp.call("fetch_result", {"invocation_id": record["invocation_id"]})
        assert fetched.is_error and structured(fetched)["error"]["outcome"] == "unknown"
    assert len(remotes.holds.requests) == 1


async def test_embedded_client_killed_result_stored_delivery_failed_fetched_later(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    args, env = ["--config", str(config(remotes, tmp_path))], remotes.env(token)
    server, session = await killed_mid_call(args, env, tmp_path / "client.log", remotes)
    await wait_until(lambda: "the client closed its end" in read(tmp_path), "EOF seen")
    remotes.holds.event("release").set()
    await ended(server)  # the call ran to its end, then the server left on its own

    async with connected(args, env, tmp_path / "mcp.log") as mcp:
        record = await the_call(mcp, session)
        assert record["outcome"] == "committed"
        assert record["kinds"][-1] == "RESULT_DELIVERY_FAILED"
        fetched = await mcp.call("fetch_result", {"invocation_id": record["invocation_id"]})
        assert fetched.is_error is False
        assert structured(fetched)["result"]["body"] == "late and done"

        # Recorded once the answer was written -- after the client could read it.
        async def delivered() -> bool:
            return (await the_call(mcp, session))["kinds"][-1] == "RESULT_DELIVERED"

        await wait_until(delivered, "the fetch is recorded as the delivery")
    assert len(remotes.holds.requests) == 1


async def test_through_the_daemon_a_killed_client_s_result_is_stored_and_fetched_later(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    async with running_daemon(tmp_path, targets(remotes), token=token) as daemon:
        args, env = ["--socket", str(daemon.socket)], env_without_secrets()
        server, session = await killed_mid_call(args, env, tmp_path / "client.log", remotes)
        await ended(server)  # the proxy left: it hung up on the daemon
        remotes.holds.event("release").set()

        async with connected(args, env, tmp_path / "mcp.log") as mcp:

            async def stored() -> bool:
                return (await the_call(mcp, session))["outcome"] == "committed"

            await wait_until(stored, "the daemon stores the result")
            record = await the_call(mcp, session)
            assert record["kinds"][-1] == "RESULT_DELIVERY_FAILED"
            fetched = await mcp.call("fetch_result", {"invocation_id": record["invocation_id"]})
            assert fetched.is_error is False
            assert structured(fetched)["result"]["body"] == "late and done"
            # The same uid reconnecting is the requester: its fetch is the delivery (a new
            # MCP connection, a new session -- a label, which decides nothing).
            assert "delivery" not in structured(fetched)
            assert (await the_call(mcp, session))["kinds"][-1] == "RESULT_DELIVERED"
    assert len(remotes.holds.requests) == 1


async def test_a_call_the_client_cancels_after_dispatch_runs_on_and_is_fetched(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    """The SDK client gives up on a call (its ``notifications/cancelled``): MCP forbids an answer
    then, so the stored result is RESULT_DELIVERY_FAILED; the same connection fetches it."""
    args, env = ["--config", str(config(remotes, tmp_path))], remotes.env(token)
    async with connected(args, env, tmp_path / "mcp.log") as mcp:
        session = structured(await mcp.call("list_targets"))["session"]
        with trio.move_on_after(WAIT) as waited:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(mcp.call, "http_request", HELD)
                await wait_for(remotes.holds.event("received"))
                nursery.cancel_scope.cancel()
        assert not waited.cancelled_caught
        # The server reads its input in order: once a request sent after the cancellation is
        # answered, the cancellation was read -- only then may the remote answer.  (Released
        # at once, a loaded server could finish the call and answer it before reading the
        # cancellation: RESULT_DELIVERED, rightly, and not the case under test.)
        await mcp.call("list_targets")
        remotes.holds.event("release").set()

        seen: list[list[str]] = []

        async def failed() -> bool:
            seen.append((await the_call(mcp, session))["kinds"])
            return seen[-1][-1] == "RESULT_DELIVERY_FAILED"

        try:
            await wait_until(failed, "the lost answer is recorded")
        except AssertionError:
            raise AssertionError(f"kinds: {seen[-1] if seen else None}") from None
        record = await the_call(mcp, session)
        fetched = await mcp.call("fetch_result", {"invocation_id": record["invocation_id"]})
        assert structured(fetched)["result"]["body"] == "late and done"
    assert len(remotes.holds.requests) == 1
