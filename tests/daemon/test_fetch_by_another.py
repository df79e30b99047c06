"""Through the daemon: agent A posts (session ``agentA``) and hangs up after dispatch -- stored,
RESULT_DELIVERY_FAILED.  Agent B, an ``affidavit mcp`` proxy run as ANOTHER uid (``nobody``),
lists A's session and fetches the result: B reads it whole, and its answer says what is true for
B -- the result as stored, no ``error``/``isError`` telling it to fetch again (which would loop:
its fetches never deliver), and ``delivery.recorded: false``.  The record stays undelivered.  A's
own fetch (its uid; no session needed: a session is a label, it decides nothing) delivers it,
recorded with the reader's uid.  Before, B's fetch recorded RESULT_DELIVERED {channel: fetch}:
the journal claimed A got the result.  The rule itself: tests/broker/test_fetch_by_another.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import trio

from affidavit.api.client import Client
from tests.mcp.conftest import Remotes, remotes, token, wait_for  # noqa: F401 (fixtures)
from tests.mcp.kit import env_without_secrets
from tests.mcp.test_protocol import INIT, Raw, call

from .kit import NOBODY, as_user, running_daemon, wait_until

BODY = b'{"target":"holds","method":"POST","path":"/h","body":"{}","session":"agentA"}'


def _delivery(events: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [
        (e["kind"], e["attrs"].get("reader"))
        for e in events
        if e["kind"].startswith("RESULT_DELIVER")
    ]


async def test_another_uid_s_fetch_is_a_read_and_the_requester_s_a_delivery(
    tmp_path: Path,
    remotes: Remotes,  # noqa: F811
    token: str,  # noqa: F811
    shared_socket_dir: Path,
) -> None:
    async with (
        running_daemon(
            tmp_path,
            remotes.targets(),
            token=token,
            service={"allow_gids": [NOBODY]},
            socket_dir=shared_socket_dir,
        ) as daemon,
        Client.open(daemon.socket) as client,
    ):
        a = await trio.open_unix_socket(str(daemon.socket))
        head = b"POST /v1/calls HTTP/1.1\r\nhost: a\r\ncontent-length: %d\r\n\r\n" % len(BODY)
        await a.send_all(head + BODY)
        await wait_for(remotes.holds.event("received"))
        await a.aclose()  # agent A goes away after dispatch
        remotes.holds.event("release").set()

        async def failed() -> str | None:
            listed = (await client.actions(session="agentA"))["actions"]
            if listed and _delivery(await client.events(listed[0]["invocation_id"])):
                found: str = listed[0]["invocation_id"]
                return found
            return None

        iid = await wait_until(failed, "A's call stored, its answer failed")
        assert _delivery(await client.events(iid)) == [("RESULT_DELIVERY_FAILED", None)]

        env = env_without_secrets()
        env["HOME"] = "/nonexistent"
        with (tmp_path / "b.log").open("ab") as log:
            proc = await trio.lowlevel.open_process(
                as_user(NOBODY, "-m", "affidavit", "mcp", "--socket", str(daemon.socket)),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
            )
        b = Raw(proc, tmp_path / "b.log")
        try:
            await b.send(INIT)
            await b.answer(0)
            await b.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            await b.send(call(1, "fetch_result", {"invocation_id": iid}))
            read = (await b.answer(1))["result"]
        finally:
            proc.kill()
            with trio.fail_after(20):
                await proc.wait()
            for stream in (proc.stdin, proc.stdout):
                assert stream is not None
                await stream.aclose()
        # B reads it whole, told the truth for B: no error that sends it to fetch again.
        assert read["isError"] is False
        shown = read["structuredContent"]
        assert shown["result"]["body"] == "late and done"
        assert "error" not in shown
        assert shown["delivery"]["recorded"] is False
        # ... and the journal does not say A got it.
        assert _delivery(await client.events(iid)) == [("RESULT_DELIVERY_FAILED", None)]

        own = await client.fetch_result(iid)  # A's uid (this process's): the requester
        assert own is not None and own["result"]["body"] == "late and done"
        assert "delivery" not in own and "error" not in own
        assert _delivery(await client.events(iid)) == [
            ("RESULT_DELIVERY_FAILED", None),
            ("RESULT_DELIVERED", {"uid": os.getuid()}),
        ]
    assert len(remotes.holds.requests) == 1  # sent once: every fetch a read
