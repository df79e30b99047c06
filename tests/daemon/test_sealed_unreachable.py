"""The operator's sealed detail (why a credential failed: its reference, the file, the OS's
words) opens only with ``affidavit journal open-sealed`` run embedded with the broker key file
(affidavit/cli/sealed.py).  A caller reaches the broker through the daemon's socket or MCP: no
answer there -- the envelope, the record, the events, every listing, a guessed route, every MCP
tool -- carries it.  Not vacuous: the detail is sealed in the journal, and the operator opens it
afterwards from the same journal."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from affidavit.api.wire import blocking_request
from affidavit.mcp.tools import READ_TOOLS
from tests.mcp.kit import connected, env_without_secrets, structured

from .kit import cli, embedded, running_daemon

CANARY = "CANARY-sealed-daemon-41b9"


async def _get(socket: Path, target: str) -> tuple[int, bytes]:
    answer = await trio.to_thread.run_sync(blocking_request, str(socket), "GET", target)
    return answer.status, answer.body


async def test_no_socket_route_and_no_mcp_tool_returns_the_sealed_detail(
    tmp_path: Path,
) -> None:
    loose = tmp_path / "loose-token-file"
    loose.write_text(CANARY)
    loose.chmod(0o600)
    target = {
        "kind": "http",
        "url": "http://127.0.0.1:9",
        "methods": ["GET"],
        "credential": f"file:{loose}",
        "inject": "bearer",
    }
    seen: list[bytes] = []
    async with running_daemon(tmp_path, {"api": target}, token=None) as daemon:
        loose.chmod(0o644)  # (after the start, which refuses it) the call's detail names it
        body = json.dumps({"target": "api", "method": "GET", "path": "/"}).encode()
        answer = await trio.to_thread.run_sync(
            blocking_request, str(daemon.socket), "POST", "/v1/calls", body
        )
        envelope = json.loads(answer.body)
        iid = envelope["invocation_id"]
        assert envelope["error"]["code"] == "CREDENTIAL_INVALID", envelope
        seen.append(answer.body)
        for route in (
            f"/v1/invocations/{iid}",
            f"/v1/invocations/{iid}/result",
            "/v1/actions",
            "/v1/sessions",
            "/v1/metrics",
            "/v1/catalog",
            "/v1/health",
        ):
            status, got = await _get(daemon.socket, route)
            assert status == 200, (route, got)
            seen.append(got)
        for guess in ("sealed", "detail", "payload", "open-sealed", "events"):
            status, got = await _get(daemon.socket, f"/v1/invocations/{iid}/{guess}")
            assert status == 404, (guess, got)
            seen.append(got)
        for args, status in ((("record", iid, "--json"), 0), (("result", iid), 1)):
            done = await cli(daemon, *args)
            assert done.returncode == status, (args, done.stderr)  # 1: an error envelope
            seen += [done.stdout, done.stderr]
        # The command has no way to the daemon: it takes no --socket at all.
        refused = await cli(daemon, "journal", "open-sealed", iid)
        assert refused.returncode == 2 and b"unrecognized arguments: --socket" in refused.stderr
        assert refused.stdout == b""

        # The caller's MCP server, through the same daemon: every read tool it offers.
        log = tmp_path / "mcp.log"
        args = ["--socket", str(daemon.socket)]
        async with connected(args, env_without_secrets(), log) as mcp:
            tools = {t.name for t in (await mcp.session.list_tools()).tools}
            assert tools == {"http_request"} | set(READ_TOOLS), tools
            called = structured(await mcp.call("http_request", {**json.loads(body)}))
            assert called["error"]["code"] == "CREDENTIAL_INVALID", called
            for tool, arguments in (
                ("get_record", {"invocation_id": iid}),
                ("fetch_result", {"invocation_id": iid}),
                ("get_record", {"invocation_id": called["invocation_id"]}),
                ("list_actions", {}),
                ("list_targets", {}),
            ):
                await mcp.call(tool, arguments)
            seen += [m.encode() for m in mcp.wire]
    log_text = daemon.log.read_bytes()
    for blob in seen:
        # (The caller may learn the mode -- the message says what is wrong -- never where.)
        assert b"loose-token-file" not in blob, blob[:300]
        assert CANARY.encode() not in blob
    assert CANARY.encode() not in log_text

    # The operator, with the broker key file, opens what no answer above carried.
    opened = await embedded("journal", "open-sealed", iid, "--config", str(daemon.config), "--json")
    assert opened.returncode == 0, opened.stderr
    sealed = {s["kind"]: s["payload"] for s in json.loads(opened.stdout)["sealed"]}
    detail = sealed["CREDENTIAL_FAILED"]["detail"]
    assert detail.startswith(f"file:{loose}: ") and "mode 0644" in detail, detail
    assert detail.encode() in log_text  # the daemon's log line: the operator's, too
    assert all(detail.encode() not in blob for blob in seen)
    assert CANARY.encode() not in opened.stdout + opened.stderr
