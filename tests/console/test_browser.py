"""The operator console in a real headless chromium (issue 13, "What it must show").

One daemon, two scripted remotes: ``pay`` needs an approval for POSTs (its callers wait up to
20 s for the decision), ``flaky`` applies a request and hangs up (the outcome is unknown).  The
operator is this test's uid, logged in with a link from ``affidavit console-url``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import trio

from affidavit.console import COOKIE
from tests.daemon.kit import WAIT, wait_until

from .kit import CHARGE, DROPPED, LEDGER_DROPPED, Browser, World, console_world, get


async def _login(chrome: Browser, world: World) -> str:
    await chrome.get(f"{world.origin}/approvals")
    assert await chrome.count("#login") == 1  # no session: the login page
    url = await world.login_url()
    await chrome.log_in(url)
    await wait_until(lambda: chrome.count("#operator"), "the console shows who is logged in")
    return url


async def _on_approvals_page(chrome: Browser, world: World, iid: str) -> None:
    async def shown() -> bool:
        await chrome.get(f"{world.origin}/approvals")
        return await chrome.count(f"#approval-{iid}") == 1

    await wait_until(shown, f"{iid} on the approvals page")


async def _decision(world: World, iid: str, kind: str) -> dict[str, Any]:
    record = await world.record(iid)
    [event] = [e for e in record["events"] if e["kind"] == kind]
    attrs: dict[str, Any] = event["attrs"]
    return attrs


async def _unknown_page(chrome: Browser, world: World, action: dict[str, Any]) -> str:
    """Call ``action`` (its remote hangs up after the request: unknown), log in, open its page."""
    envelope = await world.call(action)
    assert envelope["error"]["outcome"] == "unknown", envelope
    iid = str(envelope["invocation_id"])
    await _login(chrome, world)
    await chrome.get(f"{world.origin}/invocations/{iid}")
    return iid


async def _exit(proc: trio.Process) -> int:
    with trio.fail_after(WAIT):
        return await proc.wait()


async def test_log_in_approve_a_waiting_call_and_deny_another(
    tmp_path: Path, token: str, chrome: Browser
) -> None:
    async with console_world(tmp_path, token) as world:
        url = await _login(chrome, world)
        assert await chrome.count("#none-pending") == 1

        caller = await world.caller(CHARGE)  # waits for the decision
        iid = await world.one_pending()
        await _on_approvals_page(chrome, world, iid)
        card = await chrome.text(f"#approval-{iid}")
        # The fingerprint, readably: where, what, with which credential (by name), until when.
        assert "method POST" in card and f"url {world.pay.url}/v1/charges" in card
        assert '{"amount": 5}' in card and "sha256" in card
        assert "env:AFFIDAVIT_TEST_TOKEN" in card and "expires in" in card
        assert token not in await chrome.source()
        assert world.pay.requests == []

        await chrome.type(f"#approval-{iid} input[name=note]", "amount checked")
        await chrome.decide(f"#approval-{iid} button.approve")
        await wait_until(lambda: chrome.count("#decided"), "the decision is confirmed")
        assert await _exit(caller) == 0  # the waiting call completed with the result
        assert [r.header("authorization") for r in world.pay.requests] == [f"Bearer {token}"]
        granted = await _decision(world, iid, "APPROVAL_GRANTED")
        me = os.geteuid()
        assert granted["operator"]["uid"] == me and granted["operator"]["via"] == "console"
        assert granted["note"] == "amount checked"
        assert (await world.record(iid))["record"]["outcome"] == "committed"

        second = await world.caller(CHARGE)
        other = await world.one_pending()
        assert other != iid
        await _on_approvals_page(chrome, world, other)
        await chrome.type(f"#approval-{other} input[name=note]", "not today")
        await chrome.decide(f"#approval-{other} button.deny")
        await wait_until(lambda: chrome.count("#decided"), "the denial is confirmed")
        assert await _exit(second) == 1  # its envelope: APPROVAL_DENIED
        denied = await _decision(world, other, "APPROVAL_DENIED")
        assert denied["operator"]["via"] == "console" and denied["note"] == "not today"
        assert len(world.pay.requests) == 1  # the denied request was never sent

        await chrome.log_in(url)  # the one-time link, again
        assert await chrome.count("#login-failed") == 1


async def test_an_unknown_dropped_post_is_reconciled_by_attestation(
    tmp_path: Path, token: str, chrome: Browser
) -> None:
    async with console_world(tmp_path, token) as world:
        iid = await _unknown_page(chrome, world, DROPPED)
        assert await chrome.text("#outcome") == "unknown"
        timeline = await chrome.text("#timeline")
        assert "DISPATCH_STARTED" in timeline and "ATTEMPT_INTERRUPTED" in timeline
        assert "transport_observed" in timeline  # the evidence source of what was seen
        assert "dispatch: DISPATCH_STARTED at seq" in await chrome.text("#attempts")
        # The lifecycle: the path drawn, the current state marked.
        assert await chrome.count("#lifecycle g.state.current[data-state=interrupted]") == 1
        assert await chrome.count("#lifecycle g.state.visited[data-state=dispatched]") == 1
        assert await chrome.count("#lifecycle path.edge.on") >= 4

        await chrome.type("#attest-note", "the transfer is in the bank's ledger")
        await chrome.decide("#attest-committed")
        await wait_until(lambda: chrome.count("#done"), "the reconciliation is confirmed")
        assert await chrome.text("#outcome") == "committed (attested)"  # not the remote's word
        assert await chrome.text("#source") == "operator_attested"
        assert "RECONCILED" in await chrome.text("#timeline")
        assert await chrome.count("#reconcile") == 0  # nothing left to reconcile
        assert await chrome.count("#lifecycle g.current[data-state=reconciled_committed]") == 1

        record = await world.record(iid)
        [event] = [e for e in record["events"] if e["kind"] == "RECONCILED"]
        assert event["source"] == "operator_attested"
        assert event["observer"].startswith(f"operator:uid={os.geteuid()}")
        assert event["attrs"]["operator"]["via"] == "console"
        assert event["attrs"]["note"] == "the transfer is in the bank's ledger"
        # The original attempt stays as recorded (seed: never rewritten as "not dispatched").
        kinds = [e["kind"] for e in record["events"]]
        assert kinds.index("DISPATCH_STARTED") < kinds.index("ATTEMPT_INTERRUPTED")
        assert len(world.flaky.requests) == 1


async def test_an_unknown_charge_is_reconciled_by_the_target_s_query(
    tmp_path: Path, token: str, chrome: Browser
) -> None:
    async with console_world(tmp_path, token) as world:
        iid = await _unknown_page(chrome, world, LEDGER_DROPPED)
        await chrome.decide("#reconcile-query")
        await wait_until(lambda: chrome.count("#done"), "the query's verdict is shown")
        assert await chrome.text("#outcome") == "committed"
        assert await chrome.text("#source") == "remote_query"
        record = await world.record(iid)
        [event] = [e for e in record["events"] if e["kind"] == "RECONCILED"]
        assert event["source"] == "remote_query" and event["observer"].startswith("act_")
        # The query ran as an invocation of its own: a GET of the charge by its key.
        assert [r.method for r in world.ledger.requests] == ["POST", "GET"]
        assert "idempotency_key=k-console-1" in world.ledger.requests[1].target


async def test_a_forged_or_missing_csrf_token_is_refused_and_nothing_is_recorded(
    tmp_path: Path, token: str, chrome: Browser
) -> None:
    async with console_world(tmp_path, token) as world:
        caller = await world.caller(CHARGE)
        iid = await world.one_pending()
        await _login(chrome, world)
        for tamper in (
            "document.querySelectorAll('input[name=csrf]').forEach(e => e.value = 'forged')",
            "document.querySelectorAll('input[name=csrf]').forEach(e => e.remove())",
        ):
            await _on_approvals_page(chrome, world, iid)
            await chrome.run(lambda d, js=tamper: d.execute_script(js))
            await chrome.decide(f"#approval-{iid} button.approve")
            await wait_until(lambda: chrome.count("#problem"), "the refusal page")
            assert "CSRF" in await chrome.text("#problem")
        record = await world.record(iid)
        assert record["record"]["state"] == "awaiting_approval"
        assert not any(e["kind"].startswith("APPROVAL_GRANTED") for e in record["events"])
        assert world.pay.requests == []
        caller.kill()
        await _exit(caller)


async def test_what_the_remote_sent_renders_inert(
    tmp_path: Path, token: str, chrome: Browser
) -> None:
    """A remote (or a caller) may put HTML in a body: the console shows it as text."""
    from tests.http.hostile import Reply

    hostile = b'<img id="pwned" src="x"><script>document.title="pwned"</script>'
    async with console_world(tmp_path, token, pay_reply=Reply(200, body=hostile)) as world:
        await _login(chrome, world)
        action = dict(CHARGE, body='<b id="bold">caller html</b>', session='<i id="s">x</i>')
        caller = await world.caller(action)
        iid = await world.one_pending()
        await _on_approvals_page(chrome, world, iid)
        assert '<b id="bold">caller html</b>' in await chrome.text(f"#approval-{iid}")
        assert await chrome.count("#bold") == 0
        await chrome.decide(f"#approval-{iid} button.approve")
        assert await _exit(caller) == 0
        await chrome.get(f"{world.origin}/invocations/{iid}")
        assert hostile.decode() in await chrome.text("#stream-body")
        assert await chrome.count("#pwned") == 0 and await chrome.count("#s") == 0
        assert "pwned" not in await chrome.run(lambda d: d.title)
        # The download link, with the browser's session (a script may not fetch: the CSP).
        cookie = await chrome.run(lambda d: d.get_cookie(COOKIE))
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        status, headers, body = await get(
            f"{world.origin}/invocations/{iid}/result.json", cookie=f"{COOKIE}={cookie['value']}"
        )
        assert status == 200 and "attachment" in headers["content-disposition"]
        assert json.loads(body)["result"]["body"] == hostile.decode()


async def test_actions_filter_and_count_and_the_journal_verifies(
    tmp_path: Path, token: str, chrome: Browser
) -> None:
    async with console_world(tmp_path, token, wait="0s") as world:
        dropped = (await world.call(dict(DROPPED, session="night-batch")))["invocation_id"]
        pending = (await world.call(dict(CHARGE, session="day")))["invocation_id"]
        refused = await world.call({"target": "nowhere", "method": "GET", "path": "/"})
        await _login(chrome, world)

        await chrome.get(f"{world.origin}/actions")
        listed = await chrome.text("#actions")
        assert dropped in listed and pending in listed and refused["invocation_id"] in listed
        assert await chrome.count("meta[http-equiv=refresh]") == 1  # live by default
        matrix = await chrome.text("#matrix")
        assert "remote_execution" in matrix and "credential_injection" in matrix
        # One unknown in remote_execution: the row's cell under "unknown" counts it.
        cells = await chrome.run(
            lambda d: [
                [c.text for c in row.find_elements("css selector", "th, td")]
                for row in d.find_elements("css selector", "#matrix tr")
            ]
        )
        head = cells[0]
        row = next(r for r in cells if r[0] == "remote_execution")
        assert row[head.index("unknown")] == "1"

        for query, shown, hidden in (
            ("outcome=unknown", dropped, pending),
            ("session=day", pending, dropped),
            ("phase=credential_injection", pending, dropped),
            ("code=INVALID_TARGET", refused["invocation_id"], dropped),
            ("until=2000-01-01T00:00:00Z&live=0", None, dropped),
        ):
            await chrome.get(f"{world.origin}/actions?{query}")
            listed = await chrome.text("#actions")
            assert (shown is None or shown in listed) and hidden not in listed, query
        assert await chrome.count("meta[http-equiv=refresh]") == 0  # paused
        await chrome.get(f"{world.origin}/actions?outcome=maybe")
        assert "outcome: expected one of" in await chrome.text("#problem")

        await chrome.get(f"{world.origin}/journal")
        assert (await chrome.text("#verify")).startswith("intact:")
        assert "seq" in await chrome.text("#anchor")
        sessions = await chrome.text("#sessions")
        assert "night-batch" in sessions and "day" in sessions
        # The whole verify's button: Post/Redirect/Get -- the browser lands on the page
        # itself, which a reload reads again, not posts again.
        await chrome.decide("#verify-whole button")
        assert await chrome.run(lambda d: d.current_url) == f"{world.origin}/journal"
        # The press is answered at once and the verify runs on (docs/console.md): look again
        # (bounded) until the page no longer says it runs.
        for _ in range(100):
            if await chrome.count("#verify-running") == 0:
                break
            await trio.sleep(0.1)
            await chrome.get(f"{world.origin}/journal")
        assert await chrome.count("#verify-running") == 0
        assert (await chrome.text("#verify")).startswith("intact:")
