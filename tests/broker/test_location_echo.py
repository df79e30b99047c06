"""A redirect's Location that echoes the credential in another form is neither followed nor shown.

Seed: "Do not forward authorization credentials across origins" and "Exclude secrets ... from the
envelope".  A remote that reflects the injected token into a Location rarely does so byte for
byte: it base64s a ``state``, hex-dumps a session, lower-cases a host name.  Each redaction form
(docs/redaction.md, "The forms") -- and, in a remote's short header text, the same forms with
their letters in either case -- makes the Location a credential echo: the 3xx is the result
(``redirect_not_followed``), the origin the redirect pointed to never hears of it, and no form of
the token reaches the envelope, the record or the journal's files.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.http.hostile import HostileServer, Received, Reply, scripts

from .helpers import TOKEN_ENV, http_target, open_broker, write_config

# Mixed case, so that a case change is a different string; 20 bytes, so base64 has no padding
# and its cores at every alignment are long.
CANARY = "LocCanary" + base64.b32encode(os.urandom(10)).decode().lower()[:11]
RAW = CANARY.encode()


def _b64_blob(shift: int) -> str:
    """The token ``shift`` bytes into a base64'd JSON state (the core of the token's base64)."""
    blob = b"{" * shift + b'"t":"' + RAW + b'"}'
    return base64.urlsafe_b64encode(blob).decode().rstrip("=")


FORMS: dict[str, Callable[[], str]] = {
    "base64": lambda: base64.b64encode(RAW).decode(),
    "base64url-unpadded": lambda: base64.urlsafe_b64encode(RAW + b"x").decode().rstrip("="),
    "base64-of-bearer": lambda: base64.b64encode(b"Bearer " + RAW).decode(),
    "base64-blob-0": lambda: _b64_blob(0),
    "base64-blob-1": lambda: _b64_blob(1),
    "base64-blob-2": lambda: _b64_blob(2),
    "hex": lambda: RAW.hex(),
    "HEX": lambda: RAW.hex().upper(),
    "lower": lambda: CANARY.lower(),
    "upper": lambda: CANARY.upper(),
    "percent-lower": lambda: "".join(f"%{b:02x}" for b in CANARY.lower().encode()),
    "quoted-twice-upper": lambda: urllib.parse.quote(urllib.parse.quote(CANARY.upper(), safe="")),
    "host-label": lambda: "",  # the token as a host name label (lower-cased by any parser)
}


def _needles() -> list[bytes]:
    """What must not be found (searched case-insensitively): the token, its base64 and hex."""
    out = [RAW, base64.b64encode(RAW), RAW.hex().encode()]
    return [n.lower() for n in out]


def _assert_clean(where: str, data: bytes) -> None:
    low = data.lower()
    for needle in _needles():
        assert needle not in low, f"a form of the canary is in {where}"


@pytest.mark.parametrize("form", sorted(FORMS))
async def test_a_location_echoing_an_encoded_or_case_changed_credential_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    monkeypatch.setenv(TOKEN_ENV, CANARY)
    async with HostileServer.running(scripts.serve(Reply(200, body=b"elsewhere"))) as other:

        def route(r: Received) -> Reply:
            if form == "host-label":
                location = f"http://{CANARY}.localhost:{other.port}/x"
            else:
                location = f"{other.url}/login?state={FORMS[form]()}&next=%2F"
            return Reply(302, headers=[("Location", location)])

        async with HostileServer.running(scripts.serve(route)) as first:
            allowed = [other.url, f"http://{CANARY.lower()}.localhost:{other.port}"]
            cfg = write_config(
                tmp_path,
                {"t": http_target(first.url, follow_redirects=True, redirect_origins=allowed)},
            )
            async with open_broker(cfg) as broker:
                with trio.fail_after(20):
                    env: dict[str, Any] = await broker.call(
                        {"target": "t", "method": "GET", "path": "/start"}
                    )
                records = repr(broker.record(env["invocation_id"]))
                events = repr(broker.events(env["invocation_id"]))
    # The token really went to the first server: its absence below is the broker's doing.
    assert any(CANARY in v for r in first.requests for _, v in r.headers)
    assert other.requests == [] and other.connections == 0
    assert env["error"]["code"] == "REMOTE_REDIRECTED", env
    assert env["result"]["status"] == 302
    _assert_clean("the envelope", json.dumps(env).encode())
    _assert_clean("the record", records.encode())
    _assert_clean("the events", events.encode())
    for path in sorted(tmp_path.glob("journal.db*")):
        _assert_clean(path.name, path.read_bytes())


async def test_a_location_quoting_the_credential_twice_is_neither_followed_nor_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A login redirect quoting the request URL inside a quoted ``return_to``: a token's ``/``
    and ``+`` arrive as ``%252F`` and ``%252B``, which no single-level form matches.  The 3xx is
    the result, and its Location reaches the caller replaced whole."""
    token = "Tok/" + base64.b32encode(os.urandom(10)).decode() + "+x"
    monkeypatch.setenv(TOKEN_ENV, token)
    inner = urllib.parse.quote(f"/start?token={token}", safe="")
    async with HostileServer.running(scripts.serve(Reply(200))) as other:
        location = f"{other.url}/login?return_to={urllib.parse.quote(inner, safe='')}"
        async with HostileServer.running(
            scripts.serve(Reply(302, headers=[("Location", location)]))
        ) as first:
            target = http_target(first.url, follow_redirects=True, redirect_origins=[other.url])
            async with open_broker(write_config(tmp_path, {"t": target})) as broker:
                with trio.fail_after(20):
                    env = await broker.call({"target": "t", "method": "GET", "path": "/"})
    assert other.connections == 0
    assert env["result"]["status"] == 302
    shown = json.dumps(env)
    for _ in range(3):
        assert token not in shown
        shown = urllib.parse.unquote(shown)
    assert ["location", "[REDACTED]"] in [[n.lower(), v] for n, v in env["result"]["headers"]]
