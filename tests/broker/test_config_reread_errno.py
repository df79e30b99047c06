"""Which failed config reads are edits (audit 53b r2): only an errno of this process or its
machine (``TRANSIENT_READ_ERRNOS``: no descriptor left, an I/O error) is ``ConfigUnread``, the
set-up failure the dispatch gate answers with backoff.  An errno describing what the path now
holds -- a Unix socket there (``ENXIO``), a symlink loop (``ELOOP``), a parent replaced by a
file (``ENOTDIR``), read permission taken away (``EACCES``: an operator's edit) -- is a
configuration that no longer loads: the target counts as changed (CONFIG_CHANGED,
after_correction), as a FIFO there always was."""

from __future__ import annotations

import errno
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

import affidavit.privatefile as privatefile
from affidavit.config import ConfigError, ConfigUnread, load_config, read_config
from affidavit.config.loader import TRANSIENT_READ_ERRNOS
from affidavit.engine.snapshot import ConfigSnapshot
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import assert_error, http_target, open_broker, write_config

LIMIT = 20


def _refuse_open(monkeypatch: pytest.MonkeyPatch, path: Path, code: int) -> None:
    """``os.open`` of ``path`` (only) fails with ``code``, as the kernel would."""
    real = os.open

    def refusing(p: object, *args: object, **kwargs: object) -> int:
        if os.fspath(p) == os.fspath(path):  # type: ignore[arg-type]
            raise OSError(code, os.strerror(code), os.fspath(path))
        return real(p, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(privatefile.os, "open", refusing)


@pytest.fixture
def bound_socket(tmp_path: Path) -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    yield held
    for s in held:
        s.close()


def _replace(kind: str, path: Path, held: list[socket.socket], mp: pytest.MonkeyPatch) -> int:
    """Put ``kind`` where the config was; the errno its open now fails with."""
    if kind == "socket":
        path.unlink()
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        held.append(s)
        return errno.ENXIO
    if kind == "loop":
        path.unlink()
        path.symlink_to(path)
        return errno.ELOOP
    if kind == "notdir":  # the config's directory replaced by a file, reached via a symlink
        real = path.parent / "real"
        real.mkdir()
        shutil.move(path, real / path.name)
        path.symlink_to(real / path.name)
        shutil.rmtree(real)
        real.write_text("x")
        return errno.ENOTDIR
    assert kind == "eacces"
    if os.geteuid() != 0:
        path.chmod(0)
    else:  # root reads a mode-0 file: the kernel's EACCES, injected
        _refuse_open(mp, path, errno.EACCES)
    return errno.EACCES


@pytest.mark.parametrize("kind", ["socket", "loop", "notdir", "eacces"])
async def test_a_path_that_now_refuses_its_read_is_an_edit(
    tmp_path: Path, kind: str, bound_socket: list[socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_config(tmp_path, {"api": http_target("http://127.0.0.1:9/")})
    snap = ConfigSnapshot(load_config(path), lambda purpose, data: f"{purpose}:{data.hex()}")
    bound = snap.hash(snap.config.targets["api"])
    assert not await snap.changed("api", bound)
    code = _replace(kind, path, bound_socket, monkeypatch)
    with pytest.raises(ConfigError) as caught:
        read_config(path)
    assert not isinstance(caught.value, ConfigUnread), caught.value
    assert caught.value.code == "CONFIG_UNREADABLE" and caught.value.file == str(path)
    assert os.strerror(code) in str(caught.value)
    with trio.fail_after(LIMIT):
        assert await snap.changed("api", bound)


@pytest.mark.parametrize("code", sorted(TRANSIENT_READ_ERRNOS), ids=errno.errorcode.get)
def test_only_a_transient_errno_is_an_unread_config(
    tmp_path: Path, code: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_config(tmp_path, {"api": http_target("http://127.0.0.1:9/")})
    _refuse_open(monkeypatch, path, code)
    with pytest.raises(ConfigUnread) as caught:
        read_config(path)
    assert caught.value.errno == code and caught.value.code == "CONFIG_UNREADABLE"


async def test_a_call_after_the_config_became_a_socket_is_config_changed(
    tmp_path: Path, token: str, bound_socket: list[socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end, ENXIO: recorded CONFIG_CHANGED (after_correction), nothing sent -- not the
    SETUP_FAILED / backoff of a read that could not happen."""
    call = {"target": "api", "method": "GET", "path": "/x"}
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as b:
            with trio.fail_after(LIMIT):
                first = await b.call(call)
            assert first.get("error") is None, first
            _replace("socket", cfg, bound_socket, monkeypatch)
            with trio.fail_after(LIMIT):
                env = await b.call(call)
            assert_error(
                b,
                env,
                phase="validation",
                outcome="not_attempted",
                retry="after_correction",
                code="CONFIG_CHANGED",
            )
    assert len(srv.requests) == 1
