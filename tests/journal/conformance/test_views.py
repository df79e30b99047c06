"""The action and session views on every backend: folds of the durable events, never stored
twice (seed: "separate session and action views")."""

from __future__ import annotations

import trio

from affidavit.statemachine import Event, Outcome, Phase
from affidavit.statemachine import EventKind as E

from ..helpers import accepted, happy, interrupted
from .conftest import Place


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def _fill(place: Place) -> None:
    async def fill() -> None:
        async with place.open(clock=Clock()) as j:
            for ev in happy("ok-1", "alice"):
                await j.append(ev)
            for ev in interrupted("lost-1", "alice"):
                await j.append(ev)
            await j.append(accepted("bad-1", "bob"))
            await j.append(
                Event(E.PREFLIGHT_FAILED, "bad-1", {"code": "INVALID_TARGET", "field": "target"})
            )
            for ev in happy("ok-2", None):
                await j.append(ev)

    trio.run(fill)


def test_list_actions_filters(place: Place) -> None:
    _fill(place)
    with place.reader() as r:
        assert [x.invocation_id for x in r.list_actions()] == ["ok-1", "lost-1", "bad-1", "ok-2"]
        assert [x.invocation_id for x in r.list_actions(session="alice")] == ["ok-1", "lost-1"]
        assert [x.invocation_id for x in r.list_actions(outcome=Outcome.UNKNOWN)] == ["lost-1"]
        assert [x.invocation_id for x in r.list_actions(phase="validation")] == ["bad-1"]
        assert [x.invocation_id for x in r.list_actions(outcome="committed")] == ["ok-1", "ok-2"]
        accepted_at = {x.invocation_id: r.events(x.invocation_id)[0].at for x in r.list_actions()}
        since = accepted_at["lost-1"]
        until = accepted_at["bad-1"]
        assert [x.invocation_id for x in r.list_actions(since=since, until=until)] == [
            "lost-1",
            "bad-1",
        ]
        bad = r.list_actions(phase=Phase.VALIDATION)[0]
        assert (bad.code is not None and bad.code.value, bad.field) == ("INVALID_TARGET", "target")


def test_record_and_sessions(place: Place) -> None:
    _fill(place)
    with place.reader() as r:
        rec = r.record("lost-1")
        assert rec is not None and rec.outcome is Outcome.UNKNOWN and rec.session == "alice"
        assert r.record("nope") is None
        sessions = {s["session"]: s for s in r.sessions()}
    assert set(sessions) == {"alice", "bob", None}
    assert sessions["alice"]["actions"] == 2
    assert sessions["alice"]["outcomes"] == {"committed": 1, "unknown": 1}
    assert sessions["bob"]["outcomes"] == {"not_attempted": 1}
    assert sessions["alice"]["first_seen"] < sessions["alice"]["last_seen"]
