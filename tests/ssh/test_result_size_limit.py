"""An SSH command's output is bounded by its target's ``max_result`` -- stdout and stderr
together (docs/configuration.md): past it the driver stops reading, the channel and the
connection are closed, and the attempt ends ``unknown`` / ``RESULT_SIZE_LIMIT`` with the limit in
the evidence (the bytes received withheld: ``tail_redacted``, as any answer cut short); nothing
of the output is a result, and the journal holds no more than about the limit of it.  Against
the real sshd (``head -c`` of /dev/zero) and the scripted server."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.engine import RESULT_CHUNK
from affidavit.statemachine import EventKind
from tests.broker.helpers import assert_error, assert_ok, open_broker, write_config

from .brokerkit import ssh_target
from .hostile import HostileServer
from .sshd import Sshd

LIMIT = 1 << 20
WAIT = 20


pytestmark = pytest.mark.usefixtures("key_env")


def _footprint(tmp_path: Path) -> int:
    return sum(
        f.stat().st_size
        for p in tmp_path.iterdir()
        if p.name.startswith("journal")
        for f in ([p] if p.is_file() else p.rglob("*"))
        if f.is_file()
    )


async def _cut(tmp_path: Path, target: dict[str, Any], command: str) -> dict[str, Any]:
    cfg = write_config(tmp_path, {"box": target})
    async with open_broker(cfg) as b:
        before = _footprint(tmp_path)
        start = time.monotonic()
        with trio.fail_after(WAIT):
            env = await b.call({"target": "box", "command": command})
        took = time.monotonic() - start
        assert_error(b, env, phase="remote_execution", outcome="unknown", retry="reconcile",
                     code="RESULT_SIZE_LIMIT")  # fmt: skip
        iid = env["invocation_id"]
        assert "result" not in env and b.journal.read_result(iid) is None
        evidence = env["evidence"]
        over = evidence["result_size_limit"]
        # Cut short: each stream's last bytes are withheld whatever they were, and with them
        # every count and hash of what was received (docs/redaction.md, "Partial answers").
        assert over == {"limit": LIMIT, "received_withheld": "tail_redacted"}
        assert evidence["response_complete"] is False
        assert evidence["ssh"]["path"][-1] == "interrupted"
        assert evidence["ssh"]["result_size_limit"] == over
        events = list(b.events(iid))
        assert EventKind.RESULT_COMMITTED not in [e.kind for e in events]
        [ended] = [e for e in events if e.kind is EventKind.ATTEMPT_INTERRUPTED]
        assert ended.attrs["result_size_limit"] == over
        facts = ended.attrs["facts"]
        assert facts["received_withheld"] == "tail_redacted"
        assert facts["stdout_bytes"] is None and facts.get("stdout_sha256") is None
        grown = _footprint(tmp_path) - before
    # Stopped at the limit, well before the 10 s total; about the limit stored, not the rest.
    assert took < 5.0
    assert grown <= LIMIT + RESULT_CHUNK + (128 << 10), grown
    return facts  # type: ignore[no-any-return]


async def test_stdout_and_stderr_together_past_max_result_end_unknown(
    tmp_path: Path, sshd: Sshd
) -> None:
    # Each stream stays under the limit; together they pass it.  Without the limit this is a
    # complete, committed 1.5 MB result.
    half = LIMIT * 3 // 4
    command = f"head -c {half} /dev/zero; head -c {half} /dev/zero >&2"
    target = ssh_target(sshd.port, sshd.user, sshd.host_pin, max_result=LIMIT)
    facts = await _cut(tmp_path, target, command)
    # Both streams count: each received bytes, so each one's count is withheld (null).
    assert "stderr_bytes" in facts and facts["stderr_bytes"] is None


async def test_endless_output_is_cut_at_max_result_in_time(tmp_path: Path, sshd: Sshd) -> None:
    # A command that prints 200 MB: read whole, it would fill the journal with it.
    target = ssh_target(sshd.port, sshd.user, sshd.host_pin, max_result=LIMIT)
    await _cut(tmp_path, target, "head -c 200000000 /dev/zero")


async def test_output_within_max_result_is_committed(tmp_path: Path, sshd: Sshd) -> None:
    target = ssh_target(sshd.port, sshd.user, sshd.host_pin, max_result=LIMIT)
    cfg = write_config(tmp_path, {"box": target})
    async with open_broker(cfg) as b:
        with trio.fail_after(WAIT):
            env = await b.call({"target": "box", "command": f"head -c {LIMIT} /dev/zero"})
        assert_ok(b, env)
        stored = b.journal.read_result(env["invocation_id"])
        assert stored is not None and len(stored.streams["stdout"]) == LIMIT


async def test_the_scripted_server_past_max_result_is_cut(
    tmp_path: Path, hostile: HostileServer
) -> None:
    target = ssh_target(hostile.port, "bob", hostile.pin, max_result=LIMIT)
    await _cut(tmp_path, target, f"big {4 * LIMIT}")
