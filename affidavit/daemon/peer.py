"""Who is on the other end of a connection: the kernel's word (SO_PEERCRED), not the client's.

A Unix socket's peer credentials are the pid, uid and gid of the process that called
``connect()``, recorded by the kernel at that moment (socket(7)); the client cannot choose them.
Supplementary groups come from SO_PEERGROUPS (Linux >= 4.13), so a socket group granted to an
agent's account through ``usermod -aG`` works as well as its primary group.
"""

from __future__ import annotations

import errno
import socket
import struct
import sys
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Peer", "PeerPolicy", "peer_credentials_supported", "peer_of"]

_CRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}
_SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59 if sys.platform == "linux" else None)
"""Python does not name SO_PEERGROUPS; 59 is its value in Linux's asm-generic/socket.h."""
_GROUPS_FIRST_TRY = 64


class _Sock(Protocol):
    def getsockopt(self, level: int, optname: int, buflen: int) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Peer:
    pid: int
    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    """Supplementary groups, where the kernel reports them."""

    def describe(self) -> str:
        return f"uid={self.uid} gid={self.gid} pid={self.pid}"


def peer_credentials_supported() -> bool:
    return hasattr(socket, "SO_PEERCRED")


def peer_of(sock: _Sock) -> Peer:
    """The connected peer's credentials.  ``OSError`` if the kernel has none (not a Unix
    socket, or a platform without SO_PEERCRED)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
    pid, uid, gid = _CRED.unpack(raw)
    return Peer(pid=pid, uid=uid, gid=gid, groups=_groups(sock))


def _groups(sock: _Sock) -> tuple[int, ...]:
    if _SO_PEERGROUPS is None:
        return ()
    size = 4 * _GROUPS_FIRST_TRY
    for _ in range(2):
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, _SO_PEERGROUPS, size)
        except OSError as exc:
            if exc.errno == errno.ERANGE and size == 4 * _GROUPS_FIRST_TRY:
                size = 4 * 65536  # NGROUPS_MAX
                continue
            return ()  # an older kernel: primary group only
        return struct.unpack(f"{len(raw) // 4}I", raw[: len(raw) // 4 * 4])
    return ()


@dataclass(frozen=True, slots=True)
class PeerPolicy:
    """``[service] allow_uids`` / ``allow_gids``: a peer is allowed when its uid is listed or
    one of its groups (primary or supplementary) is."""

    uids: frozenset[int]
    gids: frozenset[int]

    def allows(self, peer: Peer) -> bool:
        if peer.uid in self.uids or peer.gid in self.gids:
            return True
        return any(g in self.gids for g in peer.groups)
