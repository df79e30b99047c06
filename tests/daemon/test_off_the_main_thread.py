"""The daemon run inside another program takes SIGTERM and SIGINT for its stop (trio's
receiver), which Python allows on the main thread only: called off it, ``serve`` is refused
with a code (``NOT_MAIN_THREAD``) before it claims its socket -- not trio's bare RuntimeError
from the middle of its start."""

from __future__ import annotations

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
    monkeypatch.setattr(server, "_raise_open_files", lambda: None)  # (not this process's)
    socket = tmp_path / "s.sock"
    config = load_config(
        write_daemon_config(tmp_path, api_target("http://127.0.0.1:9"), socket=socket)
    )
    found = signal.getsignal(signal.SIGTERM)
    raised: list[BaseException] = []

    def host() -> None:
        try:
            trio.run(server.serve, config)
        except BaseException as exc:  # (whatever it is, the test says)
            raised.append(exc)

    thread = threading.Thread(target=host, name="host-worker")
    thread.start()
    thread.join(HUNG)
    assert not thread.is_alive()
    (exc,) = raised
    assert isinstance(exc, DaemonError), repr(exc)
    assert exc.code == "NOT_MAIN_THREAD" and "'host-worker'" in str(exc)
    assert not socket.exists() and not list(tmp_path.glob("s.sock*"))  # nothing claimed
    assert signal.getsignal(signal.SIGTERM) is found
