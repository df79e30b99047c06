"""The driver against a real OpenSSH sshd: every classification row sshd can produce."""

from __future__ import annotations

import hashlib
import socket

import pytest
import trio

from affidavit.adapters.base import AttemptInterrupted, SetupError
from affidavit.adapters.ssh import (
    CHUNK,
    SshTarget,
    SshTimeouts,
    load_known_hosts,
    perform,
    prepare_credential,
)
from affidavit.statemachine import Code, Outcome
from tests.cancel import REACHED_WITHIN, cancel_once

from .conftest import LOOP_HELD, Recorder, Sshd


async def test_exit_status_zero_is_committed_success_with_separate_streams(sshd: Sshd) -> None:
    rec = Recorder()
    cred = prepare_credential(sshd.client_key)
    with trio.fail_after(10):
        res = await perform(sshd.target(), cred, "echo out; echo err >&2", None, rec.ctx)
    assert (res.outcome, res.code) == (Outcome.COMMITTED, None)
    assert res.summary == {"exit_status": 0, "exit_signal": None, "core_dumped": False}
    assert rec.stream("stdout") == b"out\n" and rec.stream("stderr") == b"err\n"
    assert res.facts["stdout_sha256"] == hashlib.sha256(b"out\n").hexdigest()
    assert res.facts["stderr_sha256"] == hashlib.sha256(b"err\n").hexdigest()
    assert res.facts["host_key"].startswith("ssh-ed25519 SHA256:")
    assert rec.ctx.machine.state == "closed" and rec.ctx.machine.complete
    ev = rec.events
    assert ev[:6] == [
        "tcp_connected",
        "transport_ready",
        "host_key_verified",
        "authenticated",
        "session_open",
        "exec",
    ]
    assert ev[6:8] == ["exec_sent", "exec_accepted"] and ev[-1] == "channel_closed"
    # The gate was awaited exactly once, before the dispatch step was fired.
    assert len(rec.gate_calls) == 1 and rec.gate_calls[0]["_steps_before"] == 5
    assert (
        rec.gate_calls[0]["command_sha256"] == hashlib.sha256(b"echo out; echo err >&2").hexdigest()
    )


async def test_exit_status_23_is_committed_command_failed_not_a_failure_to_run(sshd: Sshd) -> None:
    rec = Recorder()
    with trio.fail_after(10):
        res = await perform(
            sshd.target(), prepare_credential(sshd.client_key), "exit 23", None, rec.ctx
        )
    assert (res.outcome, res.code) == (Outcome.COMMITTED, Code.REMOTE_COMMAND_FAILED)
    assert res.summary["exit_status"] == 23 and res.summary["exit_signal"] is None


async def test_exit_signal_is_committed_command_failed_with_the_signal(sshd: Sshd) -> None:
    rec = Recorder()
    with trio.fail_after(10):
        res = await perform(
            sshd.target(), prepare_credential(sshd.client_key), "kill -9 $$", None, rec.ctx
        )
    assert (res.outcome, res.code) == (Outcome.COMMITTED, Code.REMOTE_COMMAND_FAILED)
    assert res.summary == {"exit_status": None, "exit_signal": "KILL", "core_dumped": False}
    assert "exit_signal" in rec.events


async def test_host_key_mismatch_is_found_before_authentication(sshd: Sshd) -> None:
    rec = Recorder()
    other_pub = prepare_credential(sshd.other_key).public_fingerprint
    assert other_pub is not None
    wrong = SshTarget("127.0.0.1", sshd.port, sshd.user, (_pub_pin(sshd.other_key),), SshTimeouts())
    with trio.fail_after(10), pytest.raises(SetupError) as ei:
        await perform(wrong, prepare_credential(sshd.client_key), "true", None, rec.ctx)
    assert (ei.value.code, ei.value.stage) == (Code.HOST_KEY_MISMATCH, "host_key")
    assert "authenticated" not in rec.events and rec.events[-1] == "setup_failed"
    assert not rec.ctx.machine.dispatched and rec.gate_calls == []
    assert "ssh-ed25519 SHA256:" in str(ei.value)


async def test_empty_pin_list_is_a_mismatch_not_trust_on_first_use(sshd: Sshd) -> None:
    rec = Recorder()
    target = SshTarget("127.0.0.1", sshd.port, sshd.user, ())
    with trio.fail_after(10), pytest.raises(SetupError) as ei:
        await perform(target, prepare_credential(sshd.client_key), "true", None, rec.ctx)
    assert ei.value.code == Code.HOST_KEY_MISMATCH and "no host key is pinned" in str(ei.value)


async def test_known_hosts_file_pins_the_real_server(sshd: Sshd) -> None:
    pins = load_known_hosts(str(sshd.known_hosts), "127.0.0.1", sshd.port)
    target = SshTarget("127.0.0.1", sshd.port, sshd.user, pins)
    rec = Recorder()
    with trio.fail_after(10):
        res = await perform(target, prepare_credential(sshd.client_key), "true", None, rec.ctx)
    assert res.code is None


async def test_authentication_rejected_with_an_unauthorised_key(sshd: Sshd) -> None:
    rec = Recorder()
    with trio.fail_after(10), pytest.raises(SetupError) as ei:
        await perform(sshd.target(), prepare_credential(sshd.other_key), "true", None, rec.ctx)
    assert (ei.value.code, ei.value.stage) == (Code.REMOTE_AUTH_FAILED, "userauth")
    assert not rec.ctx.machine.dispatched and rec.gate_calls == []


async def test_connection_refused_on_a_closed_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: the kernel answers RST
        rec = Recorder()
        target = SshTarget("127.0.0.1", port, "nobody", ("ssh-ed25519 AAAA",))
        with trio.fail_after(10), pytest.raises(SetupError) as ei:
            await perform(target, prepare_credential(b"pw", kind="password"), "true", None, rec.ctx)
    assert (ei.value.code, ei.value.stage) == (Code.CONNECTION_REFUSED, "tcp_connect")
    assert rec.events == ["setup_failed"]
    assert not rec.ctx.machine.dispatched


async def test_caller_timeout_after_exec_propagates_cancelled_with_dispatch_proven(
    sshd: Sshd,
) -> None:
    rec = Recorder()
    with trio.fail_after(REACHED_WITHIN + 10), trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            # The caller gives up 0.2 s into the command, not 1 s after the call began: a
            # loaded machine's sshd had not always run the command by then.
            sent = lambda: rec.ctx.machine.dispatched  # noqa: E731
            nursery.start_soon(cancel_once, scope, sent, "exec sent", 0.2)
            await perform(
                sshd.target(), prepare_credential(sshd.client_key), "sleep 30", None, rec.ctx
            )
    assert scope.cancelled_caught
    assert rec.ctx.machine.dispatched and not rec.ctx.machine.complete
    assert rec.events[-1] == "cancelled" and rec.ctx.machine.state == "interrupted"


async def test_own_exec_timeout_is_outcome_unknown(sshd: Sshd) -> None:
    rec = Recorder()
    with trio.fail_after(10), pytest.raises(AttemptInterrupted) as ei:
        await perform(
            sshd.target(exec=0.5), prepare_credential(sshd.client_key), "sleep 30", None, rec.ctx
        )
    assert ei.value.code == Code.REMOTE_OUTCOME_UNKNOWN
    assert rec.events[-1] == "timed_out" and rec.ctx.machine.dispatched


async def test_stdin_is_written_interleaved_with_reads(sshd: Sshd) -> None:
    # 4 MiB through `cat` exceeds both channel windows -- OpenSSH's session window is 2 MiB,
    # libssh's own grows to about 1.28 MB -- and what the pipes in between hold: a driver that
    # wrote all stdin before reading anything would deadlock.  (1 MiB fitted in the windows, so
    # such a driver passed.)
    data = bytes(range(256)) * 16384
    rec = Recorder()
    with trio.fail_after(20):
        res = await perform(
            sshd.target(), prepare_credential(sshd.client_key), "cat", data, rec.ctx
        )
    assert res.code is None and rec.stream("stdout") == data


async def test_a_command_that_exits_without_reading_its_stdin_is_still_a_result(
    sshd: Sshd,
) -> None:
    # `head -c 3` reads 3 bytes and exits; sshd closes the channel while 8 MiB are still to be
    # written.  libssh then refuses the write ("Remote channel is closed"): that used to escape
    # the driver as a raw SSHError (the engine's REMOTE_OUTCOME_UNKNOWN) although exit-status,
    # EOF and close -- a complete result -- had arrived.
    data = b"abc" + bytes(8 * 1024 * 1024)
    rec = Recorder()
    with trio.fail_after(20):
        res = await perform(
            sshd.target(), prepare_credential(sshd.client_key), "head -c 3", data, rec.ctx
        )
    assert (res.outcome, res.code, res.summary["exit_status"]) == (Outcome.COMMITTED, None, 0)
    assert rec.stream("stdout") == b"abc"
    assert 0 < res.facts["stdin_unsent"] < len(data)
    assert rec.steps[-1][1] == {"stdin_unsent": res.facts["stdin_unsent"]}  # journaled step
    assert rec.ctx.machine.state == "closed"


async def test_large_output_streams_through_the_sink_in_bounded_chunks(sshd: Sshd) -> None:
    size = 5 * 1024 * 1024
    rec = Recorder()
    with trio.fail_after(30):
        res = await perform(
            sshd.target(),
            prepare_credential(sshd.client_key),
            f"head -c {size} /dev/urandom",
            None,
            rec.ctx,
        )
    out = [d for s, d in rec.chunks if s == "stdout"]
    assert res.code is None and sum(map(len, out)) == size
    assert len(out) >= size // CHUNK and max(map(len, out)) <= CHUNK
    assert res.facts["stdout_sha256"] == hashlib.sha256(b"".join(out)).hexdigest()
    assert res.facts["stdout_bytes"] == size


async def test_a_slow_command_does_not_block_the_trio_loop(sshd: Sshd) -> None:
    gaps: list[float] = []
    done = trio.Event()

    async def ticker() -> None:
        last = trio.current_time()
        while not done.is_set():
            await trio.sleep(0.01)
            now = trio.current_time()
            gaps.append(now - last)
            last = now

    rec = Recorder()
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            await perform(
                sshd.target(), prepare_credential(sshd.client_key), "sleep 2", None, rec.ctx
            )
            done.set()
    assert len(gaps) > 50  # the ticker ran all along (~2 s / 10 ms)
    assert max(gaps) < LOOP_HELD


async def test_eight_concurrent_execs_share_one_loop(sshd: Sshd) -> None:
    results = {}

    async def one(i: int) -> None:
        rec = Recorder()
        res = await perform(
            sshd.target(), prepare_credential(sshd.client_key), f"echo {i}", None, rec.ctx
        )
        results[i] = (res.code, rec.stream("stdout"))

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(one, i)
    assert results == {i: (None, f"{i}\n".encode()) for i in range(8)}


def _pub_pin(private_key: bytes) -> str:
    import base64

    import ssh.key

    key = ssh.key.import_privkey_base64(private_key)
    pub = key.export_privkey_to_pubkey()
    blob = base64.b64decode(pub.export_pubkey_base64())
    return f"ssh-ed25519 {base64.b64encode(blob).decode()}"
