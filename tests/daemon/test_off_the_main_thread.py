"""The daemon run inside another program takes SIGTERM and SIGINT for its stop (trio's
receiver), which Python allows on the main thread only: called off it, ``serve`` is refused
with a code (``NOT_MAIN_THREAD``) before it claims its socket -- not trio's bare RuntimeError
from the middle of its start."""

from __future__ import annotations

import resource
import signal
import threading
from pathlib import Path

import pytest
import trio

from affidavit.config import load_config
from affidavit.daemon import server
from affidavit.daemon.server import DaemonError

from .kit import HUNG, api_target, write_daemon_config


def test_serve_called_off_the_main_thread_is_refused_with_a_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    socket = tmp_path / "s.sock"
    config = load_config(
        write_daemon_config(tmp_path, api_target("http://127.0.0.1:9"), socket=socket)
    )
    found = signal.getsignal(signal.SIGTERM)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Below the hard limit, so that a serve() that went as far as raising it would show.
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 512), hard))
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    raised: list[BaseException] = []

    def host() -> None:
        try:
            trio.run(server.serve, config)
        except BaseException as exc:  # (whatever it is, the test says)
            raised.append(exc)

    thread = threading.Thread(target=host, name="host-worker")
    try:
        thread.start()
        thread.join(HUNG)
        after = resource.getrlimit(resource.RLIMIT_NOFILE)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert not thread.is_alive()
    (exc,) = raised
    assert isinstance(exc, DaemonError), repr(exc)
    assert exc.code == "NOT_MAIN_THREAD" and "'host-worker'" in str(exc)
    assert not socket.exists() and not list(tmp_path.glob("s.sock*"))  # nothing claimed
    assert signal.getsignal(signal.SIGTERM) is found
    assert after == limits  # refused before any of it (the process's open-files limit)
