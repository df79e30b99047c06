"""Whom the driver trusts on the network between the broker and a target: a Location's host
only as the connection would resolve it (urls.py).  Loopback servers only, every wait
bounded."""

from __future__ import annotations

import trio

from affidavit.adapters.http import HttpClient, HttpRequest, RedirectDecision, Timeouts

from .fakes import FakeEngine
from .hostile import HostileServer, Reply, scripts

FAST = Timeouts(connect=2.0, write=2.0, read=2.0)
TOKEN = "Bearer trust-secret-0001"


def get(url: str, ca_file: str | None = None, **kw: object) -> HttpRequest:
    return HttpRequest(
        "GET",
        url,
        [("Authorization", TOKEN)],
        credential_headers=frozenset({"authorization"}),
        ca_file=ca_file,
        timeouts=FAST,
        **kw,  # type: ignore[arg-type]
    )


async def perform(client: HttpClient, request: HttpRequest) -> tuple[FakeEngine, object]:
    fe = FakeEngine()
    with trio.fail_after(10):
        return fe, await client.perform(request, fe.ctx)


async def test_a_location_host_with_a_trailing_dot_is_not_followed(client: HttpClient) -> None:
    """``localhost.`` is compared as ``localhost`` by a policy but resolved (no search list)
    and sent as SNI with its dot by a connection: not followed, the 3xx stands."""
    allowed: list[str] = []

    def policy(method: str, url: str) -> RedirectDecision:
        allowed.append(url)
        return RedirectDecision(True, True, "")

    async with HostileServer.running(scripts.serve(Reply(200))) as other:
        location = f"http://localhost.:{other.port}/next"
        async with HostileServer.running(scripts.redirect(location)) as srv:
            _fe, res = await perform(
                client, get(srv.url + "/start", follow_redirects=True, redirect_policy=policy)
            )
    facts = res.facts  # type: ignore[attr-defined]
    assert facts["status"] == 307
    assert facts["redirect_not_followed"]["reason"] == "URL host must not end in a dot"
    assert allowed == [] and other.requests == []
