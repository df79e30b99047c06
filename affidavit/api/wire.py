"""The daemon's API as its clients speak it: HTTP/1.1 with JSON bodies over a Unix socket.

Sans-IO (h11) so that the async ``Client`` and the command line's blocking client share one
reading of requests and answers.  This module imports only the standard library and h11: it is
on the path of ``affidavit call --socket``, whose whole process must stay light (no engine,
journal, cryptography or config).

Answers: HTTP 200 carries the JSON the embedded command would print (an envelope, a record, a
list).  Any other status is the API's own trouble, never the action's, with the body
``{"api_error": {"code": ..., "message": ...}}`` (``ApiError``).
"""

from __future__ import annotations

import json
import math
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

import h11

__all__ = [
    "READ_SIZE",
    "SOCKET_ENV",
    "AnswerLost",
    "ApiError",
    "ClientError",
    "DaemonUnavailable",
    "Response",
    "ResponseReader",
    "blocking_request",
    "encode_request",
    "invocation_path",
    "parse_time",
    "socket_path",
    "target",
]

SOCKET_ENV = "AFFIDAVIT_SOCKET"
READ_SIZE = 65536
_HEADERS = [("host", "affidavit"), ("accept", "application/json")]


class ClientError(Exception):
    """The daemon could not be asked, or did not answer completely."""


class DaemonUnavailable(ClientError):
    """Nothing answers on the socket (missing, refused, or not ours to open)."""


class AnswerLost(ClientError):
    """The connection ended before a complete answer.  For ``POST /v1/calls`` the call may have
    run: the daemon keeps its result (``affidavit actions``, then ``affidavit result ID``); an
    ``idempotency_key`` lets the caller resume the same invocation instead of a second one."""


class ApiError(ClientError):
    """The daemon answered with an API-level error (400 bad JSON, 403 peer refused, 404,
    503 overloaded or shutting down) -- never an action's error, which is an envelope."""

    def __init__(self, status: int, code: str, message: str) -> None:
        self.status = status
        self.code = code
        self.message = message
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    content_type: str
    body: bytes

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
            return ApiError(self.status, str(err["code"]), str(err["message"]))
        except (ValueError, KeyError, TypeError):
            return ApiError(self.status, "HTTP_ERROR", f"the daemon answered HTTP {self.status}")


def socket_path(explicit: str | os.PathLike[str] | None) -> str | None:
    """``--socket`` beats ``$AFFIDAVIT_SOCKET``; None (embedded) when neither is set."""
    if explicit:
        return os.fspath(explicit)
    return os.environ.get(SOCKET_ENV) or None


def parse_time(value: str) -> float:
    """Epoch seconds or ISO 8601 (naive means UTC), as the filters of ``affidavit actions``
    and ``GET /v1/actions`` take them.  ``ValueError`` says what was expected."""
    try:
        t = float(value)
        if math.isfinite(t):
            return t
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"expected ISO 8601 or epoch seconds, got {value!r}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def target(path: str, params: Mapping[str, object] | None = None) -> str:
    """A request target: ``path`` plus the query of the params that are not None."""
    query = {k: str(v) for k, v in (params or {}).items() if v is not None}
    return f"{path}?{urlencode(query)}" if query else path


def invocation_path(invocation_id: str, suffix: str = "") -> str:
    # Quoted: an id is the caller's text; a "/" or "?" in it must not change the route.
    return f"/v1/invocations/{quote(invocation_id, safe='')}{suffix}"


def encode_request(
    conn: h11.Connection, method: str, request_target: str, body: bytes | None = None
) -> bytes:
    headers = list(_HEADERS)
    if body is not None:
        headers += [("content-type", "application/json"), ("content-length", str(len(body)))]
    data = conn.send(h11.Request(method=method, target=request_target, headers=headers)) or b""
    if body:
        data += conn.send(h11.Data(data=body)) or b""
    data += conn.send(h11.EndOfMessage()) or b""
    return data


class ResponseReader:
    """Feeds received bytes to h11 until one whole response has arrived."""

    def __init__(self, conn: h11.Connection) -> None:
        self._conn = conn
        self._status = 0
        self._type = ""
        self._body = bytearray()
        self.started = False
        """A byte of the answer arrived (a retry would no longer be a first try)."""

    def feed(self, data: bytes) -> Response | None:
        """The response once complete, else None (call again with more bytes).  ``data=b""``
        is the end of the stream: ``AnswerLost`` if the answer is not complete."""
        if data:
            self.started = True
        try:
            self._conn.receive_data(data)
            while True:
                event = self._conn.next_event()
                if event is h11.NEED_DATA:
                    if not data:
                        raise AnswerLost("the daemon closed the connection before answering")
                    return None
                if isinstance(event, h11.Response):
                    self._status = event.status_code
                    for name, value in event.headers:
                        if name == b"content-type":
                            self._type = value.decode("latin-1")
                elif isinstance(event, h11.Data):
                    self._body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    return Response(self._status, self._type, bytes(self._body))
                elif isinstance(event, h11.ConnectionClosed):
                    raise AnswerLost("the daemon closed the connection before answering")
        except h11.RemoteProtocolError as exc:
            raise AnswerLost(f"the daemon's answer is not valid HTTP/1.1 ({exc})") from None

    def reusable(self) -> bool:
        """After a complete response: both sides are done, the connection can carry another."""
        if self._conn.our_state is h11.DONE and self._conn.their_state is h11.DONE:
            self._conn.start_next_cycle()
            return True
        return False


def blocking_request(
    path: str, method: str, request_target: str, body: bytes | None = None
) -> Response:
    """One request on a fresh connection, for a short-lived process (the command line).  No
    timeout of its own: a call is bounded by its target's timeouts in the daemon."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            sock.connect(path)
        except OSError as exc:
            raise DaemonUnavailable(
                f"cannot reach the affidavit daemon at {path} ({exc.strerror or exc})"
            ) from None
        conn = h11.Connection(h11.CLIENT)
        reader = ResponseReader(conn)
        try:
            sock.sendall(encode_request(conn, method, request_target, body))
            while True:
                response = reader.feed(sock.recv(READ_SIZE))
                if response is not None:
                    return response
        except OSError as exc:
            raise AnswerLost(
                f"the connection to the daemon broke before it answered ({exc.strerror or exc})"
            ) from None
    finally:
        sock.close()
