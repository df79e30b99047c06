"""The action and session views on every backend: folds of the durable events, never stored
twice (seed: "separate session and action views")."""

from __future__ import annotations

import trio

from affidavit.statemachine import Outcome, Phase

from ..helpers import Ticking, fill_views
from .conftest import Place


def _fill(place: Place) -> None:
    async def fill() -> None:
        async with place.open(clock=Ticking()) as j:
            await fill_views(j)

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
