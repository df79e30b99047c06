"""The socket file's creation: its mode never comes from a ``chmod`` that could follow a link.

Whoever can write the socket's directory could swap the fresh socket file for a symlink between
``bind`` and a ``chmod`` of the path; the chmod would then follow it and make any file the
daemon owns (its journal key, say) group-accessible.  The daemon sets the mode through the
umask around ``bind`` and checks, without following a link, what is at the path afterwards."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from affidavit.daemon import socketfile
from affidavit.daemon.server import DaemonError


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
async def test_the_socket_file_is_0660_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    path = tmp_path / "s.sock"
    old = os.umask(umask)
    try:
        listener, inode = socketfile.bind_socket(path)
        after = os.umask(umask)  # the umask bind_socket left: its own must not outlive bind
    finally:
        os.umask(old)
    try:
        st = os.lstat(path)
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o660
        assert st.st_ino == inode
        assert after == umask
    finally:
        await listener.aclose()


def test_a_path_swapped_for_a_symlink_after_bind_is_refused_and_its_target_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "journal.key"
    victim.write_bytes(b"not a secret, but the daemon's")
    victim.chmod(0o600)
    path = tmp_path / "s.sock"
    real_bind = socket.socket.bind

    def bind_then_swap(self: socket.socket, address: object) -> None:
        real_bind(self, address)  # type: ignore[arg-type]
        os.unlink(path)  # the attacker wins the race ...
        os.symlink(victim, path)  # ... and plants a link to a file the daemon owns

    monkeypatch.setattr(socket.socket, "bind", bind_then_swap)
    with pytest.raises(DaemonError, match="replaced while the socket was created"):
        socketfile.bind_socket(path)
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert path.is_symlink()  # not ours: left alone
