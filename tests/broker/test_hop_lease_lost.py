"""A redirect's next-hop gate checks a retry's lease in the appending transaction; when it
ran out, the journal writes LEASE_LOST there (``journal/leases.py``, ``check_lease``).  The
worker had sent its first hop, and the durable LEASE_LOST says so (``after_dispatch``), as the
engine's own LEASE_LOST after a dispatch does: the record must not read as a worker stopped
before it sent anything.  Both backends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer

from .helpers import GateStall
from .test_stale_worker_after_dispatch import HOP, LIMIT, _Ahead, _brokers, _redirecting

E = EventKind


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_a_lease_lost_at_a_redirect_s_next_hop_is_recorded_after_dispatch(
    tmp_path: Path,
    token: str,
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
    request: pytest.FixtureRequest,
) -> None:
    async with (
        HostileServer.running(_redirecting("drop")) as srv,
        _brokers(tmp_path, srv.url, backend, request, follow_redirects=True) as (a, _b),
    ):
        first = await a.call(HOP)
        assert first["error"]["outcome"] == "unknown", first
        iid = first["invocation_id"]
        stall = GateStall(a._engine.bindings["http"], hop=2, limit=LIMIT / 2)
        a._engine.bindings["http"] = stall
        out: dict[str, Any] = {}

        async def retry() -> None:
            out["a"] = await a.call(HOP)

        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(retry)
                await stall.stopped.wait()  # the retry's first hop was sent and answered 307
                monkeypatch.setattr(a.journal, "_clock", _Ahead.time)  # its lease ran out
                stall.resume.set()
        events = a.events(iid)
    assert [r.target for r in srv.requests] == ["/v1/x", "/v1/x"]
    assert out["a"]["error"]["code"] == "LEASE_LOST"
    assert "it had dispatched" in out["a"]["error"]["message"]  # the envelope knows it
    (lost,) = [e for e in events if e.kind is E.LEASE_LOST]
    # ... and so should the durable record, as for every other LEASE_LOST after a dispatch.
    assert lost.attrs.get("after_dispatch") is True, dict(lost.attrs)
