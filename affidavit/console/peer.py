"""Which local user owns the other end of a loopback TCP connection (or a listening socket).

Cookies are not isolated by port (RFC 6265 §8.5: "cookies for a given host are shared across
all the ports on that host") and SameSite counts ``127.0.0.1:OTHER`` as the same site, so an
operator's browser sends the console's session cookie to any server on loopback -- one an agent
runs included.  A cookie therefore cannot prove who is asking.  The kernel can: on Linux,
``/proc/net/tcp`` and ``/proc/net/tcp6`` list every TCP socket of this network namespace with the
uid that owns it (``sock_i_uid``).  The console looks up the socket whose local address is the
connection's remote address and whose remote address is the console's -- the client's end -- and
requires its uid to be the session's operator (docs/console.md, "Security model").

A peer that is not on this machine has no row: for a console bound to loopback that cannot
happen, and is refused; a remote console (``console_allow_remote``) cannot check at all.

Only an ``ESTABLISHED`` row names its owner.  A client that closes its end right after sending
a request leaves an orphaned socket -- ``FIN_WAIT``, then ``TIME_WAIT`` -- that no process owns,
and the kernel lists the TIME_WAIT one with uid 0: read while the console was still busy with
the request, that row made any local user's request look like root's (found by review: with
root an operator, an agent holding a stolen cookie and CSRF token approved its own request).
Such a peer is unidentified, and refused.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterator
from pathlib import Path

__all__ = ["Address", "listener_owners", "socket_owner"]

Address = tuple[str, int]
_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_ESTABLISHED = "01"  # TCP_ESTABLISHED in include/net/tcp_states.h
_LISTEN = "0A"  # TCP_LISTEN


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


def socket_owner(local: Address, remote: Address) -> int | None:
    """The uid owning the established TCP socket bound to ``local`` and connected to
    ``remote``; None when no socket of this machine is (the peer is elsewhere, or closed its
    end: see the module docstring)."""
    want = (_normal(local), _normal(remote))
    for here, there, state, uid in _rows():
        if state == _ESTABLISHED and (_address(here), _address(there)) == want:
            return uid
    return None


def listener_owners(address: Address) -> set[int]:
    """The uids owning a listening TCP socket that accepts connections to ``address`` (bound to
    it exactly or to the wildcard address of its family, on its port)."""
    ip, port = _normal(address)
    owners = set()
    for here, _, state, uid in _rows():
        if state != _LISTEN:
            continue
        bound, bound_port = _address(here)
        if bound_port == port and (bound == ip or bound.is_unspecified):
            owners.add(uid)
    return owners
