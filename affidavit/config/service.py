"""``[service]``: how ``affidavit serve`` listens and whom it answers (docs/deployment.md), and
who its operators are (docs/approvals.md).

Declared once here like every other setting (``affidavit.schema``).  Embedded calls
(``affidavit call`` without ``--socket``, ``Broker.open``) ignore the section, except the
operator settings: an operator command run embedded checks its own user against them too.
"""

from __future__ import annotations

import pwd
from dataclasses import dataclass
from pathlib import Path

from affidavit.schema import Field, Read, Schema, duration_setting

from .address import console_address, is_loopback, public_origin, served_through_tls

__all__ = ["MIN_SHARED_LEASE_MARGIN", "SERVICE", "ServiceConfig"]

MIN_SHARED_LEASE_MARGIN = 1.0
"""The least ``lease_margin`` (seconds) a shared journal accepts.  Lease expiry compares wall
clocks across hosts: a worker stops dispatching ``lease_margin`` before its lease ends by its own
clock (``engine/attempt.py``), and another host closes the attempt, and may retry it, once the
lease ended by *its* clock.  With no margin to speak of (a millisecond), a clock ahead by more
lets the other host retry while the first is still mid-dispatch: a second send under the next
generation.  A
single-host SQLite journal has one clock: any positive margin will do there (a duration is
positive: 0 is refused everywhere by the parser)."""

_MAX_ID = 2**32 - 2
"""uid_t/gid_t are 32 bits; 2**32 - 1 is (uid_t)-1, "no id", never a real account."""


@dataclass(frozen=True)
class ServiceConfig:
    socket: Path
    allow_uids: tuple[int, ...] | None
    """None: the uid the daemon runs as (known only when it starts)."""
    allow_gids: tuple[int, ...]
    shutdown_grace: float
    max_calls: int
    call_rate: float
    """Calls (job polls and reconciliation queries too) one uid may start a second, sustained
    (``daemon/shares.py``)."""
    call_burst: int
    """... and at once, after a quiet spell (the token bucket's size)."""
    operator_uids: tuple[int, ...]
    """Who may approve, deny and attest (docs/approvals.md): by uid ..."""
    operator_gids: tuple[int, ...]
    """... or by a primary or supplementary group."""
    allow_self_approval: bool
    """Whether an operator may decide on a request their own uid made (default: no)."""
    max_pending_approvals: int
    """Requests of one uid that may await a decision at once (docs/approvals.md)."""
    lease_margin: float
    """Seconds a lease outlives its call's timeout (other daemons of a shared journal wait)."""
    console_allow_remote: bool
    """Whether ``console`` may name an address other than loopback (docs/console.md)."""
    console: tuple[str, int] | None
    """Where ``affidavit serve`` serves the operator console (host, port); None: nowhere."""
    console_public_origin: str | None
    """``https://HOST[:PORT]`` where a TLS proxy serves the console (its forms post from there)."""
    console_proxy_user: int | None
    """The uid of that proxy's local user (given as a name or a uid, resolved when the config is
    loaded): its connections to the loopback console are the proxy; any other uid's are checked
    like on a plain loopback console (docs/console.md, "Security model").  None: not declared,
    and then no direct connection is checked."""

    @property
    def has_operators(self) -> bool:
        return bool(self.operator_uids or self.operator_gids)


def _socket(r: Read) -> Path:
    return r.resolve_path(r.string())


def _ids(r: Read) -> tuple[int, ...] | None:
    value = r.raw()
    if value is None:
        return None
    if not isinstance(value, list):
        raise r.error("must be an array of numeric ids")
    out: list[int] = []
    for i, item in enumerate(value):
        # bool is an int subclass: `allow_uids = [true]` is a mistake, not uid 1.
        if not isinstance(item, int) or isinstance(item, bool) or not 0 <= item <= _MAX_ID:
            raise r.error(f"must be a numeric id between 0 and {_MAX_ID}", f"[{i}]")
        out.append(item)
    return tuple(out)


def _gids(r: Read) -> tuple[int, ...]:
    return _ids(r) or ()


def _console(r: Read) -> tuple[str, int] | None:
    if r.raw() is None:
        return None
    try:
        return console_address(r.string(max_len=300), r.values["console_allow_remote"])
    except ValueError as exc:
        raise r.error(str(exc)) from None


def _public_origin(r: Read) -> str | None:
    console = r.values["console"]
    try:
        origin = None if r.raw() is None else public_origin(r.string(max_len=300))
        if console is not None:
            served_through_tls(console[0], origin)  # a remote console: through TLS only
    except ValueError as exc:
        raise r.error(str(exc)) from None
    return origin


def _proxy_user(r: Read) -> int | None:
    value = r.raw()
    if value is None:
        return None
    if r.values["console_public_origin"] is None:
        raise r.error(
            "needs console_public_origin: the proxy's user is declared for a console served "
            "behind a proxy"
        )
    console = r.values["console"]
    if console is not None and not is_loopback(console[0]):
        raise r.error(
            f"applies to a loopback console only, not {console[0]}: a peer on another machine "
            "cannot be identified, so no connection could be told from the proxy's"
        )
    try:
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_ID:
            return pwd.getpwuid(value).pw_uid
        if isinstance(value, str) and value and not value.isdigit() and len(value) <= 256:
            return pwd.getpwnam(value).pw_uid
    except KeyError:
        raise r.error(f"no such user on this machine: {value!r}") from None
    hint = " (a uid is a number: console_proxy_user = 33)" if isinstance(value, str) else ""
    raise r.error(f"must be a user name or a numeric uid{hint}")


def _max_calls(r: Read) -> int:
    return r.integer(1, 100_000)


CALL_RATE_RANGE = (0.01, 100_000.0)
"""``call_rate``'s bounds: a call a hundred seconds to as many as a daemon could journal."""


def _call_rate(r: Read) -> float:
    value = r.raw()
    lo, hi = CALL_RATE_RANGE
    # bool is an int subclass: `call_rate = true` is a mistake, not 1 call a second.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise r.error(f"must be a number of calls a second from {lo:g} to {hi:g}")
    return float(value)


def _call_burst(r: Read) -> int:
    return r.integer(1, 1_000_000)


def _max_pending(r: Read) -> int:
    return r.integer(1, 10_000)


SERVICE = Schema(
    ServiceConfig,
    (
        Field(
            "socket",
            _socket,
            default="affidavit.sock",
            doc="the Unix socket `affidavit serve` listens on (created mode 0660)",
        ),
        Field(
            "allow_uids",
            _ids,
            default=None,
            shown="the daemon's own uid",
            doc="peers (SO_PEERCRED) whose uid may use the socket",
        ),
        Field(
            "allow_gids",
            _gids,
            default=[],
            doc="peers whose primary or supplementary group may use the socket",
        ),
        Field(
            "shutdown_grace",
            duration_setting,
            default=30,
            doc="seconds in-flight calls may finish after SIGTERM (`affidavit mcp`: or the end of "
            "its input) before they are stopped",
        ),
        Field(
            "max_calls",
            _max_calls,
            default=256,
            doc="calls running at once in the daemon, and in each embedded `affidavit mcp` "
            "session -- a job's poll and a reconciliation query (the socket's or the console's) "
            "count as calls (each reaches the remote); one more is answered overloaded (503 / "
            "OVERLOADED), nothing run (an operator's attestation, which sends nothing, is never "
            "refused so); `affidavit mcp` (embedded; the proxy, `--socket`, reads no config and "
            "uses 256) also holds at most `max_calls` + 16 requests open, their lines 64 MiB in "
            "all (a longer one alone), and answers one more OVERLOADED at once "
            "([mcp](mcp.md#delivery-what-is-recorded-when-the-agent-goes-away))",
        ),
        Field(
            "call_rate",
            _call_rate,
            default=20,
            doc="calls one peer uid may start a second through the socket, sustained (an "
            "operator's are not counted) -- a job's poll and a reconciliation query count as "
            "calls; past it (and `call_burst`) "
            "a call is answered 429 / RATE_LIMITED with `Retry-After`, nothing journaled, "
            "nothing sent: one uid cannot fill the journal's disk faster than this (a refused "
            "call is journaled too, ~2.4 KB)",
        ),
        Field(
            "call_burst",
            _call_burst,
            default=200,
            doc="calls one peer uid may start at once after a quiet spell (the bucket "
            "`call_rate` refills)",
        ),
        Field(
            "operator_uids",
            _gids,
            default=[],
            doc="uids that may approve, deny and attest (see [approvals](approvals.md)); they "
            "may also use the socket",
        ),
        Field(
            "operator_gids",
            _gids,
            default=[],
            doc="groups (primary or supplementary) whose members are operators",
        ),
        Field(
            "allow_self_approval",
            Read.boolean,
            default=False,
            doc="let an operator decide on a request made by their own uid",
        ),
        Field(
            "max_pending_approvals",
            _max_pending,
            default=20,
            doc="requests of one requester uid (the socket peer's; embedded, this process's) "
            "that may await an operator's decision at once, per broker process; one more is "
            "refused before it is recorded for approval, nothing sent (APPROVAL_LIMIT: "
            "credential_injection, not_attempted, retry backoff)",
        ),
        Field(
            "lease_margin",
            duration_setting,
            default=30,
            doc="seconds a call's lease outlives its timeout: after it, a daemon that stopped "
            "mid-call is presumed gone and another (on a shared journal) may close or retry the "
            "call; on a shared journal it is also the clock skew tolerated between the "
            f"daemons' hosts, and must be at least {MIN_SHARED_LEASE_MARGIN:g}",
        ),
        Field(
            "console_allow_remote",
            Read.boolean,
            default=False,
            doc="let `console` name an address other than loopback (served only through a TLS "
            "proxy: needs an `https://` `console_public_origin`)",
        ),
        Field(
            "console",
            _console,
            default=None,
            shown="none",
            doc='serve the operator console on this `"HOST:PORT"` (see [console](console.md)); '
            "loopback only unless `console_allow_remote`",
        ),
        Field(
            "console_public_origin",
            _public_origin,
            default=None,
            shown="none",
            doc='the console\'s origin behind a TLS proxy (`"https://console.example:8443"`): '
            "its pages are accepted under that name too (declare `console_proxy_user` too, "
            "or direct connections to the loopback listener are not owner-checked: see "
            "[console](console.md)); required, and `https://`, for a non-loopback `console`",
        ),
        Field(
            "console_proxy_user",
            _proxy_user,
            default=None,
            shown="none",
            doc='the local user (`"www-data"`, or a uid) that proxy connects as: its '
            "connections must name the public origin, every other connection to the loopback "
            "console is owner-checked as without a proxy (see [console](console.md)); needs "
            "`console_public_origin` and a loopback `console`",
        ),
    ),
)
