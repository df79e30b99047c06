"""An answer that holds only part of an echo of the credential gives none of it away.

Seed: "Exclude secrets ... from the envelope".  A form of the credential is redacted where it
stands whole (docs/redaction.md); a window of an echo -- ``Range: bytes=22-27`` of a page that
prints the request's ``Authorization`` -- is too short to be a form, and the windows put
together are the credential.  So a caller may not ask for a part of the answer (``Range``,
``If-Range``: ``FORBIDDEN_HEADER``), and an answer that ends inside a form, however it came to
end there, ends with that form's beginning redacted (``Redactor.flush``, ``CUT_FORM`` bytes of
it or more).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import trio

from affidavit.protocols.actions import ActionInvalid, parse_action
from affidavit.secrets.redaction import CUT_FORM, REDACTED, Redactor
from affidavit.statemachine import Code
from tests.http.hostile import HostileServer, Received, Reply, scripts

from .helpers import TOKEN_ENV, http_target, open_broker, write_config

SECRET = "sk_live_Q7pW3xN9rT2vL5mK8jH4"
BEARER = b"Bearer " + SECRET.encode()


@pytest.mark.parametrize("name", ["Range", "range", "If-Range", "IF_RANGE", "if-range"])
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


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
@pytest.mark.parametrize(
    "tail",
    [
        SECRET.encode()[:CUT_FORM],
        SECRET.encode()[:-1],
        BEARER[:-1],
        BEARER[: len("Bearer ") + CUT_FORM],
        base64.b64encode(SECRET.encode())[:12],
        SECRET.encode().hex().encode()[:-1],
    ],
)
def test_a_stream_ending_inside_a_form_ends_with_its_beginning_redacted(
    tail: bytes, step: int
) -> None:
    data = b'{"echo": "ok"}\nAuthorization: ' + tail
    out = _streamed(Redactor([SECRET.encode(), BEARER]), data, step)
    assert out.endswith(REDACTED)
    assert out.startswith(b'{"echo": "ok"}\nAuthorization: ')
    assert SECRET.encode()[:CUT_FORM] not in out
    assert base64.b64encode(BEARER)[:CUT_FORM] not in out


@pytest.mark.parametrize("tail", [b"", b"s", b"sk_", b"Bea", b"items", b"}\n"])
def test_fewer_bytes_of_a_form_or_none_end_the_stream_as_they_were(tail: bytes) -> None:
    data = b"list of " + tail
    r = Redactor([SECRET.encode(), BEARER])
    assert _streamed(r, data, 2) == data
    assert not r.changed


async def test_an_answer_cut_inside_an_echo_reaches_no_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A target that shows the first 30 bytes of what it was sent (a preview)."""
    monkeypatch.setenv(TOKEN_ENV, SECRET)

    def preview(r: Received) -> Reply:
        return Reply(200, body=b"you sent: " + (r.header("authorization") or "").encode()[:30])

    async with HostileServer.running(scripts.serve(preview)) as server:
        cfg = write_config(tmp_path, {"t": http_target(server.url)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(20):
                env = await broker.call({"target": "t", "method": "GET", "path": "/x"})
    assert server.requests[0].header("authorization") == BEARER.decode()
    assert env["result"]["body"] == "you sent: [REDACTED]", env
    assert SECRET[:CUT_FORM] not in json.dumps(env)
