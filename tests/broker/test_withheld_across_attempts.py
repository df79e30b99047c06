"""A retry's summary, merged over an earlier attempt's in the record's ``evidence.<protocol>``
(``rules_attempt._on_observed``), leaves neither attempt's received sizes beside the other's
path (affidavit/engine/echoed.py)."""

from __future__ import annotations

from typing import Any

import pytest

from affidavit.engine.echoed import without_received_size
from affidavit.statemachine import Event, EventKind
from tests.http.test_machine import _exchange, _send_get
from tests.statemachine.lifecycle_helpers import IID, projector_in

MEASURED = {"path": ["headers_sent", "body"], "body_bytes": 7, "total": 7}
ECHOED = {"path": ["headers_sent", "body", "framing_complete"], "body_bytes": 9, "total": 9}


def _summary(facts: dict[str, Any], withheld: list[str]) -> Event:
    attrs = {"protocol": "http", "state": "body", "facts": facts, "generation": 0}
    [(event, _)] = without_received_size(
        [(Event(EventKind.PROTOCOL_OBSERVED, IID, attrs), None)], withheld
    )
    return event


@pytest.mark.parametrize(
    "first_withheld", [False, True], ids=["measured_then_echoed", "echoed_then_measured"]
)
def test_the_record_shows_the_last_attempt_s_sizes_or_none(first_withheld: bool) -> None:
    """Attempt 1 interrupted with its counts (or with its echo withheld), attempt 2 the other
    way round: the record reads as attempt 2's alone."""
    first, second = (ECHOED, MEASURED) if first_withheld else (MEASURED, ECHOED)
    p = projector_in("dispatched")
    p.apply(_summary(first, ["body"] if first_withheld else []))
    p.apply(_summary(second, [] if first_withheld else ["body"]))
    http = p.record().evidence["http"]
    assert http["path"] == second["path"]
    if first_withheld:
        assert (http["body_bytes"], http["total"], http["received_withheld"]) == (7, 7, None)
    else:
        assert (http["body_bytes"], http["total"], http["received_withheld"]) == (
            None,
            None,
            "redacted",
        )


def test_a_head_that_echoed_leaves_no_earlier_head_count_in_the_record() -> None:
    """The HTTP driver withholds the head's count itself (``progress``: an informational head
    echoed the secret, nothing of the body yet): a retry cut there shows no earlier count of
    the head, and its word stands though the engine's sink withheld nothing."""
    m, ex = _exchange()
    _send_get(m, ex)
    ex.head_echoed = lambda: "redacted"
    obs = ex.abort("timed_out")
    assert obs is not None
    p = projector_in("dispatched")
    p.apply(_summary({"response_bytes": 50, "body_bytes": 0}, []))
    p.apply(_summary(dict(obs.facts), []))
    http = p.record().evidence["http"]
    assert (http["response_bytes"], http["received_withheld"]) == (None, "redacted")
