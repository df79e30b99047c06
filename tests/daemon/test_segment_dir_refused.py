"""A SQLite journal whose ``<path>.results`` is there but is not a directory (a regular file):
no long result's bytes can be stored, so every call with one would be sent to its target and
end ``RESULT_STORE_FAILED``.  The daemon refuses to start instead, code ``SEGMENT_DIR_UNUSABLE``
(as the start-up reclaim and ``affidavit journal reclaim`` name it), before its socket is bound
and before its start-up recovery writes; ``affidavit serve`` exits 2 with the code, no
traceback.  Its absence is no refusal: the first long result makes the directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from affidavit.config import load_config
from affidavit.daemon.server import Daemon, DaemonError
from tests.broker.helpers import TOKEN_ENV

from .kit import WAIT, api_target, ask, write_daemon_config

URL = "http://127.0.0.1:9"  # never called: the daemon does not start


def _config(tmp_path: Path) -> tuple[Path, Path, Path]:
    socket = tmp_path / "affidavit.sock"
    cfg = write_daemon_config(tmp_path, api_target(URL), socket=socket)
    results = Path(f"{load_config(cfg).journal.location}.results")
    return cfg, socket, results


async def test_a_results_path_that_is_a_file_refuses_the_start(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    cfg, socket, results = _config(tmp_path)
    results.write_bytes(b"not a directory")
    with trio.fail_after(WAIT), pytest.raises(DaemonError) as caught:
        await Daemon(load_config(cfg)).run()
    assert caught.value.code == "SEGMENT_DIR_UNUSABLE", caught.value
    assert "is not a directory" in str(caught.value), caught.value
    assert not socket.exists()  # never bound
    assert results.read_bytes() == b"not a directory"  # left as it was


async def test_no_results_directory_yet_is_no_refusal(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    cfg, socket, results = _config(tmp_path)
    async with trio.open_nursery() as nursery:
        daemon = Daemon(load_config(cfg))
        with trio.fail_after(WAIT):
            await nursery.start(daemon.run)
            assert (await ask(socket, "GET", "/v1/health"))[0] == 200
        daemon.shutdown.set()
    assert not results.exists()


def test_serve_exits_2_with_the_code(tmp_path: Path, token: str) -> None:
    cfg, _, results = _config(tmp_path)
    results.write_bytes(b"")
    done = subprocess.run(
        [sys.executable, "-m", "affidavit", "serve", "--config", str(cfg)],
        env={**os.environ, TOKEN_ENV: token},
        capture_output=True,
        timeout=WAIT,
        cwd=tmp_path,
        check=False,
    )
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err.startswith("affidavit: SEGMENT_DIR_UNUSABLE: "), err
    assert "Traceback" not in err
