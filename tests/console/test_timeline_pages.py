"""An invocation's page shows the first and last rows of a long timeline and pages through the
rest (docs/console.md, "Pages"): a caller adds a row to its submission's timeline with every
poll of its operation, and the page drew every one -- 4,000 rows, 1.75 MB, 0.25-0.35 s of
rendering on the daemon's event loop.

The console is served in this process as the daemon serves it (a real loopback socket)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import trio

from affidavit.console.pages import EDGE, PAGE, timeline_rows
from tests.broker.helpers import http_target, open_broker
from tests.broker.test_operations import JOBS, SUBMIT, job_api
from tests.http.hostile import HostileServer, scripts

from .kit import WAIT, get, log_in_to, operator_config, served

POLLS = 200
"""Polls of one job: its submission's timeline then holds more rows than a page shows whole."""


@pytest.mark.parametrize(
    ("count", "start", "rows"),
    [
        pytest.param(3, None, [0, 1, 2], id="short_whole"),
        pytest.param(300, None, [*range(EDGE), (200, EDGE), *range(250, 300)], id="the_ends"),
        pytest.param(300, EDGE, [(EDGE, 0), *range(EDGE, EDGE + PAGE), (150, 150)], id="a_page"),
        pytest.param(300, 0, [*range(PAGE), (200, PAGE)], id="the_first_page"),
        pytest.param(300, 10_000, [(200, 100), *range(200, 300)], id="past_the_end_is_the_last"),
    ],
)
def test_the_rows_a_page_shows(count: int, start: int | None, rows: list[object]) -> None:
    assert timeline_rows(count, start) == rows


async def test_a_long_timeline_shows_its_ends_and_pages_through_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with HostileServer.running(scripts.serve(job_api(["running"]))) as srv:
        path = operator_config(
            tmp_path, monkeypatch, {"jobs": http_target(srv.url + "/v1", **JOBS)}
        )
        async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
            submitted = await b.call(dict(SUBMIT))
            iid, op = submitted["invocation_id"], submitted["operation"]["id"]
            with trio.fail_after(WAIT * 4):
                for _ in range(POLLS):
                    await b.poll_operation(op)
            events = len(b.events(iid))
            assert events > POLLS
            cookie, _ = await log_in_to(console, origin)
            status, _, page = await get(f"{origin}/invocations/{iid}", cookie=cookie)
            assert status == 200
            text = page.decode()
            assert text.count('class="event"') == 2 * EDGE
            assert f"({events} events" in text
            hidden = events - 2 * EDGE
            assert f'{hidden} more events — <a href="/invocations/{iid}?from={EDGE}">' in text
            seqs = [int(s) for s in re.findall(r'class="event"[^>]*><td>(\d+)</td>', text)]
            assert seqs == sorted(seqs) and len(set(seqs)) == 2 * EDGE

            status, _, page = await get(f"{origin}/invocations/{iid}?from={EDGE}", cookie=cookie)
            assert status == 200
            text = page.decode()
            shown = [int(s) for s in re.findall(r'class="event"[^>]*><td>(\d+)</td>', text)]
            assert len(shown) == PAGE and shown[0] > seqs[EDGE - 1], (shown[:3], seqs[EDGE - 1])
            assert f'?from={EDGE + PAGE}">' in text and '?from=0">' in text
            assert 'id="timeline-ends"' in text

            # Anything that is no row number, an empty value too (parse_qsl drops it unless told).
            for bad in ("x1", "-1", "", "1e3", "%20", "%D9%A3"):
                status, _, page = await get(f"{origin}/invocations/{iid}?from={bad}", cookie=cookie)
                assert status == 400, bad
                assert b"INVALID_FIELD" in page and b"from: a timeline row number" in page, bad
