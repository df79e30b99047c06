"""Every refusal of the console carries a stable code (docs/console.md, "Refusals") -- and the
field at fault where there is one -- on its error page, for a script as for an operator; and a
failure shows a code, never the console's paths, uids or exception text: those go to its log.

The console is served in this process as the daemon serves it (a real loopback socket)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from affidavit.approvals import Operator
from tests.broker.helpers import http_target, open_broker

from .kit import _request, get, log_in_to, operator_config, post, refusal, served


async def test_each_refusal_names_its_code_and_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, csrf = await log_in_to(console, origin)
        same = {"Origin": origin, "Cookie": cookie}
        got = {}
        for what, url in (
            ("no such page", "/nope"),
            ("no such file", "/static/nope.css"),
            ("no such invocation", "/invocations/act_nope"),
            ("no such download", "/invocations/act_nope/result.json"),
            ("a filter's value", "/actions?outcome=maybe"),
            ("a filter's time", "/actions?since=yesterday"),
        ):
            status, _, page = await get(origin + url, cookie=cookie)
            got[what] = status, refusal(page)
        status, _, page = await _request("PUT", f"{origin}/approvals", b"", {"Cookie": cookie})
        got["a method"] = status, refusal(page)
        body = b"csrf=" + csrf.encode() + b"&note=\xff"
        form = {**same, "Content-Type": "application/x-www-form-urlencoded"}
        status, _, page = await _request("POST", f"{origin}/journal/verify", body, form)
        got["a form not UTF-8"] = status, refusal(page)
        status, _, page = await post(f"{origin}/journal/verify", {"csrf": csrf, "x": "1"}, same)
        got["an unknown field"] = status, refusal(page)
        # One that would not show as itself (the one rule: U+034F draws nothing) is not echoed.
        fields = {"csrf": csrf, "dry_run\u034f": "1"}
        status, _, page = await post(f"{origin}/journal/verify", fields, same)
        got["an unknown invisible field"] = status, refusal(page)
        # The decisions' and reconciliations' own refusals (``OperatorError``), with their field;
        # a reconciliation's is shown on the invocation's page.
        action = {"target": "nope", "method": "GET", "path": "/"}
        iid = (await b.call(action))["invocation_id"]
        reconcile = f"{origin}/invocations/{iid}/reconcile"
        for what, url, form in (
            ("a note with a query", reconcile, {"how": "query", "note": "x"}),
            ("not unknown", reconcile, {"how": "committed", "note": "x"}),
            ("a how", reconcile, {"how": "maybe"}),
            ("no note", reconcile, {"how": "committed"}),
            ("a blank note", reconcile, {"how": "rejected", "note": " "}),
            ("a note too long", reconcile, {"how": "committed", "note": "x" * 2001}),
            ("a note's control", f"{origin}/approvals/{iid}/approve", {"note": "ok\x1b[2J"}),
            ("no such approval", f"{origin}/approvals/{iid}/approve", {}),
        ):
            status, _, page = await post(url, {"csrf": csrf, **form}, same)
            got[what] = status, refusal(page)
        status, _, page = await get(f"{origin}/approvals/{iid}/content/body", cookie=cookie)
        got["no such content"] = status, refusal(page)
    assert got == {
        "no such page": (404, ("NOT_FOUND", None)),
        "no such file": (404, ("NOT_FOUND", None)),
        "no such invocation": (404, ("NO_SUCH_INVOCATION", None)),
        "no such download": (404, ("NO_SUCH_INVOCATION", None)),
        "a filter's value": (400, ("INVALID_FIELD", "outcome")),
        "a filter's time": (400, ("INVALID_FIELD", "since")),
        "a method": (405, ("METHOD_NOT_ALLOWED", None)),
        "a form not UTF-8": (400, ("BAD_REQUEST", "form")),
        "an unknown field": (400, ("INVALID_FIELD", "x")),
        "an unknown invisible field": (400, ("INVALID_FIELD", "form")),
        "a note with a query": (400, ("INVALID_FIELD", "note")),
        "not unknown": (409, ("NOT_UNKNOWN", None)),
        "a how": (400, ("BAD_REQUEST", "how")),
        "no note": (400, ("NOTE_REQUIRED", "note")),
        "a blank note": (400, ("NOTE_REQUIRED", "note")),
        "a note too long": (400, ("BAD_NOTE", "note")),
        "a note's control": (400, ("BAD_NOTE", "note")),
        "no such approval": (404, ("NO_SUCH_APPROVAL", None)),
        "no such content": (404, ("NO_SUCH_APPROVAL", None)),
    }


async def test_an_unusable_token_directory_is_logged_and_not_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Anyone who can reach the console may post /login: the 500 says FILE_UNUSABLE and to see
    the log; the directory's path and its owners' uids are in the log only."""
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        token, _ = console.tokens.mint(Operator.current())
        console.tokens.directory.chmod(0o755)  # open to others: nothing in it is trusted
        with caplog.at_level(logging.ERROR, logger="affidavit.console"):
            status, headers, page = await post(
                f"{origin}/login", {"token": token}, {"Origin": origin}
            )
    where = str(console.tokens.directory)
    assert (status, refusal(page)) == (500, ("FILE_UNUSABLE", None))
    assert where.encode() not in page and b"0700" not in page and b"uid" not in page
    assert "set-cookie" not in headers
    assert any(where in r.getMessage() for r in caplog.records), caplog.text


async def test_a_failure_shows_a_code_never_its_exception(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, _ = await log_in_to(console, origin)

        async def broken(req: object) -> None:
            raise RuntimeError("/var/lib/secret-path uid=4242")

        monkeypatch.setattr(console, "_journal", broken)
        with caplog.at_level(logging.ERROR, logger="affidavit.console"):
            status, _, page = await get(f"{origin}/journal", cookie=cookie)
    assert (status, refusal(page)) == (500, ("CONSOLE_FAILED", None))
    assert b"secret-path" not in page and b"4242" not in page
    assert "secret-path" in caplog.text


async def test_a_query_of_an_invocation_on_a_removed_target_is_answered_as_the_operator_sees_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console is an operator's channel: a reconciliation asked there of an invocation on a
    target the configuration no longer names is answered with what its record shows
    (``NOT_UNKNOWN``: it ended not attempted), as the console's page of it shows it -- never
    ``NO_SUCH_INVOCATION``, the words a caller on the socket or MCP gets for it
    (tests/daemon/test_hidden_ids.py)."""
    both = {"pay": http_target("http://127.0.0.1:9"), "old": http_target("http://127.0.0.1:9")}
    path = operator_config(tmp_path, monkeypatch, both)
    async with open_broker(path) as b:
        iid = (await b.call({"target": "old", "method": "GET", "path": "/"}))["invocation_id"]
    path = operator_config(tmp_path, monkeypatch, {"pay": both["pay"]})  # "old" removed
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, csrf = await log_in_to(console, origin)
        same = {"Origin": origin, "Cookie": cookie}
        reconcile = f"{origin}/invocations/{iid}/reconcile"
        status, _, page = await post(reconcile, {"csrf": csrf, "how": "query"}, same)
    assert (status, refusal(page)) == (409, ("NOT_UNKNOWN", None)), page
