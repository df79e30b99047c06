"""The console's reconciliation query is a call of the daemon's like the socket's (``Calls``):
past ``[service] max_calls`` it is refused 503 OVERLOADED on the page, nothing sent; under it,
it runs.  It used to run outside the daemon's calls -- uncapped, not waited for by the
shutdown grace, and cut off at the end as if its caller had gone (CALLER_CANCELLED)."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.daemon.kit import HUNG

from .kit import CHARGE, LEDGER_DROPPED, console_world, log_in, post


async def test_a_console_query_past_max_calls_is_refused_overloaded_and_sends_nothing(
    tmp_path: Path, token: str
) -> None:
    async with console_world(tmp_path, token, service={"max_calls": 1}) as world:
        envelope = await world.call(dict(LEDGER_DROPPED))
        assert envelope["error"]["outcome"] == "unknown", envelope
        iid = envelope["invocation_id"]
        caller = await world.caller(CHARGE)  # waits for a decision: the one call in flight
        try:
            pending = await world.one_pending()
            cookie, csrf = await log_in(world)
            same = {"Origin": world.origin, "Cookie": cookie}
            reconcile = f"{world.origin}/invocations/{iid}/reconcile"
            status, _, page = await post(reconcile, {"csrf": csrf, "how": "query"}, same)
            assert status == 503 and b"OVERLOADED" in page, page
            assert [r.method for r in world.ledger.requests] == ["POST"]  # no query sent
            # A note with it is refused for what was sent, cap full or not (never 503 first).
            form = {"csrf": csrf, "how": "query", "note": "checked"}
            status, _, page = await post(reconcile, form, same)
            assert status == 400 and b"INVALID_FIELD" in page, page
            # The slot freed (the request denied, its caller answered), the same query runs.
            deny = f"{world.origin}/approvals/{pending}/deny"
            status, _, _ = await post(deny, {"csrf": csrf}, same)
            assert status == 303
            with trio.fail_after(HUNG):
                await caller.wait()
        finally:
            if caller.returncode is None:
                caller.kill()
                await caller.wait()
        status, _, page = await post(reconcile, {"csrf": csrf, "how": "query"}, same)
        assert status == 303, page
        assert [r.method for r in world.ledger.requests] == ["POST", "GET"]
