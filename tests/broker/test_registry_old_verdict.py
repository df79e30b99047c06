"""A plugin-style protocol whose reconcile contract's ``verdict`` takes the three arguments of
before the bound values were added is refused ``CONFIG_INVALID`` at ``targets.NAME.kind`` when
the config is read (docs/adding-a-protocol.md) -- never a TypeError when a reconciliation asks
it; one taking the four arguments loads, and is judged once (audit52c round 2)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from affidavit.config import ConfigError, load_config
from affidavit.protocols import register, registry, unregister
from affidavit.protocols.registry import OLD_VERDICT
from affidavit.protocols.settle import settle_of
from affidavit.protocols.spec import ReconcileContract
from tests.toy_protocol.protocol import PROTOCOL as TOY


def _query(target: Any, values: Mapping[str, str | None]) -> Mapping[str, Any]:
    return {"target": target.name, "line": "status"}


def old_verdict(target: Any, summary: Mapping[str, Any], streams: Mapping[str, bytes]) -> Any:
    raise AssertionError("never called: refused before")


def new_verdict(
    target: Any,
    summary: Mapping[str, Any],
    streams: Mapping[str, bytes],
    values: Mapping[str, str | None],
) -> Any:
    return None, None


@pytest.fixture
def toy_with() -> Iterator[Any]:
    def use(verdict: Any) -> None:
        contract = ReconcileContract(query=_query, verdict=verdict, settle=settle_of)
        register(dataclasses.replace(TOY, reconcile=contract))

    try:
        yield use
    finally:
        unregister(TOY.kind)


def _config(tmp_path: Path) -> Path:
    cfg = tmp_path / "affidavit.toml"
    cfg.write_text(
        '[journal]\npath = "j.db"\n[targets.zz]\nkind = "toy"\nport = 7000\ncredential = "env:T"\n'
    )
    return cfg


def test_a_three_argument_verdict_is_refused_at_the_kind(toy_with: Any, tmp_path: Path) -> None:
    toy_with(old_verdict)
    with pytest.raises(ConfigError) as info:
        load_config(_config(tmp_path))
    assert (info.value.code, info.value.field) == ("CONFIG_INVALID", "targets.zz.kind")
    assert info.value.message == OLD_VERDICT
    assert "verdict(target, summary, streams, values)" in OLD_VERDICT


def test_a_four_argument_verdict_loads_and_is_judged_once(toy_with: Any, tmp_path: Path) -> None:
    toy_with(new_verdict)
    config = load_config(_config(tmp_path))
    assert config.targets["zz"].kind == "toy"
    assert registry._judged["toy"].reconcile.verdict is new_verdict  # judged, remembered
