"""``rows.fold_events``, the views' reading of each row with ``stored_event`` and
``decode_attrs`` inlined, gives the very events ``rows.event_from_row`` gives -- for canonical
attrs and for any other text, down to the ``AlteredRow`` a row someone edited raises and which
of its columns it names."""

from __future__ import annotations

from typing import Any

import pytest

from affidavit.journal.rows import AlteredRow, event_from_row, fold_events


def _reference(row: tuple[Any, ...]) -> Any:
    seq, at, iid, kind, source, observer, observer_seq, attrs = row
    return event_from_row((seq, at, iid, None, kind, source, observer, observer_seq, attrs))


def _outcome(fn: Any, row: tuple[Any, ...]) -> Any:
    try:
        return fn(row)
    except Exception as exc:  # the error itself is what is compared
        return type(exc), str(exc)


ATTRS = [
    "{}",
    '{"status":201}',
    '{"operation":{"budget":3,"target":"t"},"session":"s"}',
    '"text"',
    "7",
    "{ }",  # not canonical: read by json.loads
    '{"a":1} ',
    ' {"a":1}',
    '{"a":1}x',  # extra data
    '{"a":1}{"b":2}',
    "",
    "{",
    '{"a": }',
    '{"caf\\u00e9":"\\u2603"}',
]


@pytest.mark.parametrize("attrs", ATTRS)
def test_a_row_reads_as_stored_event_reads_it(attrs: str) -> None:
    row = (5, 1.5, "act_1", "REQUEST_SENT", "transport_observed", "obs", 9, attrs)
    want = _outcome(_reference, row)
    got = _outcome(lambda r: next(fold_events([r])), row)
    assert got == want


@pytest.mark.parametrize(
    "kind, source, attrs",
    [
        ("NO_SUCH_KIND", "transport_observed", "{"),  # the kind fails before the attrs
        ("REQUEST_SENT", "no_such_source", "{"),  # the attrs before the source
        ("REQUEST_SENT", "no_such_source", "{}"),
    ],
)
def test_an_edited_row_fails_first_where_stored_event_does(
    kind: str, source: str, attrs: str
) -> None:
    row = (5, 1.5, "act_1", kind, source, None, None, attrs)
    want = _outcome(_reference, row)
    assert isinstance(want, tuple) and want[0] is AlteredRow  # an error naming the row
    assert _outcome(lambda r: next(fold_events([r])), row) == want


@pytest.mark.parametrize(
    "row, column",
    [
        ((5, 1.5, "act_1", "REQUEST_SENT", "transport_observed", None, None, "[]"), "attrs"),
        ((5, "x", "act_1", "REQUEST_SENT", "transport_observed", None, None, "{}"), "at"),
        ((5, 1.5, b"act", "REQUEST_SENT", "transport_observed", None, None, "{}"), "invocation_id"),
        ((5, 1.5, "act_1", "REQUEST_SENT", "transport_observed", b"o", None, "{}"), "observer"),
        ((5, 1.5, "act_1", "REQUEST_SENT", "transport_observed", None, "9", "{}"), "observer_seq"),
        ((5, 1.5, "act_1", "REQUEST_SENT", "transport_observed", None, None, b"{}"), "attrs"),
    ],
)
def test_a_column_of_another_type_is_an_altered_row(row: tuple[Any, ...], column: str) -> None:
    """A column the broker never writes so (SQLite keeps whatever type it is given) is named,
    never its value.  (Not ``seq``: SQLite's ``INTEGER PRIMARY KEY`` holds integers only.)"""
    want = _outcome(_reference, row)
    assert want[0] is AlteredRow and f"its {column} " in want[1]
    assert _outcome(lambda r: next(fold_events([r])), row) == want


def test_many_rows_read_in_order() -> None:
    rows = [
        (n, float(n), f"act_{n % 3}", "REQUEST_SENT", "transport_observed", None, None, a)
        for n, a in enumerate([*ATTRS[:3], "{ }"], start=1)
    ]
    assert list(fold_events(rows)) == [_reference(r) for r in rows]
