"""Input read from a non-blocking stdin is read whole (review of 9ba3c1f / d74e843, finding 2).

A parent such as node sets O_NONBLOCK on the pipe it shares as our fd 0; Python's buffered
``read(n)`` then returns what has arrived, or None.  ``vault put`` stored a cut value with exit
0, ``vault init --passphrase-stdin`` set a cut passphrase, and with nothing arrived yet ``vault
put`` and ``call -`` crashed with a traceback.  Each command test feeds a non-blocking pipe in
two chunks, the second only once the command has taken the first (``_wait_taken``: a pause alone
let ``call -``, slower to start, find both there -- re-review of d446f96, finding 3), and checks
that the whole input was taken and that the parent's flag is left as it set it; the unit tests
start ``InputReader`` with nothing arrived yet.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from affidavit.cli.stdin import InputReader
from affidavit.secrets.vault import Vault

PAUSE = 0.4
"""How long the unit tests' writer waits before its first chunk: the reader starts on nothing."""
LIMIT = 60.0
"""Seconds a test waits for the command (or the reader) to take a chunk or to finish."""


def _wait_taken(r: int, gone: Callable[[], bool]) -> None:
    """Wait until nothing written to the pipe ``r`` is left unread (FIONREAD 0: the reader took
    it) or ``gone()`` (it will read no more), at most ``LIMIT`` seconds."""
    deadline = time.monotonic() + LIMIT
    while fcntl.ioctl(r, termios.FIONREAD, bytes(4)) != bytes(4) and not gone():
        if time.monotonic() > deadline:
            pytest.fail(f"a chunk written was still unread after {LIMIT}s")
        time.sleep(0.01)


def _fed(cwd: Path, argv: Sequence[str], chunks: Sequence[bytes]) -> tuple[int, str, str]:
    """Run ``affidavit argv`` with a non-blocking pipe as stdin, written in ``chunks``, each
    once the command has taken the one before; bounded: the command is killed after ``LIMIT``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AFFIDAVIT_")}
    r, w = os.pipe()
    os.set_blocking(r, False)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "affidavit", *argv],
            stdin=r,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
        )
        try:
            for chunk in chunks:
                # Our end of the pipe stays open: a command gone early cannot break the write.
                os.write(w, chunk)
                _wait_taken(r, lambda: proc.poll() is not None)
            os.close(w)
            w = -1
            out, err = proc.communicate(timeout=LIMIT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        # The flag is the file description's, shared with the parent: left as it was set.
        assert not os.get_blocking(r)
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture
def unlocked(tmp_path: Path) -> Path:
    vault = Vault.init(tmp_path / "v.vault", "pw", n_log2=10)
    vault.unlock("pw")
    return vault.path


def test_vault_put_stores_the_whole_value_from_a_non_blocking_stdin(
    tmp_path: Path, unlocked: Path
) -> None:
    argv = ("vault", "put", "--vault", str(unlocked), "deploy")
    code, out, err = _fed(tmp_path, argv, [b"TOKEN-PART-ONE", b"-PART-TWO\n"])
    assert (code, out, err) == (0, "stored deploy version 1\n", "")
    assert Vault.open(unlocked).get("deploy") == (b"TOKEN-PART-ONE-PART-TWO", 1)


def test_vault_init_passphrase_stdin_takes_the_whole_line_from_a_non_blocking_stdin(
    tmp_path: Path,
) -> None:
    path = tmp_path / "new.vault"
    argv = ("vault", "init", "--vault", str(path), "--passphrase-stdin")
    code, _, err = _fed(tmp_path, argv, [b"correct-horse", b"-battery-staple\n"])
    assert code == 0, err
    Vault.open(path).unlock("correct-horse-battery-staple")  # WrongPassphrase for a cut one


def test_call_dash_reads_the_whole_action_from_a_non_blocking_stdin(tmp_path: Path) -> None:
    """Split mid-object: a cut read would be a JSON refusal; read whole, the action is judged
    (its unknown target, field ``target``)."""
    cfg = tmp_path / "affidavit.toml"
    done = subprocess.run(
        [sys.executable, "-m", "affidavit", "init", "--config", str(cfg)],
        capture_output=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("AFFIDAVIT_")},
    )
    assert done.returncode == 0, done.stderr
    chunks = [b'{"target": "nope",', b' "method": "GET", "path": "/x"}\n']
    code, out, err = _fed(tmp_path, ("call", "-", "--config", str(cfg)), chunks)
    assert (code, err) == (1, ""), err
    error = json.loads(out)["error"]
    assert (error["phase"], error["field"]) == ("validation", "target"), error


def test_readline_takes_nothing_past_the_line() -> None:
    """The passphrase line is read up to its newline, whatever arrives with it after."""
    r, w = os.pipe()
    os.set_blocking(r, False)

    with _writing(r, w, [b"first", b" line\nsecond"]):
        reader = InputReader(r)
        assert reader.readline(100) == b"first line\n"
        assert reader.read(100) == b"second"
        assert reader.read(100) == b""


def test_read_waits_for_input_that_has_not_arrived_yet() -> None:
    """Nothing there when ``read`` starts (a BlockingIOError, or None from Python's buffered
    reader), then a part (what a cut read stops at): it waits on until the end of input."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    with _writing(r, w, [b"TOKEN-PART-ONE", b"-PART-TWO"]):
        assert InputReader(r).read(100) == b"TOKEN-PART-ONE-PART-TWO"


@contextlib.contextmanager
def _writing(r: int, w: int, chunks: Sequence[bytes]) -> Iterator[None]:
    """A thread writing ``chunks`` to the pipe ``w`` -- the first after ``PAUSE``, each next
    once the reader of ``r`` has taken the one before -- then closing it; ``r`` is closed
    after.  The reader never waits for ever: the end of input comes, however it reads."""
    done = threading.Event()

    def writer() -> None:
        try:
            time.sleep(PAUSE)
            for chunk in chunks:
                os.write(w, chunk)
                _wait_taken(r, done.is_set)
        finally:
            os.close(w)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=LIMIT)
        os.close(r)
