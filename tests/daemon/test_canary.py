"""Canary through the daemon: the credential lives only in the daemon's process.  A remote that
echoes the Authorization header back (in its body and a header) is called through every client;
then every API answer, every client's output and the daemon's whole log are searched for the
canary -- raw and base64 -- and it is in none of them.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import trio

from affidavit.api.client import Client
from tests.http.hostile import HostileServer, Received, Reply, scripts

from .kit import action, action_bytes, api_target, cli, curl_api, running_daemon


def _echo(req: Received) -> Reply:
    auth = req.header("authorization") or ""
    return Reply(200, headers=[("X-Echo", auth)], body=json.dumps({"you_sent": auth}).encode())


def _forms(secret: str) -> list[bytes]:
    raw = secret.encode()
    return [raw, base64.b64encode(raw), base64.urlsafe_b64encode(raw)]


async def test_the_canary_is_in_no_answer_no_client_output_and_no_daemon_log(
    tmp_path: Path, token: str, curl: str
) -> None:
    seen: list[bytes] = []
    async with HostileServer.running(scripts.serve(_echo)) as srv:
        targets = {
            "api": api_target(srv.url)["api"],
            "down": api_target("http://127.0.0.1:9", methods=["GET"])["api"],
        }
        async with running_daemon(tmp_path, targets, token=token) as daemon:
            by_cli = await cli(daemon, "call", "-", stdin=action_bytes("/v1/echo"))
            iid = by_cli.json()["invocation_id"]
            seen += [by_cli.stdout, by_cli.stderr]
            for args in (
                ("result", iid),
                ("record", iid),
                ("record", iid, "--json"),
                ("actions", "--json"),
                ("sessions", "--json"),
                ("metrics", "--prometheus"),
            ):
                done = await cli(daemon, *args)
                assert done.returncode == 0, (args, done.stderr)
                seen += [done.stdout, done.stderr]
            down = await cli(
                daemon, "call", "-", stdin=json.dumps({**action(), "target": "down"}).encode()
            )
            seen += [down.stdout, down.stderr]
            async with Client.open(daemon.socket) as client:
                from_client = await client.call(action("/v1/echo", "POST", body="{}"))
                seen.append(json.dumps(from_client).encode())
                seen.append(json.dumps(await client.events(iid)).encode())
            for path, body in (("/v1/calls", action_bytes("/v1/echo")), ("/v1/health", None)):
                status, answer = await curl_api(curl, daemon.socket, path, body)
                assert status == 200
                seen.append(json.dumps(answer).encode())
        await trio.sleep(0)
        seen.append(daemon.log.read_bytes())
    # Not vacuous: the remote got the credential every time and echoed it back.
    assert [r.header("authorization") for r in srv.requests] == [f"Bearer {token}"] * 3
    echoed = json.loads(by_cli.json()["result"]["body"])["you_sent"]
    # The whole injected value is one of the forms removed (docs/redaction.md).
    assert echoed == "[REDACTED]"
    for blob in seen:
        for form in _forms(token):
            assert form not in blob
