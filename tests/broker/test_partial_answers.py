"""An answer that holds only part of an echo of the credential gives none of it away.

Seed: "Exclude secrets ... from the envelope".  A form of the credential is redacted where it
stands whole (docs/redaction.md); a window of an echo -- ``Range: bytes=22-27`` of a page that
prints the request's ``Authorization`` -- is too short to be a form, and the windows put
together are the credential.  So a caller may not ask for a part of the answer (``Range``,
``If-Range``: ``FORBIDDEN_HEADER``), and an answer that ends inside a form, however it came to
end there, ends with that form's beginning redacted (``Redactor.flush``, ``CUT_FORM``
secret-derived bytes of it or more) -- and the record says so for what it is,
``tail_redacted``, never as an echo.  Bytes that do not derive from the secret (``Bearer``, a
Basic user name, a key's armour and its format's first characters, a vendor's token prefix)
count for nothing, so an
ordinary ending that only looks like a form's start is left as it was.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from affidavit.protocols.actions import ActionInvalid, parse_action
from affidavit.secrets.redaction import CUT_FORM, REDACTED, Redactor
from affidavit.statemachine import Code, EventKind
from tests.http.hostile import HostileServer, Peer, Received, Reply, scripts

from .helpers import TOKEN_ENV, http_target, open_broker, write_config

SECRET = "sk_live_Q7pW3xN9rT2vL5mK8jH4"
PASSWORD = b"Zq8!vR2#mK5pL9wX"
BEARER = b"Bearer " + SECRET.encode()
VENDOR = len("sk_live_")  # public: every such token starts with it (``VENDOR_PREFIXES``)
_MIXED = 9
"""base64(BEARER)'s character that mixes "Bearer "'s last bits with the token's first."""


@pytest.mark.parametrize(
    "name", ["Range", "range", "If-Range", "IF_RANGE", "if-range", "Request-Range", "request_range"]
)
def test_a_caller_may_not_ask_for_part_of_the_answer(tmp_path: Path, name: str) -> None:
    from affidavit.config import config_from_dict

    config = config_from_dict(
        {"targets": {"t": http_target("http://127.0.0.1:9/api")}}, base_dir=tmp_path
    )
    action = {"target": "t", "method": "GET", "path": "/echo", "headers": {name: "bytes=0-5"}}
    with pytest.raises(ActionInvalid) as info:
        parse_action(action, config)
    assert (info.value.code, info.value.field) == (Code.FORBIDDEN_HEADER, f"headers.{name}")


def _streamed(r: Redactor, data: bytes, step: int) -> bytes:
    out = b"".join(r.feed(data[i : i + step]) for i in range(0, len(data), step))
    return out + r.flush()


BASIC = b"alice.smith:" + PASSWORD
BASIC_VALUES = [BASIC, b"Basic " + base64.b64encode(BASIC), PASSWORD]  # as the binding lists them
KEY = (
    Ed25519PrivateKey.generate()
    .private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption())
    .replace(b"\r\n", b"\n")
)
KEY_BODY = KEY.splitlines()[1:-1]


def _key_id(value: object) -> str | None:
    """A parameter's id that is the same in every pytest-xdist worker: the key's PEM differs
    between runs (a fresh key, and the OpenSSH format's random check integers)."""
    if isinstance(value, list) and KEY in value:
        return "key"
    if isinstance(value, bytes) and value and value in KEY:
        return f"key-{len(value)}"
    return None


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
@pytest.mark.parametrize(
    ("values", "tail"),
    [
        ([SECRET.encode(), BEARER], SECRET.encode()[: VENDOR + CUT_FORM]),
        ([SECRET.encode(), BEARER], SECRET.encode()[:-1]),
        ([SECRET.encode(), BEARER], BEARER[:-1]),
        ([SECRET.encode(), BEARER], BEARER[: len("Bearer ") + VENDOR + CUT_FORM]),
        ([SECRET.encode(), BEARER], base64.b64encode(SECRET.encode())[: 10 + CUT_FORM]),
        # base64 of "Bearer ": 9 public characters, the 10th mixes the space with the token;
        # 8 past it are the token's alone (its base64 core at that alignment).
        ([SECRET.encode(), BEARER], base64.b64encode(BEARER)[: _MIXED + 1 + CUT_FORM]),
        # The floor as a literal: 8 bytes past the vendor prefix of this token (``cut_floor``).
        ([SECRET.encode(), BEARER], b"sk_live_Q7pW3xN9"),
        ([SECRET.encode(), BEARER], b"Bearer sk_live_Q7pW3xN9"),
        ([b"github_pat_" + SECRET.encode()[8:]], b"github_pat_" + SECRET.encode()[8:16]),
        ([SECRET.encode(), BEARER], SECRET.encode().hex().encode()[:-1]),
        ([SECRET.encode(), BEARER], SECRET.encode().hex().encode()[: 2 * VENDOR + CUT_FORM]),
        (BASIC_VALUES, b"alice.smith:" + PASSWORD[:CUT_FORM]),
        (BASIC_VALUES, PASSWORD[:-1]),
        # base64 of "alice.smith:" is 16 whole characters; the password's begin after them.
        (BASIC_VALUES, b"Basic " + base64.b64encode(BASIC)[: 16 + CUT_FORM]),
        ([KEY], KEY_BODY[1][:CUT_FORM]),
        ([KEY], KEY_BODY[2][: CUT_FORM + 5]),
        # The OpenSSH format's first 52 body characters are public; 8 past them are not.
        ([KEY], KEY.splitlines()[0] + b"\n" + KEY_BODY[0][: 52 + CUT_FORM]),
    ],
    ids=_key_id,
)
def test_a_stream_ending_inside_a_form_ends_with_its_beginning_redacted(
    values: list[bytes], tail: bytes, step: int
) -> None:
    data = b'{"echo": "ok"}\nAuthorization: ' + tail
    r = Redactor(values)
    out = _streamed(r, data, step)
    assert out.endswith(REDACTED)
    assert out.startswith(b'{"echo": "ok"}\nAuthorization: ')
    assert r.tail_redacted and not r.echoed
    assert SECRET.encode()[:CUT_FORM] not in out and PASSWORD[:CUT_FORM] not in out
    assert base64.b64encode(BEARER)[: _MIXED + 1 + CUT_FORM] not in out


@pytest.mark.parametrize(
    ("values", "tail"),
    [
        ([SECRET.encode(), BEARER], b""),
        ([SECRET.encode(), BEARER], b"s"),
        ([SECRET.encode(), BEARER], b"sk_l"),
        ([SECRET.encode(), BEARER], SECRET.encode()[: CUT_FORM - 1]),
        ([SECRET.encode(), BEARER], SECRET.encode().hex().encode()[: CUT_FORM - 1]),
        ([SECRET.encode(), BEARER], b"Use Authorization: Bearer"),
        ([SECRET.encode(), BEARER], b"Use Authorization: Bearer "),
        ([SECRET.encode(), BEARER], b"Bearer " + SECRET.encode()[: CUT_FORM - 1]),
        ([SECRET.encode(), BEARER], base64.b64encode(BEARER)[: _MIXED + CUT_FORM]),
        ([SECRET.encode(), BEARER], b"sk_live_Q7pW3xN"),  # the floor as a literal: 7 of 8
        ([SECRET.encode(), BEARER], b"Bearer sk_live_Q7pW3xN"),
        # A vendor's prefix is every such token's, no sign of this one (``VENDOR_PREFIXES``).
        ([SECRET.encode(), BEARER], b"key: sk_live_"),
        ([SECRET.encode(), BEARER], b"Bearer SK_LIVE_"),
        ([SECRET.encode(), BEARER], SECRET.encode().hex().encode()[: 2 * VENDOR]),
        ([SECRET.encode(), BEARER], base64.b64encode(SECRET.encode())[:10]),
        ([b"github_pat_" + SECRET.encode()[8:]], b"token: github_pat_"),
        ([b"sk-proj-" + SECRET.encode()[8:]], b"export OPENAI_API_KEY=sk-proj-"),
        ([b"xoxb-" + SECRET.encode()[8:]], b"SLACK_TOKEN=xoxb-"),
        ([b"ghp_" + SECRET.encode()[8:]], b"token: ghp_"),
        (BASIC_VALUES, b"alice.smith"),  # /whoami: the user name is no secret
        (BASIC_VALUES, b"alice.smith:"),
        (BASIC_VALUES, b"alice.smith:" + PASSWORD[: CUT_FORM - 1]),
        (BASIC_VALUES, b"Basic " + base64.b64encode(b"alice.smith:")),
        ([KEY], b"-----"),
        ([KEY], b"see below\n----"),
        ([KEY], KEY.splitlines()[0] + b"\n"),
        ([KEY], KEY_BODY[0][:52]),  # another OpenSSH key's start: the format's, not this key's
        ([KEY], b"items"),
        ([KEY], b"}\n"),
    ],
)
def test_an_ordinary_ending_or_too_few_secret_bytes_end_the_stream_as_they_were(
    values: list[bytes], tail: bytes
) -> None:
    data = b"list of " + tail
    r = Redactor(values)
    assert _streamed(r, data, 2) == data
    assert not r.changed and not r.tail_redacted


async def _completed(
    tmp_path: Path, script: Callable[[Peer], Awaitable[None]]
) -> tuple[dict[str, Any], Mapping[str, Any], list[Received]]:
    """``GET /x`` of target ``t`` served by ``script``: the envelope, its complete-response
    row's attributes, and what the server received."""
    async with HostileServer.running(script) as server:
        cfg = write_config(tmp_path, {"t": http_target(server.url)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(20):
                env = await broker.call({"target": "t", "method": "GET", "path": "/x"})
            [complete] = [
                e.attrs
                for e in broker.events(env["invocation_id"])
                if e.kind is EventKind.REMOTE_RESPONSE_COMPLETE
            ]
    return env, complete, server.requests


@pytest.mark.parametrize(
    ("said", "body", "withheld"),
    [
        # A preview of the first 30 bytes of what the target was sent: cut inside the token.
        (lambda auth: b"you sent: " + auth[:30], "you sent: Bearer [REDACTED]", "tail_redacted"),
        (lambda auth: b"you sent: " + auth, "you sent: [REDACTED]", "redacted"),
        (lambda auth: b"Use Authorization: Bearer", "Use Authorization: Bearer", None),
    ],
)
async def test_an_answer_cut_inside_an_echo_reaches_no_caller_and_says_what_it_was(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    said: Callable[[bytes], bytes],
    body: str,
    withheld: str | None,
) -> None:
    monkeypatch.setenv(TOKEN_ENV, SECRET)

    def reply(r: Received) -> Reply:
        return Reply(200, body=said((r.header("authorization") or "").encode()))

    env, complete, received = await _completed(tmp_path, scripts.serve(reply))
    assert received[0].header("authorization") == BEARER.decode()
    assert env["result"]["body"] == body, env
    assert SECRET[:CUT_FORM] not in json.dumps(env)
    http = env["evidence"]["http"]
    assert http["received_withheld"] == withheld
    assert (http["body_bytes"] is None) == (withheld is not None)
    assert complete.get("body_received_withheld") == withheld
    assert ("body_sha256" in complete) == (withheld is None)


@pytest.mark.parametrize(
    ("text", "scrubbed"),
    [
        (f"Bearer {SECRET[: VENDOR + CUT_FORM]}", "Bearer [REDACTED]"),
        (f"seen: BEARER {SECRET[: VENDOR + CUT_FORM].upper()}", "seen: BEARER [REDACTED]"),
        (f"seen: {SECRET[: VENDOR + CUT_FORM - 1]}", f"seen: {SECRET[: VENDOR + CUT_FORM - 1]}"),
        (f"seen: {SECRET[: CUT_FORM - 1]}", f"seen: {SECRET[: CUT_FORM - 1]}"),
        ("Use Authorization: Bearer", "Use Authorization: Bearer"),
    ],
)
def test_a_header_value_or_reason_cut_inside_an_echo_ends_redacted(
    text: str, scrubbed: str
) -> None:
    assert Redactor([SECRET.encode(), BEARER]).scrub_text(text) == scrubbed


def test_short_text_ending_inside_a_short_values_form_in_another_case_ends_redacted() -> None:
    """A short value's forms keep their case in bodies, not in short text (a parser may have
    folded it): so too the end rule -- here a hex dump in mixed case."""
    begun = b"k9#Lm2".hex()[: CUT_FORM + 2]  # of 12 digits; not a MIN_ANY_CASE value
    mixed = begun[:2].upper() + begun[2:]
    r = Redactor([b"k9#Lm2"])
    assert r.scrub_text(f"id={mixed}") == "id=[REDACTED]"
    assert _streamed(r, f"id={mixed}".encode(), 3) == f"id={mixed}".encode()


async def test_a_head_cut_inside_an_echo_reaches_no_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A target that shows 24 bytes of the Authorization it got in a header and its reason."""
    monkeypatch.setenv(TOKEN_ENV, SECRET)

    def reply(r: Received) -> Reply:
        seen = (r.header("authorization") or "")[:24]
        return Reply(200, headers=[("X-Seen", seen)], reason=f"Saw {seen}".encode(), body=b"ok")

    async with HostileServer.running(scripts.serve(reply)) as server:
        cfg = write_config(tmp_path, {"t": http_target(server.url)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(20):
                env = await broker.call({"target": "t", "method": "GET", "path": "/x"})
    assert env["result"]["body"] == "ok", env
    text = json.dumps(env)
    assert SECRET[:CUT_FORM] not in text
    assert ["x-seen", "Bearer [REDACTED]"] in [[n.lower(), v] for n, v in env["result"]["headers"]]
    assert "Saw Bearer [REDACTED]" in text


def test_a_result_cut_at_its_limit_with_its_end_redacted_is_not_called_an_echo() -> None:
    from affidavit.engine.attempt import _too_large_message

    message = _too_large_message({"limit": 64, "received_withheld": "tail_redacted"})
    assert "may be ordinary text" in message and "echoed" not in message
    assert "redacted" not in message  # nothing of the result is returned, so none redacted
    assert "bytes received" not in message.replace("the bytes received are not told", "")


@pytest.mark.parametrize("max_result", [20, None])
@pytest.mark.parametrize(
    "seen", [bytes, base64.b64encode], ids=["as-sent", "base64"]
)  # the driver's literal check (``_head_echoed``); a form only the scrub finds
async def test_a_head_that_echoed_keeps_the_record_saying_so_whatever_the_body_ends_with(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    max_result: int | None,
    seen: Callable[[bytes], bytes],
) -> None:
    """The head echoed the whole Authorization; the body ends inside it.  The record says
    ``redacted`` -- an echo -- never the weaker ``tail_redacted`` ("may be ordinary text")
    that the body alone would earn: reasons combine by strength, none is lowered."""
    monkeypatch.setenv(TOKEN_ENV, SECRET)

    def reply(r: Received) -> Reply:
        auth = (r.header("authorization") or "").encode()
        head = [("X-Seen", seen(auth).decode())]
        return Reply(200, headers=head, body=b"you sent: " + auth[:30])

    async with HostileServer.running(scripts.serve(reply)) as server:
        cfg = write_config(tmp_path, {"t": http_target(server.url, max_result=max_result)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(20):
                env = await broker.call({"target": "t", "method": "GET", "path": "/x"})
    text = json.dumps(env)
    assert SECRET[:CUT_FORM] not in text
    assert "may be ordinary text" not in text and "tail_redacted" not in text, env
    assert env["evidence"]["http"]["received_withheld"] == "redacted", env
    if max_result is not None:
        assert env["error"]["code"] == Code.RESULT_SIZE_LIMIT.value, env
        assert env["evidence"]["result_size_limit"]["received_withheld"] == "redacted"
        assert "echoed a secret" in env["error"]["message"]


SHORT = b"k9#Lm2Qx"  # an 8-byte Basic password
LONG = b"Zq8vR2mK5pL9wXa7Tb3Nc6Yd1Hf4Jg0S"  # a 32-byte token
_ROWS = [
    # (a Basic password, its form, the form's floor: min(8, max(2, ceil(bytes / 2))))
    (SHORT[:4], SHORT[:4], 2),
    (SHORT[:5], SHORT[:5], 3),
    (SHORT[:6], SHORT[:6], 3),
    (SHORT, SHORT, 4),
    (SHORT[:4], SHORT[:4].hex().encode(), 4),  # hex: 8 digits
    (SHORT, SHORT.hex().encode(), 8),  # 16 digits
    (LONG, LONG, 8),
    (LONG, LONG.hex().encode(), 8),
]


@pytest.mark.parametrize("cut", [True, False], ids=["floor", "floor-less-one"])
@pytest.mark.parametrize(
    ("value", "form", "floor"), _ROWS, ids=[f"{len(v)}B-{len(f)}" for v, f, _ in _ROWS]
)
def test_a_cut_end_shows_fewer_than_half_of_a_form_of_three_bytes_or_more(
    value: bytes, form: bytes, floor: int, cut: bool
) -> None:
    """The floor's bytes of a form's beginning end redacted; one fewer are left as they were:
    fewer than half of the form (at most ``ceil(d / 2) - 1`` of its ``d`` bytes)."""
    r = Redactor([b"alice:" + value, value])
    tail = form[: floor if cut else floor - 1]
    data = b"you sent: " + tail
    out = _streamed(r, data, 3)
    assert out == (b"you sent: " + REDACTED if cut else data)
    assert r.tail_redacted is cut and not r.echoed
    if not cut:
        assert 2 * len(tail) < len(form)


def _hex_in_head(interim: bool) -> Callable[[Peer], Awaitable[None]]:
    """The Authorization's hex in a 103's Link (or the 200's own header), then a 200 whose
    body ends in its first 30 bytes."""

    async def script(peer: Peer) -> None:
        req = await peer.read_request()
        if req is None:
            return
        auth = (req.header("authorization") or "").encode()
        echo = b"X-Seen: " + auth.hex().encode() + b"\r\n"
        body = b"you sent: " + auth[:30]
        early = b"HTTP/1.1 103 Early Hints\r\nLink: <" + auth.hex().encode() + b">\r\n\r\n"
        head = b"HTTP/1.1 200 OK\r\n" + (b"" if interim else echo)
        length = f"Content-Length: {len(body)}\r\n\r\n".encode()
        await peer.send_raw((early if interim else b"") + head + length + body)
        await peer.close()

    return script


@pytest.mark.parametrize("interim", [True, False], ids=["103-link", "200-header"])
async def test_a_head_echo_only_the_driver_saw_keeps_the_streams_row_saying_redacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interim: bool
) -> None:
    """The driver's word (its head held the credential's hex) reaches the complete-response
    row's ``body_received_withheld`` too, not only the envelope: a body that only ends inside
    the credential does not lower it to ``tail_redacted``."""
    monkeypatch.setenv(TOKEN_ENV, SECRET)
    env, complete, _ = await _completed(tmp_path, _hex_in_head(interim))
    assert env["result"]["body"] == "you sent: Bearer [REDACTED]", env
    assert env["evidence"]["http"]["received_withheld"] == "redacted", env
    assert complete.get("body_received_withheld") == "redacted", complete
    assert "body_sha256" not in complete
