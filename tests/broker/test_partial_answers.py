"""An answer that holds only part of an echo of the credential: what reaches a caller never
depends on whether bytes match the secret's beginning.

Seed: "Exclude secrets ... from the envelope".  A form of the credential is redacted where it
stands whole (docs/redaction.md); a window of an echo -- ``Range: bytes=22-27`` of a page that
prints the request's ``Authorization`` -- is too short to be a form, and the windows put
together are the credential.  So a caller may not ask for a part of the answer (``Range``,
``If-Range``: ``FORBIDDEN_HEADER``).

An end is never cut because it looks like a form's beginning: a remote that echoes the request
path at the end of a 404 page (or in a ``Location``, a reason phrase) would turn such a cut
into a prefix oracle -- the caller writes its guess into the path, and ``[REDACTED]`` tells it
whether the guess begins the secret (audit 54b, F1: a bearer token recovered in 892 calls).  A
stream that ended complete is flushed with no end cut (an echo cut short at its very end is the
documented limit, as one cut short and followed by other bytes); one cut short withholds its
last ``tail_window`` bytes whatever they are (``Redactor.flush``), recorded ``tail_redacted``.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from affidavit.protocols.actions import ActionInvalid, parse_action
from affidavit.secrets.redaction import REDACTED, Redactor, tail_window
from affidavit.statemachine import Code
from tests.http.hostile import HostileServer, Peer, Received, Reply, scripts

from .helpers import TOKEN_ENV, http_target, open_broker, write_config

SECRET = "sk_live_Q7pW3xN9rT2vL5mK8jH4"
PASSWORD = b"Zq8!vR2#mK5pL9wX"
BEARER = b"Bearer " + SECRET.encode()
RIGHT = SECRET[:16]
"""A guess that is the secret's beginning: the vendor prefix and eight of its own bytes."""
WRONG = RIGHT[:-1] + "8"
"""The same guess with its last character wrong."""
assert WRONG != RIGHT and not SECRET.startswith(WRONG)


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


def _streamed(r: Redactor, data: bytes, step: int, complete: bool = True) -> bytes:
    out = b"".join(r.feed(data[i : i + step]) for i in range(0, len(data), step))
    return out + r.flush(complete)


BASIC = b"alice.smith:" + PASSWORD
BASIC_VALUES = [BASIC, b"Basic " + base64.b64encode(BASIC), PASSWORD]  # as the binding lists them
KEY = (
    Ed25519PrivateKey.generate()
    .private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption())
    .replace(b"\r\n", b"\n")
)
KEY_BODY = KEY.splitlines()[1:-1]
_TOKEN = [SECRET.encode(), BEARER]

_ENDS = [
    # (values, the end of a secret's form, ordinary text of the same length)
    (_TOKEN, SECRET.encode()[:16], b"sk_live_xxxxxxxx"),
    (_TOKEN, SECRET.encode()[:-1], b"y" * (len(SECRET) - 1)),
    (_TOKEN, BEARER[:-1], b"Bearer " + b"z" * (len(SECRET) - 1)),
    (_TOKEN, base64.b64encode(BEARER)[:20], b"QmVhcmVyIHNrX2xpdmVf"[:20]),
    (_TOKEN, SECRET.encode().hex().encode()[:-1], b"0" * (2 * len(SECRET) - 1)),
    (BASIC_VALUES, b"alice.smith:" + PASSWORD[:8], b"alice.smith:password"[:20]),
    (BASIC_VALUES, PASSWORD[:-1], b"q" * (len(PASSWORD) - 1)),
    ([KEY], KEY_BODY[1][:20], b"k" * 20),
]
_END_IDS = [f"{i}" for i in range(len(_ENDS))]


@pytest.mark.parametrize("step", [1, 7, 1000])
@pytest.mark.parametrize(("values", "begun", "ordinary"), _ENDS, ids=_END_IDS)
def test_a_complete_stream_keeps_its_end_whatever_it_is(
    values: list[bytes], begun: bytes, ordinary: bytes, step: int
) -> None:
    """No end cut: whether an end begins a form would be a prefix oracle on a caller's echo."""
    for tail in (begun, ordinary):
        data = b'{"echo": "ok"}\nAuthorization: ' + tail
        r = Redactor(values)
        assert _streamed(r, data, step) == data
        assert not r.changed and not r.tail_redacted and not r.echoed


@pytest.mark.parametrize("step", [1, 7, 1000])
@pytest.mark.parametrize("lead", [0, 10, 300, 5000])
@pytest.mark.parametrize(("values", "begun", "ordinary"), _ENDS, ids=_END_IDS)
def test_a_stream_cut_short_withholds_the_same_tail_whatever_it_is(
    values: list[bytes], begun: bytes, ordinary: bytes, lead: int, step: int
) -> None:
    """The last ``tail_window`` bytes (all of a shorter stream) go, replaced by one
    ``[REDACTED]``: the same output for a secret's beginning as for ordinary text."""
    outs = []
    for tail in (begun, ordinary):
        data = b"n" * lead + b"Authorization: " + tail
        r = Redactor(values)
        out = _streamed(r, data, step, complete=False)
        assert r._plan is not None and r.tail_redacted and not r.echoed
        assert out == data[: max(0, len(data) - tail_window(r._plan))] + REDACTED
        outs.append(out)
    assert outs[0] == outs[1]
    assert r.ending() == (False, True, False)  # flushed: nothing held back, its word kept


def test_the_tail_window_depends_on_the_plan_alone() -> None:
    """A power of two, 256 at least, as wide as the widest match (``feed`` holds that back)."""
    for values in (_TOKEN, BASIC_VALUES, [KEY], [b"k9#L"]):
        plan = Redactor(values)._plan
        assert plan is not None
        tail = tail_window(plan)
        assert (
            tail >= max(256, plan.widest)
            and tail & (tail - 1) == 0
            and tail < 2 * max(256, plan.widest)
        )


def test_a_whole_form_is_replaced_at_any_end_complete_or_cut() -> None:
    data = b"you sent: " + BEARER
    whole = Redactor(_TOKEN)
    assert _streamed(whole, data, 3) == b"you sent: " + REDACTED and whole.echoed
    cut = Redactor(_TOKEN)
    assert _streamed(cut, data, 3, complete=False) == REDACTED and cut.echoed
    assert cut.tail_redacted
    held = Redactor(_TOKEN)
    held.feed(data)
    assert held.ending() == (True, True, False)  # an echo in the held-back bytes is an echo


@pytest.mark.parametrize(
    ("text", "scrubbed"),
    [
        # A remote's short text is never cut at its end (a Location echoing the path).
        (f"Bearer {RIGHT}", f"Bearer {RIGHT}"),
        (f"seen: BEARER {RIGHT.upper()}", f"seen: BEARER {RIGHT.upper()}"),
        (f"/login?next=/{RIGHT}", f"/login?next=/{RIGHT}"),
        # A whole form is, in either case, and one only percent-decoding shows.
        (f"seen: {BEARER.decode()}", "seen: [REDACTED]"),
        (f"seen: {SECRET.upper()}", "seen: [REDACTED]"),
        (f"/l?next=%2F{SECRET}%2Fx".replace("_", "%5F"), "/l?next=%2F[REDACTED]%2Fx"),
    ],
)
def test_a_header_value_or_reason_has_no_end_cut_but_loses_whole_forms(
    text: str, scrubbed: str
) -> None:
    assert Redactor(_TOKEN).scrub_text(text) == scrubbed


async def _calls(
    tmp_path: Path,
    script: Callable[[Peer], Awaitable[None]],
    paths: list[str],
    **target: Any,
) -> list[tuple[dict[str, Any], list[Any]]]:
    """``GET <path>`` of target ``t`` served by ``script``, for each path with a broker of its
    own (a connection, sequence numbers of its own): the envelope and its record's rows (kind,
    attributes)."""
    out = []
    async with HostileServer.running(script) as server:
        for i, path in enumerate(paths):
            tmp = tmp_path / str(i)
            tmp.mkdir()
            cfg = write_config(tmp, {"t": http_target(server.url, **target)})
            async with open_broker(cfg) as broker:
                with trio.fail_after(20):
                    env = await broker.call({"target": "t", "method": "GET", "path": path})
                rows = [(e.kind.value, e.attrs) for e in broker.events(env["invocation_id"])]
                out.append((env, rows))
    return out


_VOLATILE = frozenset(
    {
        "invocation_id",
        "at",
        "boot",
        "started_at",
        "finished_at",
        "generation",
        "elapsed_ms",
        "holder",
        "lease_boot",
        "lease_expires_at",
        "expires_at",
    }
)


def _hash(value: Any) -> bool:
    return isinstance(value, str) and "sha256:" in value


def _shown(value: Any, guess: str) -> Any:
    """``value`` with the guess written as ``GUESS`` and what differs from call to call (ids,
    times, each broker's keyed hashes, and the hashes of what differs: the path the remote
    echoed) left out.  Each call has a broker of its own, so sequence numbers agree."""
    if isinstance(value, Mapping):
        return {
            k: _shown(v, guess)
            for k, v in value.items()
            if k not in _VOLATILE and "sha256" not in k and not k.endswith("_id") and not _hash(v)
        }
    if isinstance(value, list | tuple):
        return [_shown(v, guess) for v in value]
    if isinstance(value, str):
        return value.replace(guess, "GUESS")
    return value


def _alike(one: tuple[dict[str, Any], list[Any]], other: tuple[dict[str, Any], list[Any]]) -> None:
    """The right guess's call and the wrong one's differ only in the guessed characters --
    the envelope and every row of the record."""
    (env_r, rows_r), (env_w, rows_w) = one, other
    a, b = _shown(env_r, RIGHT), _shown(env_w, WRONG)
    assert a == b, _differ(a, b)
    a, b = _shown(rows_r, RIGHT), _shown(rows_w, WRONG)
    assert a == b, _differ(a, b)


def _differ(a: Any, b: Any, at: str = "") -> list[str]:
    """Where ``a`` and ``b`` differ (paths), for a failure's message."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in a.keys() | b.keys() for d in _differ(a.get(k), b.get(k), f"{at}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in _differ(x, y, f"{at}[{i}]")
        ]
    return [] if a == b else [f"{at}: {a!r} != {b!r}"]


def _echoing(where: str) -> Callable[[Peer], Awaitable[None]]:
    """A remote that never echoes the credential, only the request path: at the end of a 404
    page, in a redirect's ``Location``, or at the end of its reason phrase."""

    def reply(r: Received) -> Reply:
        if where == "body":
            return Reply(404, body=b"404 Not found: " + r.target.encode())
        if where == "location":
            return Reply(302, headers=[("Location", f"/login?next={r.target}")], body=b"moved")
        return Reply(404, reason=b"Not found " + r.target.encode(), body=b"none")

    return scripts.serve(reply)


@pytest.mark.parametrize("where", ["body", "location", "reason"])
async def test_a_guess_echoed_at_the_end_is_shown_alike_right_or_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The prefix oracle (audit 54b, F1), end to end: a right and a wrong guess of the token's
    beginning, written into the path, come back shown both, and the answers and records differ
    only in the guess -- nothing tells which one began the secret."""
    monkeypatch.setenv(TOKEN_ENV, SECRET)
    right, wrong = await _calls(tmp_path, _echoing(where), [f"/{RIGHT}", f"/{WRONG}"])
    _alike(right, wrong)
    env = right[0]
    assert RIGHT in json.dumps(env["result"]) and REDACTED.decode() not in json.dumps(env)
    assert env["evidence"]["http"]["received_withheld"] is None
    assert SECRET not in json.dumps(env) + json.dumps(right[1])


def _cut_short(how: str) -> Callable[[Peer], Awaitable[None]]:
    """A 200 whose body ends with the request path and is then cut: the connection closed
    before its ``Content-Length``, or the body past the target's ``max_result``."""

    async def script(peer: Peer) -> None:
        while (req := await peer.read_request()) is not None:
            lead = b"x" * 100 if how == "max_result" else b"page: "
            body = lead + b"Not found: " + req.target.encode()
            length = len(body) + (100 if how == "closed" else 0)
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {length}\r\n\r\n".encode()
            await peer.send_raw(head + body)
            if how == "closed":
                await peer.close()
                return

    return script


@pytest.mark.parametrize("how", ["closed", "max_result"])
async def test_an_answer_cut_short_is_recorded_alike_whatever_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Cut short, an answer withholds its end whatever it was: the record says
    ``tail_redacted`` and withholds the counts for the right guess and the wrong one alike."""
    monkeypatch.setenv(TOKEN_ENV, SECRET)
    target = {"max_result": 64} if how == "max_result" else {}
    calls = await _calls(tmp_path, _cut_short(how), [f"/{RIGHT}", f"/{WRONG}"], **target)
    _alike(*calls)
    env = calls[0][0]
    assert env["error"]["outcome"] == "unknown", env
    assert env["evidence"]["http"]["received_withheld"] == "tail_redacted", env
    assert env["evidence"]["http"].get("body_bytes") is None
    if how == "max_result":
        over = env["evidence"]["result_size_limit"]
        assert over == {"limit": 64, "received_withheld": "tail_redacted"}


async def test_a_body_stored_cut_short_shows_the_same_tail_withheld_whatever_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deflate body corrupt after its end: what decoded is stored cut short
    (``body_truncated``), its last ``tail_window`` bytes withheld -- the guess among them,
    right or wrong."""
    monkeypatch.setenv(TOKEN_ENV, SECRET)
    lead = b"a" * 2000

    def reply(r: Received) -> Reply:
        body = zlib.compress(lead + b" Not found: " + r.target.encode()) + b"trailing"
        return Reply(200, headers=[("Content-Encoding", "deflate")], body=body)

    right, wrong = await _calls(tmp_path, scripts.serve(reply), [f"/{RIGHT}", f"/{WRONG}"])
    _alike(right, wrong)
    result = right[0]["result"]
    assert result["body_truncated"] is True
    assert result["body"] == right[0]["result"]["body"] == wrong[0]["result"]["body"]
    tail = tail_window(Redactor(_TOKEN)._plan)
    decoded = lead + f" Not found: /{RIGHT}".encode()
    assert result["body"].encode() == decoded[: len(decoded) - tail] + REDACTED


@pytest.mark.parametrize("where", ["body", "header", "reason", "cut"])
async def test_an_echo_of_the_whole_credential_is_still_replaced_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    monkeypatch.setenv(TOKEN_ENV, SECRET)

    async def script(peer: Peer) -> None:
        req = await peer.read_request()
        if req is None:
            return
        auth = (req.header("authorization") or "").encode()
        body = b"you sent: " + auth if where in ("body", "cut") else b"ok"
        head = [b"HTTP/1.1 200 " + (b"Saw " + auth if where == "reason" else b"OK")]
        if where == "header":
            head.append(b"X-Seen: " + auth)
        head.append(b"Content-Length: %d" % (len(body) + (50 if where == "cut" else 0)))
        await peer.send_raw(b"\r\n".join(head) + b"\r\n\r\n" + body)
        await peer.close()

    [(env, rows)] = await _calls(tmp_path, script, ["/x"])
    text = json.dumps(env) + json.dumps(rows, default=str)
    assert SECRET not in text and SECRET[8:16] not in text
    # Withheld where a stream echoed it; a head's echo alone leaves a clean body measured.
    why = "redacted" if where in ("body", "cut") else None
    assert env["evidence"]["http"]["received_withheld"] == why, env
    if where == "body":
        assert env["result"]["body"] == "you sent: [REDACTED]"


def test_a_result_cut_at_its_limit_is_not_called_an_echo() -> None:
    from affidavit.engine.attempt import _too_large_message

    message = _too_large_message({"limit": 64, "received_withheld": "tail_redacted"})
    assert "cut short" in message and "echoed" not in message
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
    """The head echoed the whole Authorization; the body ends inside it.  Cut at
    ``max_result``, the record says ``redacted`` -- an echo -- never the weaker
    ``tail_redacted`` that a body cut short alone would earn: reasons combine by strength."""
    monkeypatch.setenv(TOKEN_ENV, SECRET)

    def reply(r: Received) -> Reply:
        auth = (r.header("authorization") or "").encode()
        head = [("X-Seen", seen(auth).decode())]
        return Reply(200, headers=head, body=b"you sent: " + auth[:30])

    [(env, _)] = await _calls(tmp_path, scripts.serve(reply), ["/x"], max_result=max_result)
    text = json.dumps(env)
    assert SECRET not in text and seen(BEARER).decode() not in text
    assert "tail_redacted" not in text, env
    if max_result is not None:
        assert env["evidence"]["http"]["received_withheld"] == "redacted", env
        assert env["error"]["code"] == Code.RESULT_SIZE_LIMIT.value, env
        assert env["evidence"]["result_size_limit"]["received_withheld"] == "redacted"
        assert "echoed a secret" in env["error"]["message"]
    else:  # complete: its end kept (docs/redaction.md's limit), nothing of it withheld
        assert env["result"]["body"] == "you sent: " + BEARER[:30].decode()
        assert env["evidence"]["http"]["received_withheld"] is None, env
