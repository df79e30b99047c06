"""A caller's sessions and metrics (the daemon's ``/v1/sessions`` and ``/v1/metrics``: kept,
``readable`` given) count only the invocations on a target the configuration names -- as the
same views over the filtered stream would -- from the kept summary's counts per target, never
a stream of the journal; without ``readable`` (the console, the operator's CLI) every one."""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.journal import JournalReader, SessionSummary
from affidavit.journal.reader_views import _by_session
from affidavit.journal.views import fold_each
from affidavit.statemachine import Record
from affidavit.views import metrics_key

from .helpers import happy, interrupted
from .test_readable_page import _fill, _no_stream, _on, _payments

# Session A's first invocation is on the removed target: the filtered view meets B first.
# C holds only invocations on it.
_RUNS = [
    _on(happy("a-old", "A"), "old"),
    happy("b-0", "B"),
    interrupted("a-0", "A"),
    _on(happy("c-old", "C"), "old"),
    _on(interrupted("b-old", "B"), "old"),
    happy("a-1", "A"),
    interrupted("b-1", "B"),
]


def _tallies(records: Iterable[Record]) -> dict[Hashable, int]:
    out: dict[Hashable, int] = {}
    for rec in records:
        out[metrics_key(rec)] = out.get(metrics_key(rec), 0) + 1
    return out


def _expected(r: JournalReader, readable: Any) -> dict[str, Any]:
    """Each view of the stream filtered by ``readable`` (None: not filtered)."""
    now = time.time()
    folded = [
        (rec, f, last)
        for rec, f, last in fold_each(r.tables, None, now)
        if readable is None or readable(rec.target)
    ]
    since = sorted(f for _, f, _ in folded)[len(folded) // 2]
    return {
        "sessions": _by_session(iter(folded)),
        "metrics": _tallies(rec for rec, _, _ in folded),
        "since": _tallies(rec for rec, f, _ in folded if f >= since),
        "A": _tallies(rec for rec, _, _ in folded if rec.session == "A"),
        "since_at": since,
    }


def _kept(r: JournalReader, summary: SessionSummary, readable: Any, since: float) -> Any:
    return {
        "sessions": r.summarized_sessions(summary, readable)[0],
        "metrics": r.summarized_tallies(summary, readable=readable)[0],
        "since": r.summarized_tallies(summary, since=since, readable=readable)[0],
        "A": r.summarized_tallies(summary, session="A", readable=readable)[0],
    }


@pytest.mark.parametrize("readable", [_payments, None], ids=["caller", "operator"])
def test_a_callers_sessions_and_metrics_count_only_the_targets_it_may_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, readable: Any
) -> None:
    db = tmp_path / "j.db"
    trio.run(_fill, db, _RUNS)
    summary = SessionSummary(metrics_key)
    with JournalReader.open(db) as r:
        expected = _expected(r, readable)
        since = expected.pop("since_at")
        # A session's metrics before anything is kept: that session folded now, filtered.
        assert r.summarized_tallies(summary, session="A", readable=readable) == (
            expected["A"],
            None,
        )
        monkeypatch.setattr(r, "iter_actions", _no_stream)
        kept = _kept(r, summary, readable, since)
    assert kept == expected
    names = [s["session"] for s in kept["sessions"]]
    assert names == (["B", "A"] if readable else ["A", "B", "C"])
    total = sum(expected["metrics"].values())
    assert total == (4 if readable else 7)


def test_readable_is_asked_once_per_target(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    trio.run(_fill, db, _RUNS)
    summary = SessionSummary(metrics_key)
    asked: list[str | None] = []

    def readable(target: str | None) -> bool:
        asked.append(target)
        return _payments(target)

    with JournalReader.open(db) as r:
        r.summarized_sessions(summary, readable)
        assert sorted(map(str, asked)) == ["old", "payments"]
        asked.clear()
        r.summarized_tallies(summary, readable=readable)
        assert sorted(map(str, asked)) == ["old", "payments"]
