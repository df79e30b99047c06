"""What the console's journal page says of a verify claims no more than it proved: results
checked by their marker only (stored before per-chunk hashes) are not counted among those that
match their chained hashes, a journal-level problem is not "BROKEN at seq None", and the lease
rows are among what only a whole verify checks (``templates/journal.html``).

The console is served in this process as the daemon serves it (a real loopback socket)."""

from __future__ import annotations

import dataclasses
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from affidavit.journal import VerifyReport
from tests.broker.helpers import http_target, open_broker

from .kit import get, log_in_to, operator_config, served


def _verify_line(page: str) -> str:
    m = re.search(r'id="verify">([^<]*)<', page)
    assert m is not None, page[:2000]
    return m.group(1)


def _journal_page(console: Any, report: VerifyReport, **more: Any) -> str:
    """The journal page's template rendered with ``report`` as its verify (the last whole one
    unless ``more`` says it was extended)."""
    context: dict[str, Any] = {
        "report": dataclasses.asdict(report),
        "whole": None,
        "checked_at": None,
        "checked_through": None,
        "unread_through": None,
        "running": None,
        "failure": None,
        "checkpoint": None,
        "head": {"seq": report.count, "hash": "h"},
        "sessions": [],
        "sessions_total": 0,
        "sessions_as_of": None,
        "sessions_error": None,
        "operator": None,
        "csrf": "",
        "elsewhere": False,
        "version": "0",
        "here": "/journal",
        **more,
    }
    return str(console.templates.get_template("journal.html").render(**context))


async def test_results_checked_by_their_marker_only_are_counted_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (_, console):
        report = VerifyReport(True, 40, None, "intact", results=3, results_marker_only=1)
        line = _verify_line(_journal_page(console, report))
        assert line.startswith("intact: 40 events, 2 stored results match their chained"), line
        assert "1 stored results predate per-chunk hashes: only their marker matches" in line
        whole = {"at": 1.0, "started_at": 1.0, "through": 30, "ok": True, "results": 3}
        page = _journal_page(
            console,
            dataclasses.replace(report, results=4),
            whole={**whole, "results_marker_only": 1},
            checked_at=2.0,
            checked_through=40,
            unread_through=30,
        )
        assert "2 stored results matching their chained hashes and 1 predating per-chunk" in page
        plain = _journal_page(console, dataclasses.replace(report, results_marker_only=0))
        assert "3 stored results match" in plain and "predate" not in plain


async def test_a_journal_level_problem_names_no_seq(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lease row naming seq 0 for an invocation with no lease event: no row has that seq, so
    verify reports it at journal level -- and the page said "BROKEN at seq None"."""
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, _ = await log_in_to(console, origin)
        await b.call({"target": "nope", "method": "GET", "path": "/"})
        conn = sqlite3.connect(tmp_path / "journal.db", isolation_level=None)
        try:
            for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='trigger'"):
                conn.execute(f'DROP TRIGGER "{name}"')
            conn.execute("INSERT INTO leases VALUES ('inv-none', 'w', 1, 1.0, 0)")
        finally:
            conn.close()
        _, _, page = await get(f"{origin}/journal", cookie=cookie)
    line = _verify_line(page.decode())
    assert line.startswith(
        "BROKEN (LEASE_ALTERED): the lease row of invocation inv-none names seq 0"
    ), line
    assert "None" not in line
