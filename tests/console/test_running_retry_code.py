"""A running retry is counted and filtered under the code its views show, not the code of the
attempt before it.

A retry holding its lease shows no ``code`` (``views.shown_error``), but the console's code
filter and the metrics by code (kept: the console's and the daemon's ``SessionSummary``
tallies; folded now: ``views.metrics``) still used the projection's code -- the earlier
attempt's: a row filtered by REMOTE_OUTCOME_UNKNOWN showed no code at all.  Once the retry ends
with that code again, it is counted and filtered under it again.

The console is served in this process as the daemon serves it (a real loopback socket)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E
from affidavit.views import metrics, metrics_of
from tests.broker.helpers import http_target, open_broker
from tests.journal.helpers import interrupted

from .kit import get, log_in_to, operator_config, served

IID = "act_retry_code"
EARLIER = "REMOTE_OUTCOME_UNKNOWN"


def _by_code(data: dict[str, Any]) -> dict[str, int]:
    return {f"{r['code']}/{r['outcome']}": r["count"] for r in data["by_code_outcome"]}


async def test_a_running_retry_is_counted_and_filtered_under_the_code_it_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, _ = await log_in_to(console, origin)
        j = b.journal

        async def seen(want_code: str) -> None:
            """The filter by each code, the kept counts and the counts folded now agree."""
            for code in (EARLIER, "OK"):
                _, _, page = await get(f"{origin}/actions?code={code}", cookie=cookie)
                assert (IID.encode() in page) == (code == want_code), (code, page[-3000:])
            kept = _by_code(metrics_of(j.summarized_tallies(console.summary)[0]))
            folded = _by_code(metrics(j.iter_actions()))
            assert kept == folded == {f"{want_code}/unknown": 1}, (kept, folded)

        for ev in interrupted(IID):
            await j.append(ev)
        await seen(EARLIER)  # at rest: its own code
        await j.acquire_lease(IID, "broker-2", ttl=600.0)
        rec = j.record(IID, now=time.time())
        assert rec is not None and rec.state == "retry_pending" and rec.code is not None
        await seen("OK")  # the retry runs: shown with no code, so counted under none
        await j.append(Event(E.DISPATCH_STARTED, IID, {"generation": 1}))
        await seen("OK")
        await j.append(Event(E.ATTEMPT_INTERRUPTED, IID, {"code": EARLIER}))
        await seen(EARLIER)  # final with that code again
