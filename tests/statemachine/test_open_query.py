"""``open_query`` reads a record's reconciliation queries from the end back to the last one
opened under the generation (a claim's rules check, flat in the record's length): it answers
what the reading from the start -- its definition, kept here -- answers, for any rows."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.statemachine import open_query


def _from_the_start(items: Iterable[Mapping[str, Any]], generation: int) -> str | None:
    """The last query a row opened (``open``, that generation) that no later row naming it
    closed (the reading before the one from the end)."""
    current = None
    for item in items:
        if item.get("open") and item.get("generation") == generation:
            current = item.get("query_invocation")
        elif item.get("query_invocation") == current:
            current = None
    return current if isinstance(current, str) else None


_ITEM = st.dictionaries(
    st.sampled_from(["open", "generation", "query_invocation", "stale"]),
    st.sampled_from([None, True, False, 0, 1, 2, "q1", "q2", "q3", ["q1"]]),
)


@settings(max_examples=2000, deadline=None)
@given(st.lists(_ITEM, max_size=12), st.sampled_from([0, 1, 2]))
def test_the_reading_from_the_end_answers_as_the_reading_from_the_start(
    items: list[dict[str, Any]], generation: int
) -> None:
    expected = _from_the_start(items, generation)
    assert open_query(items, generation) == expected
    assert open_query(tuple(items), generation) == expected
    assert open_query(iter(items), generation) == expected  # not a sequence: read once


def test_a_query_closed_after_another_opened_is_still_judged_by_the_last_opened() -> None:
    rows: list[dict[str, Any]] = [
        {"query_invocation": "q1", "open": True, "generation": 1},
        {"query_invocation": "q1"},
        {"query_invocation": "q2", "open": True, "generation": 1},
        {"query_invocation": "q1"},
        {"query_invocation": "q3", "open": True, "generation": 0},
    ]
    assert open_query(rows, 1) == "q2"
    assert open_query([*rows, {"query_invocation": "q2", "code": "X"}], 1) is None
    assert open_query(rows, 0) == "q3" and open_query(rows, 2) is None
