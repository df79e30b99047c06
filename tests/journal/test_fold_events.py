"""``rows.fold_events``, the views' reading of each row with ``stored_event`` and
``decode_attrs`` inlined, gives the very events ``stored_event(KINDS[kind], ...,
decode_attrs(attrs), ...)`` gives -- for canonical attrs and for any other text, down to the error
a row someone edited raises and which of its columns raises it first."""

from __future__ import annotations

from typing import Any

import pytest

from affidavit.journal.rows import KINDS, SOURCES, decode_attrs, fold_events
from affidavit.statemachine import stored_event


def _reference(row: tuple[Any, ...]) -> Any:
    seq, at, iid, kind, source, observer, observer_seq, attrs = row
    return stored_event(
        KINDS[kind], iid, decode_attrs(attrs), SOURCES[source], seq, at, observer, observer_seq
    )


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
    assert isinstance(want, tuple)  # an error
    assert _outcome(lambda r: next(fold_events([r])), row) == want


def test_many_rows_read_in_order() -> None:
    rows = [
        (n, float(n), f"act_{n % 3}", "REQUEST_SENT", "transport_observed", None, None, a)
        for n, a in enumerate(ATTRS[:4], start=1)
    ]
    assert list(fold_events(rows)) == [_reference(r) for r in rows]
