"""The privilege boundary and the caller's end of it: who may connect, what a client without the
broker's files still gets, and what a client that goes away leaves behind.

Seed, "A result delivery error must not repeat execution": a caller that hangs up after dispatch
does not abandon the effect -- the daemon finishes, stores the result and records the failed
delivery; the result is fetched, never re-run.  Before dispatch the call is withdrawn
(CALLER_CANCELLED, not_attempted).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import stat
from pathlib import Path

import pytest
import trio

from affidavit.api.client import Client
from affidavit.daemon import server as daemon_server
from affidavit.daemon.admission import Server
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import HostileServer, Reply, scripts, unresponsive_listener

from .kit import (
    NOBODY,
    WAIT,
    action_bytes,
    api_target,
    as_user,
    cli,
    client_env,
    curl_api,
    in_process,
    run,
    running_daemon,
    start_caller,
    wait_until,
)


async def _final_record(client: Client, states: tuple[str, ...] = ()) -> dict[str, object]:
    """The only record, once final (and, with ``states``, in one of them)."""

    async def final() -> dict[str, object] | None:
        rows = (await client.actions())["actions"]
        if rows and rows[0]["final"] and (not states or rows[0]["state"] in states):
            return rows[0]
        return None

    found: dict[str, object] = await wait_until(final, f"the record reached {states or 'final'}")
    return found


async def test_a_client_killed_after_the_remote_got_the_request_finds_its_result_stored(
    tmp_path: Path, token: str
) -> None:
    ok = Reply(200, body=b'{"charged": true}')
    async with (
        HostileServer.running(scripts.held(ok)) as srv,
        running_daemon(tmp_path, api_target(srv.url), token=token) as daemon,
    ):
        caller = await start_caller(daemon, action_bytes("/v1/charge", "POST", body="{}"))
        with trio.fail_after(WAIT):
            await srv.event("received").wait()
        caller.kill()
        with trio.fail_after(WAIT):
            await caller.wait()
        srv.event("release").set()

        async with Client.open(daemon.socket) as client:
            record = await _final_record(
                client, ("delivery_failed_committed", "delivered_committed")
            )
            assert record["state"] == "delivery_failed_committed"
            assert (record["phase"], record["outcome"], record["retry"]) == (
                "result_delivery",
                "committed",
                "fetch_result",
            )
            iid = str(record["invocation_id"])

            fetched = await cli(daemon, "result", iid)
            envelope = fetched.json()
            assert envelope["result"]["status"] == 200
            assert json.loads(envelope["result"]["body"]) == {"charged": True}
            events = [e["kind"] for e in await client.events(iid)]
        # Stored, then the failed answer, then the fetch that delivered it -- and one request.
        tail = events[events.index("RESULT_COMMITTED") :]
        assert tail == ["RESULT_COMMITTED", "RESULT_DELIVERY_FAILED", "RESULT_DELIVERED"]
        assert fetched.returncode == 0
        assert len(srv.requests) == 1


async def test_a_client_gone_before_dispatch_withdraws_the_call(tmp_path: Path, token: str) -> None:
    async with unresponsive_listener() as port:
        target = api_target(f"http://127.0.0.1:{port}", timeout={"connect": 15, "total": 20})
        async with running_daemon(tmp_path, target, token=token) as daemon:
            caller = await start_caller(daemon, action_bytes("/v1/charge", "POST", body="{}"))
            async with Client.open(daemon.socket) as client:

                async def connecting() -> bool:
                    rows = (await client.actions())["actions"]
                    return bool(rows) and rows[0]["state"] == "authorized"

                await wait_until(connecting, "the call is in connection setup")
                caller.kill()
                with trio.fail_after(WAIT):
                    await caller.wait()
                # Well before the 15 s connect timeout: the hang-up itself ended the call.
                with trio.fail_after(5):
                    record = await _final_record(client)
            events = [e["kind"] for e in await _events(daemon.socket, str(record["invocation_id"]))]
    assert (record["code"], record["phase"], record["outcome"], record["retry"]) == (
        "CALLER_CANCELLED",
        "connection_setup",
        "not_attempted",
        "backoff",
    )
    assert "DISPATCH_STARTED" not in events


async def _half_close_then_read(socket: Path, request: bytes, *, sent: trio.Event | None) -> bytes:
    """Send ``request``, then shut the write side (``shutdown(SHUT_WR)``, as ``nc -N`` or
    ``socat`` does once its input ends) -- after ``sent`` is set, if given -- and read what the
    daemon writes until it closes."""
    stream = await trio.open_unix_socket(str(socket))
    async with stream:
        await stream.send_all(request)
        if sent is not None:
            await sent.wait()
        await stream.send_eof()
        answer = b""
        with trio.fail_after(WAIT):
            while chunk := await stream.receive_some():
                answer += chunk
    return answer


async def test_a_caller_that_half_closes_after_its_request_has_hung_up(
    tmp_path: Path, token: str
) -> None:
    """End of stream is a hang-up, a half-close included: a read on the socket cannot tell
    ``shutdown(SHUT_WR)`` from a close, and withdrawing a call whose caller left is the point.
    So the call is withdrawn (CALLER_CANCELLED, not_attempted) and nothing is written back;
    a read is answered at once, before the end of the stream is seen (docs/deployment.md, "A
    caller that goes away": keep the write side open until the answer)."""
    body = action_bytes("/v1/charge", "POST", body="{}")
    call = b"POST /v1/calls HTTP/1.1\r\nhost: a\r\ncontent-length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )
    async with unresponsive_listener() as port:
        target = api_target(f"http://127.0.0.1:{port}", timeout={"connect": 15, "total": 20})
        async with (
            running_daemon(tmp_path, target, token=token) as daemon,
            Client.open(daemon.socket) as client,
            trio.open_nursery() as nursery,
        ):
            connecting = trio.Event()
            answers: list[bytes] = []

            async def caller() -> None:
                answers.append(await _half_close_then_read(daemon.socket, call, sent=connecting))

            nursery.start_soon(caller)

            async def in_setup() -> bool:
                rows = (await client.actions())["actions"]
                return bool(rows) and rows[0]["state"] == "authorized"

            await wait_until(in_setup, "the call is in connection setup")
            connecting.set()
            with trio.fail_after(5):  # well before the 15 s connect timeout
                record = await _final_record(client)
            health = b"GET /v1/health HTTP/1.1\r\nhost: a\r\n\r\n"
            read = await _half_close_then_read(daemon.socket, health, sent=None)
            events = [e["kind"] for e in await client.events(str(record["invocation_id"]))]
    assert answers == [b""]  # not a byte of an answer: the call's caller was gone
    assert (record["code"], record["phase"], record["outcome"]) == (
        "CALLER_CANCELLED",
        "connection_setup",
        "not_attempted",
    )
    assert "DISPATCH_STARTED" not in events
    assert read.startswith(b"HTTP/1.1 200 "), read


async def _events(socket: Path, iid: str) -> list[dict[str, object]]:
    async with Client.open(socket) as client:
        return await client.events(iid)


async def _send_late_then_read(socket: Path) -> bytes:
    """Send a request head, wait until the daemon has surely answered, send its body, then read
    what the daemon wrote -- as a client whose request crossed the answer does."""
    body = b"x" * 8192
    stream = await trio.open_unix_socket(str(socket))
    async with stream:
        head = b"POST /v1/calls HTTP/1.1\r\nhost: a\r\ncontent-length: %d\r\n\r\n" % len(body)
        await stream.send_all(head)
        await trio.sleep(0.3)
        await stream.send_all(body)  # a broken pipe here without the lingering close
        await stream.send_eof()
        answer = b""
        with trio.fail_after(WAIT):
            while chunk := await stream.receive_some():
                answer += chunk
    return answer


async def test_a_uid_not_allowed_is_refused_with_403_and_a_log_line(
    tmp_path: Path, token: str, curl: str
) -> None:
    me = os.geteuid()
    someone_else = me + 12345
    async with (
        HostileServer.running(scripts.held(Reply(200))) as srv,
        running_daemon(
            tmp_path, api_target(srv.url), token=token, service={"allow_uids": [someone_else]}
        ) as daemon,
    ):
        by_cli = await cli(daemon, "call", "-", stdin=action_bytes())
        status, body = await curl_api(curl, daemon.socket, "/v1/calls", action_bytes())
        late = await _send_late_then_read(daemon.socket)
        log = daemon.log_text()
    # A client still sending when its answer came (curl's request crossing the 403) may finish
    # sending and then reads the answer: a lingering close, not a broken pipe.
    assert late.startswith(b"HTTP/1.1 403 ")
    assert b"PEER_REFUSED" in late
    assert by_cli.returncode == 2
    assert f"uid {me} may not use this broker".encode() in by_cli.stderr
    assert by_cli.stdout == b""
    assert status == 403
    assert body["api_error"]["code"] == "PEER_REFUSED"
    assert f"refused peer uid={me} " in log
    assert srv.requests == []


def test_the_socket_is_0660_and_the_daemons_own_files_0600(tmp_path: Path, token: str) -> None:
    async def main() -> tuple[int, dict[str, int]]:
        async with running_daemon(tmp_path, api_target("http://127.0.0.1:9"), token=token) as d:
            own = [d.journal, Path(f"{d.journal}.key"), Path(f"{d.journal}.lock")]
            return os.stat(d.socket).st_mode, {p.name: stat.S_IMODE(p.stat().st_mode) for p in own}

    mode, files = trio.run(main)
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o660
    assert files == {"journal.db": 0o600, "journal.db.key": 0o600, "journal.db.lock": 0o600}


CLIENT_SCRIPT = """
import json, sys, trio, affidavit

async def main():
    async with affidavit.Client.open() as client:   # the socket from $AFFIDAVIT_SOCKET
        envelope = await client.call(json.loads(sys.argv[1]))
        print(json.dumps(envelope))

trio.run(main)
"""


async def test_a_client_of_another_uid_without_the_brokers_files_gets_results(
    tmp_path: Path, token: str, shared_socket_dir: Path
) -> None:
    ok = Reply(200, body=b'{"deployed": "v7"}')
    async with (
        HostileServer.running(scripts.serve(ok)) as srv,
        running_daemon(
            tmp_path,
            api_target(srv.url),
            token=token,
            service={"allow_gids": [NOBODY]},
            socket_dir=shared_socket_dir,
        ) as daemon,
    ):
        env = client_env(daemon.socket)
        env["HOME"] = "/nonexistent"
        assert token not in "".join(env.values())

        # Nothing of the broker's is readable to this client: journal, key, config.
        for secret_file in (daemon.journal, Path(f"{daemon.journal}.key"), daemon.config):
            probe = await run(as_user(NOBODY, "-c", f"open({str(secret_file)!r}).read()"), env=env)
            assert probe.returncode == 1 and b"PermissionError" in probe.stderr, secret_file

        cli_argv = as_user(NOBODY, "-m", "affidavit", "call", "-")
        by_cli = await run(cli_argv, stdin=action_bytes(), env=env)
        action = json.dumps({"target": "api", "method": "GET", "path": "/v1/x"})
        by_client = await run(as_user(NOBODY, "-c", CLIENT_SCRIPT, action), env=env)
    assert by_cli.returncode == 0, by_cli.stderr
    assert by_client.returncode == 0, by_client.stderr
    for envelope in (by_cli.json(), json.loads(by_client.stdout)):
        assert json.loads(envelope["result"]["body"]) == {"deployed": "v7"}
    assert [r.header("authorization") for r in srv.requests] == [f"Bearer {token}"] * 2
    _ = signal  # (SIGKILL above is sent through Process.kill)


async def test_an_answer_not_taken_within_write_wait_is_not_recorded_delivered(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller that sends its call and never reads the answer: the write gives up after
    ``write_wait`` (h11server.py) and the link says broken, so the stored result is
    RESULT_DELIVERY_FAILED -- never RESULT_DELIVERED -- and the caller fetches it.

    The daemon runs in this process (``Daemon.run``, as ``affidavit serve`` runs it) so that its
    ``Server`` can be given a short ``write_wait``; the answer is larger than a Unix socket's
    buffers hold."""
    monkeypatch.setattr(daemon_server, "Server", functools.partial(Server, write_wait=0.3))
    monkeypatch.setenv(TOKEN_ENV, token)
    big = Reply(200, headers=[("Content-Type", "text/plain")], body=b"x" * 900_000)
    async with in_process(tmp_path, scripts.serve(big)) as (srv, socket):
        stream = await trio.open_unix_socket(str(socket))
        body = action_bytes()
        await stream.send_all(
            b"POST /v1/calls HTTP/1.1\r\nhost: affidavit\r\ncontent-length: %d\r\n\r\n%s"
            % (len(body), body)
        )  # and never read (until the end)
        async with Client.open(socket) as client:
            record = await _final_record(
                client, ("delivery_failed_committed", "delivered_committed")
            )
            events = [e["kind"] for e in await client.events(str(record["invocation_id"]))]
        unread = 0
        with trio.fail_after(WAIT):  # the daemon closed it: what the kernel held, then the end
            while data := await stream.receive_some(1 << 20):
                unread += len(data)
        await stream.aclose()
    assert record["state"] == "delivery_failed_committed"
    assert (record["phase"], record["outcome"], record["retry"]) == (
        "result_delivery",
        "committed",
        "fetch_result",
    )
    assert events[events.index("RESULT_COMMITTED") :] == [
        "RESULT_COMMITTED",
        "RESULT_DELIVERY_FAILED",
    ]
    assert 0 < unread < len(big.body)
    assert len(srv.requests) == 1
