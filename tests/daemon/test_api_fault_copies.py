"""An API-level error survives ``pickle`` and ``copy`` whole: the client's ``ApiError`` and the
daemon's ``ApiProblem`` (``affidavit.api.wire.ApiFault``) are exceptions a caller may hand to
another process (a multiprocessing pool, a test runner's worker) or copy; the default
``BaseException`` reduction called the class with the message alone -- TypeError in place of
the error."""

from __future__ import annotations

import copy
import pickle

import pytest

from affidavit.api.wire import ApiError, ApiFault
from affidavit.daemon.http import ApiProblem

PARTS = {
    "status": 400,
    "code": "BAD_JSON",
    "message": "body: not JSON",
    "field": "body",
    "retry_after": 3,
    "action_code": "INVALID_FIELD",
}


@pytest.mark.parametrize("cls", [ApiError, ApiProblem])
@pytest.mark.parametrize(
    "round_trip",
    [
        lambda e: pickle.loads(pickle.dumps(e)),
        copy.copy,
        copy.deepcopy,
    ],
    ids=["pickle", "copy", "deepcopy"],
)
def test_an_api_fault_keeps_every_part_across_pickle_and_copy(
    cls: type, round_trip: object
) -> None:
    fault = cls(**PARTS)
    fault.add_note("seen by the test")
    again = round_trip(fault)  # type: ignore[operator]
    assert type(again) is cls and again is not fault
    assert isinstance(again, ApiFault)
    assert {k: getattr(again, k) for k in PARTS} == PARTS
    assert str(again) == PARTS["message"] and again.args == fault.args
    assert again.__notes__ == ["seen by the test"]


def test_the_optional_parts_stay_none() -> None:
    again = pickle.loads(pickle.dumps(ApiError(404, "NOT_FOUND", "no such action")))
    assert (again.status, again.code, again.message) == (404, "NOT_FOUND", "no such action")
    assert (again.field, again.retry_after, again.action_code) == (None, None, None)
