"""A same-key retry's lease and the hint that invited it agree on the key's send window.

ACTION_ACCEPTED records with the key's expiry the send window of a retry with the target's
default timeout (its lease, ``timeout.total + lease_margin``): the hint says
``same_idempotency_key`` only while a retry taken now could send within the key's retention
(less its margin), and ``acquire_op`` refuses a lease that could outlast it
(``KeyRetentionPassed``).  Judged at the lease's end with the window counted a second time, a
retry the hint had just invited was refused; a record written before the window was recorded
keeps the rule it was written under (the hint judges the key at the moment, the lease at its
end).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from affidavit.journal import Journal, KeyRetentionPassed, SessionSummary
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E
from affidavit.statemachine.retry import RETENTION_MARGIN_S
from affidavit.views import metrics_key

from .helpers import FINGERPRINT, interrupted

WINDOW = 130.0  # a target timeout of 100 s and lease_margin 30 s


async def _record_unknown(j: Journal, iid: str, left: float, window: float | None) -> None:
    """Unknown outcome, a remote-deduplicated key with ``left`` seconds of retention."""
    expires = time.time() + left
    await j.bind_idempotency("payments.create", "k-" + iid, FINGERPRINT, iid, expires)
    first, *rest = interrupted(iid)
    idem = {"key": "k-" + iid, "scope": "payments.create", "expires_at": expires}
    if window is not None:
        idem["send_window"] = window
    operation = {**first.attrs["operation"], "idempotency": idem}
    for ev in [Event(first.kind, iid, {**first.attrs, "operation": operation}), *rest]:
        await j.append(ev)


def _hint(j: Journal, iid: str) -> str:
    record = j.record(iid, now=time.time())
    assert record is not None
    return record.retry


async def test_a_retry_the_hint_invites_takes_its_lease(tmp_path: Path) -> None:
    async with Journal.open(tmp_path / "j.db") as j:
        # 20 s more than the margin and the window: a retry taken now ends its lease in time.
        await _record_unknown(j, "inv-1", RETENTION_MARGIN_S + WINDOW + 20, WINDOW)
        assert _hint(j, "inv-1") == "same_idempotency_key"
        lease = await j.acquire_lease("inv-1", "broker-1", ttl=WINDOW, same_key=True)
        assert lease.generation == 1


async def test_a_retry_whose_lease_outlasts_the_window_it_was_promised_is_refused(
    tmp_path: Path,
) -> None:
    async with Journal.open(tmp_path / "j.db") as j:
        await _record_unknown(j, "inv-1", RETENTION_MARGIN_S + WINDOW + 20, WINDOW)
        assert _hint(j, "inv-1") == "same_idempotency_key"
        # A longer lease (lease_margin raised since the call was accepted) would end with the
        # key inside its margin: refused, nothing written.
        with pytest.raises(KeyRetentionPassed):
            await j.acquire_lease("inv-1", "broker-1", ttl=WINDOW + 40, same_key=True)
        assert E.RETRY_LEASE_ACQUIRED not in [e.kind for e in j.events("inv-1")]


async def test_a_record_without_a_send_window_keeps_the_rule_it_was_written_under(
    tmp_path: Path,
) -> None:
    async with Journal.open(tmp_path / "j.db") as j:
        # Within the margin now, not at the end of a 130 s lease.
        await _record_unknown(j, "inv-old", RETENTION_MARGIN_S + 90, None)
        assert _hint(j, "inv-old") == "same_idempotency_key"
        with pytest.raises(KeyRetentionPassed):
            await j.acquire_lease("inv-old", "broker-1", ttl=WINDOW, same_key=True)
        lease = await j.acquire_lease("inv-old", "broker-1", ttl=35.0, same_key=True)
        assert lease.generation == 1


async def test_a_reader_given_todays_lease_invites_only_the_retry_it_takes(tmp_path: Path) -> None:
    """``JournalReader.send_windows``: the lease a same-key retry takes now (a lease_margin
    raised since the call was accepted).  A record whose recorded window -- or none, for one
    written before windows were recorded -- the key outlasts, but not today's lease: the hint
    is ``reconcile``, as the lease check answers; one the key outlasts either way keeps
    ``same_idempotency_key`` and its retry takes the lease."""
    async with Journal.open(tmp_path / "j.db") as j:
        j.send_windows = {"payments": WINDOW + 40}  # lease_margin raised by 40 s
        await _record_unknown(j, "inv-1", RETENTION_MARGIN_S + WINDOW + 20, WINDOW)
        await _record_unknown(j, "inv-old", RETENTION_MARGIN_S + WINDOW + 20, None)
        await _record_unknown(j, "inv-far", RETENTION_MARGIN_S + WINDOW + 60, WINDOW)
        for iid in ("inv-1", "inv-old"):
            assert _hint(j, iid) == "reconcile"
            with pytest.raises(KeyRetentionPassed):
                await j.acquire_lease(iid, "broker-1", ttl=WINDOW + 40, same_key=True)
        assert [r.retry for r in j.list_actions()] == [
            "reconcile",
            "reconcile",
            "same_idempotency_key",
        ]
        assert _hint(j, "inv-far") == "same_idempotency_key"
        # Every view path judges it so: streamed, the newest page, the console's kept page.
        judged = {"inv-1": "reconcile", "inv-old": "reconcile", "inv-far": "same_idempotency_key"}
        assert {r.invocation_id: r.retry for r in j.iter_actions()} == judged
        newest, total = j.newest_actions(10)
        assert total == 3 and {r.invocation_id: r.retry for r in newest} == judged
        _, page, total, _ = j.summarized_page(SessionSummary(metrics_key), 10)
        assert total == 3 and {r.invocation_id: r.retry for r in page} == judged
        lease = await j.acquire_lease("inv-far", "broker-1", ttl=WINDOW + 40, same_key=True)
        assert lease.generation == 1
        j.send_windows = None  # a reader without the config: the record's own window
        assert _hint(j, "inv-1") == "same_idempotency_key"
