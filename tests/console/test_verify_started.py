"""What a whole verify proves, said as it is: the rows through the seq it verified, as they were
when it STARTED reading (``JournalReader.verify`` reads one snapshot) -- not as they are when it
finished.  The console said "whole journal verified at T" with T when it finished: a row
changed while a long verify ran (~41 s at 1M events) was worded as verified at a time the
verify no longer read it.  The journal page and the kept views' marker now say "verified
through seq N (started T1, finished T2)".

The console is served in this process as the daemon serves it (a real loopback socket)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from affidavit.console.verified import KeptVerify
from affidavit.journal import JournalReader
from tests.broker.helpers import http_target, open_broker

from .kit import get, log_in_to, operator_config, post, served, settled

LONG = 41.0  # how long the verify takes, by the console's clock


def _text(page: bytes, id: str) -> str:
    m = re.search(rf'id="{id}">([^<]*)<'.encode(), page)
    assert m is not None, page[-3000:]
    return " ".join(m.group(1).decode().split())


async def test_a_whole_verify_is_shown_with_the_seq_it_read_and_when_it_started_and_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    now = [1_700_000_000.0]  # 2023-11-14 22:13:20 UTC
    real = JournalReader.verify

    def slow(self: JournalReader, *a: Any, **k: Any) -> Any:
        report = real(self, *a, **k)  # (reads its snapshot, then the clock moves on)
        now[0] += LONG
        return report

    monkeypatch.setattr(JournalReader, "verify", slow)
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        console.verified = KeptVerify(console.summary, clock=lambda: now[0])
        cookie, csrf = await log_in_to(console, origin)
        await b.call({"target": "nope", "method": "GET", "path": "/"})
        read = b.journal.head()[0]
        status, _, _ = await post(
            f"{origin}/journal/verify", {"csrf": csrf}, {"Origin": origin, "Cookie": cookie}
        )
        assert status == 303
        await settled(console)
        await b.call({"target": "nope", "method": "GET", "path": "/"})  # after it: not claimed
        assert b.journal.head()[0] > read
        want = (
            f"verified through seq {read} (started 2023-11-14 22:13:20 UTC, "
            "finished 2023-11-14 22:14:01 UTC"
        )
        _, _, page = await get(f"{origin}/journal", cookie=cookie)
        assert want in _text(page, "verify-when"), _text(page, "verify-when")
        _, _, page = await get(f"{origin}/actions", cookie=cookie)
        line = _text(page, "counts-as-of")
        assert f"intact, {want}; the rows as they were when it started reading)." in line, line
        _, as_of = b.journal.summarized_sessions(console.summary)  # (a marker of its own)
        assert (as_of.verified_started_at, as_of.verified_at, as_of.verified_through) == (
            1_700_000_000.0,
            1_700_000_000.0 + LONG,
            read,
        )
