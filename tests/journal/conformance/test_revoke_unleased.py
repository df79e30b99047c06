"""``Journal.append(unleased=True)`` -- how an operator's APPROVAL_REVOKED is written: only while
no live lease holds the invocation, judged in the writing transaction by the lease clock (the
database's on PostgreSQL), else ``LeaseBusy`` and nothing written -- on every backend."""

from __future__ import annotations

import pytest

from affidavit.journal import LeaseBusy
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E

from ..helpers import accepted
from .conftest import Place
from .test_leases import Clock, _stall

FP = "sha256:a990"


async def test_a_revoke_lands_only_once_no_live_dispatch_lease_holds_the_invocation(
    place: Place,
) -> None:
    clock = Clock()
    revoke = Event(E.APPROVAL_REVOKED, "inv-1", {"code": "APPROVAL_DENIED", "note": "no"})
    async with place.open(clock=clock) as j:
        for ev in [
            accepted("inv-1", budget=1),
            Event(E.PREFLIGHT_VALIDATED, "inv-1", {"config_hash": "sha256:c0ff"}),
            Event(E.APPROVAL_REQUESTED, "inv-1", {"fingerprint": FP, "expires_at": 2e9}),
            Event(E.APPROVAL_GRANTED, "inv-1", {"fingerprint": FP, "operator": {}}),
        ]:
            await j.append(ev)
        await j.acquire_lease("inv-1", "w1", ttl=10, kind=E.DISPATCH_LEASE_ACQUIRED)
        with pytest.raises(LeaseBusy):
            await j.append(revoke, barrier=True, unleased=True)
        assert [e.kind for e in j.events("inv-1")][-1] is E.DISPATCH_LEASE_ACQUIRED
        _stall(place, clock, 11)  # its holder stalled: its gate is refused from now on
        await j.append(revoke, barrier=True, unleased=True)
        record = j.record("inv-1")
        assert record is not None and record.state == "approval_denied"
