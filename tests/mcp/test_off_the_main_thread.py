"""``affidavit.mcp.run`` takes SIGTERM and SIGINT for its stop (trio's receiver, embedded or a
proxy), which Python allows on the main thread only: called off it, it is refused with a code
(``McpError``, ``NOT_MAIN_THREAD``) before it reads its config or reaches a daemon -- not
trio's bare RuntimeError from the middle of its start."""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import pytest
import trio

from affidavit.mcp import McpError, run
from tests.broker.helpers import http_target, write_config
from tests.daemon.kit import HUNG


@pytest.mark.parametrize("proxy", [False, True], ids=["embedded", "proxy"])
def test_run_called_off_the_main_thread_is_refused_with_a_code(tmp_path: Path, proxy: bool) -> None:
    cfg = write_config(tmp_path, {"ok": http_target("http://127.0.0.1:9")})
    socket = str(tmp_path / "daemon.sock") if proxy else None
    raised: list[BaseException] = []

    def host() -> None:
        try:
            trio.run(functools.partial(run, config=str(cfg), socket=socket))
        except BaseException as exc:  # (whatever it is, the test says)
            raised.append(exc)

    thread = threading.Thread(target=host, name="host-worker")
    thread.start()
    thread.join(HUNG)
    assert not thread.is_alive()
    (exc,) = raised
    assert isinstance(exc, McpError), repr(exc)
    assert exc.code == "NOT_MAIN_THREAD" and "'host-worker'" in str(exc)
