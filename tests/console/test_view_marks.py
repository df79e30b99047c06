"""The console shows an action without a session as markup no session name can produce: ``-``
was shown for none and for a session named ``-`` (a valid name: printable ASCII) alike.  And an
outcome an operator attested is marked so, and counted apart in the sessions table.

The console is served in this process as the daemon serves it (a real loopback socket)."""

from __future__ import annotations

from pathlib import Path

import pytest

from affidavit.console.text import NO_SESSION
from affidavit.statemachine import Event, EventKind, EvidenceSource
from tests.broker.helpers import http_target, open_broker
from tests.journal.helpers import happy, interrupted

from .kit import get, log_in_to, operator_config, post, served


async def test_no_session_is_not_shown_as_a_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    refused = {"target": "nope", "method": "GET", "path": "/"}
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, _ = await log_in_to(console, origin)
        none = (await b.call(refused))["invocation_id"]
        dash = (await b.call({**refused, "session": "-"}))["invocation_id"]
        _, _, actions = await get(f"{origin}/actions", cookie=cookie)
        _, _, journal = await get(f"{origin}/journal", cookie=cookie)
        _, _, of_none = await get(f"{origin}/invocations/{none}", cookie=cookie)
        _, _, of_dash = await get(f"{origin}/invocations/{dash}", cookie=cookie)
    shown = str(NO_SESSION).encode()
    assert shown == b'<em class="muted">no session</em>'
    for page in (actions, journal):
        assert page.count(shown) == 1, page[-3000:]  # of two: the one without
    assert b"<th>session</th><td>" + shown + b"</td>" in of_none
    assert shown not in of_dash
    assert b'<th>session</th><td><code class="session">-</code></td>' in of_dash


async def test_an_attested_outcome_is_marked_and_counted_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, _ = await log_in_to(console, origin)
        for ev in [*happy("inv-proven", "ops"), *interrupted("inv-attested", "ops")]:
            await b.journal.append(ev)
        attested = {"outcome": "committed", "note": "checked the ledger"}
        await b.journal.append(
            Event(
                EventKind.RECONCILED,
                "inv-attested",
                attested,
                source=EvidenceSource.OPERATOR_ATTESTED,
                observer="ops",
                observer_seq=1,
            )
        )
        _, _, actions = await get(f"{origin}/actions", cookie=cookie)
        _, _, journal = await get(f"{origin}/journal", cookie=cookie)
        _, _, of_attested = await get(f"{origin}/invocations/inv-attested", cookie=cookie)
        _, _, of_proven = await get(f"{origin}/invocations/inv-proven", cookie=cookie)
    assert actions.count(b'<td class="committed">committed (attested)</td>') == 1
    assert actions.count(b'<td class="committed">committed</td>') == 1
    assert b"<b>committed (attested)</b>" in of_attested
    assert b"<b>committed</b>" in of_proven and b"(attested)" not in of_proven
    assert b'<span class="committed">committed 1</span>' in journal
    assert b'<span class="committed">committed(attested) 1</span>' in journal


async def test_the_reconciled_banner_marks_an_attested_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the operator attests on the invocation's page, its banner said "the outcome is
    now committed" -- as if the remote's answer proved it; the table below it said attested."""
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, csrf = await log_in_to(console, origin)
        for ev in interrupted("inv-banner", "ops"):
            await b.journal.append(ev)
        status, _, _ = await post(
            f"{origin}/invocations/inv-banner/reconcile",
            {"csrf": csrf, "how": "committed", "note": "checked the ledger"},
            {"Origin": origin, "Cookie": cookie},
        )
        assert status == 303
        _, _, page = await get(f"{origin}/invocations/inv-banner", cookie=cookie)
    assert b"Reconciled: the outcome is now <b>committed (attested)</b>." in page, page[:3000]
