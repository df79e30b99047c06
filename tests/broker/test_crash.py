"""Crash test (seed, "Dispatch shifts the burden of proof"): a real broker process is SIGKILLed
after the server has received its request.  The journal on disk must then say
``unknown`` — never ``not_attempted`` — and a second ``affidavit call`` of the same action with
the same idempotency key must resume *that* invocation and send the *same* key, with the retry
budget in the record (not in a process) saying this is attempt 2.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import trio

from tests.http.hostile import HostileServer, Peer, Reply

from .helpers import TOKEN_ENV, http_target, raw_kinds, write_config

LIMIT = 30
LEASE_MARGIN = 0.5
"""The first broker runs with the engine's lease margin shortened (the shipped 30 s margin would
make this test wait half a minute for the dead holder's lease to expire), through the public
``Broker.open(settings=EngineSettings(lease_margin=...))``; it is killed while waiting for the
answer, before anything the command line adds (printing) could matter.  The second call is the
plain ``python -m affidavit call``."""

KILLABLE_BROKER = (
    "import json, sys, trio\n"
    "from affidavit import Broker\n"
    "from affidavit.engine import EngineSettings\n"
    "async def main():\n"
    "    action = json.loads(open(sys.argv[1], encoding='utf-8').read())\n"
    f"    settings = EngineSettings(lease_margin={LEASE_MARGIN})\n"
    "    async with Broker.open(sys.argv[2], settings=settings) as broker:\n"
    "        print(json.dumps(await broker.call(action)))\n"
    "trio.run(main)\n"
)


async def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    return await trio.run_process(
        [sys.executable, "-m", "affidavit", *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=env,
    )


async def test_sigkill_after_server_received_request_leaves_unknown_and_retry_reuses_key(
    tmp_path: Path,
) -> None:
    token = "crash-" + os.urandom(8).hex()
    env = {**os.environ, TOKEN_ENV: token}
    effects: Counter[str] = Counter()
    received = trio.Event()

    async def api(peer: Peer) -> None:
        # First request for a key: apply it, tell the test, then hang (never answer) so the
        # CLI is killed while waiting.  A repeat with the same key replays the answer.
        while True:
            req = await peer.read_request()
            if req is None:
                return
            key = req.header("Idempotency-Key") or ""
            effects[key] += 1
            if effects[key] == 1:
                received.set()
                await trio.sleep_forever()
            await peer.respond(Reply(201, body=b'{"payment":"pay_7"}'))

    async with HostileServer.running(api) as srv:
        cfg = write_config(
            tmp_path,
            {
                "payments": http_target(
                    srv.url,
                    methods=["POST"],
                    idempotent=[],
                    timeout={"connect": 2, "total": 2},
                    idempotency={
                        "header": "Idempotency-Key",
                        "scope": "payments.create",
                        "retention": "1h",
                    },
                )
            },
        )
        action = tmp_path / "action.json"
        action.write_text(
            json.dumps(
                {
                    "target": "payments",
                    "method": "POST",
                    "path": "/payments",
                    "body": '{"amount":100}',
                    "idempotency_key": "crash-key-1",
                }
            )
        )
        db = tmp_path / "journal.db"

        proc = await trio.lowlevel.open_process(
            [sys.executable, "-c", KILLABLE_BROKER, str(action), str(cfg)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        killed_at = time.time()
        try:
            with trio.fail_after(LIMIT):
                await received.wait()
                killed_at = time.time()
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == -signal.SIGKILL
        # What the disk says right after the crash: dispatch recorded, nothing after a result.
        on_disk = raw_kinds(db)
        assert "DISPATCH_STARTED" in on_disk
        assert "RESULT_COMMITTED" not in on_disk

        with trio.fail_after(LIMIT):
            listed = await _cli("actions", "--json", "--config", str(cfg), env=env)
        assert listed.returncode == 0, listed.stderr
        (row,) = json.loads(listed.stdout)
        iid = row["invocation_id"]
        assert row["outcome"] == "unknown"

        with trio.fail_after(LIMIT):
            shown = await _cli("record", iid, "--json", "--config", str(cfg), env=env)
        assert shown.returncode == 0, shown.stderr
        rec: dict[str, Any] = json.loads(shown.stdout)["record"]
        assert rec["outcome"] == "unknown"
        assert rec["evidence"]["dispatch_started"] is True
        assert rec["idempotency"]["key"] == "crash-key-1"
        assert rec["budget"]["used"] == 1
        with trio.fail_after(LIMIT):
            text = await _cli("record", iid, "--config", str(cfg), env=env)
        assert b"outcome unknown" in text.stdout
        assert b"not_attempted" not in text.stdout

        # The dead holder's lease runs for the call's timeout plus the margin; wait it out.
        await trio.sleep(max(0.0, killed_at + 2 + LEASE_MARGIN + 0.3 - time.time()))
        with trio.fail_after(LIMIT):
            again = await _cli("call", str(action), "--config", str(cfg), env=env)
        assert again.returncode == 0, (again.stdout, again.stderr)
        envelope = json.loads(again.stdout)
        assert envelope["invocation_id"] == iid
        assert "error" not in envelope
        assert envelope["result"]["status"] == 201
        assert envelope["evidence"]["budget"]["used"] == 2
        assert envelope["evidence"]["idempotency"]["key"] == "crash-key-1"
        outcomes = [a["outcome"] for a in envelope["evidence"]["attempts"]]
        assert outcomes == ["unknown", "committed"]

    assert [r.header("Idempotency-Key") for r in srv.requests] == ["crash-key-1", "crash-key-1"]
    assert effects == Counter({"crash-key-1": 2})  # the server saw the key twice...
    kinds = raw_kinds(db, iid)
    # ...and the journal shows the crash closed as unknown before the retry's lease.
    assert kinds.index("ATTEMPT_INTERRUPTED") < kinds.index("RETRY_LEASE_ACQUIRED")
    assert kinds.count("DISPATCH_STARTED") == 2
    assert token not in (again.stdout + again.stderr).decode()


async def test_retry_while_the_crashed_holder_still_holds_its_lease_sends_nothing(
    tmp_path: Path,
) -> None:
    """Within the dead process's lease nobody may act on the invocation: the second call
    answers from the record (busy) and the server sees no second request."""
    token = "crash-" + os.urandom(8).hex()
    env = {**os.environ, TOKEN_ENV: token}
    received = trio.Event()

    async def api(peer: Peer) -> None:
        if await peer.read_request() is not None:
            received.set()
            await trio.sleep_forever()

    async with HostileServer.running(api) as srv:
        cfg = write_config(
            tmp_path,
            {
                "payments": http_target(
                    srv.url,
                    methods=["POST"],
                    idempotent=[],
                    idempotency={"header": "Idempotency-Key", "scope": "p", "retention": "1h"},
                )
            },
        )
        action = json.dumps(
            {"target": "payments", "method": "POST", "path": "/p", "idempotency_key": "k2"}
        )
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "affidavit", "call", "-", "--config", str(cfg)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert proc.stdin is not None
            await proc.stdin.send_all(action.encode())
            await proc.stdin.aclose()
            with trio.fail_after(LIMIT):
                await received.wait()
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        with trio.fail_after(LIMIT):
            busy = await trio.run_process(
                [sys.executable, "-m", "affidavit", "call", "-", "--config", str(cfg)],
                stdin=action.encode(),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env=env,
            )
        assert busy.returncode == 1, busy.stderr
        envelope = json.loads(busy.stdout)
        # The dead broker's lease has not expired: the invocation is, as far as the journal can
        # tell, still running elsewhere — fetch later, never send again.
        assert envelope["error"]["code"] == "IN_PROGRESS"
        assert envelope["error"]["outcome"] == "unknown"
        assert envelope["error"]["retry"] == "fetch_result"
        assert len(srv.requests) == 1
