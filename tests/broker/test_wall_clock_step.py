"""A wall clock stepped forward while an attempt is in flight closes nothing of it: a same-key call
is told IN_PROGRESS, and the request is sent once.

Seed, "Idempotency is defined by the remote contract": "allow only one active attempt".  On a
SQLite journal a lease's expiry is judged by the wall clock, while the attempt's own deadline is
trio's monotonic clock: stepped +120 s (an NTP correction, an operator's ``date``) while A's POST
was in flight, a same-key caller found A's lease "run out", closed A's attempt (interrupted,
unknown) and -- as ``decide()`` allows for a verified deduplication contract -- sent a second
POST overlapping the first.  An attempt its own broker is running is live whatever a clock says
(``Recorder.running``); for another broker process on the host, a lease taken on this boot is
judged by the boot clock too (``CLOCK_BOOTTIME``, which does not step: ``journal/boot.py``).

The wall clock is monkeypatched (``time.time``), the step a real one would make; the boot clock
(``_boot_now`` in ``journal/boot.py``) and the boot id only where a case says so.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.journal import boot
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Peer, Reply

from .helpers import event_kinds, http_target, open_broker, write_config
from .http_rows import IDEM, LIMIT, POST

E = EventKind
STEP = 120.0  # seconds the wall clock jumps: past A's lease (its timeout + lease_margin)
ACTION = {**POST, "idempotency_key": "clock-step"}


async def _held(peer: Peer) -> None:
    """Every request is held until the test sets ``release``."""
    if await peer.read_request() is None:
        return
    peer.server.event(f"received-{peer.index}").set()
    await peer.server.event("release").wait()
    await peer.respond(Reply(201, body=b'{"payment":"pay_1"}'))


async def test_a_stepped_wall_clock_never_closes_an_attempt_its_broker_runs(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No boot clock to judge by (as on a host without one): only ``Recorder.running`` can
    # keep A's attempt open, so this proves it, not the boot-clock check beside it.
    monkeypatch.setattr(boot, "_boot_id", lambda: None)
    async with HostileServer.running(_held) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, idempotency=IDEM)})
        async with open_broker(cfg) as broker:
            envs: dict[str, Any] = {}

            async def call(name: str) -> None:
                envs[name] = await broker.call(ACTION, timeout=5)

            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(call, "a")
                    await srv.event("received-0").wait()  # A's POST is in flight
                    real = time.time
                    monkeypatch.setattr(time, "time", lambda: real() + STEP)
                    await call("b")  # the same key, while A runs
                    srv.event("release").set()
            monkeypatch.undo()
            b = envs["b"]
            assert b["error"]["code"] == "IN_PROGRESS", b
            assert b["error"]["retry"] == "fetch_result", b
            a = envs["a"]
            assert "error" not in a, a  # A's attempt was not closed under it
            iid = a["invocation_id"]
            assert b["invocation_id"] == iid
            kinds = event_kinds(broker, iid)
            assert E.ATTEMPT_INTERRUPTED not in kinds and E.RETRY_LEASE_ACQUIRED not in kinds
            (accepted,) = [e for e in broker.events(iid) if e.kind is E.ACTION_ACCEPTED]
            assert accepted.attrs.get("lease_boot") is None  # no boot clock kept it open
        assert len(srv.requests) == 1  # one POST


CASES = {
    # wall clock stepped, the boot clock not: A's lease runs on -- IN_PROGRESS, one POST
    "stepped": False,
    # the lease really ran out (both clocks moved): B closes A's attempt and retries
    "lapsed": True,
    # the lease was taken on another boot (or host): only the wall clock can judge it
    "other_boot": True,
}


@pytest.mark.parametrize("case", CASES)
async def test_another_broker_on_the_host_judges_a_lease_by_the_boot_clock(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """B is a second broker on the same journal (another process on the host, as far as A's
    attempts go): it knows nothing of A's running attempt, only its recorded lease."""
    async with HostileServer.running(_held) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, idempotency=IDEM)})
        async with open_broker(cfg) as a, open_broker(cfg) as b:
            envs: dict[str, Any] = {}

            async def call(name: str, broker: Broker) -> None:
                envs[name] = await broker.call(ACTION, timeout=5)

            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(call, "a", a)
                    await srv.event("received-0").wait()  # A's POST is in flight
                    real = time.time
                    monkeypatch.setattr(time, "time", lambda: real() + STEP)
                    if case == "lapsed":
                        boot_now = boot._boot_now
                        later = boot_now()
                        assert later is not None
                        monkeypatch.setattr(boot, "_boot_now", lambda: later + STEP)
                    elif case == "other_boot":
                        monkeypatch.setattr(boot, "_boot_id", lambda: "another-boot")
                    nursery.start_soon(call, "b", b)
                    if CASES[case]:
                        await srv.event("received-1").wait()  # B's retry is in flight
                    else:
                        while "b" not in envs:
                            await trio.sleep(0.01)
                    srv.event("release").set()
            monkeypatch.undo()
            iid = envs["a"]["invocation_id"]
            kinds = event_kinds(b, iid)
            # The key's binding by the boot clock too (``key_moment``): a wall clock stepped
            # back later cannot make it look younger (tests/journal/test_key_clock_step.py).
            accepted = next(e for e in b.events(iid) if e.kind is E.ACTION_ACCEPTED)
            mark = accepted.attrs["operation"]["idempotency"]["boot"]
            assert mark["id"] == boot._boot_id() and isinstance(mark["at"], float)
            closes = [e for e in b.events(iid) if e.kind is E.ATTEMPT_INTERRUPTED]
        if not CASES[case]:
            assert envs["b"]["error"]["code"] == "IN_PROGRESS", envs["b"]
            assert "error" not in envs["a"], envs["a"]
            assert E.ATTEMPT_INTERRUPTED not in kinds
            assert len(srv.requests) == 1
        else:
            assert E.ATTEMPT_INTERRUPTED in kinds and E.RETRY_LEASE_ACQUIRED in kinds
            # Recovery's close carries its moment by the boot clock: a reconciliation's settle
            # window is measured from it (tests/broker/test_settle_clock_step.py).
            assert closes and all(isinstance(e.attrs.get("boot"), dict) for e in closes)
            assert len(srv.requests) == 2
