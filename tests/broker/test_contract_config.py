"""The ``operations`` and ``batch`` settings of an HTTP target (docs/configuration.md): their
selectors and lists are validated at load time, and every mistake is a ``ConfigError`` naming
the setting to fix -- an operation or a batch read from the wrong place would be tracked on a
guess."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from affidavit.adapters.base import RemoteResult
from affidavit.protocols.http.operations import poll_action, poll_state, read_operation
from affidavit.protocols.http.selectors import Selector, pointer
from affidavit.statemachine import Outcome

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


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (200, b'{"status": "succeeded"}', ("succeeded", "succeeded")),
        (200, b'{"status": "failed"}', ("failed", "failed")),
        (200, b'{"status": "running"}', ("pending", "running")),
        (200, b'{"status": 7}', ("pending", 7)),
        (200, b'{"status": null}', (None, None)),
        (200, b"not json", (None, None)),
        (303, b'{"status": "succeeded"}', (None, None)),  # only a 2xx names a state
        (204, b"", (None, None)),
    ],
)
def test_a_status_answer_names_a_state_only_from_its_status_value(
    tmp_path: Path, status: int, body: bytes, expected: tuple[Any, Any]
) -> None:
    target = load(tmp_path, _with("operations = {}")).targets["billing"]
    assert poll_state(target, {"status": status, "headers": []}, body) == expected


@pytest.mark.parametrize(
    ("location", "status_url", "status_path"),
    [
        ("/v2/jobs/j1", "https://billing.example.com/v2/jobs/j1", "/jobs/j1"),
        ("jobs/j1?full=1", "https://billing.example.com/v2/jobs/j1?full=1", "/jobs/j1?full=1"),
        ("https://billing.example.com:443/v2/j#x", "https://billing.example.com:443/v2/j", "/j"),
        ("/other/jobs/j1", "https://billing.example.com/other/jobs/j1", None),  # off base path
        ("https://evil.example/v2/jobs/j1", "https://evil.example/v2/jobs/j1", None),
        ("http://billing.example.com/v2/j", "http://billing.example.com/v2/j", None),  # scheme
        ("ftp://x/y", None, None),
    ],
)
def test_a_status_resource_is_queried_only_on_the_targets_origin_and_base_path(
    tmp_path: Path, location: str, status_url: str | None, status_path: str | None
) -> None:
    text = _with("operations = {}").replace(
        'url = "https://billing.example.com"', 'url = "https://billing.example.com/v2"'
    )
    target = load(tmp_path, text).targets["billing"]
    action = SimpleNamespace(path="/jobs", body=b"")
    result = RemoteResult(
        Outcome.COMMITTED, None, summary={"status": 202, "headers": [["Location", location]]}
    )
    read = read_operation(action, target, result, b'{"id": "j1"}')
    assert read == {"job_id": "j1", "status_url": status_url, "status_path": status_path}
    op = {**read, "id": "op_1"}
    if status_path is None:
        with pytest.raises(ValueError, match="reconcile the job by hand"):
            poll_action(target, op)
    else:
        assert poll_action(target, op) == {
            "target": "billing",
            "method": "GET",
            "path": status_path,
        }
