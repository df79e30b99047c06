"""A config re-read that ran out of memory (audit 53b r3): a ``MemoryError`` while reading or
parsing the file says nothing of its bytes.  It is ``ConfigUnread`` (as ``ENOMEM``), the set-up
failure the dispatch gate answers with backoff -- never "no valid config" (CONFIG_CHANGED), and
never kept as what those bytes hold: once memory is back the same bytes are the same config.
A network filesystem's transient errnos are unread too; ``ESTALE`` (the file replaced on the
server) stays an edit."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import affidavit.engine.snapshot as snapshot
import affidavit.privatefile as privatefile
from affidavit.config import ConfigError, ConfigUnread, load_config, read_config
from affidavit.engine.snapshot import ConfigSnapshot

from .helpers import http_target, write_config


def _boom(*args: object, **kwargs: object) -> object:
    raise MemoryError


def _snap(tmp_path: Path) -> tuple[Path, ConfigSnapshot, str]:
    path = write_config(tmp_path, {"api": http_target("http://127.0.0.1:9/")})
    snap = ConfigSnapshot(load_config(path), lambda purpose, data: f"{purpose}:{data.hex()}")
    return path, snap, snap.hash(snap.config.targets["api"])


@pytest.mark.parametrize("step", ["read_config", "parse_config"])
async def test_out_of_memory_is_unread_and_not_kept(
    tmp_path: Path, step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, snap, bound = _snap(tmp_path)
    snap._seen = None  # forget the bytes the config was parsed from: the re-read parses them
    with monkeypatch.context() as mp:
        mp.setattr(snapshot, step, _boom)
        with pytest.raises(ConfigUnread) as caught:
            await snap.changed("api", bound)
        assert caught.value.errno == errno.ENOMEM and caught.value.code == "CONFIG_UNREADABLE"
        assert snap._seen is None
    assert not await snap.changed("api", bound)  # memory back, same bytes: unchanged
    assert snap._seen is not None and snap._seen.config is not None


def test_a_parse_out_of_memory_is_not_cached_for_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _, _ = _snap(tmp_path)
    with monkeypatch.context() as mp:
        mp.setattr(snapshot, "parse_config", _boom)
        with pytest.raises(ConfigUnread):
            snapshot._read(path, None)
    assert snapshot._read(path, None).config is not None


@pytest.mark.parametrize(
    "code",
    [errno.ETIMEDOUT, errno.ENOLCK, errno.ECOMM, errno.EHOSTDOWN, errno.ESTALE],
    ids=errno.errorcode.get,
)
def test_network_filesystem_errnos(
    tmp_path: Path, code: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _, _ = _snap(tmp_path)

    def refusing(fd: int, n: int) -> bytes:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(privatefile.os, "read", refusing)
    with pytest.raises(ConfigError) as caught:
        read_config(path)
    assert isinstance(caught.value, ConfigUnread) == (code != errno.ESTALE), caught.value
    assert os.strerror(code) in str(caught.value)
