"""The engine's own numbers are per broker (``Broker.open(settings=EngineSettings(...))``), not
module globals: the lease a call records is its total timeout plus *this* broker's margin
(design notes, "Leases for the first attempt"), and a nonsensical value is refused when the
settings are made, before any broker uses them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import trio

from affidavit.api import Broker
from affidavit.config import load_config
from affidavit.engine import EngineSettings
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import assert_ok, http_target, write_config

GET = {"target": "api", "method": "GET", "path": "/thing"}
TOTAL = 5  # http_target's total timeout


@pytest.mark.parametrize("margin", [0.0, 7.0, EngineSettings().lease_margin])
async def test_the_recorded_lease_is_the_total_timeout_plus_this_brokers_margin(
    tmp_path: Path, token: str, margin: float
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        settings = EngineSettings(lease_margin=margin)
        async with Broker.open(config=load_config(cfg), settings=settings) as broker:
            with trio.fail_after(10):
                env = await broker.call(GET)
            assert_ok(broker, env)
            accepted = broker.events(env["invocation_id"])[0]
    assert accepted.kind is EventKind.ACTION_ACCEPTED and accepted.at is not None
    # Computed when the call started, a moment before the row was stamped.
    held = accepted.attrs["lease_expires_at"] - accepted.at
    assert TOTAL + margin - 1.0 < held <= TOTAL + margin


def test_the_shipped_defaults() -> None:
    assert EngineSettings() == EngineSettings(lease_margin=30.0, inline_result_limit=1024 * 1024)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lease_margin": -1.0},
        {"lease_margin": math.nan},
        {"lease_margin": math.inf},
        {"inline_result_limit": -1},
        {"inline_result_limit": 1.5},
        {"inline_result_limit": True},
    ],
)
def test_nonsensical_settings_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        EngineSettings(**kwargs)  # type: ignore[arg-type]
