"""A retried SSH command's result is the retry's own stdout and stderr, on either journal.

The first attempt of an idempotent command writes three chunks' worth to stderr and hangs; its
caller's timeout ends it after dispatch (CALLER_CANCELLED, unknown) with those chunks stored:
on a shared journal every chunk is a row as it arrives.  The same idempotency key again
retries it under a new lease (the command is declared idempotent), and this time the command
writes one line to stdout and nothing to stderr.  The retry's result must be exactly that line
-- not the first attempt's stderr beside it -- and its complete response must not end
RESULT_STORE_FAILED because of what the first attempt left.

A real OpenSSH sshd on loopback, a real PostgreSQL (``pg_url``).
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.statemachine import EventKind
from tests.broker.helpers import assert_error, assert_ok, event_kinds, open_broker, write_config

from .brokerkit import ssh_target
from .sshd import Sshd

LIMIT = 30
CHUNK = 64 * 1024


pytestmark = pytest.mark.usefixtures("key_env")


def _journal(tmp: Path, backend: str, request: pytest.FixtureRequest) -> dict[str, Any] | None:
    if backend == "sqlite":
        return None
    url = request.getfixturevalue("pg_url")
    return {"url": url, "key_file": str(tmp / "j.key"), "signing_key": str(tmp / "j.sk")}


def _stored_rows(url: str, iid: str) -> dict[str, int]:
    """{stream: chunk rows} of an invocation in a shared journal, read as the database sees it."""
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT stream, count(*) FROM result_chunks WHERE invocation_id = %s GROUP BY stream",
            (iid,),
        ).fetchall()
    return {str(s): int(n) for s, n in rows}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_a_retry_that_writes_no_stderr_commits_only_its_own_stdout(
    tmp_path: Path, sshd: Sshd, backend: str, request: pytest.FixtureRequest
) -> None:
    flag, pidfile = tmp_path / "ran-once", tmp_path / "remote.pid"
    command = (
        f"if [ -e {flag} ]; then echo second; else touch {flag}; "
        f"head -c {3 * CHUNK} /dev/zero | tr '\\0' e >&2; echo $$ > {pidfile}; exec sleep 30; fi"
    )
    target = ssh_target(sshd.port, sshd.user, sshd.host_pin, idempotent_commands=[command])
    journal = _journal(tmp_path, backend, request)
    cfg = write_config(tmp_path, {"box": target}, journal=journal)
    action = {"target": "box", "command": command, "idempotency_key": "release-7"}
    try:
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as b:
                first = await b.call(action, timeout=2)
                assert_error(b, first, phase="remote_execution", outcome="unknown",
                             retry=first["error"]["retry"], code="CALLER_CANCELLED")  # fmt: skip
                iid = first["invocation_id"]
                if journal is not None:
                    # The scenario holds: the first attempt's stderr chunks are stored rows
                    # (the full ones; the redactor holds the end back).
                    assert set(_stored_rows(journal["url"], iid)) == {"stderr"}
                second = await b.call(action)
                assert second["invocation_id"] == iid
                assert_ok(b, second)
                result = second["result"]
                assert result["stdout"] == "second\n" and "stderr" not in result, result
                assert result["exit_status"] == 0
                stored = b.journal.read_result(iid)
                assert stored is not None and stored.streams == {"stdout": b"second\n"}
                kinds = event_kinds(b, iid)
                assert kinds.count(EventKind.DISPATCH_STARTED) == 2
                assert EventKind.RESULT_STORE_FAILED not in kinds
                (committed,) = [e for e in b.events(iid) if e.kind is EventKind.RESULT_COMMITTED]
                assert committed.attrs["generation"] == 1
                assert committed.attrs["chunks"] == {"stdout": 1}
                fetched = await b.fetch_result(iid)
                assert fetched is not None and fetched["result"] == result
                assert b.journal.verify().ok
        if journal is not None:
            assert _stored_rows(journal["url"], iid) == {"stdout": 1}
    finally:
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
