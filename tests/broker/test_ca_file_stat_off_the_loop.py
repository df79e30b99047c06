"""The stat that says whether a CA file moved runs in the same abandonable worker thread as its
read, never on the event loop: a stat on a hung network mount blocks like a read, and on the
loop it stalled every call the broker was making, and held this one past its deadline.

``TrustStore.resolve`` (the handshake's trust), ``ConfigSnapshot.account_hash_async`` (the
account a call records) and ``ConfigSnapshot.trusted`` (the bytes a call pins), each with the
file's last read settled -- the steady state, where only a stat is made: the stat is made to
hang (until released, at most ``HANG`` seconds); another task on the loop keeps ticking, and
the call gives up at its caller's deadline.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import affidavit.adapters.http.trust as http_trust
import affidavit.engine.snapshot as engine_snapshot
from affidavit.config import load_config
from affidavit.engine.snapshot import ConfigSnapshot
from tests.http.hostile import make_tls

from .helpers import http_target, write_config

DEADLINE = 0.3
HANG = 3.0
"""How long the stat hangs at most (released at the test's end): far past ``DEADLINE``."""
TICK = 0.01


@pytest.fixture
def hung_stat(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Any], None]]:
    """``hang(module)``: that module's ``stat_key`` blocks until the test ends (or ``HANG``)."""
    release = threading.Event()
    monkeypatch.setattr(http_trust, "SETTLED_NS", -(10**18))  # every read settled: only a stat
    monkeypatch.setattr(engine_snapshot, "SETTLED_NS", -(10**18))

    def hang(module: Any) -> None:
        name = "stat_key" if module is http_trust else "_stat_key"
        real = getattr(module, name)

        def hanging(path: Any) -> Any:
            release.wait(HANG)
            return real(path)

        monkeypatch.setattr(module, name, hanging)

    try:
        yield hang
    finally:
        release.set()


async def _gives_up_while_the_loop_runs(use: Callable[[], Awaitable[Any]]) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(TICK)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        began = trio.current_time()
        with trio.move_on_after(DEADLINE) as scope:
            await use()
        took = trio.current_time() - began
        nursery.cancel_scope.cancel()
    assert scope.cancelled_caught, "the call did not wait on the hung stat"
    assert took < DEADLINE + 1.0, f"the call held {took:.2f} s past a {DEADLINE} s deadline"
    assert ticks >= (DEADLINE / TICK) / 3, f"the loop ran {ticks} ticks in {took:.2f} s"


async def test_the_handshakes_trust_stats_its_ca_file_off_the_loop(
    tmp_path: Path, hung_stat: Callable[[Any], None]
) -> None:
    ca_file = make_tls(tmp_path).ca_file
    store = http_trust.TrustStore()
    kept = await store.resolve(ca_file)  # read and kept, settled
    assert await store.resolve(ca_file) is kept
    hung_stat(http_trust)
    await _gives_up_while_the_loop_runs(lambda: store.resolve(ca_file))


@pytest.mark.parametrize("use", ["account_hash_async", "trusted"])
async def test_the_recorded_account_stats_its_ca_file_off_the_loop(
    tmp_path: Path, hung_stat: Callable[[Any], None], use: str
) -> None:
    ca_file = make_tls(tmp_path).ca_file
    cfg = load_config(
        write_config(tmp_path, {"api": http_target("https://127.0.0.1:8443", ca_file=ca_file)})
    )
    target = cfg.targets["api"]
    snap = ConfigSnapshot(cfg, lambda label, data: label + data.hex())
    first = await snap.account_hash_async(target)  # read and kept, settled
    assert await snap.account_hash_async(target) == first
    hung_stat(engine_snapshot)
    if use == "trusted":
        await _gives_up_while_the_loop_runs(lambda: snap.trusted(target, None))
    else:
        await _gives_up_while_the_loop_runs(lambda: snap.account_hash_async(target))
