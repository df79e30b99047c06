"""A caller's actions page (``views.actions_page`` with ``readable``: the daemon's and MCP's
lists hold only invocations on a target the configuration names) is the filtered view's, page
and count.  With a kept summary and no filter but the session it is read alone -- the summary's
count per target, then the rows of the records shown (``JournalReader.newest_readable``) --
however many invocations are on a target no longer named; the summary is derived, so a row
altered under it never puts a record of a target the caller may not read on its page.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
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


def _streamed(
    r: JournalReader, limit: int, readable: Any, session: str | None = None
) -> tuple[list[str], int, bool]:
    rows = (rec for rec in r.iter_actions(session=session) if readable(rec.target))
    return _ids(Newest(limit).take(rows))


def _payments(target: str | None) -> bool:
    return target is None or target == "payments"


def _no_stream(**_kw: Any) -> Any:
    raise AssertionError("streamed the view")


def _rows_read(r: JournalReader, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The invocations whose rows are read from now on (``Tables.fold_rows_of``, each
    statement's list); a fold of every invocation (``grouped_events``) fails the test."""
    read: list[list[str]] = []
    kind = type(r.tables)
    real = kind.fold_rows_of

    def fold_rows_of(self: Any, iids: Sequence[str], through: int) -> Iterator[Any]:
        read.append(list(iids))
        return real(self, iids, through)

    def grouped_events(self: Any, session: str | None = None) -> Any:
        raise AssertionError("folded every invocation")

    monkeypatch.setattr(kind, "fold_rows_of", fold_rows_of)
    monkeypatch.setattr(kind, "grouped_events", grouped_events)
    return read


# Three readable invocations among four on a target the configuration no longer names.
_MIXED = [
    _on(happy("inv-old-0"), "old"),
    happy("inv-0"),
    _on(happy("inv-old-1"), "old"),
    happy("inv-1"),
    _on(happy("inv-old-2"), "old"),
    happy("inv-2"),
    _on(happy("inv-old-3"), "old"),
]


def test_the_page_is_read_alone_while_no_invocation_is_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "j.db"
    trio.run(_fill, db, [happy(f"inv-{n}") for n in range(5)])
    summary = SessionSummary()
    with JournalReader.open(db) as r:
        expected = _streamed(r, 3, _payments)
        monkeypatch.setattr(r, "iter_actions", _no_stream)
        page = actions_page(r, 3, readable=_payments, summary=summary)
    assert _ids(page) == expected == (["inv-2", "inv-3", "inv-4"], 5, True)


def test_invocations_on_another_target_are_neither_listed_nor_counted_nor_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "j.db"
    trio.run(_fill, db, _MIXED)
    summary = SessionSummary()
    with JournalReader.open(db) as r:
        expected = _streamed(r, 2, _payments)
        monkeypatch.setattr(r, "iter_actions", _no_stream)
        first = actions_page(r, 2, readable=_payments, summary=summary)  # (folds it whole)
        read = _rows_read(r, monkeypatch)
        page = actions_page(r, 2, readable=_payments, summary=summary)
        whole = actions_page(r, 10, readable=_payments, summary=summary)
    assert _ids(page) == _ids(first) == expected == (["inv-1", "inv-2"], 3, True)
    assert _ids(whole) == (["inv-0", "inv-1", "inv-2"], 3, False)
    # The rows of the records shown, and none else: not one of another target's.
    assert read == [["inv-1", "inv-2"], ["inv-0", "inv-1", "inv-2"]]


def test_readable_is_asked_once_per_target_not_once_per_invocation(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    trio.run(_fill, db, _MIXED)
    summary = SessionSummary()
    asked: list[str | None] = []

    def readable(target: str | None) -> bool:
        asked.append(target)
        return _payments(target)

    with JournalReader.open(db) as r:
        found = r.newest_readable(10, summary, readable)
    assert found is not None and found[1] == 3
    # Once each for the count and the page, once each again to check the page's fold.
    assert sorted(asked, key=str) == ["old", "payments", "payments"]


def test_a_sessions_page_is_streamed_alone_until_a_summary_is_kept_then_read_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "j.db"
    runs = [
        happy("a-0", "alice"),
        _on(happy("a-old", "alice"), "old"),
        happy("b-0", "bob"),
        happy("a-1", "alice"),
        _on(happy("b-old", "bob"), "old"),
        happy("a-2", "alice"),
        happy("b-1", "bob"),
    ]
    trio.run(_fill, db, runs)
    summary = SessionSummary()
    with JournalReader.open(db) as r:
        expected = _streamed(r, 2, _payments, "alice")
        streams: list[dict[str, Any]] = []
        real = r.iter_actions

        def counted(**kw: Any) -> Any:
            streams.append(kw)
            return real(**kw)

        monkeypatch.setattr(r, "iter_actions", counted)
        # Nothing kept: the session alone is streamed (not the whole journal folded for it).
        before = actions_page(r, 2, session="alice", readable=_payments, summary=summary)
        assert [s["session"] for s in streams] == ["alice"]
        assert not summary.kept
        actions_page(r, 1, readable=_payments, summary=summary)  # (the whole page: kept now)
        assert summary.kept
        monkeypatch.setattr(r, "iter_actions", _no_stream)
        read = _rows_read(r, monkeypatch)
        kept = actions_page(r, 2, session="alice", readable=_payments, summary=summary)
        nobody = actions_page(r, 2, session="carol", readable=_payments, summary=summary)
    assert _ids(before) == _ids(kept) == expected == (["a-1", "a-2"], 3, True)
    assert _ids(nobody) == ([], 0, False)
    assert read == [["a-1", "a-2"]]


def test_a_row_altered_under_the_summary_never_lists_an_unreadable_record(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    trio.run(_fill, db, [happy("inv-0"), _on(happy("inv-old"), "old"), happy("inv-1")])
    summary = SessionSummary()
    with JournalReader.open(db) as r:
        page = actions_page(r, 2, readable=_payments, summary=summary)
        assert _ids(page) == (["inv-0", "inv-1"], 2, False)
    # Someone with write access moves inv-1 to the target the configuration no longer names.
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("DROP TRIGGER events_no_update")
        conn.execute(
            "UPDATE events SET attrs = replace(attrs, '\"payments\"', '\"old\"') WHERE seq = "
            "(SELECT min(seq) FROM events WHERE invocation_id = 'inv-1')"
        )
    finally:
        conn.close()
    with JournalReader.open(db) as r:
        rec = r.record("inv-1")
        assert rec is not None and rec.target == "old"  # (the row says so now)
        expected = _streamed(r, 2, _payments)
        page = actions_page(r, 2, readable=_payments, summary=summary)
        assert _ids(page) == expected == (["inv-0"], 1, False)
        # Not answered from it again as it was: it is folded again, and agrees with the rows.
        again = actions_page(r, 2, readable=_payments, summary=summary)
        assert _ids(again) == expected


def _alter(db: Path, *statements: str) -> None:
    """Rows changed in place by someone with write access to the file."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("DROP TRIGGER IF EXISTS events_no_update")
        for sql in statements:
            conn.execute(sql)
    finally:
        conn.close()


def test_an_invocation_moved_to_another_session_under_the_summary_is_not_on_its_old_page(
    tmp_path: Path,
) -> None:
    """A kept summary lists ``a-1`` in alice's session; its rows, altered in place, now say
    bob's.  Alice's page folds them (``newest_readable``), sees another session than the kept
    one, forgets the summary and streams: ``a-1`` is not on alice's page."""
    db = tmp_path / "j.db"
    trio.run(_fill, db, [happy("a-0", "alice"), happy("a-1", "alice"), happy("b-0", "bob")])
    summary = SessionSummary()
    with JournalReader.open(db) as r:
        actions_page(r, 10, readable=_payments, summary=summary)  # (kept from here)
        page = actions_page(r, 10, session="alice", readable=_payments, summary=summary)
        assert _ids(page) == (["a-0", "a-1"], 2, False)
    _alter(
        db,
        "UPDATE events SET session_id = 'bob' WHERE invocation_id = 'a-1'",
        "UPDATE events SET attrs = replace(attrs, '\"alice\"', '\"bob\"') "
        "WHERE invocation_id = 'a-1'",
    )
    with JournalReader.open(db) as r:
        rec = r.record("a-1")
        assert rec is not None and rec.session == "bob"  # (the rows say so now)
        expected = _streamed(r, 10, _payments, "alice")
        page = actions_page(r, 10, session="alice", readable=_payments, summary=summary)
    assert _ids(page) == expected == (["a-0"], 1, False)
    assert not summary.kept  # forgotten: folded again at the next request


def test_an_invocation_whose_first_seq_moved_under_the_summary_is_not_paged_as_kept(
    tmp_path: Path,
) -> None:
    """``inv-1`` and ``inv-2`` were accepted one after the other (their first rows adjacent);
    those two rows' seqs, swapped in place, put ``inv-2`` before ``inv-1`` in the view's order.
    The kept summary's page (``inv-1``, ``inv-2``) is not answered -- the fold's first seqs are
    not the kept ones -- and the page is the stream's, in the order the rows now say."""
    db = tmp_path / "j.db"
    one, two = happy("inv-1"), happy("inv-2")
    trio.run(_fill, db, [happy("inv-0"), [one[0], two[0], *one[1:], *two[1:]]])
    summary = SessionSummary()
    with JournalReader.open(db) as r:
        page = actions_page(r, 2, readable=_payments, summary=summary)
        assert _ids(page) == (["inv-1", "inv-2"], 3, True)
    first = "(SELECT min(seq) FROM events WHERE invocation_id = '{}')"
    _alter(
        db,
        f"UPDATE events SET seq = 1000000 WHERE seq = {first.format('inv-1')}",
        f"UPDATE events SET seq = seq - 1 WHERE seq = {first.format('inv-2')}",
        "UPDATE events SET seq = 1 + (SELECT min(seq) FROM events WHERE invocation_id = "
        "'inv-2') WHERE seq = 1000000",
    )
    with JournalReader.open(db) as r:
        expected = _streamed(r, 2, _payments)
        assert expected == (["inv-2", "inv-1"], 3, True)  # (inv-2 first now)
        page = actions_page(r, 2, readable=_payments, summary=summary)
    assert _ids(page) == expected
    assert not summary.kept


def test_a_target_refused_between_the_summary_step_and_the_fold_is_not_listed(
    tmp_path: Path,
) -> None:
    """``readable`` is asked again once the page's records are folded: a target the
    configuration stopped naming in between (a reload) is not answered from the page chosen
    before -- the page is the stream's, under the answer as it is now."""
    db = tmp_path / "j.db"
    trio.run(_fill, db, _MIXED)
    summary = SessionSummary()
    with JournalReader.open(db) as r:
        actions_page(r, 1, readable=lambda _t: True, summary=summary)  # (kept from here)
        asked: list[str | None] = []

        def flips(target: str | None) -> bool:
            asked.append(target)
            return target != "old" or asked.count("old") == 1  # "old": yes once, then no

        expected = _streamed(r, 10, _payments)
        page = actions_page(r, 10, readable=flips, summary=summary)
    assert _ids(page) == expected == (["inv-0", "inv-1", "inv-2"], 3, False)
