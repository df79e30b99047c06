"""``JournalReader.approvals_after``: what a daemon's dispatcher learns at each sweep of the
approvals other brokers asked and granted (``engine.approval.refresh``) -- the invocations with
an APPROVAL_REQUESTED or APPROVAL_GRANTED after a seq, and the head it read through, on every
backend."""

from __future__ import annotations

import trio

from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E

from ..helpers import Ticking, accepted, happy
from .conftest import Place

FP = "sha256:" + "ab" * 32


def test_the_approvals_asked_or_granted_after_a_seq_and_the_head_read_through(
    place: Place,
) -> None:
    async def fill() -> None:
        async with place.open(clock=Ticking()) as j:
            for iid in ("asked", "granted"):
                for ev in [
                    accepted(iid),
                    Event(E.PREFLIGHT_VALIDATED, iid, {"config_hash": "sha256:c0ff"}),
                    Event(E.APPROVAL_REQUESTED, iid, {"fingerprint": FP, "expires_at": 2e9}),
                ]:
                    await j.append(ev)
            for ev in happy("plain"):  # no approval: never named
                await j.append(ev)
            await j.append(Event(E.APPROVAL_GRANTED, "granted", {"fingerprint": FP}))

    trio.run(fill)
    with place.reader() as r:
        head = r.head()[0]
        # Each with whether its grant is among the rows (a daemon's ``GRACE`` counts from it).
        assert r.approvals_after(0) == (head, {"asked": False, "granted": True})
        # After both requests: only the grant (the last row) is new.
        assert r.approvals_after(head - 1) == (head, {"granted": True})
        assert r.approvals_after(head) == (head, {})
        if place.kind == "sqlite":  # a range of the primary key, not a scan of the journal
            statement = r.tables.SQL["approvals_between"]
            plan = r.tables.conn.execute(f"EXPLAIN QUERY PLAN {statement}", (1, 2)).fetchall()
            text = " ".join(str(row) for row in plan)
            assert "SCAN" not in text and "PRIMARY KEY" in text, text
