"""The few ASGI pieces the routes need: a request with its peer and link, JSON answers, and
the API's own errors (``{"api_error": {"code", "message"}}``; never an envelope).

Status codes are the API's, never the action's: every envelope -- error or not -- is HTTP 200.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from affidavit.api.limits import ActionInvalid, load_action_json

from .link import Link
from .peer import Peer

__all__ = ["ASGIApp", "ApiProblem", "Receive", "Request", "Send", "api_error_body", "json_body"]

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Message, Receive, Send], Awaitable[None]]

MAX_BODY = 16 * 1024 * 1024
"""An action is small; targets enforce their own ``max_body`` (PAYLOAD_LIMIT, an envelope)."""


class ApiProblem(Exception):
    """An API-level refusal: answered with ``status`` and ``{"api_error": ...}``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        self.status = status
        self.code = code
        self.message = message
        super().__init__(message)


class ClientGone(Exception):
    """The client hung up (before its body arrived, or before its answer could be written)."""


def json_body(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode("utf-8") + b"\n"


def api_error_body(code: str, message: str) -> bytes:
    return json_body({"api_error": {"code": code, "message": message}})


def parse_json(raw: bytes) -> Any:
    # Size, UTF-8 and nesting are checked before the parser runs (issue 9: 100k nested
    # arrays ended in a RecursionError); the message says which.
    try:
        return load_action_json(raw, MAX_BODY)
    except ActionInvalid as exc:
        raise ApiProblem(400, "BAD_JSON", f"the body {exc.message}") from None


@dataclass
class Request:
    scope: Mapping[str, Any]
    receive: Receive
    send: Send
    peer: Peer
    link: Link
    params: dict[str, str] = field(default_factory=dict)
    answered: bool = False

    def __post_init__(self) -> None:
        raw = self.scope.get("query_string", b"").decode("latin-1")
        self.params = dict(parse_qsl(raw, keep_blank_values=True))

    @property
    def method(self) -> str:
        return str(self.scope["method"])

    @property
    def path(self) -> str:
        return str(self.scope["path"])

    async def body(self) -> bytes:
        data = bytearray()
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            data += message.get("body", b"")
            if len(data) > MAX_BODY:
                raise ApiProblem(413, "BODY_TOO_LARGE", f"the body exceeds {MAX_BODY} bytes")
            if not message.get("more_body", False):
                return bytes(data)

    async def json(self) -> Any:
        return parse_json(await self.body())

    async def json_object(self) -> dict[str, Any]:
        """The body as a JSON object; an empty body is ``{}``."""
        raw = await self.body()
        value = parse_json(raw) if raw.strip() else {}
        if not isinstance(value, dict):
            raise ApiProblem(400, "BAD_REQUEST", "the body must be a JSON object")
        return value

    def text_param(self, name: str) -> str | None:
        return self.params.get(name) or None

    def count_param(self, name: str) -> int | None:
        raw = self.params.get(name)
        if not raw:
            return None
        if not raw.isdigit():
            raise ApiProblem(400, "BAD_REQUEST", f"{name}: expected a whole number >= 0")
        return int(raw)

    def float_param(self, name: str) -> float | None:
        raw = self.params.get(name)
        if not raw:
            return None
        try:
            value = float(raw)
        except ValueError:
            value = float("nan")
        if not value >= 0 or value == float("inf"):
            raise ApiProblem(400, "BAD_REQUEST", f"{name}: expected a number of seconds >= 0")
        return value

    async def respond(
        self,
        status: int,
        body: bytes,
        content_type: bytes = b"application/json",
        *,
        close: bool = False,
    ) -> None:
        headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body))]
        if close:
            headers.append((b"connection", b"close"))
        self.answered = True
        self.link.cork()  # one answer, one write (link.py)
        try:
            await self.send({"type": "http.response.start", "status": status, "headers": headers})
            await self.send({"type": "http.response.body", "body": body})
        finally:
            await self.link.uncork()

    async def respond_json(self, value: Any) -> None:
        await self.respond(200, json_body(value))

    async def respond_problem(self, problem: ApiProblem, *, close: bool = False) -> None:
        await self.respond(
            problem.status, api_error_body(problem.code, problem.message), close=close
        )
