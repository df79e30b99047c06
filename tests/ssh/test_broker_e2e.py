"""SSH end to end through ``Broker.call``: for every classification row of issue 5 the
envelope's phase/outcome/retry/code agree with the durable record, the evidence says how the
broker knows, and the private key never reaches the journal file."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.statemachine import EventKind
from tests.broker.helpers import (
    assert_error,
    assert_ok,
    closed_port,
    event_kinds,
    open_broker,
    write_config,
)
from tests.journal.helpers import stored_chunk

from .brokerkit import KEY_ENV, OTHER_KEY_ENV, leaked, ssh_target
from .hostile import HostileServer, big_output, garbage_handshake_server
from .sshd import Sshd, SshKeys

LIMIT = 20


@pytest.fixture(autouse=True)
def key_env(ssh_keys: SshKeys) -> Iterator[None]:
    os.environ[KEY_ENV] = ssh_keys.client_key.decode()
    os.environ[OTHER_KEY_ENV] = ssh_keys.other_key.decode()
    try:
        yield
    finally:
        del os.environ[KEY_ENV], os.environ[OTHER_KEY_ENV]


def _journal_bytes(tmp_path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("journal"))


def _not_attempted(b: Broker, env: dict[str, object]) -> None:
    """No exec could have been requested: no DISPATCH_STARTED on disk, none in the evidence."""
    iid = str(env["invocation_id"])
    assert EventKind.DISPATCH_STARTED not in event_kinds(b, iid)
    evidence = env["evidence"]
    assert isinstance(evidence, dict)
    assert not evidence.get("dispatch_started")
    assert all(a["outcome"] == "not_attempted" for a in evidence["attempts"])


async def test_every_row_sshd_produces_through_broker_call(
    tmp_path: Path, sshd: Sshd, hostile: HostileServer
) -> None:
    cfg = write_config(
        tmp_path,
        {
            "box": ssh_target(sshd.port, sshd.user, sshd.host_pin),
            "wrongkey": ssh_target(sshd.port, sshd.user, hostile.pin),
        },
    )
    with trio.fail_after(LIMIT):
        async with open_broker(cfg) as b:
            env = await b.call({"target": "box", "command": "echo hi"})
            assert_ok(b, env)
            # What was received, before redaction, is on record when redaction changed
            # nothing (docs/redaction.md, "What was received").
            [complete] = [e for e in b.events(env["invocation_id"])
                          if e.kind is EventKind.REMOTE_RESPONSE_COMPLETE]  # fmt: skip
            assert complete.attrs["stdout_bytes"] == 3
            received = hashlib.sha256(b"hi\n").hexdigest()
            assert complete.attrs["stdout_sha256"] == "sha256:" + received
            env = await b.call({"target": "box", "command": f"cat {sshd.client_key_path}"})
            assert_ok(b, env)
            [complete] = [e for e in b.events(env["invocation_id"])
                          if e.kind is EventKind.REMOTE_RESPONSE_COMPLETE]  # fmt: skip
            assert complete.attrs["stdout_received_withheld"] == "redacted"
            assert "stdout_sha256" not in complete.attrs
            env = await b.call({"target": "box", "command": "exit 23"})
            assert_error(b, env, phase="remote_execution", outcome="committed", retry="never",
                         code="REMOTE_COMMAND_FAILED")  # fmt: skip
            assert env["evidence"]["exit_status"] == 23
            env = await b.call({"target": "wrongkey", "command": "true"})
            assert_error(b, env, phase="connection_setup", outcome="not_attempted",
                         retry="after_correction", code="HOST_KEY_MISMATCH")  # fmt: skip
            _not_attempted(b, env)
    assert leaked(_journal_bytes(tmp_path), sshd.client_key) == []


async def test_every_scripted_row_through_broker_call(
    tmp_path: Path, ssh_keys: SshKeys, hostile: HostileServer
) -> None:
    cfg = write_config(tmp_path, {"evil": ssh_target(hostile.port, "bob", hostile.pin)})
    with trio.fail_after(LIMIT):
        async with open_broker(cfg) as b:
            env = await b.call({"target": "evil", "command": "refuse"})
            assert_error(b, env, phase="remote_execution", outcome="rejected",
                         retry="after_correction", code="EXEC_REJECTED")  # fmt: skip
            env = await b.call({"target": "evil", "command": "noexit"})
            assert_error(b, env, phase="remote_execution", outcome="unknown",
                         retry="reconcile", code="REMOTE_RESULT_INCOMPLETE")  # fmt: skip
            # Output and exit-status 0, then CHANNEL_FAILURE: a refusal that contradicts itself
            # is no rejection (audit 49, #2), and the output no result.
            env = await b.call({"target": "evil", "command": "refuseafter out status"})
            assert_error(b, env, phase="remote_execution", outcome="unknown",
                         retry="reconcile", code="REMOTE_RESULT_INCOMPLETE")  # fmt: skip
            assert "result" not in env and b.journal.read_result(env["invocation_id"]) is None
            [cut] = [e for e in b.events(env["invocation_id"])
                     if e.kind is EventKind.ATTEMPT_INTERRUPTED]  # fmt: skip
            held = {
                k: cut.attrs["facts"][k] for k in ("unread_stdout_bytes", "exit_status", "reply")
            }
            assert held == {"unread_stdout_bytes": 4, "exit_status": 0, "reply": "CHANNEL_FAILURE"}
            env = await b.call({"target": "evil", "command": "drop"})
            assert_error(b, env, phase="remote_execution", outcome="unknown",
                         retry="reconcile", code="REMOTE_OUTCOME_UNKNOWN")  # fmt: skip
            env = await b.call({"target": "evil", "command": "status_then_break"})
            assert_error(b, env, phase="remote_execution", outcome="unknown",
                         retry="reconcile", code="REMOTE_RESULT_INCOMPLETE")  # fmt: skip
            # The exit status arrived, but the output is not presented as a complete result.
            assert "result" not in env and not env["evidence"]["response_complete"]
            assert b.journal.read_result(env["invocation_id"]) is None
    assert leaked(_journal_bytes(tmp_path), ssh_keys.client_key) == []


async def test_connection_refused_is_setup_not_attempted_backoff_with_every_attempt_recorded(
    tmp_path: Path, ssh_keys: SshKeys
) -> None:
    cfg = write_config(tmp_path, {"down": ssh_target(closed_port(), "bob", ssh_keys.other_pin)})
    with trio.fail_after(LIMIT):
        async with open_broker(cfg) as b:
            env = await b.call({"target": "down", "command": "true"})
            assert_error(b, env, phase="connection_setup", outcome="not_attempted",
                         retry="backoff", code="CONNECTION_REFUSED")  # fmt: skip
            _not_attempted(b, env)
            # Seed: bounded in-broker retries, each attempt in the one record.
            stages = [(a["stage"], a["code"]) for a in env["evidence"]["attempts"]]
            assert stages == [("tcp_connect", "CONNECTION_REFUSED")] * 2


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(b"SSH-2.0-hostile\r\n" + b"\xff" * 64, id="garbage-packet-after-banner"),
        pytest.param(b"HTTP/1.1 400 Bad Request\r\n\r\n", id="not-ssh-at-all"),
        pytest.param(b"SSH-1.5-ancient\r\n", id="unsupported-protocol-version"),
    ],
)
async def test_handshake_failure_is_setup_not_attempted_backoff(
    tmp_path: Path, ssh_keys: SshKeys, reply: bytes
) -> None:
    with trio.fail_after(LIMIT):
        async with garbage_handshake_server(reply) as port:
            cfg = write_config(tmp_path, {"junk": ssh_target(port, "bob", ssh_keys.other_pin)})
            async with open_broker(cfg) as b:
                env = await b.call({"target": "junk", "command": "true"})
                assert_error(b, env, phase="connection_setup", outcome="not_attempted",
                             retry="backoff", code="TLS_FAILED")  # fmt: skip
                _not_attempted(b, env)
                stages = [(a["stage"], a["code"]) for a in env["evidence"]["attempts"]]
                assert stages == [("ssh_handshake", "TLS_FAILED")] * 2


async def test_authentication_rejected_by_sshd_is_remote_auth_failed_after_correction(
    tmp_path: Path, sshd: Sshd
) -> None:
    target = ssh_target(sshd.port, sshd.user, sshd.host_pin, key_env=OTHER_KEY_ENV)
    cfg = write_config(tmp_path, {"box": target})
    with trio.fail_after(LIMIT):
        async with open_broker(cfg) as b:
            env = await b.call({"target": "box", "command": "true"})
            assert_error(b, env, phase="connection_setup", outcome="not_attempted",
                         retry="after_correction", code="REMOTE_AUTH_FAILED")  # fmt: skip
            _not_attempted(b, env)
            # Not retried in-broker: the same key would be refused again.
            assert [a["stage"] for a in env["evidence"]["attempts"]] == ["userauth"]
    assert leaked(_journal_bytes(tmp_path), sshd.other_key) == []


async def test_authentication_rejected_by_the_scripted_server_sends_no_exec(
    tmp_path: Path, hostile: HostileServer
) -> None:
    cfg = write_config(tmp_path, {"evil": ssh_target(hostile.port, "refuse", hostile.pin)})
    execs, sessions = len(hostile.exec_requests), hostile.sessions_opened
    with trio.fail_after(LIMIT):
        async with open_broker(cfg) as b:
            env = await b.call({"target": "evil", "command": "exit 0"})
            assert_error(b, env, phase="connection_setup", outcome="not_attempted",
                         retry="after_correction", code="REMOTE_AUTH_FAILED")  # fmt: skip
            _not_attempted(b, env)
    assert (len(hostile.exec_requests), hostile.sessions_opened) == (execs, sessions)


async def test_caller_timeout_after_exit_status_with_output_open_stays_unknown(
    tmp_path: Path, sshd: Sshd
) -> None:
    # The shell prints, leaves a child holding its stdout, and exits 0: sshd reports the exit
    # status while the output stream is still open.  The caller's deadline then ends the call:
    # an exit status without the complete streams is no complete result (seed: record "the
    # completeness of stdout and stderr, the exit status ... and the channel close") -- the
    # outcome stays unknown with the caller's cause, and the partial output is not a result.
    pidfile = tmp_path / "child.pid"
    cfg = write_config(tmp_path, {"box": ssh_target(sshd.port, sshd.user, sshd.host_pin)})
    command = f"echo partial-output; sleep 30 & echo $! > {pidfile}; exit 0"
    try:
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as b:
                env = await b.call({"target": "box", "command": command}, timeout=1.5)
                assert_error(b, env, phase="remote_execution", outcome="unknown",
                             retry="reconcile", code="CALLER_CANCELLED")  # fmt: skip
                assert not env["evidence"]["response_complete"]
                assert "result" not in env and "partial-output" not in repr(env)
                kinds = event_kinds(b, env["invocation_id"])
                assert EventKind.RESULT_COMMITTED not in kinds
                assert b.journal.read_result(env["invocation_id"]) is None
    finally:
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


async def test_caller_timeout_after_exec_sent_is_caller_cancelled_unknown_reconcile(
    tmp_path: Path, sshd: Sshd
) -> None:
    pidfile = tmp_path / "remote.pid"
    cfg = write_config(tmp_path, {"box": ssh_target(sshd.port, sshd.user, sshd.host_pin)})
    # The shell records its pid, then becomes `sleep 30`: proof the exec ran, and a handle to
    # stop the remote process afterwards (closing the channel does not kill it — the seed's
    # point: "the remote process may keep running").
    command = f"echo $$ > {pidfile}; exec sleep 30"
    try:
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as b:
                # The caller's deadline ends it (its code, below), not the remote's 30 s: the
                # LIMIT bounds the test; no elapsed time is asserted (a loaded machine).
                env = await b.call({"target": "box", "command": command}, timeout=1)
                rec = assert_error(b, env, phase="remote_execution", outcome="unknown",
                                   retry="reconcile", code="CALLER_CANCELLED")  # fmt: skip
                assert rec.evidence["dispatch_started"] is True
                assert env["evidence"]["dispatch_started"] is True
                assert not env["evidence"]["response_complete"]
                kinds = event_kinds(b, env["invocation_id"])
                assert EventKind.DISPATCH_STARTED in kinds
                assert EventKind.RESULT_COMMITTED not in kinds
                # Fetching is a read of the same unknown record, never a second exec.
                again = await b.fetch_result(env["invocation_id"])
                assert again is not None and again["error"] == env["error"]
        assert pidfile.read_text().strip().isdigit()
    finally:
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


async def test_exit_signal_is_committed_command_failed_with_the_signal_in_evidence(
    tmp_path: Path, either_server: Sshd | HostileServer
) -> None:
    if isinstance(either_server, Sshd):
        sshd = either_server
        target, command = ssh_target(sshd.port, sshd.user, sshd.host_pin), "kill -KILL $$"
    else:
        hostile = either_server
        target, command = ssh_target(hostile.port, "bob", hostile.pin), "signal"
    cfg = write_config(tmp_path, {"t": target})
    with trio.fail_after(LIMIT):
        async with open_broker(cfg) as b:
            env = await b.call({"target": "t", "command": command})
            rec = assert_error(b, env, phase="remote_execution", outcome="committed",
                               retry="never", code="REMOTE_COMMAND_FAILED")  # fmt: skip
            assert env["evidence"]["exit_signal"] == "KILL"
            assert env["evidence"]["exit_status"] is None
            assert env["evidence"]["response_complete"] is True
            assert env["result"]["exit_signal"] == "KILL"
            assert rec.evidence["exit_signal"] == "KILL"
            assert EventKind.RESULT_COMMITTED in event_kinds(b, env["invocation_id"])


async def test_large_output_is_stored_in_chunks_and_fetched_intact_without_reexecution(
    tmp_path: Path, hostile: HostileServer
) -> None:
    size = 5 * 1024 * 1024
    expected = big_output(size)
    command = f"big {size} {uuid.uuid4().hex}"  # unique: the shared server counts our execs
    cfg = write_config(tmp_path, {"evil": ssh_target(hostile.port, "bob", hostile.pin)})
    with trio.fail_after(LIMIT):
        async with open_broker(cfg) as b:
            env = await b.call({"target": "evil", "command": command})
            assert_ok(b, env)
            iid = env["invocation_id"]
            # Over the inline limit: the envelope carries size, hash and where to fetch it.
            assert "stdout" not in env["result"]
            ref = env["result"]["by_reference"]
            assert ref["bytes"] == size and ref["fetch"]["invocation_id"] == iid
            assert ref["streams"]["stdout"]["sha256"] == (
                "sha256:" + hashlib.sha256(expected).hexdigest()
            )
            # Stored as sequenced chunks of at most 64 KiB with a completeness marker.
            chunks = env["evidence"]["result"]["chunks"]["stdout"]
            assert chunks == -(-size // (64 * 1024))
            stored = b.journal.read_result(iid)
            assert stored is not None
            stream = stored.summary["streams"]["stdout"]
            assert stream["bytes"] == size
            assert stream["sha256"] == "sha256:" + hashlib.sha256(expected).hexdigest()
            fetched = await b.fetch_result(iid)
            assert fetched is not None
            assert fetched["result"]["stdout"].encode() == expected
            assert fetched["result"]["sha256"] == env["result"]["sha256"]
            assert fetched["result"]["sha256"] == env["evidence"]["result"]["sha256"]
            kinds = event_kinds(b, iid)
            assert kinds.count(EventKind.DISPATCH_STARTED) == 1
    # On disk, read by a separate connection: one sealed chunk per index 0..n-1, each in its
    # row or -- a long result -- in a segment file beside the journal its reference names.
    db = tmp_path / "journal.db"
    blobs = [stored_chunk(db, iid, "stdout", idx) for idx in range(chunks)]
    assert all(64 * 1024 < len(b) <= 64 * 1024 + 64 for b in blobs[:-1])
    assert b"".join(blobs).find(expected[:4096]) == -1  # sealed, never the plaintext
    assert hostile.exec_requests.count(command) == 1


async def test_a_listed_idempotent_command_with_stdin_is_reconciled_not_sent_again(
    tmp_path: Path, hostile: HostileServer
) -> None:
    # `drop` is listed as idempotent.  Without stdin its unknown outcome is safe to send again;
    # with stdin the listing vouches for nothing the stdin feeds it (`sh`, `psql`).
    target = ssh_target(hostile.port, "bob", hostile.pin, idempotent_commands=["drop"])
    cfg = write_config(tmp_path, {"evil": target})
    with trio.fail_after(LIMIT):
        async with open_broker(cfg) as b:
            plain = await b.call({"target": "evil", "command": "drop"})
            assert_error(b, plain, phase="remote_execution", outcome="unknown",
                         retry="backoff", code="REMOTE_OUTCOME_UNKNOWN")  # fmt: skip
            fed = await b.call({"target": "evil", "command": "drop", "stdin": "rm -rf /srv\n"})
            assert_error(b, fed, phase="remote_execution", outcome="unknown",
                         retry="reconcile", code="REMOTE_OUTCOME_UNKNOWN")  # fmt: skip
