"""A followed redirect may not carry what the broker refuses from the caller.

Seed: "re-validate the target, the credential scope, and the method" on every hop.  A 307 keeps
the method and the credential; a target's open redirect (``/go?next=...``) would otherwise
carry ``?_method=DELETE`` -- which ``params.py`` refuses in a caller's path -- to a POST the
target allows, or a second spelling of the credential's query parameter beside it.  A Location
to the target's origin is held to ``check_request_query``, as a caller's path is: refused, the
3xx is the result (``redirect_not_followed``).  And the hop that is followed loses every
spelling of the credential's parameter before the credential goes back (``set_query``).
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.adapters.http.urls import set_query
from affidavit.protocols.http.binding import LOCATION_REFUSED
from affidavit.protocols.http.params import credential_spelling
from tests.http.hostile import HostileServer, Received, Reply, scripts

from .helpers import TOKEN_ENV, assert_ok, assert_redirected, http_target, open_broker, write_config

SECRET = "sk_live_redirq_5Tz8Wq2Lp9"


async def _via_open_redirect(
    tmp_path: Path, location: str, **target: Any
) -> tuple[dict[str, Any], list[Received], Any]:
    def route(r: Received) -> Reply:
        # The open redirect: /go sends on to what ``next`` names (here fixed per test, so the
        # caller's path itself holds nothing params.py refuses).
        if r.target.startswith("/api/go"):
            return Reply(307, headers=[("Location", location)])
        return Reply(200, body=b"ok")

    async with HostileServer.running(scripts.serve(route)) as server:
        spec = http_target(server.url + "/api", methods=["GET", "POST"], follow_redirects=True)
        cfg = write_config(tmp_path, {"t": {**spec, **target}})
        async with open_broker(cfg) as broker:
            path = "/go?next=1"
            with trio.fail_after(20):
                env = await broker.call({"target": "t", "method": "POST", "path": path})
            rec = assert_redirected(broker, env) if "error" in env else assert_ok(broker, env)
    return env, server.requests, rec


@pytest.mark.parametrize(
    ("location", "target"),
    [
        ("/api/items/1?_method=DELETE", {"inject": "bearer"}),
        ("/api/items/1?x-http-method-override=DELETE", {"inject": "bearer"}),
        ("/api/items/1?%255Fmethod=DELETE", {"inject": "bearer"}),
        ("/api/items/1%3F_method%3DDELETE", {"inject": "bearer"}),  # a decoding hop's query
        # A query a hop that decodes it re-splits: refused unless ``escaped_query_values``.
        ("/api/items/1?a%26_method%3DDELETE", {"inject": "bearer"}),
        ("/api/x?API_KEY=attacker", {"inject": "query:api_key"}),
        ("/api/x?Api_Key=attacker", {"inject": "query:api_key"}),
        ("/api/x?a=1&api.key=attacker", {"inject": "query:api_key"}),
        ("/api/search?q=100%", {"inject": "bearer"}),  # a "%" that is no escape
        ("/api/x?api_key%5B%5D=attacker", {"inject": "query:api_key"}),
    ],
)
async def test_a_location_naming_what_a_caller_may_not_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, location: str, target: dict[str, Any]
) -> None:
    monkeypatch.setenv(TOKEN_ENV, SECRET)
    env, requests, _ = await _via_open_redirect(tmp_path, location, **target)
    assert env["result"]["status"] == 307
    assert [r.target.split("?")[0] for r in requests] == ["/api/go"]
    refused = env["evidence"].get("redirect_not_followed") or {}
    assert str(refused.get("reason", "")).startswith(LOCATION_REFUSED), env["evidence"]


async def test_a_clean_location_is_still_followed_with_the_credential(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, SECRET)
    env, requests, _ = await _via_open_redirect(tmp_path, "/api/items/1?page=2&method=x")
    assert env["result"]["status"] == 200
    assert [r.target for r in requests][1] == "/api/items/1?page=2&method=x"
    assert requests[1].method == "POST"
    assert requests[1].header("authorization") == f"Bearer {SECRET}"


async def test_a_location_with_an_escaped_separator_in_a_value_is_followed_for_such_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A URL-valued parameter's own ``%26_method%3D`` is no name for a target that says its
    values hold such escapes (``escaped_query_values``); any other reads it as one (above)."""
    monkeypatch.setenv(TOKEN_ENV, SECRET)
    location = "/api/items/1?next=%2Fcb%3Fa%3D1%26_method%3Dx"
    env, requests, _ = await _via_open_redirect(tmp_path, location, escaped_query_values=True)
    assert env["result"]["status"] == 200
    assert [r.target for r in requests][1] == location


@pytest.mark.parametrize(
    "query",
    ["API_KEY=attacker", "api%5Fkey=x", "api.key=x", "Api-Key=x", "api_key%5B%5D=x", "api_key=x"],
)
def test_set_query_drops_every_spelling_of_the_credential_parameter(query: str) -> None:
    url = f"https://h.example/api/x?a=1&{query}&b=2"
    out = set_query(url, "api_key", ["SECRET"], credential_spelling("api_key"))
    assert urllib.parse.urlsplit(out).query == "a=1&b=2&api_key=SECRET"


def test_set_query_keeps_names_that_are_not_the_credential_s() -> None:
    url = "https://h.example/x?api_keys=1&my_api_key=2&x%5Bapi_key%5D=3"
    out = set_query(url, "api_key", [], credential_spelling("api_key"))
    assert urllib.parse.parse_qsl(urllib.parse.urlsplit(out).query) == [
        ("api_keys", "1"),
        ("my_api_key", "2"),
        ("x[api_key]", "3"),
    ]
