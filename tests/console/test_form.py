"""A console form is read whole up to ``MAX_FORM`` (64 KiB) and refused past it, 413, with no
more of it read (``Request.form``): a body streamed without end is not buffered.  Driven
without sockets, message by message, and once over a real loopback connection."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.console.request import MAX_FORM, Refused, Request
from tests.broker.helpers import http_target, open_broker

from .kit import operator_config, post, refusal, served

CHUNK = 8 * 1024


def _request(body: bytes, chunk: int = CHUNK) -> tuple[Request, list[int]]:
    """A POST whose body arrives in ``chunk``-byte messages; and the count of those read."""
    parts = [body[i : i + chunk] for i in range(0, len(body), chunk)] or [b""]
    read = [0]

    async def receive() -> dict[str, Any]:
        i = read[0]
        read[0] += 1
        return {"type": "http.request", "body": parts[i], "more_body": i + 1 < len(parts)}

    async def send(message: dict[str, Any]) -> None:
        raise AssertionError("nothing is sent while a form is read")

    scope = {"method": "POST", "path": "/login", "headers": []}
    return Request(scope, receive, send), read


def _form(size: int) -> bytes:
    head = b"token="
    return head + b"a" * (size - len(head))


@pytest.mark.parametrize("chunk", [CHUNK, MAX_FORM, MAX_FORM + 1, 1000])
async def test_a_form_of_64_kib_is_read_and_one_byte_more_is_refused(chunk: int) -> None:
    req, _ = _request(_form(MAX_FORM), chunk)
    assert await req.form() == {"token": "a" * (MAX_FORM - 6)}
    req, read = _request(_form(MAX_FORM + 1) + b"a" * (4 * CHUNK), chunk)
    with pytest.raises(Refused) as info:
        await req.form()
    assert (info.value.status, info.value.code) == (413, "FORM_TOO_LARGE")
    # Read only until the limit was passed: the rest is never taken in.
    assert read[0] == -(-(MAX_FORM + 1) // chunk)


async def test_a_form_past_the_limit_is_answered_413_over_http(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        with trio.fail_after(20):  # (a guard against a hang, no speed asserted)
            status, headers, page = await post(
                f"{origin}/login", {"token": "a" * MAX_FORM}, {"Origin": origin}
            )
        assert (status, refusal(page)) == (413, ("FORM_TOO_LARGE", None))
        assert "set-cookie" not in headers
        assert console.sessions._by_id == {}


async def test_a_form_cut_off_mid_body_is_a_bad_request_and_not_acted_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Part of a login form (a whole valid token), then the client gone (``http.disconnect``):
    400 BAD_REQUEST, never the part read as the form; the token is not used up.  Driven as
    ASGI, message by message: over hypercorn a body cut mid-frame is its own bare 400
    (``test_connections``)."""
    from affidavit.approvals import Operator

    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        token, _ = console.tokens.mint(Operator.current())
        messages = [
            {"type": "http.request", "body": f"token={token}".encode(), "more_body": True},
            {"type": "http.disconnect"},
        ]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return messages.pop(0)

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        host = origin.removeprefix("http://").encode()
        headers = [(b"host", host), (b"origin", origin.encode())]
        scope = {"type": "http", "method": "POST", "path": "/login", "headers": headers}
        await console(scope, receive, send)
        start, body = sent
        assert start["status"] == 400
        assert b"set-cookie" not in dict(start["headers"])
        assert refusal(body["body"]) == ("BAD_REQUEST", None) and b"cut off" in body["body"]
        status, headers, _ = await post(f"{origin}/login", {"token": token}, {"Origin": origin})
        assert status == 200 and "set-cookie" in headers  # the link still works, once
