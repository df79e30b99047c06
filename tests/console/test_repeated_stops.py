"""The invocation page shows how many times in a row a retry was stopped before its gate: the
record keeps such stops as one ``attempts`` entry with a count (``repeated``), so the page
must say the count, or an operator would read one stop where there were many (audit 52a).

The console is served in this process as the daemon serves it (a real loopback socket)."""

from __future__ import annotations

from pathlib import Path

import pytest

from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E
from tests.broker.helpers import http_target, open_broker
from tests.journal.helpers import interrupted

from .kit import get, log_in_to, operator_config, served

IID = "act_repeated_stops"


async def test_the_page_counts_the_stops_one_entry_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, _ = await log_in_to(console, origin)
        j = b.journal
        for ev in interrupted(IID):
            await j.append(ev)
        for stage in ("connecting", "idle", "connecting"):  # any stage: one run
            lease = await j.acquire_lease(IID, "broker-2", ttl=600.0)
            stop = {"code": "CALLER_CANCELLED", "stage": stage}
            await j.append(Event(E.SETUP_FAILED, IID, {**stop, "generation": lease.generation}))
        _, _, page = await get(f"{origin}/invocations/{IID}", cookie=cookie)
        text = page.decode()
        assert text.count('class="attempt"') == 2, text[-3000:]
        assert "stopped before the gate 3 times in a row" in text, text[-3000:]
        assert "connecting/CALLER_CANCELLED × 2, idle/CALLER_CANCELLED × 1" in text, text[-3000:]
