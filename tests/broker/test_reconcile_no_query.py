"""``NO_QUERY`` says which of its four reasons there is no query to run -- the target gone, its
kind changed, its protocol uninstalled, or a protocol with no reconcile contract -- under the
one stable code callers branch on (MCP: retry "never"), each with what to do (audit 51f,
item 4)."""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from affidavit.approvals import OperatorError
from affidavit.reconcile import service

IID = "act_01M98DVAD4ZS7NPHRSRVWG396Z"
RECORD: Any = SimpleNamespace(target="api", protocol="toy")
CONTRACT = object()
SPECS = {"toy": SimpleNamespace(reconcile=None), "http": SimpleNamespace(reconcile=CONTRACT)}


@pytest.mark.parametrize(
    ("target", "message", "field"),
    [
        (None, f"the target api of {IID} is no longer configured; {service._ATTEST}", None),
        (
            SimpleNamespace(name="api", kind="http"),
            f"the target api is now of kind http, not toy as when {IID} was sent; "
            f"{service._ATTEST}",
            "targets.api.kind",
        ),
        (
            SimpleNamespace(name="api", kind="toy"),
            "protocol toy has no reconcile query: attest the outcome (--attest)",
            None,
        ),
    ],
    ids=["target-gone", "kind-changed", "no-contract"],
)
def test_each_reason_has_its_own_words_under_one_code(
    monkeypatch: pytest.MonkeyPatch, target: Any, message: str, field: str | None
) -> None:
    monkeypatch.setattr(service, "get", SPECS.get)
    with pytest.raises(OperatorError) as info:
        service._queryable(IID, RECORD, target)
    assert (info.value.code, info.value.status) == ("NO_QUERY", 400)
    assert (info.value.message, info.value.field) == (message, field)


def test_an_uninstalled_protocol_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "get", lambda kind: None)
    with pytest.raises(OperatorError) as info:
        service._queryable(IID, RECORD, SimpleNamespace(name="api", kind="toy"))
    assert info.value.code == "NO_QUERY"
    assert info.value.message == f"protocol toy is not installed; {service._ATTEST}"


def test_a_protocol_with_a_contract_is_queried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "get", SPECS.get)
    target = SimpleNamespace(name="api", kind="http")
    record: Any = SimpleNamespace(target="api", protocol="http")
    assert service._queryable(IID, record, target) == (target, CONTRACT)


def test_a_record_naming_no_target_is_told_without_a_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through ``query()``: a record with no target reads 'the target of act_...', not 'the
    target None of act_...' (review 51 round 2, item 4)."""
    record: Any = SimpleNamespace(target=None, protocol="toy")

    async def at_rest(engine: Any, iid: str, *, operator: bool) -> Any:
        return record

    monkeypatch.setattr(service, "_unknown_at_rest", at_rest)
    engine: Any = SimpleNamespace(settings=None, config=SimpleNamespace(targets={}))
    with pytest.raises(OperatorError) as info:
        trio.run(functools.partial(service.query, engine, IID, requester=0))
    assert info.value.code == "NO_QUERY"
    assert info.value.message == f"the target of {IID} is no longer configured; {service._ATTEST}"
