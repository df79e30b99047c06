"""A caller's actions page (``views.actions_page`` with ``readable``: the daemon's and MCP's
lists hold only invocations on a target the configuration names) is the filtered view's, page
and count.  With the daemon's kept summary and no filter it is read alone -- the rows of the
records shown, as the unfiltered page is -- while the summary finds no invocation on another
target (``JournalReader.newest_readable``); once one is there, the page is the filtered stream.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.journal import Journal, JournalReader, SessionSummary
from affidavit.statemachine import Event
from affidavit.views import Newest, actions_page

from .helpers import happy


def _on(events: list[Event], target: str) -> list[Event]:
    first = events[0]
    op = {**first.attrs["operation"], "target": target}
    return [Event(first.kind, first.invocation_id, {**first.attrs, "operation": op}), *events[1:]]


async def _fill(db: Path, runs: list[list[Event]]) -> None:
    async with Journal.open(db) as j:
        for run in runs:
            for ev in run:
                await j.append(ev, barrier=True)


def _ids(page: Newest) -> tuple[list[str], int, bool]:
    return [r.invocation_id for r in page.records], page.total, page.truncated


def _streamed(r: JournalReader, limit: int, readable: Any) -> tuple[list[str], int, bool]:
    rows = (rec for rec in r.iter_actions() if readable(rec.target))
    return _ids(Newest(limit).take(rows))


def _payments(target: str | None) -> bool:
    return target is None or target == "payments"


def test_the_page_is_read_alone_while_no_invocation_is_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "j.db"
    trio.run(_fill, db, [happy(f"inv-{n}") for n in range(5)])
    summary = SessionSummary()
    with JournalReader.open(db) as r:
        expected = _streamed(r, 3, _payments)

        def no_stream(**_kw: Any) -> Any:
            raise AssertionError("streamed the whole view")

        monkeypatch.setattr(r, "iter_actions", no_stream)
        page = actions_page(r, 3, readable=_payments, summary=summary)
    assert _ids(page) == expected == (["inv-2", "inv-3", "inv-4"], 5, True)


def test_an_invocation_on_another_target_is_neither_listed_nor_counted(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    runs = [happy("inv-0"), _on(happy("inv-old"), "old"), happy("inv-1"), happy("inv-2")]
    trio.run(_fill, db, runs)
    summary = SessionSummary()
    with JournalReader.open(db) as r:
        assert r.newest_readable(2, summary, _payments) is None
        page = actions_page(r, 2, readable=_payments, summary=summary)
        assert _ids(page) == _streamed(r, 2, _payments) == (["inv-1", "inv-2"], 3, True)
        # Every target readable (the console's view): the whole page, read alone.
        found = r.newest_readable(10, summary, lambda _t: True)
        assert found is not None
        assert [x.invocation_id for x in found[0]] == ["inv-0", "inv-old", "inv-1", "inv-2"]
        assert found[1] == 4
