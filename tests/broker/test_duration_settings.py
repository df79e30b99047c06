"""Every duration setting is read by one rule (``affidavit.schema.duration_setting``): ``"1h30m"``
or a number of seconds, refused at the setting's own path with ``parse_duration``'s words; 0
only where the setting says it means something (a settle window, an approval's wait)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from affidavit.config import Config, ConfigError, config_from_dict
from tests.broker.helpers import http_target

IDEMPOTENCY = {"header": "Idempotency-Key", "scope": "s"}
RECONCILE = {"path": "/x", "rejected_if": ["status:404", "json:/error=not_found"]}

# (what the setting is, where it goes, the path a refusal names, its value read back, 0 allowed)
ROWS: list[tuple[str, Callable[[Any], dict[str, Any]], str, Callable[[Config], float], bool]] = [
    (
        "reconnect",
        lambda v: {"journal": {"reconnect": v}},
        "journal.reconnect",
        lambda c: c.journal.reconnect,
        False,
    ),
    (
        "shutdown_grace",
        lambda v: {"service": {"shutdown_grace": v}},
        "service.shutdown_grace",
        lambda c: c.service.shutdown_grace,
        False,
    ),
    (
        "lease_margin",
        lambda v: {"service": {"lease_margin": v}},
        "service.lease_margin",
        lambda c: c.service.lease_margin,
        False,
    ),
    (
        "retention",
        lambda v: {"target": {"idempotency": {**IDEMPOTENCY, "retention": v}}},
        "targets.pay.idempotency.retention",
        lambda c: c.targets["pay"].idempotency.retention_s,
        False,
    ),
    (
        "settle",
        lambda v: {"target": {"reconcile": {**RECONCILE, "settle": v}}},
        "targets.pay.reconcile.settle",
        lambda c: c.targets["pay"].reconcile.settle,
        True,
    ),
    (
        "ttl",
        lambda v: {"target": {"approval": {"ttl": v}}},
        "targets.pay.approval.ttl",
        lambda c: c.targets["pay"].approval.ttl,
        False,
    ),
    (
        "wait",
        lambda v: {"target": {"approval": {"ttl": "7d", "wait": v}}},
        "targets.pay.approval.wait",
        lambda c: c.targets["pay"].approval.wait,
        True,
    ),
]


def _load(tmp_path: Path, parts: dict[str, Any]) -> Config:
    target = http_target("http://127.0.0.1:9", **parts.get("target", {}))
    table = {
        "journal": {"path": str(tmp_path / "j.db"), **parts.get("journal", {})},
        "service": {"operator_uids": [0], **parts.get("service", {})},
        "targets": {"pay": target},
    }
    return config_from_dict(table, base_dir=tmp_path)


@pytest.mark.parametrize(("name", "place", "path", "read", "zero"), ROWS, ids=[r[0] for r in ROWS])
def test_a_duration_setting_reads_one_way_and_names_its_path(
    tmp_path: Path,
    name: str,
    place: Callable[[Any], dict[str, Any]],
    path: str,
    read: Callable[[Config], float],
    zero: bool,
) -> None:
    assert read(_load(tmp_path, place("50m30s"))) == 3030.0
    assert read(_load(tmp_path, place(45))) == 45.0
    refusals = [("soon", 'must be a duration like "24h"'), (True, "must be a duration")]
    refusals.append(("-1s", "must be a duration"))
    if zero:
        assert read(_load(tmp_path, place("0s"))) == 0.0
        refusals.append((-1, "must not be negative"))
    else:
        refusals.append(("0s", "must be a positive duration"))
    refusals.append(("36501d", "must be at most 100 years"))
    for value, words in refusals:
        with pytest.raises(ConfigError) as info:
            _load(tmp_path, place(value))
        assert (info.value.code, info.value.field) == ("CONFIG_INVALID", path), value
        assert words in info.value.message, (value, info.value.message)


def test_reconnect_is_at_most_max_reconnect(tmp_path: Path) -> None:
    """A client bounds a journal read by ``bounds.MAX_RECONNECT`` (``wire.read_wait``): a
    broker may not be told to wait out a lost database longer than that."""
    assert _load(tmp_path, {"journal": {"reconnect": "1h"}}).journal.reconnect == 3600.0
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, {"journal": {"reconnect": "3601s"}})
    assert (info.value.code, info.value.field) == ("CONFIG_INVALID", "journal.reconnect")
    assert "at most 3600 seconds" in info.value.message
