"""An idempotency key's retention on a shared PostgreSQL journal is recorded and judged in the
database's time (docs/journal.md, "Clocks"): ``operation.idempotency.expires_at`` in
ACTION_ACCEPTED is moved into that time by its writer, and a same-key retry's lease is refused
(``KeyRetentionPassed``, nothing written) once the key is past its retention by the database's
clock -- whatever the clock of the broker asking.  Judged by a broker's own clock, one running
behind resent a key the remote had already forgotten: the remote applies it as new."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from affidavit.journal import Journal, JournalReader, KeyRetentionPassed, SigningKey
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E

from .helpers import FINGERPRINT, interrupted

SKEW = 3600.0


def _behind() -> float:
    return time.time() - SKEW


def _ahead() -> float:
    return time.time() + SKEW


def _keys(tmp: Path, name: str) -> dict[str, Path]:
    return {"key_file": tmp / "shared.key", "signing_key": tmp / f"{name}.signing.key"}


def _unknown(iid: str, key_expires_at: float) -> list[Event]:
    """Dispatched, connection dropped: unknown, with a remote-deduplicated key expiring at
    ``key_expires_at`` (by its writer's clock, as the engine writes it)."""
    first, *rest = interrupted(iid)
    operation = dict(first.attrs["operation"])
    operation["idempotency"] = {
        "key": "k-" + iid,
        "scope": "payments.create",
        "remote_contract": "http",
        "expires_at": key_expires_at,
    }
    return [Event(first.kind, iid, {**first.attrs, "operation": operation}), *rest]


async def _record_unknown(j: Journal, iid: str, key_expires_at: float) -> None:
    """Bind the key (as the engine does first), then record ``_unknown``."""
    await j.bind_idempotency("payments.create", "k-" + iid, FINGERPRINT, iid, key_expires_at)
    for ev in _unknown(iid, key_expires_at):
        await j.append(ev)


def _key_expiry(j: Journal, iid: str) -> float:
    (accepted,) = [e for e in j.events(iid) if e.kind is E.ACTION_ACCEPTED]
    return float(accepted.attrs["operation"]["idempotency"]["expires_at"])


async def test_a_clock_ahead_records_the_key_expiry_in_database_time(
    pg_url: str, tmp_path: Path
) -> None:
    async with Journal.open(pg_url, clock=_ahead, **_keys(tmp_path, "a")) as a:
        # Ten minutes' retention, by A's clock.
        await _record_unknown(a, "inv-1", _ahead() + 600)
        # The same instant in the database's time -- not an hour later, as A's clock wrote it.
        assert time.time() + 590 < _key_expiry(a, "inv-1") < time.time() + 601
        record = a.record("inv-1", now=time.time())
        assert record is not None and record.retry == "same_idempotency_key"
    # The moved expiry is what was hashed and signed: the chain verifies with A's key.
    with JournalReader.open(pg_url) as r:
        public = SigningKey.load(tmp_path / "a.signing.key").public_raw
        report = r.verify(public_keys=[public])
        assert report.ok, report.reason


async def test_a_same_key_retry_is_judged_by_the_database_clock(
    pg_url: str, tmp_path: Path
) -> None:
    async with (
        Journal.open(pg_url, **_keys(tmp_path, "b")) as b,
        Journal.open(pg_url, clock=_behind, **_keys(tmp_path, "behind")) as behind,
        Journal.open(pg_url, clock=_ahead, **_keys(tmp_path, "ahead")) as ahead,
    ):
        # Bound by B (the database's time): 30 s left, within the 60 s margin -- past use.
        await _record_unknown(b, "inv-old", time.time() + 30)
        # An hour behind, its own clock says the key has an hour to go: refused, no lease.
        with pytest.raises(KeyRetentionPassed) as caught:
            await behind.acquire_lease("inv-old", "broker-behind", ttl=60, same_key=True)
        assert abs(caught.value.now - time.time()) < 5  # the database's clock, not its own
        kinds = [e.kind for e in b.events("inv-old")]
        assert E.RETRY_LEASE_ACQUIRED not in kinds, kinds
        # Ten minutes left: an hour ahead, its own clock says gone -- the journal says not.
        await _record_unknown(b, "inv-live", time.time() + 600)
        lease = await ahead.acquire_lease("inv-live", "broker-ahead", ttl=60, same_key=True)
        assert lease.generation == 1


async def test_the_binding_row_records_the_key_expiry_in_database_time(
    pg_url: str, tmp_path: Path
) -> None:
    # The binding row's ``expires_at`` is the key's retention as the event's is: the same
    # instant in the database's time, never an hour late because A's clock runs ahead -- an
    # operator or auditor reading the row would take the key as retained an hour too long.
    async with Journal.open(pg_url, clock=_ahead, **_keys(tmp_path, "a")) as a:
        await _record_unknown(a, "inv-1", _ahead() + 600)
        bound = await a.bind_idempotency("payments.create", "k-inv-1", FINGERPRINT, "inv-1", 0.0)
        in_event = _key_expiry(a, "inv-1")
    with JournalReader.open(pg_url) as r:
        row = r.find_idempotency("payments.create", "k-inv-1")
    assert row is not None and row.expires_at is not None
    assert bound == row  # the first binding, as stored: a second bind returns it unchanged
    assert time.time() + 590 < row.expires_at < time.time() + 601
    assert abs(row.expires_at - in_event) < 5  # the event's instant
