"""A same-key retry on a shared PostgreSQL journal, decided by a broker whose clock disagrees
with the database's: the key's retention is recorded and judged in the database's time
(docs/journal.md, "Clocks").

The key is bound while the broker's clock is right (as a broker with a synchronised clock
binds it), then the broker's clock is moved an hour -- as another broker, on a skewed host,
would read the same record.  Judged by its own clock, a broker an hour behind resent a key the
remote had already forgotten (the remote applies it as new: a double charge), and a broker an
hour ahead refused a retry still well within retention.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import affidavit.engine.approval as approval
import affidavit.engine.attempt as attempt
import affidavit.engine.invocation as invocation
import affidavit.engine.recovery as recovery
from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.journal import JournalWriteError
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E
from tests.http.hostile import HostileServer, Peer, Reply, Script

from .helpers import http_target, write_config
from .http_rows import IDEM

LIMIT = 30  # seconds: the bound on each scenario
HOUR = 3600.0
CHARGE = {"target": "api", "method": "POST", "path": "/v1/x", "idempotency_key": "charge"}


class _Clock:
    """The broker's host clock: ``skew`` seconds off the database's."""

    skew = 0.0

    @classmethod
    def time(cls) -> float:
        return time.time() + cls.skew


def _dropping_first() -> tuple[Script, list[str]]:
    """``POST /v1/x``: the first closed unanswered (unknown outcome), each later one answered
    201.  The list collects every request the remote received."""
    received: list[str] = []

    async def script(peer: Peer) -> None:
        while True:
            req = await peer.read_request()
            if req is None:
                return
            received.append(req.target)
            if peer.index == 0:
                await peer.close()
                return
            await peer.respond(Reply(201, body=b'{"ok": true}'))

    return script, received


@asynccontextmanager
async def _broker(
    tmp: Path, url: str, pg_url: str, retention: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Broker]:
    _Clock.skew = 0.0
    target = http_target(url, idempotency={**IDEM, "retention": retention})
    journal = {"url": pg_url, "key_file": str(tmp / "k"), "signing_key": str(tmp / "a")}
    cfg = load_config(write_config(tmp, {"api": target}, journal=journal))
    async with Broker.open(config=cfg, holder="worker-A") as a:
        monkeypatch.setattr(a.journal._writer, "clock", _Clock.time)
        monkeypatch.setattr(a.journal, "_clock", _Clock.time)
        for module in (invocation, attempt, approval):
            monkeypatch.setattr(module, "time", _Clock)
        yield a


async def _unknown_then_retry(
    tmp: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch, retention: str, bind: float, at: float
) -> tuple[dict[str, Any], dict[str, Any], list[str], str]:
    """Bind and send ``CHARGE`` with the clock ``bind`` off (its outcome unknown), then call it
    again with the same key ``at`` off; the two answers, what the remote received and the
    hint the journal's actions view then shows (still ``at`` off)."""
    script, received = _dropping_first()
    async with (
        HostileServer.running(script) as srv,
        _broker(tmp, srv.url, pg_url, retention, monkeypatch) as a,
    ):
        with trio.fail_after(LIMIT):
            _Clock.skew = bind
            first = await a.call(CHARGE)
            _Clock.skew = at
            again = await a.call(CHARGE)
            (action,) = a.journal.list_actions()
    return first, again, received, action.retry.value


async def test_a_clock_behind_does_not_resend_a_key_past_retention(
    tmp_path: Path, pg_url: str, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 60 s retention is past use at once (the 60 s margin); by a clock an hour behind the
    # key still has an hour to go.
    first, again, received, shown = await _unknown_then_retry(
        tmp_path, pg_url, monkeypatch, "60s", 0.0, -HOUR
    )
    assert received == ["/v1/x"]  # sent once: never resent with a key the remote forgot
    assert first["error"]["outcome"] == "unknown", first
    assert again["error"]["outcome"] == "unknown", again
    assert again["error"]["retry"] == "reconcile", again
    assert shown == "reconcile"  # nor does a view invite the resend


async def test_a_clock_ahead_still_retries_within_retention(
    tmp_path: Path, pg_url: str, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An hour's retention: by a clock an hour ahead it is over, by the database's it has
    # almost an hour to go.
    first, again, received, _shown = await _unknown_then_retry(
        tmp_path, pg_url, monkeypatch, "1h", 0.0, HOUR
    )
    assert first["error"]["retry"] == "same_idempotency_key", first
    assert "error" not in again, again
    assert received == ["/v1/x", "/v1/x"]


async def test_a_key_bound_by_a_clock_ahead_expires_in_database_time(
    tmp_path: Path, pg_url: str, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Bound by a clock an hour ahead, a 60 s retention was recorded an hour late: a broker
    # with the right clock then resent a key the remote had forgotten.
    first, again, received, _shown = await _unknown_then_retry(
        tmp_path, pg_url, monkeypatch, "60s", HOUR, 0.0
    )
    assert first["error"]["outcome"] == "unknown", first
    assert again["error"]["retry"] == "reconcile", again
    assert received == ["/v1/x"]


async def test_a_retention_passing_before_the_lease_is_not_resent(
    tmp_path: Path, pg_url: str, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The decision's reading of the database's clock is stale (the key ran out between it and
    # the lease): the transaction taking the lease judges again, and nothing is sent.
    script, received = _dropping_first()
    async with (
        HostileServer.running(script) as srv,
        _broker(tmp_path, srv.url, pg_url, "60s", monkeypatch) as a,
    ):
        with trio.fail_after(LIMIT):
            first = await a.call(CHARGE)
            monkeypatch.setattr(a.journal, "database_now", lambda purpose=None: time.time() - HOUR)
            again = await a.call(CHARGE)
    assert first["error"]["outcome"] == "unknown", first
    assert again["error"]["retry"] == "reconcile", again
    assert received == ["/v1/x"]


async def test_a_call_the_journal_stopped_shows_its_hint_by_the_database_clock(
    tmp_path: Path, pg_url: str, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The journal refuses the retry's closing event (its answer is built from the durable
    # record: ``journal_refused``).  By the broker's clock, an hour ahead, the hour's retention
    # is over (reconcile); by the database's it has almost an hour to go: the hint every other
    # answer gives, and the lease transaction would allow.
    async def script(peer: Peer) -> None:  # every request closed unanswered: unknown
        if await peer.read_request() is not None:
            await peer.close()

    async with (
        HostileServer.running(script) as srv,
        _broker(tmp_path, srv.url, pg_url, "1h", monkeypatch) as a,
    ):
        with trio.fail_after(LIMIT):
            first = await a.call(CHARGE)  # bound by the right clock; dropped: unknown
            real_append = a.journal.append

            async def append(event: Event, **kw: Any) -> None:
                if event.kind is E.ATTEMPT_INTERRUPTED:
                    _Clock.skew = HOUR  # the retry's answer is built an hour ahead
                    raise JournalWriteError("journal: write not committed (injected)")
                await real_append(event, **kw)

            monkeypatch.setattr(a.journal, "append", append)
            monkeypatch.setattr(recovery, "time", _Clock)
            again = await a.call(CHARGE)
    assert first["error"]["retry"] == "same_idempotency_key", first
    assert again["error"]["outcome"] == "unknown", again
    assert again["error"]["retry"] == "same_idempotency_key", again
