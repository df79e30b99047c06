"""The ``operations`` and ``batch`` settings of an HTTP target (docs/configuration.md): their
selectors and lists are validated at load time, and every mistake is a ``ConfigError`` naming
the setting to fix -- an operation or a batch read from the wrong place would be tracked on a
guess."""

from __future__ import annotations

from pathlib import Path

import pytest

from affidavit.protocols.http.selectors import Selector, pointer

from .test_config import BASE, error, load

IDEM = 'idempotency = { header = "Idempotency-Key", scope = "payments.create", retention = "24h" }'


def _with(setting: str, methods: str = '["GET", "POST"]') -> str:
    text = BASE.replace(IDEM, IDEM + "\n" + setting)
    return text.replace('methods = ["GET", "POST"]', f"methods = {methods}")


def test_operations_and_batch_load_with_their_defaults(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        _with('operations = {}\nbatch = { items = "json:/results", item_status = "json:/status" }'),
    )
    ops = config.targets["billing"].operations
    assert (ops.id, ops.status_url, ops.status) == (
        Selector("json", "/id"),
        Selector("header", "Location"),
        Selector("json", "/status"),
    )
    assert (ops.succeeded, ops.failed) == (frozenset({"succeeded"}), frozenset({"failed"}))
    batch = config.targets["billing"].batch
    assert batch.request_items == batch.items == Selector("json", "/results")
    assert (batch.item_id, batch.ok, batch.rejected, batch.atomic) == (
        None,
        (200, 201, 202, 204),
        (),
        False,
    )
    assert config.targets["deploy"].kind == "ssh"


@pytest.mark.parametrize(
    ("setting", "field", "message"),
    [
        ('operations = { id = "json:id" }', "operations.id", 'starts with "/"'),
        ('operations = { id = "json:/a~2b" }', "operations.id", "followed by 0 or 1"),
        ('operations = { status_url = "xml:/a" }', "operations.status_url", "json:/POINTER"),
        ('operations = { status_url = "header:Bad Name" }', "operations.status_url", "header"),
        ('operations = { status = "" }', "operations.status", "must not be empty"),
        ("operations = { succeeded = [] }", "operations.succeeded", "at least one"),
        ('operations = { failed = ["succeeded"] }', "operations.failed", "also mean succeeded"),
        ('operations = { every = "1m" }', "operations.every", "unknown setting"),
        ("operations = 5", "operations", "must be a table"),
        ('batch = { item_status = "json:/s" }', "batch.items", "is required"),
        ('batch = { items = "json:/r" }', "batch.item_status", "is required"),
        ('batch = { items = "header:X", item_status = "json:/s" }', "batch.items", "json:/"),
        ('batch = { items = "json:/r", item_status = "json:s" }', "batch.item_status", '"/"'),
        ('batch = { items = "json:/r", item_status = "json:/s", ok = [true] }', "batch.ok[0]", ""),
        ('batch = { items = "json:/r", item_status = "json:/s", ok = 200 }', "batch.ok", "array"),
        (
            'batch = { items = "json:/r", item_status = "json:/s", rejected = [409, 200] }',
            "batch.rejected",
            "also mean ok: 200",
        ),
        (
            'batch = { items = "json:/r", item_status = "json:/s", atomic = "yes" }',
            "batch.atomic",
            "",
        ),
        (
            'batch = { items = "json:/r", item_status = "json:/s", request_items = "json:r" }',
            "batch.request_items",
            '"/"',
        ),
    ],
)
def test_a_bad_selector_or_list_names_the_setting_to_fix(
    tmp_path: Path, setting: str, field: str, message: str
) -> None:
    err = error(tmp_path, _with(setting))
    assert err.field == f"targets.billing.{field}", err
    assert message in err.message


def test_operations_need_get_to_query_the_status_resource(tmp_path: Path) -> None:
    err = error(tmp_path, _with("operations = {}", methods='["POST"]'))
    assert err.field == "targets.billing.operations"
    assert "GET" in err.message


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("", ()), ("/", ("",)), ("/a/0", ("a", "0")), ("/a~1b/c~0d", ("a/b", "c~d"))],
)
def test_json_pointers_follow_rfc_6901(text: str, tokens: tuple[str, ...]) -> None:
    assert pointer(text) == tokens
