"""A reconciliation query asked from the console is requested by the operator logged in, not
by the process serving it (rvC finding 5): the approval it waits for names that operator's
uid, who may then not approve it unless ``allow_self_approval``.  Dropping ``requester=who.uid``
(console/handlers.py) recorded the serving process's uid: this fails then."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.broker.approvalkit import OPS, OPS_UID
from tests.broker.helpers import TOKEN_ENV
from tests.broker.http_rows import LIMIT
from tests.broker.test_reconcile_approval import _gets, _payments, _pending_queries

from .kit import csrf_of, post, served


async def test_a_console_query_is_the_logged_in_operator_s_request(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)  # the embedded broker's credential
    async with (
        _payments(tmp_path) as (srv, broker, iid),
        served(broker, tmp_path) as (origin, console),
    ):
        # uid 4242, not this process's: no connection of its own to prove it by, so the
        # loopback peer check is off -- the cookie (the token) is the proof, as behind a proxy.
        console.check_peer = False
        login, _ = console.tokens.mint(OPS)
        status, headers, _ = await post(f"{origin}/login", {"token": login}, {"Origin": origin})
        assert status == 200, status
        cookie = headers["set-cookie"].split(";")[0]
        csrf = await csrf_of(origin, cookie)
        with trio.fail_after(LIMIT):
            status, _, page = await post(
                f"{origin}/invocations/{iid}/reconcile",
                {"csrf": csrf, "how": "query"},
                {"Origin": origin, "Cookie": cookie},
            )
        assert status in (200, 303), page
        (query_id,) = _pending_queries(broker, iid)
        [card] = [c for c in broker.approvals() if c["invocation_id"] == query_id]
        assert card["requester"] == {"uid": OPS_UID}
    assert _gets(srv) == 0
