"""A typed ``json:`` comparison may only turn a match into none -- and "none" on one side can
turn "both sides match: inconclusive" into "one side matches: settled".  So a condition the
former text comparison would have met but the typed one does not (``"true"`` for ``=true``,
``"404"`` for ``=404``, a longer string equal in its first 256 characters) is *ambiguous*, and
an ambiguous side leaves the whole answer inconclusive with its own reason naming the
condition (``affidavit/protocols/http/reconcile.py``, ``verdict``)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from affidavit.protocols.http.reconcile import AMBIGUOUS, MISSING, parse_condition, verdict
from affidavit.reconcile.service import NEITHER, REASON_MAX, _reason
from affidavit.statemachine import Outcome

LONG = "a" * 256


def _verdict(
    committed: list[str], rejected: list[str], body: Any, status: int = 200, **values: str
) -> tuple[Outcome | None, str | None]:
    target: Any = SimpleNamespace(
        reconcile=SimpleNamespace(
            committed_if=tuple(map(parse_condition, committed)),
            rejected_if=tuple(map(parse_condition, rejected)),
        )
    )
    streams = {"body": json.dumps(body).encode()}
    return verdict(target, {"status": status, "headers": []}, streams, values)


def _ambiguous(condition: str) -> tuple[None, str]:
    return None, AMBIGUOUS.format(condition=condition)


DELETED = (["status:200", "json:/object=charge"], ["status:200", "json:/deleted=true"])
CODE = (["status:200", "json:/paid=yes"], ["status:200", "json:/code=404"])
PREFIX = (["status:200", f"json:/s={LONG}"], ["status:200", "json:/gone=yes"])

CASES: list[tuple[str, tuple[list[str], list[str]], Any, tuple[Outcome | None, str | None]]] = [
    # The review's cases: the text rule matched both sides (inconclusive), typed one side.
    (
        "string-true",
        DELETED,
        {"object": "charge", "deleted": "true"},
        _ambiguous("json:/deleted=true"),
    ),
    ("string-404", CODE, {"paid": "yes", "code": "404"}, _ambiguous("json:/code=404")),
    ("prefix", PREFIX, {"s": LONG + "-more", "gone": "yes"}, _ambiguous(f"json:/s={LONG}")),
    # An ambiguous condition on the side that alone would match: no settlement either.
    ("prefix-alone", PREFIX, {"s": LONG + "-more"}, _ambiguous(f"json:/s={LONG}")),
    # Typed matches on both sides stay inconclusive; a clear answer still settles.
    ("both-typed", DELETED, {"object": "charge", "deleted": True}, (None, None)),
    (
        "one-typed",
        DELETED,
        {"object": "charge", "deleted": False},
        (Outcome.COMMITTED, "status:200 and json:/object=charge"),
    ),
    (
        "integer-404",
        CODE,
        {"paid": "no", "code": 404},
        (Outcome.REJECTED, "status:200 and json:/code=404"),
    ),
    ("no-code", CODE, {"paid": "yes"}, (Outcome.COMMITTED, "status:200 and json:/paid=yes")),
]


@pytest.mark.parametrize(
    ("sides", "body", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_an_ambiguous_condition_settles_nothing(
    sides: tuple[list[str], list[str]], body: Any, expected: tuple[Outcome | None, str | None]
) -> None:
    assert _verdict(*sides, body) == expected


def test_an_ambiguous_condition_on_a_side_that_fails_outright_is_no_obstacle() -> None:
    # The rejected side's status fails whatever its json: condition says: it cannot match.
    sides = (["status:200", "json:/id=ch_1"], ["status:404", "json:/code=404"])
    found = _verdict(*sides, {"id": "ch_1", "code": "404"})
    assert found == (Outcome.COMMITTED, "status:200 and json:/id=ch_1")


def test_a_missing_bound_value_has_its_own_reason() -> None:
    sides = (
        ["status:200", "json:/key={idempotency_key}"],
        ["status:404", "json:/error/key={idempotency_key}"],
    )
    found = _verdict(*sides, {"key": "k-1"})
    assert found == (None, MISSING.format(name="{idempotency_key}"))
    assert found[1] == "the invocation has no {idempotency_key} to compare the answer with"
    assert _verdict(*sides, {"key": "k-1"}, idempotency_key="k-1")[0] is Outcome.COMMITTED


@pytest.mark.parametrize(
    ("said", "recorded"),
    [
        (None, NEITHER),
        ("", NEITHER),
        (("not", "text"), NEITHER),
        ("the key was not echoed", "the key was not echoed"),
        ("line\nbreak\x1b[31m", "line\\nbreak\\u001b[31m"),
    ],
    ids=["none", "empty", "not-text", "plain", "escaped"],
)
def test_a_verdicts_reason_is_recorded_printable_and_bounded(said: object, recorded: str) -> None:
    """A plugin's ``verdict`` may say why it settles nothing; the journal and the envelope take
    that text printable (affidavit.text) and at most REASON_MAX characters (review rv52c2)."""
    assert _reason(said) == recorded
    long = _reason("x" * 5000)
    assert len(long) == REASON_MAX and long.endswith("...[cut]")
