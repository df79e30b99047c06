"""The headers on every answer of the console (docs/console.md, "Headers on every answer"), on
every kind of answer: the pages with data, a download, a static file, an error page (a refusal,
a Host not the console's, no such page), and a redirect -- not only the login page.

The console is served in this process as the daemon serves it (a real loopback socket)."""

from __future__ import annotations

import http.client
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import trio

from affidavit.console.request import CSP
from tests.broker.helpers import http_target, open_broker
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import WAIT, get, log_in_to, operator_config, post, served

EVERY = {
    "content-security-policy": CSP,
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "x-content-type-options": "nosniff",
    "cross-origin-resource-policy": "same-origin",
    "cross-origin-opener-policy": "same-origin",
}


async def _with_host(origin: str, path: str, host: str) -> tuple[int, dict[str, str]]:
    def run() -> tuple[int, dict[str, str]]:
        conn = http.client.HTTPConnection(urlsplit(origin).netloc, timeout=WAIT)
        try:
            conn.putrequest("GET", path, skip_host=True)
            conn.putheader("Host", host)
            conn.endheaders()
            response = conn.getresponse()
            response.read()
            return response.status, {k.lower(): v for k, v in response.getheaders()}
        finally:
            conn.close()

    return await trio.to_thread.run_sync(run)


async def test_every_answer_carries_the_security_headers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"stored"))) as srv:
        path = operator_config(tmp_path, monkeypatch, {"api": http_target(srv.url)})
        with trio.fail_after(WAIT):
            async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
                iid = (await b.call({"target": "api", "method": "GET", "path": "/r"}))[
                    "invocation_id"
                ]
                cookie, csrf = await log_in_to(console, origin)
                answers: dict[str, tuple[int, dict[str, str]]] = {}
                for page in (
                    "/approvals",
                    "/actions",
                    "/journal",
                    f"/invocations/{iid}",
                    f"/invocations/{iid}/result.json",
                    "/invocations/act_nope",  # an error page: no such invocation
                    "/nope",  # 404
                    "/static/console.css",
                ):
                    status, headers, _ = await get(origin + page, cookie=cookie)
                    answers[page] = status, headers
                status, headers, _ = await get(origin + "/approvals")  # no session: redirect
                answers["redirect to the login page"] = status, headers
                form = {"csrf": csrf}
                same = {"Origin": origin, "Cookie": cookie}
                status, headers, _ = await post(f"{origin}/journal/verify", form, same)
                answers["redirect after a form"] = status, headers
                status, headers, _ = await post(f"{origin}/journal/verify", {}, same)
                answers["refused form"] = status, headers
                answers["another Host"] = await _with_host(origin, "/approvals", "evil.example")
                status, headers, _ = await post(f"{origin}/logout", form, same)
                answers["logout"] = status, headers
    statuses = {what: status for what, (status, _) in answers.items()}
    assert statuses == {
        "/approvals": 200,
        "/actions": 200,
        "/journal": 200,
        f"/invocations/{iid}": 200,
        f"/invocations/{iid}/result.json": 200,
        "/invocations/act_nope": 404,
        "/nope": 404,
        "/static/console.css": 200,
        "redirect to the login page": 303,
        "redirect after a form": 303,
        "refused form": 403,
        "another Host": 421,
        "logout": 303,
    }
    for what, (_, headers) in answers.items():
        assert {k: headers.get(k) for k in EVERY} == EVERY, what
        static = what.startswith("/static/")
        assert headers["cache-control"] == ("max-age=300" if static else "no-store"), what
