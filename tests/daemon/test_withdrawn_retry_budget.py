"""A same-key retry its caller withdraws before the dispatch gate (it hangs up: SETUP_FAILED
CALLER_CANCELLED, nothing sent) spends none of the invocation's retry budget (audit 52a).
Before, another agent reading the key from ``/v1/actions`` could send the request under it and
hang up, again and again: each retry's lease took a unit and kept it, so the first caller's
``unknown`` / ``same_idempotency_key`` record turned ``reconcile`` with nothing sent, and its
own same-key retry was refused.  Here the second caller (uid nobody) hangs up more times than
the budget holds, each while its retry waits on a connect; the first caller's same-key retry
is then still taken, and the remote receives it once.  Root only (``as_user``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import trio

from affidavit.api.client import Client

from .kit import NOBODY, WAIT, api_target, as_user, cli, client_env, running_daemon, wait_until

KEY = "A-key-52a"
CHARGE = json.dumps(
    {
        "target": "api",
        "method": "POST",
        "path": "/v1/charges",
        "body": json.dumps({"qty": 9}),
        "idempotency_key": KEY,
    }
).encode()
BUDGET = 3


class Remote:
    """One loopback port the test drives: ``read_and_drop`` reads a request and closes it
    unanswered; ``hang`` fills the accept queue (further SYNs are dropped: connects hang, before
    any byte of a request could be written); ``answer`` answers each request 200.  ``keys``: the
    idempotency key of every request it read."""

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self.sock = sock
        self.keys: list[str] = []
        self._filler: trio.socket.SocketType | None = None

    @property
    def port(self) -> int:
        port: int = self.sock.getsockname()[1]
        return port

    async def _read(self, conn: trio.socket.SocketType) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await conn.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        headers = dict(
            line.split(":", 1) for line in head.decode("latin-1").split("\r\n")[1:] if ":" in line
        )
        fields = {k.strip().lower(): v.strip() for k, v in headers.items()}
        while len(body) < int(fields.get("content-length", "0")):
            chunk = await conn.recv(65536)
            if not chunk:
                break
            body += chunk
        self.keys.append(fields.get("idempotency-key", ""))

    async def read_and_drop(self) -> None:
        conn, _ = await self.sock.accept()
        with conn:
            await self._read(conn)

    async def hang(self) -> None:
        self.sock.listen(0)
        self._filler = trio.socket.socket()
        await self._filler.connect(("127.0.0.1", self.port))

    async def answer(self) -> None:
        assert self._filler is not None
        queued, _ = await self.sock.accept()  # the filler's, nothing else was queued
        queued.close()
        self._filler.close()
        self.sock.listen(16)
        while True:
            conn, _ = await self.sock.accept()
            with conn:
                await self._read(conn)
                body = b'{"charged": true}'
                head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\nconnection: close\r\n"
                await conn.send(head.encode() + b"\r\n" + body)


async def _record(client: Client, iid: str, generation: int, *states: str) -> dict[str, Any]:
    async def reached() -> dict[str, Any] | None:
        rec = await client.record(iid)
        ok = rec is not None and rec["generation"] == generation and rec["state"] in states
        return rec if ok else None

    found: dict[str, Any] = await wait_until(reached, f"generation {generation} in {states}")
    return found


async def test_retries_withdrawn_before_the_gate_leave_the_first_caller_its_budget(
    tmp_path: Path, token: str, shared_socket_dir: Path
) -> None:
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    remote = Remote(sock)
    target = api_target(
        f"http://127.0.0.1:{remote.port}",
        idempotency={"header": "Idempotency-Key", "scope": "charges", "retention": "24h"},
        timeout={"connect": 15, "total": 20},
        budget=BUDGET,
    )
    with sock:
        async with (
            running_daemon(
                tmp_path,
                target,
                token=token,
                service={"allow_gids": [NOBODY]},
                socket_dir=shared_socket_dir,
            ) as daemon,
            trio.open_nursery() as nursery,
            Client.open(daemon.socket) as client,
        ):
            nursery.start_soon(remote.read_and_drop)
            first = await cli(daemon, "call", "-", stdin=CHARGE)
            error = first.json()["error"]
            assert (error["outcome"], error["retry"]) == ("unknown", "same_idempotency_key")
            iid = first.json()["invocation_id"]

            await remote.hang()
            env = client_env(daemon.socket)
            env["HOME"] = "/nonexistent"
            argv = as_user(NOBODY, "-m", "affidavit", "call", "-")
            for generation in range(1, BUDGET + 2):  # more hang-ups than the budget holds
                other = await trio.lowlevel.open_process(
                    argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env
                )
                assert other.stdin is not None
                await other.stdin.send_all(CHARGE)
                await other.stdin.aclose()
                await _record(client, iid, generation, "retry_pending")
                other.kill()  # the hang-up, while its retry waits on the connect
                with trio.fail_after(WAIT):
                    await other.wait()
                rec = await _record(client, iid, generation, "retry_setup_failed")
                assert (rec["code"], rec["outcome"]) == ("CALLER_CANCELLED", "unknown")
                assert rec["budget"]["used"] == 1, rec["budget"]
                assert rec["retry"] == "same_idempotency_key"
                assert rec["message"].startswith("This retry was withdrawn"), rec["message"]
                assert "sent nothing; the earlier attempt's outcome (unknown)" in rec["message"]
                # One entry counts the hang-ups: the record does not grow with them.
                assert len(rec["attempts"]) == 2, rec["attempts"]
                assert rec["attempts"][-1]["repeated"] == generation

            nursery.start_soon(remote.answer)
            again = await cli(daemon, "call", "-", stdin=CHARGE)
            assert again.returncode == 0, again.stdout
            assert again.json()["result"]["status"] == 200
            kinds = [(e["kind"], e["attrs"].get("generation")) for e in await client.events(iid)]
            nursery.cancel_scope.cancel()
    # The first call and the first caller's retry: none of the withdrawn ones was sent.
    assert remote.keys == [KEY, KEY]
    assert [g for kind, g in kinds if kind == "DISPATCH_STARTED"] == [0, BUDGET + 2]
