"""A remote that keeps printing while it needs stdin gets its stdin (docs/ssh-driver.md, "A later
read is told apart").

Every call that may take packets off the socket (a stdin write, ``send_eof``) waits for a drain
that knows the order of what libssh holds.  It used to wait for a pass that found both streams
empty, which a remote that never pauses its output never gives: its stdin was never written and
the attempt ended at the exec timeout, ``timed_out``, unknown (real sshd, a remote printing every
0.2 ms while it read 4 MB, a sink of 1 ms a chunk: 10 s; committed in 0.77 s before that rule).
The drain now ends at the first read that found its stream empty and was no EOF -- which a remote
that keeps *both* streams busy (``each``) never gives: past the starvation guard's 50 ms
(``driver._STARVE``) stdin is written without it (before: the 10 s exec timeout).
"""

from __future__ import annotations

import time

import pytest
import trio

from affidavit.adapters.ssh import perform, prepare_credential
from affidavit.statemachine import Outcome

from .conftest import Recorder, SshKeys, hostile_target
from .hostile import HostileServer

STDIN = 200_000


@pytest.mark.parametrize("to", ["stdout", "stderr", "each"])
async def test_a_remote_printing_without_pause_while_it_reads_stdin_gets_its_stdin(
    hostile: HostileServer, ssh_keys: SshKeys, to: str
) -> None:
    rec = Recorder(sink_delay=0.02)  # slower than the remote: every read finds output waiting
    target = hostile_target(hostile, "bob", exec=10.0)
    started = time.monotonic()
    with trio.fail_after(30):
        res = await perform(
            target, prepare_credential(ssh_keys.client_key), f"flood {STDIN} {to}",
            b"x" * STDIN, rec.ctx,
        )  # fmt: skip
    took = time.monotonic() - started
    streams = ("stdout", "stderr") if to == "each" else (to,)
    assert (res.outcome, res.code, res.summary["exit_status"]) == (Outcome.COMMITTED, None, 0)
    assert rec.stream("stdout").endswith(b"done\n")
    assert all(b"tick\n" in rec.stream(name) for name in streams)
    assert "stdin_unsent" not in res.facts
    assert took < 5, took  # not the exec timeout


async def test_stdin_written_without_the_proof_fills_the_open_window(
    hostile: HostileServer, ssh_keys: SshKeys
) -> None:
    """A proven write is one piece a round (its pump spends the proof); a starved one has none
    to spend and fills the remote's open window.  One piece a round held 1 MB of stdin to
    64 KiB per two drains of 16 slow reads (0.6 s): past the exec timeout."""
    rec = Recorder(sink_delay=0.02)
    target = hostile_target(hostile, "bob", exec=5.0)  # asyncssh's window (2 MiB) takes it all
    with trio.fail_after(30):
        res = await perform(
            target, prepare_credential(ssh_keys.client_key), "flood 1000000 each",
            b"x" * 1_000_000, rec.ctx,
        )  # fmt: skip
    assert (res.outcome, res.code, res.summary["exit_status"]) == (Outcome.COMMITTED, None, 0)
    assert rec.stream("stdout").endswith(b"done\n") and b"tick\n" in rec.stream("stderr")
