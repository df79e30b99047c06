"""Which local user owns the other end of a loopback TCP connection (or a listening socket).

Cookies are not isolated by port (RFC 6265 §8.5: "cookies for a given host are shared across
all the ports on that host") and SameSite counts ``127.0.0.1:OTHER`` as the same site, so an
operator's browser sends the console's session cookie to any server on loopback -- one an agent
runs included.  A cookie therefore cannot prove who is asking.  The kernel can: the console
looks up the socket whose local address is the connection's remote address and whose remote
address is the console's -- the client's end -- and requires its uid to be the session's
operator (docs/console.md, "Security model").

How it asks: netlink ``SOCK_DIAG_BY_FAMILY`` (``sock_diag(7)``), one ``inet_diag_req_v2`` naming
the exact 4-tuple, without ``NLM_F_DUMP``: the kernel finds that one socket in its hash tables
(``inet_diag_find_one_icsk``) and answers one ``inet_diag_msg`` with its state and
``idiag_uid`` -- a cost that does not grow with the sockets on the machine.  Reading
``/proc/net/tcp{,6}`` instead lists every TCP socket of the network namespace: with 8000 idle
loopback connections an agent held, a console flood made the daemon's event loop parse ~26000
rows per connection and ``/v1/health`` took seconds (audit51b).  The query is written here with
``struct`` (``_netlink_owner``, ~40 lines) rather than by a library: the one that covers it,
pyroute2, is a whole netlink stack for one fixed 72-byte request, and the kernel's ABI for it
(``linux/inet_diag.h``, ``linux/netlink.h``) is stable -- no field of it has moved since 3.x.
Whether the kernel answers it (a kernel without ``inet_diag``/``tcp_diag``, a sandbox without
netlink) is proven once per process (``_netlink_works``: a loopback connection of its own looked
up); without it, ``/proc/net/tcp`` is read as before -- by the daemon, off its event loop
(``owner_of``: a worker thread, one at a time).

A peer that is not on this machine has no socket here: for a console bound to loopback that
cannot happen, and is refused; a remote console (``console_allow_remote``) cannot check at all.

Only an ``ESTABLISHED`` socket names its owner.  A client that closes its end right after
sending a request leaves an orphaned socket -- ``FIN_WAIT``, then ``TIME_WAIT`` -- that no
process owns, and the kernel reports the TIME_WAIT one with uid 0: read while the console was
still busy with the request, it made any local user's request look like root's (found by review:
with root an operator, an agent holding a stolen cookie and CSRF token approved its own
request).  Such a peer is unidentified, and refused.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import trio

__all__ = ["Address", "listener_owners", "owner_of", "socket_owner"]

Address = tuple[str, int]
_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_ESTABLISHED = "01"  # TCP_ESTABLISHED in include/net/tcp_states.h
_LISTEN = "0A"  # TCP_LISTEN

# linux/netlink.h, linux/sock_diag.h, linux/inet_diag.h
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_NOCOOKIE = 0xFFFFFFFF  # INET_DIAG_NOCOOKIE: any socket of the 4-tuple
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_ERRNO = struct.Struct("=i")  # nlmsgerr's error, first in its body
_REQUEST = struct.Struct("=BBBBI")  # inet_diag_req_v2: family, protocol, ext, pad, states
_SOCKID = struct.Struct("!HH16s16s")  # inet_diag_sockid: sport, dport, src, dst (network order)
_SOCKID_TAIL = struct.Struct("=III")  # ... if, cookie[2]
_MSG_HEAD = struct.Struct("=BB")  # inet_diag_msg: family, state, ...
_MSG_UID = struct.Struct("=I")  # ... idiag_uid, after timer, retrans, id (48), expires, queues
_UID_AT = 4 + 48 + 12
_TCP_ESTABLISHED = 1
_WAIT = 1.0
"""Seconds the kernel's answer may take (it answers at once; a bound all the same)."""

_works: bool | None = None
"""Whether this process's kernel answers the query (``_netlink_works``, asked once)."""
_proc_limiter: trio.CapacityLimiter | None = None


class _Unavailable(Exception):
    """The kernel did not answer the query as it answers one it supports."""


def _ip(hexed: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    # Each 32-bit word is printed as a host-order integer (%08X of the network-order word).
    raw = b"".join(struct.pack("=I", int(hexed[i : i + 8], 16)) for i in range(0, len(hexed), 8))
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # a dual-stack socket speaking to 127.0.0.1
    return ip


def _address(text: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    hexed, _, port = text.partition(":")
    return _ip(hexed), int(port, 16)


def _normal(address: Address) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    ip = ipaddress.ip_address(address[0].split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip, int(address[1])


def _rows() -> Iterator[tuple[str, str, str, int]]:
    """(local, remote, state, uid) of every TCP socket in this network namespace."""
    for table in _TABLES:
        try:
            lines = table.read_text("ascii").splitlines()[1:]
        except OSError:
            continue  # no IPv6 on this kernel
        for line in lines:
            fields = line.split()
            if len(fields) > 7:
                yield fields[1], fields[2], fields[3], int(fields[7])


def _proc_owner(local: Address, remote: Address) -> int | None:
    """``socket_owner`` by /proc/net/tcp{,6}: every row read (the fallback)."""
    want = (_normal(local), _normal(remote))
    for here, there, state, uid in _rows():
        if state == _ESTABLISHED and (_address(here), _address(there)) == want:
            return uid
    return None


def _netlink_owner(local: Address, remote: Address) -> int | None:
    """``socket_owner`` by one ``SOCK_DIAG_BY_FAMILY`` query of the exact 4-tuple; raises
    ``_Unavailable`` when the kernel does not answer it (no inet_diag, no netlink)."""
    (src, sport), (dst, dport) = _normal(local), _normal(remote)
    family = socket.AF_INET if src.version == 4 else socket.AF_INET6
    request = (
        _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF)
        + _SOCKID.pack(sport, dport, src.packed.ljust(16, b"\0"), dst.packed.ljust(16, b"\0"))
        + _SOCKID_TAIL.pack(0, _NOCOOKIE, _NOCOOKIE)
    )
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(_WAIT)
            head = _HEADER.pack(_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY,
                                _NLM_F_REQUEST, 1, 0)  # fmt: skip
            nl.sendto(head + request, (0, 0))
            answer = nl.recv(8192)
    except (OSError, AttributeError) as exc:  # (AttributeError: no AF_NETLINK off Linux)
        raise _Unavailable(str(exc)) from None
    if len(answer) < _HEADER.size:
        raise _Unavailable("a short answer")
    _, kind, _, _, _ = _HEADER.unpack_from(answer)
    body = answer[_HEADER.size :]
    if kind == _NLMSG_ERROR:
        if len(body) < _ERRNO.size:
            raise _Unavailable("a short error answer")
        (code,) = _ERRNO.unpack_from(body)
        if -code == errno.ENOENT:
            return None  # no such socket (``_netlink_works`` proved the query is served)
        raise _Unavailable(os.strerror(-code))
    if kind != _SOCK_DIAG_BY_FAMILY or len(body) < _UID_AT + _MSG_UID.size:
        raise _Unavailable(f"an answer of type {kind}")
    _, state = _MSG_HEAD.unpack_from(body)
    if state != _TCP_ESTABLISHED:
        return None  # an orphan's FIN_WAIT or TIME_WAIT: nobody (the module docstring)
    return int(_MSG_UID.unpack_from(body, _UID_AT)[0])


def _netlink_works() -> bool:
    """Whether the kernel answers the query: asked once per process, of a loopback connection
    of its own (its uid must come back) -- an ENOENT would not tell a socket not found from a
    kernel without ``tcp_diag``.  Blocking (each step bounded by ``_WAIT``): ``owner_of`` asks
    it in a worker thread."""
    global _works
    if _works is None:
        try:
            with (
                socket.create_server(("127.0.0.1", 0)) as listener,
                socket.create_connection(listener.getsockname(), timeout=_WAIT) as client,
            ):
                listener.settimeout(_WAIT)
                accepted, _ = listener.accept()
                with accepted:
                    got = _netlink_owner(client.getsockname(), accepted.getsockname())
            _works = got == os.geteuid()
        except (OSError, _Unavailable):
            _works = False
    return _works


def socket_owner(local: Address, remote: Address) -> int | None:
    """The uid owning the established TCP socket bound to ``local`` and connected to
    ``remote``; None when no socket of this machine is (the peer is elsewhere, or closed its
    end: see the module docstring).  Asked of the kernel's netlink when it answers, else read
    from /proc/net/tcp{,6} (here, in the caller's thread: ``owner_of`` is the daemon's)."""
    if _netlink_works():
        try:
            return _netlink_owner(local, remote)
        except _Unavailable:
            pass  # (proven to work: a transient failure -- read the table this once)
    return _proc_owner(local, remote)


async def owner_of(local: Address, remote: Address) -> int | None:
    """``socket_owner`` for the event loop: the netlink query (one hash lookup in the kernel)
    where it works, else /proc/net/tcp{,6} read in a worker thread, one at a time -- never
    parsed on the loop, where a table of thousands of rows stalled every other connection."""
    global _proc_limiter
    if _works is None:  # the one-time self-check, off the loop (a listen, connect and accept)
        await trio.to_thread.run_sync(_netlink_works)
    if _netlink_works():
        try:
            return _netlink_owner(local, remote)
        except _Unavailable:
            pass
    if _proc_limiter is None:
        _proc_limiter = trio.CapacityLimiter(1)
    return await trio.to_thread.run_sync(_proc_owner, local, remote, limiter=_proc_limiter)


def listener_owners(address: Address) -> set[int]:
    """The uids owning a listening TCP socket that accepts connections to ``address`` (bound to
    it exactly or to the wildcard address of its family, on its port).  (``affidavit
    console-url``'s check, once per command: the table is read.)"""
    ip, port = _normal(address)
    owners = set()
    for here, _, state, uid in _rows():
        if state != _LISTEN:
            continue
        bound, bound_port = _address(here)
        if bound_port == port and (bound == ip or bound.is_unspecified):
            owners.add(uid)
    return owners
