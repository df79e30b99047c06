"""A hung CA file pins one thread, of the file threads' own limiter -- never trio's default one
(adapters/filethread.py).

Each call that gave up on a stat or read hung on a network mount used to leave its worker
thread running, holding a token of trio's default thread limiter (40) until the mount answered:
41 of them, and another target's resolve on a healthy file waited, and so did every other
thread hop in the process (the dispatch gate's config re-read, the MCP transport's large lines,
the daemon's journal reads).  Now at most one thread per path is in flight, from a limiter of
its own: 41 calls on a hung path, each giving up at its deadline, have entered the hung read
once; an unrelated path resolves promptly and ``trio.to_thread.run_sync`` still runs.  The hang
is released at the end (bounded: ``HANG``), and a call waiting then gets the hung read's answer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
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

CALLS = 41
DEADLINE = 0.2
PROMPT = 2.0
"""What an unrelated path's resolve, or a default-limiter hop, may take: far below a hung one."""
HANG = 20.0
"""How long the hung path blocks at most (released at the test's end)."""


def _ca(tmp_path: Path, name: str) -> str:
    (tmp_path / name).mkdir()
    return make_tls(tmp_path / name).ca_file


class Hang:
    """``module.name`` blocks while called on ``path`` until ``release`` (or ``HANG``);
    ``entered`` counts the threads it holds."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.release = threading.Event()
        self.entered = 0
        self._count = threading.Lock()

    def on(self, module: Any, name: str, path: str) -> None:
        real = getattr(module, name)

        def hanging(p: Any, *args: Any) -> Any:
            if str(p) == path:
                with self._count:
                    self.entered += 1
                self.release.wait(HANG)
            return real(p, *args)

        self.monkeypatch.setattr(module, name, hanging)


@pytest.fixture
def hang(monkeypatch: pytest.MonkeyPatch) -> Iterator[Hang]:
    h = Hang(monkeypatch)
    try:
        yield h
    finally:
        h.release.set()


async def _give_up_many(use: Callable[[], Any]) -> None:
    """``CALLS`` calls of ``use()`` at once, each giving up at ``DEADLINE``."""
    gave_up: list[bool] = []

    async def one() -> None:
        with trio.move_on_after(DEADLINE) as scope:
            await use()
        gave_up.append(scope.cancelled_caught)

    with trio.fail_after(DEADLINE + PROMPT):
        async with trio.open_nursery() as nursery:
            for _ in range(CALLS):
                nursery.start_soon(one)
    assert gave_up == [True] * CALLS


async def _others_run_promptly(use: Callable[[], Any]) -> None:
    with trio.fail_after(PROMPT):
        await use()
    with trio.fail_after(PROMPT):
        assert await trio.to_thread.run_sync(lambda: "hop") == "hop"


async def test_calls_that_gave_up_on_a_hung_ca_file_pin_one_thread_of_their_own(
    tmp_path: Path, hang: Hang
) -> None:
    hung, healthy = _ca(tmp_path, "hung"), _ca(tmp_path, "healthy")
    hang.on(http_trust, "read_regular", hung)
    store = http_trust.TrustStore()
    await _give_up_many(lambda: store.resolve(hung))
    assert hang.entered == 1, f"{hang.entered} threads entered the hung read"
    await _others_run_promptly(lambda: store.resolve(healthy))
    # A later caller waits for that one read (no second thread) and gets its answer.
    async with trio.open_nursery() as nursery:
        got: list[Any] = []

        async def late() -> None:
            got.append(await store.resolve(hung))

        nursery.start_soon(late)
        await trio.sleep(DEADLINE)
        assert hang.entered == 1 and got == []
        hang.release.set()
    assert got[0].ca_sha256 is not None and hang.entered == 1


async def test_accounts_that_gave_up_on_a_hung_ca_file_pin_one_thread_of_their_own(
    tmp_path: Path, hang: Hang, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for the account a call records (``ConfigSnapshot.account_hash_async``), its
    file's last read settled -- the steady state, where only its stat is made -- and for the
    TLS trust of the same file: one thread for the path, whichever asked."""
    monkeypatch.setattr(engine_snapshot, "SETTLED_NS", -(10**18))  # every read settled
    hung, healthy = _ca(tmp_path, "hung"), _ca(tmp_path, "healthy")
    cfg = load_config(
        write_config(
            tmp_path,
            {
                "hung": http_target("https://127.0.0.1:8443", ca_file=hung),
                "healthy": http_target("https://127.0.0.1:8444", ca_file=healthy),
            },
        )
    )
    snap = ConfigSnapshot(cfg, lambda label, data: label + data.hex())
    await snap.account_hash_async(cfg.targets["hung"])  # read and kept, settled
    hang.on(engine_snapshot, "_stat_key", hung)
    hang.on(http_trust, "read_regular", hung)
    store = http_trust.TrustStore()
    await _give_up_many(lambda: snap.account_hash_async(cfg.targets["hung"]))
    await _give_up_many(lambda: store.resolve(hung))
    assert hang.entered == 1, f"{hang.entered} threads entered the hung stat or read"
    await _others_run_promptly(lambda: snap.account_hash_async(cfg.targets["healthy"]))
