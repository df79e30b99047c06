"""Fixtures for the MCP tests: a canary credential (handed only to the process that brokers), the
SSH test peers of tests/ssh (a real sshd, skipped without it as the external-program rule says),
and a scripted HTTP service with one target per behaviour the tools must carry intact."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.broker.helpers import TOKEN_ENV, http_target, write_config
from tests.http.hostile import HostileServer, Received, Reply, scripts
from tests.ssh.conftest import ssh_keys, sshd

from .kit import env_without_secrets

__all__ = ["Remotes", "remotes", "ssh_keys", "sshd", "token"]

IDEM = {"header": "Idempotency-Key", "scope": "payments", "retention": "24h"}
JOB = Reply(202, headers=[("Location", "/v1/jobs/j1")], body=b'{"id":"j1"}')


@pytest.fixture
def token() -> str:
    return "canary-" + secrets.token_urlsafe(24)


def echo(req: Received) -> Reply:
    """Answers with the request's own Authorization header in the body: the canary comes back
    from the remote, and must be redacted before any MCP message carries it."""
    seen = req.header("authorization") or ""
    return Reply(200, headers=[("Content-Type", "text/plain")], body=f"saw {seen}".encode())


def jobs(req: Received) -> Reply:
    if req.method == "POST":
        return JOB
    return Reply(200, body=json.dumps({"state": "done"}).encode())


@dataclass
class Remotes:
    ok: HostileServer
    rejects: HostileServer
    drops: HostileServer
    holds: HostileServer
    jobs: HostileServer

    def targets(self) -> dict[str, dict[str, Any]]:
        return {
            "ok": http_target(self.ok.url, description="answers 200, echoing what it saw"),
            "pay": http_target(self.ok.url, idempotency=IDEM),
            "rejects": http_target(self.rejects.url),
            "drops": http_target(self.drops.url),
            "holds": http_target(self.holds.url, idempotency=IDEM),
            "jobs": http_target(
                self.jobs.url + "/v1",
                operations={"status": "json:/state", "succeeded": ["done"], "failed": ["x"]},
            ),
        }

    def config(self, tmp: Path) -> Path:
        return write_config(tmp, self.targets())

    def env(self, token: str) -> dict[str, str]:
        return env_without_secrets(**{TOKEN_ENV: token})


@pytest.fixture
async def remotes() -> AsyncIterator[Remotes]:
    async with (
        HostileServer.running(scripts.serve(echo)) as ok,
        HostileServer.running(scripts.serve(Reply(403, body=b'{"error":"no"}'))) as rejects,
        HostileServer.running(scripts.apply_then_close()) as drops,
        HostileServer.running(scripts.held(Reply(200, body=b"late and done"))) as holds,
        HostileServer.running(scripts.serve(jobs)) as job_api,
    ):
        yield Remotes(ok, rejects, drops, holds, job_api)


async def wait_for(event: trio.Event, timeout: float = 20.0) -> None:
    with trio.fail_after(timeout):
        await event.wait()
