"""The daemon's API as its clients speak it: HTTP/1.1 with JSON bodies over a Unix socket.

What both clients share -- the answer (``Response``) and its errors, request targets, the
socket's location -- and the command line's one-shot request (``blocking_request``).  Standard
library only: this is the whole of ``affidavit call --socket``'s path, which must stay light
(no engine, journal, cryptography or config; tests/daemon/test_thin_client.py).

The one-shot request reads one answer from the daemon on a ``Connection: close`` request, and
reads it strictly: a status line, headers, a ``Content-Length`` body (what the daemon sends);
anything else is ``AnswerLost``, never a guess.  h11 (with the dataclasses and inspect it
imports) would cost such a process ~15 ms of its ~100 ms budget; the long-lived async
``Client``, which keeps connections alive and pools them, reads with h11 (``client.py``).

Answers: HTTP 200 carries the JSON the embedded command would print (an envelope, a record, a
list).  Any other status is the API's own trouble, never the action's, with the body
``{"api_error": {"code": ..., "message": ...}}`` (``ApiError``).
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import socket
import stat
import sys
import time
from collections.abc import Mapping

from affidavit.bounds import MAX_RECONNECT, MAX_TOTAL, MAX_TTL

TYPE_CHECKING = False  # not typing's: see affidavit/__init__.py

if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "AFTER_BROKEN_SEND",
    "ANSWER_MOST",
    "CALL_WAIT",
    "DAEMON_UID_ENV",
    "DELIVERY_WAIT",
    "READ_SIZE",
    "RESULT_CHUNK_BYTES",
    "SOCKET_ENV",
    "AnswerInvalid",
    "AnswerLost",
    "ApiError",
    "ApiFault",
    "ClientError",
    "DaemonUidInvalid",
    "DaemonUnavailable",
    "NotSent",
    "Response",
    "SocketUnsafe",
    "answer_wait",
    "approval_path",
    "blocking_request",
    "check_envelope",
    "check_peer",
    "check_socket",
    "check_timeout",
    "health_wait",
    "invocation_path",
    "parse_count",
    "parse_daemon_uid",
    "parse_page",
    "parse_time",
    "parse_timeout",
    "read_answer",
    "read_wait",
    "retry_after_of",
    "socket_path",
    "target",
    "trusted_uids",
    "unreachable",
    "unsettled_items",
]

SOCKET_ENV = "AFFIDAVIT_SOCKET"
DAEMON_UID_ENV = "AFFIDAVIT_DAEMON_UID"
"""The uid (or user name) the daemon runs as, which its clients trust with their calls
(``check_socket``): a socket in a directory of any other user but root and the client's own is
not asked."""
MAX_UID = 2**32 - 2
"""uid_t is 32 bits; 2**32 - 1 is (uid_t)-1, "no id"."""
READ_SIZE = 65536
HEADERS = (("host", "affidavit"), ("accept", "application/json"))
"""Sent with every request (HTTP/1.1 needs a Host; the socket names the server)."""
MAX_HEAD = 64 * 1024
AFTER_BROKEN_SEND = 1.0
"""Seconds a client reads, once sending its request failed, for an answer the daemon wrote
before it stopped reading (a 503 ``TOO_MANY_CONNECTIONS``): over a Unix socket it is already
there (``_answer_after_broken_send``)."""
DELIVERY_WAIT = 30.0
"""The daemon's delivery budget: seconds one answer's write may take (its ``WRITE_WAIT``: a
client that does not read its answer loses it), and a delivered answer over ``http.FREE_BODY`` may
wait for room in the answer budget as long again before it is written (``wait_answer``).  Kept
here, where both clients read it, so the daemon and its clients share one number."""
ANSWER_MOST = 256 * 1024 * 1024
"""The largest answer the daemon holds for a call, a view's page or a record: its answer budget
(``admission.ANSWER_BUDGET`` is this), which every such answer is held in while it is written --
so a client refuses a longer one (``AnswerLost``) rather than read it into memory.  A stored
result's answer (``GET .../result``) is written a piece at a time and is as large as its
target's ``max_result`` (up to 1 TiB): not bounded by this (``answer_cap``)."""
CALL_WAIT = MAX_TTL + MAX_TOTAL
"""Seconds a client waits for a call's answer when its caller gave no timeout, before the
delivery budget: the longest the daemon may legitimately take -- a wait for an operator's
decision, at most an approval's ttl (``bounds.MAX_TTL``, a week), then a send under the
target's own ``timeout.total``, which the client cannot see (at most ``bounds.MAX_TOTAL``, a
day).  A caller that knows its call is shorter gives its ``timeout``, and is waited for as long
(``answer_wait``)."""


class ClientError(Exception):
    """The daemon could not be asked, or did not answer completely."""


class DaemonUnavailable(ClientError):
    """Nothing answers on the socket (missing, refused, or not ours to open)."""


class SocketUnsafe(DaemonUnavailable):
    """The socket is where someone other than the daemon's user could have put it: not asked
    (``check_socket``)."""

    code = "DAEMON_SOCKET_UNSAFE"


class DaemonUidInvalid(ValueError):
    """A daemon uid given explicitly (``Client(daemon_uid=)``, ``--daemon-uid``) that is no
    uid and names no user: refused before any socket is looked at, never ignored."""

    code = "DAEMON_UID_INVALID"
    field = "daemon_uid"


class AnswerLost(ClientError):
    """The connection ended before a complete answer.  For ``POST /v1/calls`` the call may have
    run: the daemon keeps its result (``affidavit actions``, then ``affidavit result ID``); an
    ``idempotency_key`` lets the caller resume the same invocation instead of a second one.
    (A refusal the daemon answered before closing -- 503 ``TOO_MANY_CONNECTIONS``, the request
    not read -- is an ``ApiError``, even when it broke the request's send.)"""


class AnswerInvalid(AnswerLost):
    """The daemon answered a call 200 with something that is no envelope (an
    ``invocation_id``, ``evidence``, and either ``error`` or ``result``): as ``AnswerLost``,
    the call may have run -- nothing of it is taken as its outcome."""


class NotSent(ValueError):
    """A request this client refused before a byte of it went out (a timeout no caller may
    give, an action JSON cannot carry -- ``1e400`` read as infinity --, a page out of range):
    nothing was sent.  A ValueError, as such refusals were before."""


class ApiFault(Exception):
    """An API-level error's parts, as the daemon answers them (its ``ApiProblem``) and as a
    client reads them back (``ApiError``): ``status``, ``code``, ``message``, and ``field``,
    ``retry_after``, ``action_code`` when there are such (``ApiError`` says what each is)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        retry_after: int | None = None,
        action_code: str | None = None,
    ) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.retry_after = retry_after
        self.action_code = action_code
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        """Every part, for ``pickle`` and ``copy``: the default would call the class with
        ``args`` (the message alone) and fail -- a fault handed across processes or copied
        by a test harness would raise TypeError in its place.  The instance ``__dict__`` too
        (what a caller set on it, as ``BaseException`` keeps it)."""
        parts = (self.status, self.code, self.message, self.field, self.retry_after)
        return (type(self), (*parts, self.action_code), self.__dict__ or None)


class ApiError(ClientError, ApiFault):
    """The daemon answered with an API-level error (400 bad JSON, 403 peer refused, 404,
    429 ``RATE_LIMITED`` -- the uid's ``[service] call_rate`` --, 503 overloaded, shutting down
    or too many connections) -- never an action's error, which is an envelope.  A call refused
    busy (``affidavit.sdk.NOT_SENT_CODES``) was neither journaled nor sent: ``call_checked``
    calls again after it.  ``field``: the request's part to fix (a body field, a query
    parameter), when the daemon named one.  ``retry_after``: its ``Retry-After`` in seconds,
    when it sent one (a read declined this once, answers in flight: the same request may
    succeed then).
    ``action_code``: for an action the daemon refused before journaling it (``BAD_JSON``), the
    code the broker gives the same fault embedded (PAYLOAD_LIMIT, INVALID_FIELD)."""


class Response:
    """One complete answer.  (A plain class: ``dataclasses`` would import ``inspect``.)"""

    __slots__ = ("body", "content_type", "retry_after", "status")

    def __init__(
        self, status: int, content_type: str, body: bytes, retry_after: int | None = None
    ) -> None:
        self.status = status
        self.content_type = content_type
        self.body = body
        self.retry_after = retry_after
        """``Retry-After`` in whole seconds (``retry_after_of``), None when absent or no such."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Response):
            return NotImplemented
        return (self.status, self.content_type, self.body) == (
            other.status,
            other.content_type,
            other.body,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Response({self.status}, {self.content_type!r}, {len(self.body)} bytes)"

    def json(self) -> Any:
        """The decoded body of a 200 answer; ``ApiError`` for any other status."""
        if self.status != 200:
            raise self.error()
        try:
            return json.loads(self.body)
        except ValueError:
            raise ClientError("the daemon answered with a body that is not JSON") from None

    def text(self) -> str:
        if self.status != 200:
            raise self.error()
        return self.body.decode("utf-8")

    def error(self) -> ApiError:
        try:
            err = json.loads(self.body)["api_error"]
            field = err.get("field")
            action_code = err.get("action_code")
            return ApiError(
                self.status,
                str(err["code"]),
                str(err["message"]),
                field if isinstance(field, str) else None,
                self.retry_after,
                action_code
                if isinstance(action_code, str) and _CODE.fullmatch(action_code)
                else None,
            )
        except (ValueError, KeyError, TypeError):
            return ApiError(self.status, "HTTP_ERROR", f"the daemon answered HTTP {self.status}")


def retry_after_of(value: str | bytes | None) -> int | None:
    """A ``Retry-After`` header's whole seconds (RFC 9110 §10.2.3's delay form, at most 19
    digits); None when absent or anything else (an HTTP date: the daemon sends none)."""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    value = (value or "").strip()
    return int(value) if value.isascii() and value.isdigit() and len(value) <= 19 else None


def socket_path(explicit: str | os.PathLike[str] | None) -> str | None:
    """``--socket`` beats ``$AFFIDAVIT_SOCKET``; None (embedded) when neither is set."""
    if explicit:
        return os.fspath(explicit)
    return os.environ.get(SOCKET_ENV) or None


_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
"""A stable code as the daemon sends one (a hostile daemon's other text is not taken as one)."""
MAX_COUNT = 2**63 - 1
"""The largest chunk number or seq a request may name: the journal's integer columns' range."""


RESULT_CHUNK_BYTES = 64 * 1024
"""A stored result's chunk, as the journal cuts it (``engine.RESULT_CHUNK``; the thin client
does not import the engine): chunk K of a stream starts at byte K x this, and every chunk but a
stream's last is full -- what a client checks the daemon's pages against (``pages.py``)."""
RESULT_PAGE_CHUNKS = 64
"""The chunks of each stream a page of a stored result holds when the caller names none
(``?from_chunk=N`` alone, MCP's ``fetch_result``): 4 MiB of each stream at 64 KiB a chunk."""
MAX_RESULT_PAGE_CHUNKS = 1024
"""The most a page may hold (``?chunks=``, MCP's ``chunks``): 64 MiB of each stream -- what a
client asks for in one answer, never what the daemon holds (it writes a page chunk by chunk)."""


def parse_page(value: str) -> int:
    """``?chunks=``: a whole number from 1 to ``MAX_RESULT_PAGE_CHUNKS``; ``ValueError`` says
    what was expected."""
    if not (value.isascii() and value.isdigit()) or len(value) > 19:
        value = "-"
    if value == "-" or not 1 <= int(value) <= MAX_RESULT_PAGE_CHUNKS:
        raise ValueError(f"expected a whole number from 1 to {MAX_RESULT_PAGE_CHUNKS}")
    return int(value)


ACTIONS_LIMIT = 1000
"""How many records ``GET /v1/actions`` answers with when no ``limit`` says (the newest)."""
MAX_ACTIONS_LIMIT = 10000
"""The most it answers with: a page is held whole in the daemon's memory, the journal never
(a hostile caller fills the journal cheaply -- every refused call is a record)."""
EVENTS_LIMIT = 1000
"""How many events a page of a record (``GET /v1/invocations/{id}?from_seq=N``) holds when no
``limit`` says; at least 1 (a page of none would never move ``next_seq``), at most
``MAX_ACTIONS_LIMIT``.  A record answered whole may be larger than the
daemon ever holds for one answer (an operation's, grown by its polls): 413 ``ANSWER_TOO_LARGE``,
read it in pages instead (``Client.invocation`` does)."""
SESSIONS_LIMIT = 1000
"""How many sessions ``GET /v1/sessions`` answers with when no ``limit`` says (those seen
last)."""
MAX_SESSIONS_LIMIT = 10000
"""The most it answers with: a caller names its sessions, as many as it likes."""


def parse_limit(value: str, maximum: int, least: int = 0) -> int:
    """``?limit=``: a whole number from ``least`` to ``maximum``; ``ValueError`` says what was
    expected."""
    if (
        not (value.isascii() and value.isdigit())
        or len(value) > 19
        or not least <= int(value) <= maximum
    ):
        raise ValueError(f"expected a whole number from {least} to {maximum}")
    return int(value)


def parse_count(value: str) -> int:
    """A whole number from 0 to ``MAX_COUNT`` in ASCII digits, as ``--from-chunk`` and ``--seq``
    and the daemon's ``?from_chunk=`` take them (``str.isdigit`` alone lets ``²`` through,
    which ``int`` then refuses; a number past the columns' range reached the database as an
    OverflowError; past 4300 digits ``int`` itself refuses, in its own words).  ``ValueError``
    says what was expected."""
    if not (value.isascii() and value.isdigit()) or len(value) > 19 or int(value) > MAX_COUNT:
        raise ValueError(f"expected a whole number from 0 to {MAX_COUNT}")
    return int(value)


MAX_TIMEOUT = 36500 * 86400.0
"""The longest caller timeout, in seconds: 100 years, the bound of every configured duration
(``affidavit.schema.values.MAX_DURATION``, not imported: this module stays light)."""
TIMEOUT_RULE = (
    "INVALID_FIELD at timeout: expected a number of seconds greater than 0 "
    f"and at most {MAX_TIMEOUT:.0f} (100 years)"
)
"""The one refusal of a caller timeout, word for word the same from ``affidavit call``
embedded, through the daemon (``?timeout=``, HTTP 400 ``INVALID_FIELD``) and from the Python
API (``ValueError``)."""
_SECONDS = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def check_timeout(value: float | None) -> float | None:
    """A caller's timeout: None (the target's own), or seconds in (0, ``MAX_TIMEOUT``].  Zero
    or less left nothing to run the call in; NaN, infinity and a deadline past 100 years are
    mistakes.  ``ValueError`` is ``TIMEOUT_RULE``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(TIMEOUT_RULE)
    if not 0 < value <= MAX_TIMEOUT:  # NaN fails both
        raise ValueError(TIMEOUT_RULE)
    return float(value)


def parse_timeout(value: str) -> float:
    """``--timeout`` and the daemon's ``?timeout=``: an ASCII decimal number of seconds (an
    exponent allowed; ``float``'s ``inf``, ``nan``, ``1_0`` and non-ASCII digits are not),
    checked by ``check_timeout``."""
    if not (value.isascii() and _SECONDS.fullmatch(value)):
        raise ValueError(TIMEOUT_RULE)
    seconds = check_timeout(float(value))
    assert seconds is not None
    return seconds


def answer_wait(timeout: float | None, approval_wait: float = 0.0) -> float:
    """Seconds a client waits for a call's answer before it gives up (``AnswerLost``: the call
    may have run): the caller's ``timeout`` (else ``CALL_WAIT``), plus the time the call may
    wait for an operator (``approval_wait``: its target's ``approval.wait``, which only the
    caller knows), plus the daemon's delivery budget twice over (``DELIVERY_WAIT``: the wait
    for room in the answer budget, then the write)."""
    return (CALL_WAIT if timeout is None else timeout) + approval_wait + 2 * DELIVERY_WAIT


def health_wait() -> float:
    """Seconds a client waits for ``GET /v1/health`` before it gives up (``AnswerLost``): the
    daemon answers it with no read of the journal (one stat of its file, on a thread) and no
    call, so the delivery budget twice over (``DELIVERY_WAIT``: the wait for room in its answer
    budget, then the write) is all it may take -- a stopped or wedged daemon is told, not waited
    for.  (The views and ``fetch_result`` read the journal: ``read_wait``.)"""
    return 2 * DELIVERY_WAIT


def read_wait() -> float:
    """Seconds a client waits for the first byte of a read's answer (a view, ``fetch_result``,
    an approval) before it gives up (``AnswerLost``): the daemon reads the journal for it,
    which a shared one may take up to its ``[journal] reconnect`` to answer (a setting the
    client cannot see, at most ``bounds.MAX_RECONNECT``), then the delivery budget twice over
    (``DELIVERY_WAIT``).  A read waits for no call: ``fetch_result`` answers IN_PROGRESS for
    one still running."""
    return MAX_RECONNECT + 2 * DELIVERY_WAIT


def answer_cap(request_target: str) -> int | None:
    """The longest answer a client reads to ``request_target``: ``ANSWER_MOST``, but for a
    stored result (``ANSWER_MOST`` says why), which has no bound a client knows (None)."""
    path = request_target.partition("?")[0]
    return None if path.endswith("/result") else ANSWER_MOST


_ERROR_PARTS = ("code", "phase", "outcome", "retry", "message")


def check_envelope(value: Any) -> dict[str, Any]:
    """``value`` when it is an envelope as the contract has it (``docs/envelope.schema.json``:
    ``invocation_id``, ``evidence``, and an ``error`` with its code, phase, outcome, retry and
    message, or a ``result``, or both; ``items`` a list), else ``AnswerInvalid``: a call's 200
    that says anything less says nothing of what became of the call."""
    ok = (
        isinstance(value, dict)
        and isinstance(value.get("invocation_id"), str)
        and isinstance(value.get("evidence"), dict)
        and ("error" in value or "result" in value)
        and isinstance(value.get("items", []), list)
    )
    if ok and "error" in value:
        err = value["error"]
        ok = isinstance(err, dict) and all(isinstance(err.get(k), str) for k in _ERROR_PARTS)
    if not ok:
        raise AnswerInvalid(
            "the daemon's answer is no envelope (invocation_id, evidence, and error or result): "
            "the call may have run -- see affidavit actions, then affidavit result ID"
        )
    return value  # type: ignore[no-any-return]


def unsettled_items(envelope: Mapping[str, Any]) -> list[Any]:
    """A batch's items whose outcome is not ``committed`` (the envelope's ``items``): a call
    with any such item did not do all it was asked, whatever its parent's outcome says."""
    items = envelope.get("items")
    if not isinstance(items, list):
        return []
    return [i for i in items if not isinstance(i, dict) or i.get("outcome") != "committed"]


def parse_time(value: str) -> float:
    """Epoch seconds or ISO 8601 (naive means UTC), as the filters of ``affidavit actions``
    and ``GET /v1/actions`` take them.  ``ValueError`` says what was expected, quoting
    ``value`` as every echo does (``text.echoed``: at most ``ECHO`` characters, escaped) --
    a 15 KB ``since`` was echoed whole, by the daemon, the CLI and the console alike."""
    try:
        t = float(value)
        if math.isfinite(t):
            return t
    except ValueError:
        pass
    from datetime import UTC, datetime  # only a filter by date needs it

    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        from affidavit.text import echoed  # light: it imports nothing at its top

        raise ValueError(f"expected ISO 8601 or epoch seconds, got '{echoed(value)}'") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def target(path: str, params: Mapping[str, object] | None = None) -> str:
    """A request target: ``path`` plus the query of the params that are not None."""
    query = {k: str(v) for k, v in (params or {}).items() if v is not None}
    if not query:
        return path
    from urllib.parse import urlencode  # here: with ipaddress it costs a start ~3 ms

    return f"{path}?{urlencode(query)}"


def invocation_path(invocation_id: str, suffix: str = "") -> str:
    # Quoted: an id is the caller's text; a "/" or "?" in it must not change the route.
    from urllib.parse import quote

    return f"/v1/invocations/{quote(invocation_id, safe='')}{suffix}"


def approval_path(invocation_id: str, suffix: str = "") -> str:
    from urllib.parse import quote

    return f"/v1/approvals/{quote(invocation_id, safe='')}{suffix}"


def check_socket(path: str, daemon_uid: int | None = None) -> None:
    """Refuse (``SocketUnsafe``) a socket someone the client does not trust could have put at
    ``path``, before a byte is sent to it -- the rule the daemon keeps for its own
    (daemon/socketfile.py), with the client's own list of whom it trusts: root, itself, and
    the daemon's user it was told (``daemon_uid``, else ``$AFFIDAVIT_DAEMON_UID``:
    ``trusted_uids``).  The owner of
    the socket's directory is not trusted for owning it: a socket in a private directory of
    an attacker's would receive the call (its target, arguments, idempotency key).

    The socket file, its directory (where ``path`` leads) and every directory above belong to
    a trusted uid; the directory is writable by its owner only, sticky or not (in ``/tmp``
    anyone could have bound the name first); no directory above is writable by others unless
    sticky (whoever could rename the socket's directory could put their own there).  A path
    that is missing or not a socket is left to ``connect`` to report.  What the path leads to
    can change before ``connect``: ``check_peer`` then asks the kernel who listens."""
    real = os.path.realpath(path)
    directory = os.path.dirname(real)
    try:
        sock, own = os.lstat(real), os.lstat(directory)
    except OSError:
        return
    if not stat.S_ISSOCK(sock.st_mode):
        return
    trusted = trusted_uids(daemon_uid)
    if own.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise SocketUnsafe(
            f"refusing the daemon's socket {path}: {directory} is writable by others (mode "
            f"{stat.S_IMODE(own.st_mode):04o}), who could have put their own socket there; "
            f"the daemon's socket belongs in a directory only its user can write"
        )
    if sock.st_uid not in trusted:
        raise SocketUnsafe(
            f"refusing the daemon's socket {path}: it belongs to uid {sock.st_uid}, "
            f"{_trust_hint(sock.st_uid, trusted)}"
        )
    above = directory
    while True:
        try:
            st = os.lstat(above)
        except OSError:
            return
        if st.st_uid not in trusted:
            raise SocketUnsafe(
                f"refusing the daemon's socket {path}: {above} belongs to uid {st.st_uid}, "
                f"{_trust_hint(st.st_uid, trusted)}"
            )
        if above != directory and (
            st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX
        ):
            raise SocketUnsafe(
                f"refusing the daemon's socket {path}: {above} (uid {st.st_uid}, mode "
                f"{stat.S_IMODE(st.st_mode):04o}) lets another user replace {directory}"
            )
        if above == os.path.dirname(above):
            return
        above = os.path.dirname(above)


def check_peer(sock: socket.socket, path: str, daemon_uid: int | None = None) -> None:
    """Refuse (``SocketUnsafe``) a connected socket whose listener the client does not trust,
    before a byte of the request is sent: the kernel's word (SO_PEERCRED, the credentials of
    the process that called ``listen``), which no swap of the path can forge.  ``check_socket``
    looks at the path, ``connect`` follows it afterwards: in between, a link on the way (the
    socket path itself may be one, in a directory of anyone's) can be pointed elsewhere, a
    missing directory made.  On a platform without SO_PEERCRED the path's check stands alone."""
    if not sys.platform.startswith("linux"):
        return
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    except OSError as exc:
        raise SocketUnsafe(
            f"refusing the daemon's socket {path}: the kernel does not say who listens on it "
            f"({exc.strerror or exc})"
        ) from None
    uid = int.from_bytes(raw[4:8], sys.byteorder)  # struct ucred {pid; uid; gid}
    trusted = trusted_uids(daemon_uid)
    if uid not in trusted:
        raise SocketUnsafe(
            f"refusing the daemon's socket {path}: the process listening on it belongs to uid "
            f"{uid}, {_trust_hint(uid, trusted)}"
        )


def trusted_uids(daemon_uid: int | None = None) -> frozenset[int]:
    """Whom a client trusts to have made the daemon's socket and its directories: root, its
    own effective uid, and the daemon's user -- ``daemon_uid`` when the caller gave one
    (``parse_daemon_uid`` checked it), else the one ``$AFFIDAVIT_DAEMON_UID`` names (a uid or a
    user name), else none.  An environment value that names nobody is refused
    (``SocketUnsafe``), never ignored; beside an explicit ``daemon_uid`` it is not read."""
    trusted = {0, os.geteuid()}
    if daemon_uid is not None:
        trusted.add(daemon_uid)
        return frozenset(trusted)
    named = os.environ.get(DAEMON_UID_ENV, "").strip()
    if named:
        uid = _uid_of(named)
        if uid is None:
            raise SocketUnsafe(
                f"${DAEMON_UID_ENV}={_shown(named)} names no user: set it to the uid (or user "
                f"name) the affidavit daemon runs as, or unset it"
            )
        trusted.add(uid)
    return frozenset(trusted)


def parse_daemon_uid(value: object, what: str = "daemon_uid") -> int:
    """The daemon's uid given explicitly (``what`` names where: ``daemon_uid``,
    ``--daemon-uid``): a uid from 0 to 2**32 - 2, or the name of an existing user, as an int
    or text; anything else (a negative number, a bool, a user nobody is) is
    ``DaemonUidInvalid``."""
    if isinstance(value, int) and not isinstance(value, bool):
        uid = value if 0 <= value <= MAX_UID else None
        shown = str(value)
    elif isinstance(value, str):
        uid = _uid_of(value.strip()) if value.strip() else None
        shown = _shown(value)
    else:
        raise DaemonUidInvalid(
            f"{what}: a uid (a whole number) or a user name, not {type(value).__name__}"
        )
    if uid is None:
        raise DaemonUidInvalid(
            f"{what}: {shown} is no uid and names no user: give the uid (0 to {MAX_UID}) or "
            f"user name the affidavit daemon runs as"
        )
    return uid


def _uid_of(named: str) -> int | None:
    if named.isascii() and named.isdigit():
        if len(named) <= 10 and int(named) <= MAX_UID:
            return int(named)
        return None
    import pwd

    try:
        return pwd.getpwnam(named).pw_uid
    except (KeyError, ValueError):
        return None


def _shown(named: str) -> str:
    """``named`` as a message quotes it: as itself when short and shown as it is by the one
    rule (``affidavit.text``), else its first 64 characters quoted and escaped."""
    from affidavit.text import printable, shown_as_is

    if len(named) <= 64 and shown_as_is(named):
        return named
    return printable(repr(named[:64])) + "..."


def _trust_hint(uid: int, trusted: frozenset[int]) -> str:
    """Why a uid is not trusted, and how to trust it when it is the daemon's user: every way
    there is to say so (the command line's and MCP relay's option, ``Client``'s argument, the
    environment's variable), on one line."""
    named = sorted(trusted - {0, os.geteuid()})
    whom = f", root or the daemon's user you named (uid {named[0]})" if named else " or root"
    return (
        f"not to you (uid {os.geteuid()}){whom}: whoever it is could read every call "
        f"sent there; if uid {uid} runs the affidavit daemon, pass --daemon-uid {uid} (or "
        f"Client(daemon_uid={uid})), or set {DAEMON_UID_ENV}={uid}"
    )


def unreachable(path: str, exc: OSError) -> str:
    """Why the socket at ``path`` could not be reached; a refused permission says the usual
    cause (docs/deployment.md: the socket and its directory are the clients' group's)."""
    why = exc.strerror or str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM):
        why += (
            ": this user may not open the socket or enter its directory -- is it in the "
            "socket's group?"
        )
    return f"cannot reach the affidavit daemon at {path} ({why})"


def blocking_request(
    path: str,
    method: str,
    request_target: str,
    body: bytes | None = None,
    daemon_uid: int | None = None,
    wait: float | None = None,
) -> Response:
    """One request on a fresh connection, for a short-lived process (the command line).
    ``wait``: the seconds the whole answer may take from the start (a call's: ``answer_wait``);
    a GET's first byte is waited for ``read_wait`` at most; once that has arrived, the rest is
    read within ``DELIVERY_WAIT`` (``_Clock``).  Past either, the connection is closed:
    ``AnswerLost``.
    ``daemon_uid``: the daemon's user to trust (``parse_daemon_uid``), else the environment's."""
    check_socket(path, daemon_uid)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            sock.connect(path)
        except OSError as exc:
            raise DaemonUnavailable(unreachable(path, exc)) from None
        check_peer(sock, path, daemon_uid)
        head = [f"{method} {request_target} HTTP/1.1", *(f"{k}: {v}" for k, v in HEADERS)]
        head.append("connection: close")
        if body is not None:
            head += ["content-type: application/json", f"content-length: {len(body)}"]
        # A read (GET) is waited for ``read_wait`` at most before its first byte.
        head_wait = read_wait() if method == "GET" else None
        clock = _Clock(sock, wait, answer_cap(request_target) is not None, head_wait)
        try:
            if wait is not None or head_wait is not None:
                sock.settimeout(min(w for w in (wait, head_wait) if w is not None))
            sock.sendall("\r\n".join(head).encode("ascii") + b"\r\n\r\n" + (body or b""))
        except TimeoutError:
            raise AnswerLost(clock.late()) from None
        except OSError as exc:
            return _answer_after_broken_send(sock, exc)
        try:
            return read_answer(clock.recv, answer_cap(request_target), clock.head_read)
        except TimeoutError:
            raise AnswerLost(clock.late()) from None
        except OSError as exc:
            raise AnswerLost(
                f"the connection to the daemon broke before it answered ({exc.strerror or exc})"
            ) from None
    finally:
        sock.close()


class _Clock:
    """The thin client's bounds on an answer: all of it within ``wait`` of the start (when
    given); once its first byte arrived, its head within ``DELIVERY_WAIT`` of that byte -- the
    daemon writes an answer's head at once -- and then the whole of an answer it holds in its
    answer budget (``whole``), as it writes one within its ``WRITE_WAIT``; a stored result,
    written a piece at a time, a byte at least every ``DELIVERY_WAIT``.  ``recv`` raises
    ``TimeoutError`` past them."""

    def __init__(
        self, sock: socket.socket, wait: float | None, whole: bool, head: float | None = None
    ) -> None:
        self.sock, self.whole = sock, whole
        self.start = time.monotonic()
        self.ends = None if wait is None else self.start + wait
        self.head_ends = None if head is None else self.start + head  # the first byte's
        self.first: float | None = None
        self.head = False

    def head_read(self) -> None:
        self.head = True

    def recv(self, size: int) -> bytes:
        now = time.monotonic()
        ends = [] if self.ends is None else [self.ends]
        if self.first is None and self.head_ends is not None:
            ends.append(self.head_ends)
        if self.first is not None:
            whole = self.whole or not self.head
            ends.append(self.first + DELIVERY_WAIT if whole else now + DELIVERY_WAIT)
        if ends and min(ends) <= now:
            raise TimeoutError
        self.sock.settimeout(min(ends) - now if ends else None)
        data = self.sock.recv(size)
        if self.first is None and data:
            self.first = time.monotonic()
        return data

    def late(self) -> str:
        took = time.monotonic() - self.start
        return (
            f"the daemon sent no whole answer in time ({took:.0f} s; the call may have run: "
            f"see affidavit actions, then affidavit result ID)"
        )


def _answer_after_broken_send(sock: socket.socket, exc: OSError) -> Response:
    """The request could not be sent whole: the daemon closed the connection (EPIPE,
    ECONNRESET).  It may have answered first -- a connection over ``MAX_CONNECTIONS`` is
    refused 503 ``TOO_MANY_CONNECTIONS`` before a byte of it is read (so the call certainly
    did not run), a body over ``MAX_BODY`` gets its 413 -- and that answer, written before the
    close, sits whole in this socket's receive queue (the kernel reports the reset only once
    the queue is read empty).  A complete answer, read strictly within ``AFTER_BROKEN_SEND``,
    is the daemon's own answer to this request and is returned; anything less -- nothing, a
    partial or malformed answer -- stays ``AnswerLost``: a call that may have run is never
    reported as one that did not.  (client.py does the same.)"""
    deadline = time.monotonic() + AFTER_BROKEN_SEND

    def recv(size: int) -> bytes:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        return sock.recv(size)

    try:
        return read_answer(recv)
    except (OSError, AnswerLost):
        raise AnswerLost(
            f"the connection to the daemon broke before it answered ({exc.strerror or exc})"
        ) from None


def read_answer(recv: Any, cap: int | None = None, on_head: Any = None) -> Response:
    """Read one whole answer with ``recv(n) -> bytes`` (b"" at the end of the stream):
    ``HTTP/1.1 <status>``, headers, then exactly ``Content-Length`` bytes.  ``AnswerLost`` for a
    short or malformed answer -- a partial body is never presented as an answer --, for a
    header that frames or describes the answer given twice (``Content-Length`` twice, even
    equal: h11 would refuse the unequal and this reader is as strict), and for a body longer
    than ``cap`` (``answer_cap``), refused before it is read.  ``on_head()`` once the head
    has arrived."""
    data = bytearray()
    while (end := data.find(b"\r\n\r\n")) < 0:
        if len(data) > MAX_HEAD:
            raise AnswerLost("the daemon's answer has no end of headers")
        chunk = recv(READ_SIZE)
        if not chunk:
            raise AnswerLost("the daemon closed the connection before answering")
        data += chunk
    if on_head is not None:
        on_head()
    lines = bytes(data[:end]).decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    try:  # ASCII digits only: ``str.isdigit`` lets "²" through to ``int``, which refuses it
        status = parse_count(rest[:3])
    except ValueError:
        status = -1
    if version != "HTTP/1.1" or len(rest[:3]) != 3 or status < 0 or rest[3:4] not in ("", " "):
        raise AnswerLost("the daemon's answer is not HTTP/1.1")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise AnswerLost("the daemon's answer has a malformed header")
        if name.lower() in headers and name.lower() in _SINGLE:
            raise AnswerLost(f"the daemon's answer has {name.lower()} twice")
        headers[name.lower()] = value.strip()
    try:
        length = parse_count(headers.get("content-length", ""))
    except ValueError:
        length = -1
    if "transfer-encoding" in headers or length < 0:
        raise AnswerLost("the daemon's answer has no length this client reads")
    if cap is not None and length > cap:
        raise AnswerLost(
            f"the daemon's answer would be {length} bytes, more than the {cap} it ever sends"
        )
    body = data[end + 4 :]
    while len(body) < length:
        chunk = recv(READ_SIZE)
        if not chunk:
            raise AnswerLost("the daemon closed the connection in the middle of its answer")
        body += chunk
    return Response(
        status,
        headers.get("content-type", ""),
        bytes(body[:length]),
        retry_after_of(headers.get("retry-after")),
    )


_SINGLE = frozenset({"content-length", "content-type", "retry-after", "transfer-encoding"})
"""Headers an answer gives once: a second would leave which one counts to this reader."""
