"""An entry typed at a terminal prompt is never taken cut (review of 9ba3c1f, finding 3).

The Linux tty keeps 4095 bytes of a line (its 4096-byte buffer, less the newline) and drops what
is typed or pasted past them before ``getpass`` sees it: a pasted 5000-byte token at ``vault
put``'s prompt was stored as 4095 bytes, exit 0, and a long passphrase at ``vault init`` was set
cut.  An entry that reaches 4095 bytes is refused with a code and the way to give it whole (on
stdin); one shorter is taken as typed.  An entry that is not UTF-8 as read (cut mid-character,
or mistyped) and Ctrl-D at any prompt are refused too, never a traceback (re-review of 37dc4c4,
finding 1), and ``--passphrase-stdin`` from a terminal, which shows the line and cuts it
(finding 2).  Each test drives the command on a pseudo-terminal, bounded in time (the child is
killed past ``LIMIT``).
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


ENTER, EOF = b"\n", b"\x04"
"""What ends a line typed at a terminal; Ctrl-D (VEOF) at the start of one: the end of input."""


def _typed(
    cwd: Path, argv: tuple[str, ...], entries: list[bytes], *, prompted: bool = True
) -> tuple[int, bytes]:
    """Run ``affidavit argv`` on a pty, typing each entry (its ``ENTER`` or ``EOF`` included) at
    each prompt -- or at once, unless ``prompted`` -- in 500-byte pastes; its exit status and
    everything it wrote to the terminal."""
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
            if prompted:
                drain(b": ")  # the n-th prompt
                assert seen.count(b": ") >= n, bytes(seen)
            for i in range(0, len(entry), 500):
                os.write(fd, entry[i : i + 500])
                drain(None, 0.02)
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
    code, seen = _typed(
        tmp_path, ("vault", "put", "--vault", str(unlocked), "long"), [b"J" * 5000 + ENTER]
    )
    assert code == 2, seen
    assert b"affidavit: PAYLOAD_LIMIT: value: a terminal cuts a line at 4095 bytes" in seen
    assert b"pipe it on stdin" in seen and b"Traceback" not in seen
    assert Vault.open(unlocked).list() == []


def test_a_value_shorter_than_the_terminal_line_is_stored_as_typed(
    tmp_path: Path, unlocked: Path
) -> None:
    value = b"K" * 4094
    code, seen = _typed(
        tmp_path, ("vault", "put", "--vault", str(unlocked), "long"), [value + ENTER]
    )
    assert code == 0, seen
    assert Vault.open(unlocked).get("long") == (value, 1)


def test_a_passphrase_typed_past_the_terminal_line_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.vault"
    code, seen = _typed(tmp_path, ("vault", "init", "--vault", str(path)), [b"P" * 5000 + ENTER])
    assert code == 2, seen
    assert b"affidavit: PASSPHRASE_INVALID: a terminal cuts a line at 4095 bytes" in seen
    assert b"--passphrase-stdin" in seen and not path.exists()


def test_a_value_cut_mid_character_is_refused_not_a_traceback(
    tmp_path: Path, unlocked: Path
) -> None:
    """5200 bytes of 'é': the tty keeps 4095, the last a lone lead byte, and getpass's
    UnicodeDecodeError (naming that byte of the value) was a traceback, exit 1."""
    entry = "é".encode() * 2600 + ENTER
    code, seen = _typed(tmp_path, ("vault", "put", "--vault", str(unlocked), "long"), [entry])
    assert code == 2, seen
    assert b"affidavit: INVALID_FIELD: value: the entry is not valid UTF-8" in seen
    assert b"may be cut" in seen and b"pipe it on stdin" in seen
    assert b"Traceback" not in seen and b"0xc3" not in seen
    assert Vault.open(unlocked).list() == []


def test_a_passphrase_typed_in_invalid_utf8_is_refused_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "new.vault"
    code, seen = _typed(tmp_path, ("vault", "init", "--vault", str(path)), [b"pw\xff\xfe" + ENTER])
    assert code == 2, seen
    assert b"affidavit: PASSPHRASE_INVALID: the entry is not valid UTF-8" in seen
    assert b"--passphrase-stdin" in seen and b"Traceback" not in seen and not path.exists()


EOF_CASES = [
    # (command, entries typed, the refusal's start): Ctrl-D was an EOFError traceback, exit 1.
    ("put", [EOF], b"affidavit: INVALID_FIELD: value: no entry was given"),
    ("init", [EOF], b"affidavit: PASSPHRASE_INVALID: no entry was given"),
    ("init", [b"pw" + ENTER, EOF], b"affidavit: PASSPHRASE_INVALID: no entry was given"),
    ("unlock", [EOF], b"affidavit: PASSPHRASE_INVALID: no entry was given"),
]


@pytest.mark.parametrize(
    "command, entries, refused",
    EOF_CASES,
    ids=["put", "init", "init-repeat", "unlock"],
)
def test_the_end_of_input_at_a_prompt_is_refused_not_a_traceback(
    tmp_path: Path, unlocked: Path, command: str, entries: list[bytes], refused: bytes
) -> None:
    target = tmp_path / "new.vault" if command == "init" else unlocked
    if command == "unlock":
        Vault.open(unlocked).lock()
    argv = ("vault", command, "--vault", str(target), *(["x"] if command == "put" else []))
    code, seen = _typed(tmp_path, argv, entries)
    assert code == 2, seen
    assert refused in seen and b"Traceback" not in seen, seen
    assert not (tmp_path / "new.vault").exists()
    vault = Vault.open(unlocked)  # nothing stored, nothing unlocked
    assert vault.is_locked if command == "unlock" else vault.list() == []


@pytest.mark.parametrize("command", ["init", "unlock"])
def test_passphrase_stdin_from_a_terminal_is_refused(tmp_path: Path, command: str) -> None:
    """A terminal shows the line as typed and cuts it at 4095 bytes: ``init --passphrase-stdin``
    set a 5000-byte passphrase cut, echoed, exit 0.  Refused before a byte is read; the prompt
    (no echo, the same cut refused) is the terminal's way in."""
    path = tmp_path / "v.vault"
    if command == "unlock":
        Vault.init(path, "pw", n_log2=10)  # the line typed opens it: taken, it was unlocked
    typed = b"pw" if command == "unlock" else b"P" * 5000
    argv = ("vault", command, "--vault", str(path), "--passphrase-stdin")
    code, seen = _typed(tmp_path, argv, [typed + ENTER], prompted=False)
    assert code == 2, seen
    assert b"affidavit: PASSPHRASE_INVALID: --passphrase-stdin, but stdin is a terminal" in seen
    assert b"without echo" in seen and b"Traceback" not in seen
    assert Vault.open(path).is_locked if command == "unlock" else not path.exists()
