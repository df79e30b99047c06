"""A protocol added in-process (``register()``) whose binding's ``prepare`` takes the four
arguments of before ``trusted`` is refused as an installed one is: ``CONFIG_INVALID`` at
``targets.NAME.kind`` (docs/adding-a-protocol.md), from the config reader, ``Broker.open`` and
the command line -- never a traceback (audit 51f, item 3)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from affidavit.cli import main
from affidavit.config import ConfigError, load_config
from affidavit.protocols import register, unregister
from affidavit.protocols.registry import OLD_PREPARE
from tests.toy_protocol.protocol import PROTOCOL as TOY
from tests.toy_protocol.protocol import ToyBinding


class OldBinding(ToyBinding):
    def prepare(self, action: Any, target: Any, credential: Any, key: Any) -> Any:  # type: ignore[override]
        raise AssertionError("never called: refused before")


def _made_by_a_factory() -> OldBinding:
    return OldBinding()


@pytest.fixture(params=["class", "factory"])
def old_toy(request: pytest.FixtureRequest) -> Iterator[str]:
    """The toy protocol with an old binding, registered in-process: a class (judged when the
    config is read) or a factory (judged once made, by ``Broker.open``)."""
    binding: Any = OldBinding if request.param == "class" else _made_by_a_factory
    register(dataclasses.replace(TOY, binding=binding))
    try:
        yield request.param
    finally:
        unregister(TOY.kind)


def _config(tmp_path: Path) -> Path:
    cfg = tmp_path / "affidavit.toml"
    cfg.write_text(
        '[journal]\npath = "j.db"\n'
        '[targets.zz]\nkind = "toy"\nport = 7000\ncredential = "env:T"\n'
        '[targets.aa]\nkind = "toy"\nport = 7001\ncredential = "env:T"\n'
    )
    return cfg


async def test_the_config_or_broker_open_refuses_it_at_the_kind(
    old_toy: str, tmp_path: Path
) -> None:
    from affidavit.api import Broker

    cfg = _config(tmp_path)
    if old_toy == "class":
        with pytest.raises(ConfigError) as info:
            load_config(cfg)
    else:
        config = load_config(cfg)  # (a factory's product is not seen before it is made)
        with pytest.raises(ConfigError) as info:
            async with Broker.open(config=config):
                raise AssertionError("opened")
    assert (info.value.code, info.value.field) == ("CONFIG_INVALID", "targets.zz.kind")
    assert info.value.message == OLD_PREPARE


@pytest.mark.parametrize("command", ["call", "serve"])
def test_the_command_line_says_config_invalid_with_no_traceback(
    old_toy: str,
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("T", "tok")
    monkeypatch.chdir(tmp_path)
    cfg = _config(tmp_path)
    action = tmp_path / "action.json"
    action.write_text('{"target": "aa", "line": "x"}')
    args = [str(action)] if command == "call" else ["--socket", str(tmp_path / "s.sock")]
    try:  # (main's handler says it: call and serve have none of their own)
        rc = main([command, "--config", str(cfg), *args])
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.strip() == f"affidavit: CONFIG_INVALID: {cfg}: targets.zz.kind: {OLD_PREPARE}"
