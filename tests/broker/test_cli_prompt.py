"""An entry typed at a terminal prompt is never taken cut (review of 9ba3c1f, finding 3).

The Linux tty keeps 4095 bytes of a line (its 4096-byte buffer, less the newline) and drops what
is typed or pasted past them before ``getpass`` sees it: a pasted 5000-byte token at ``vault
put``'s prompt was stored as 4095 bytes, exit 0, and a long passphrase at ``vault init`` was set
cut.  An entry that reaches 4095 bytes is refused with a code and the way to give it whole (on
stdin); one shorter is taken as typed.  Each test drives the command on a pseudo-terminal,
bounded in time (the child is killed past ``LIMIT``).
"""

from __future__ import annotations

import os
import pty
import select
import signal
import sys
import time
from pathlib import Path

import pytest

from affidavit.secrets.vault import Vault

LIMIT = 30.0


def _typed(cwd: Path, argv: tuple[str, ...], entries: list[bytes]) -> tuple[int, bytes]:
    """Run ``affidavit argv`` on a pty, typing each entry (and a newline) at each prompt, in
    500-byte pastes; its exit status and everything it wrote to the terminal."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AFFIDAVIT_")}
    pid, fd = pty.fork()
    if pid == 0:  # the child: nothing of pytest's may run here
        try:
            os.chdir(cwd)
            os.execve(sys.executable, [sys.executable, "-m", "affidavit", *argv], env)
        finally:
            os._exit(127)
    deadline = time.monotonic() + LIMIT
    seen = bytearray()
    reaped = False

    def drain(until: bytes | None, for_s: float = 0.0) -> None:
        """Read the terminal until ``until`` appears in it (or for ``for_s`` seconds)."""
        end = min(deadline, time.monotonic() + (LIMIT if until else for_s))
        while time.monotonic() < end and not (until and until in seen):
            ready, _, _ = select.select([fd], [], [], 0.05)
            if ready:
                try:
                    seen.extend(os.read(fd, 65536))
                except OSError:  # the child is gone (EIO on Linux)
                    return

    try:
        for n, entry in enumerate(entries, 1):
            drain(b": ")  # the n-th prompt
            assert seen.count(b": ") >= n, bytes(seen)
            for i in range(0, len(entry), 500):
                os.write(fd, entry[i : i + 500])
                drain(None, 0.02)
            os.write(fd, b"\n")
        while time.monotonic() < deadline:
            drain(None, 0.1)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                reaped = True
                drain(None, 0.1)
                return os.waitstatus_to_exitcode(status), bytes(seen)
        pytest.fail(f"still running after {LIMIT}s: {bytes(seen)[-300:]!r}")
    finally:
        if not reaped:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)


@pytest.fixture
def unlocked(tmp_path: Path) -> Path:
    vault = Vault.init(tmp_path / "v.vault", "pw", n_log2=10)
    vault.unlock("pw")
    return vault.path


def test_a_value_pasted_past_the_terminal_line_is_refused_not_stored_cut(
    tmp_path: Path, unlocked: Path
) -> None:
    code, seen = _typed(tmp_path, ("vault", "put", "--vault", str(unlocked), "long"), [b"J" * 5000])
    assert code == 2, seen
    assert b"affidavit: PAYLOAD_LIMIT: value: a terminal cuts a line at 4095 bytes" in seen
    assert b"pipe it on stdin" in seen and b"Traceback" not in seen
    assert Vault.open(unlocked).list() == []


def test_a_value_shorter_than_the_terminal_line_is_stored_as_typed(
    tmp_path: Path, unlocked: Path
) -> None:
    value = b"K" * 4094
    code, seen = _typed(tmp_path, ("vault", "put", "--vault", str(unlocked), "long"), [value])
    assert code == 0, seen
    assert Vault.open(unlocked).get("long") == (value, 1)


def test_a_passphrase_typed_past_the_terminal_line_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.vault"
    code, seen = _typed(tmp_path, ("vault", "init", "--vault", str(path)), [b"P" * 5000])
    assert code == 2, seen
    assert b"affidavit: PASSPHRASE_INVALID: a terminal cuts a line at 4095 bytes" in seen
    assert b"--passphrase-stdin" in seen and not path.exists()
