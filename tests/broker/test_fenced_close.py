"""The engine's close path meeting a fenced record (``Record.fenced``): an attempt's ending --
its binder's, whose preamble was refused unawaited -- is refused there, and the call is answered
as the fence closes the record (``attempt.lease_lost``: closed with the fence's own close if
still open, the worker's LEASE_LOST recorded), never by ``delivery._close``'s own fallback, which
closed it without a LEASE_LOST -- or with the worker's SETUP_FAILED, answered CONNECTION_REFUSED,
retry backoff, to every same-key retry for good (tests/broker/test_fence_window.py tells the
whole story; which write the record refuses first there depends on the writer's timing).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from affidavit.engine import delivery
from affidavit.engine.attempt import lost_or_raise
from affidavit.engine.ids import new_invocation_id
from affidavit.statemachine import FENCE_RULES, Event, ImpossibleEvent
from affidavit.statemachine import EventKind as E

from .helpers import closed_port, http_target, open_broker, write_config
from .http_rows import IDEM, LIMIT

GONE = {
    "why": "window_over",
    "bound_at": 1.0,
    "judged_at": 3.0,
    "window": 1.1,
    "recorded": "nothing",
}


async def test_an_attempt_s_ending_in_a_fenced_record_is_answered_as_the_fence_closes_it(
    tmp_path: Path, token: str
) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    cfg = write_config(tmp_path, {"api": http_target(url, idempotency=IDEM)})
    async with open_broker(cfg) as broker:
        engine = broker._engine
        iid = new_invocation_id()
        operation = {
            "target": "api",
            "protocol": None,
            "idempotent": False,
            "fingerprint": "sha256:bound",
            "idempotency": {"key": "charge-1", "scope": IDEM["scope"]},
        }
        fenced = {"operation": operation, "fenced": {**GONE, "rules": FENCE_RULES}}
        ending = {"code": "CONNECTION_REFUSED", "stage": "tcp_connect", "generation": 0}
        with trio.fail_after(LIMIT):
            await engine.recorder.write(Event(E.ACTION_ACCEPTED, iid, fenced), barrier=True)
            with pytest.raises(ImpossibleEvent) as refused:
                await delivery._close(engine, iid, Event(E.SETUP_FAILED, iid, ending))
            assert [e.kind for e in broker.events(iid)] == [E.ACTION_ACCEPTED]  # left open
            answer = await lost_or_raise(engine, iid, 0, refused.value, dispatched=False)
        error = answer["error"]
        assert (error["code"], error["outcome"], error["retry"]) == (
            "IDEMPOTENCY_MISMATCH",
            "not_attempted",
            "after_correction",
        ), answer
        events = broker.events(iid)
        assert [e.kind for e in events] == [E.ACTION_ACCEPTED, E.PREFLIGHT_FAILED, E.LEASE_LOST]
        assert events[1].attrs["binder_gone"] == GONE
