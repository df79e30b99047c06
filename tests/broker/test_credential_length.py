"""What a caller reads never depends on the credential's length.

The project keeps a secret's length out of every record a caller reads (a ``file:``
credential's version is not its size: ``affidavit.secrets.credentials.resolve``).  The request
head's size is the caller's own bytes plus the injected credential: recorded, the credential's
length is one subtraction away.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.statemachine import EventKind
from affidavit.views.records import record_view
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import assert_ok, http_target, open_broker, write_config


def _numbers(value: Any, path: str = "") -> dict[str, Any]:
    """Every number in a protocol summary's facts, by its path."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_numbers(v, f"{path}.{k}"))
        return out
    if isinstance(value, list):
        out = {}
        for i, v in enumerate(value):
            out.update(_numbers(v, f"{path}[{i}]"))
        return out
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {path: value}
    return {}


@pytest.mark.parametrize("inject", ["bearer", "basic", "header:X-Api-Key", "query:api_key"])
async def test_the_protocol_facts_a_caller_reads_do_not_measure_the_credential(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inject: str
) -> None:
    monkeypatch.setenv("SHORT_SECRET", "svc:s3cret")
    monkeypatch.setenv("LONG_SECRET", "svc:" + "L" * 41)
    # One server each: both calls open a connection (a reused one records other facts).
    async with (
        HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as one,
        HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as other,
    ):
        targets = {
            "short": http_target(one.url, credential="env:SHORT_SECRET", inject=inject),
            "long": http_target(other.url, credential="env:LONG_SECRET", inject=inject),
        }
        cfg = write_config(tmp_path, targets)
        facts: dict[str, dict[str, Any]] = {}
        async with open_broker(cfg) as broker:
            for name in targets:
                with trio.fail_after(20):
                    env = await broker.call({"target": name, "method": "GET", "path": "/p"})
                rec = assert_ok(broker, env)
                view = record_view(rec, broker.events(env["invocation_id"]))
                kind = EventKind.PROTOCOL_OBSERVED.value
                observed = [e["attrs"]["facts"] for e in view["events"] if e["kind"] == kind]
                assert observed
                facts[name] = _numbers(observed)
    # Sent (the injected values differ in length by 35 bytes), and measured nowhere:
    assert len(one.requests) == len(other.requests) == 1
    assert facts["short"] == facts["long"]
