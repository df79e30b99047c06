"""A ``cancellable`` append -- its answer may be given up, the write going on unread -- is only
for a closing event recovery would write the same (``internal_close``).  Anything else is a
boundary its caller acts on (DISPATCH_STARTED, RESULT_COMMITTED, a lease-checked write, an
approval's expiry, a ``meanwhile``): given up, it would leave unclear what the record proves.
So the journal refuses it (``ValueError``, nothing queued) instead of taking it silently --
``Recorder.append`` dropped ``lapsed``/``deadline``/``valid_until`` with it, unchecked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.engine.recorder import Recorder
from affidavit.journal import Journal
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E

from .helpers import until_dispatch

WAIT = 10.0
IID = "inv-c"


def _interrupted() -> Event:
    return Event(E.ATTEMPT_INTERRUPTED, IID, {"code": "REMOTE_OUTCOME_UNKNOWN", "generation": 0})


REFUSED: list[tuple[str, Any, dict[str, Any]]] = [
    # (what, the event, append's other arguments)
    ("DISPATCH_STARTED", Event(E.DISPATCH_STARTED, IID, {"generation": 0}), {}),
    ("RESULT_COMMITTED", Event(E.RESULT_COMMITTED, IID, {"sha256": "x"}), {}),
    ("REQUEST_SENT", Event(E.REQUEST_SENT, IID), {}),
    ("lease", _interrupted(), {"lease": ("me", 0)}),
    ("lapsed", _interrupted(), {"lapsed": True, "deadline": 0.0}),
    ("valid_until", _interrupted(), {"valid_until": 1e12}),
    ("meanwhile", _interrupted(), {"meanwhile": lambda: None}),
]


@pytest.mark.parametrize(("what", "event", "extra"), REFUSED, ids=[r[0] for r in REFUSED])
async def test_a_cancellable_append_of_anything_but_a_plain_close_is_refused(
    tmp_path: Path, what: str, event: Event, extra: dict[str, Any]
) -> None:
    with trio.fail_after(WAIT):
        async with Journal.open(tmp_path / "j.db") as j:
            for ev in until_dispatch(IID):
                await j.append(ev, barrier=True)
            before = j.events(IID)
            # (Not the lifecycle's refusal, ``ImpossibleEvent``, a ValueError too.)
            with pytest.raises(ValueError, match=f"^cancellable append (of|with) {what}:"):
                await j.append(event, barrier=True, cancellable=True, **extra)
            assert j.events(IID) == before  # nothing queued
            # The close itself is taken, and lands.
            closed = await j.append(_interrupted(), barrier=True, cancellable=True)
            assert closed.seq is not None and j.events(IID)[-1].kind is E.ATTEMPT_INTERRUPTED


@pytest.mark.parametrize(
    "extra", [{"lapsed": True, "deadline": 0.0}, {"valid_until": 1e12}], ids=["lapsed", "valid"]
)
async def test_the_recorder_passes_what_it_was_given_to_the_journal_which_refuses_it(
    tmp_path: Path, extra: dict[str, Any]
) -> None:
    """``Recorder.append(cancellable=True)`` used to drop ``lapsed``, ``deadline`` and
    ``valid_until`` without a word: a recovery's close written without its lease check."""
    with trio.fail_after(WAIT):
        async with Journal.open(tmp_path / "j.db") as j:
            for ev in until_dispatch(IID):
                await j.append(ev, barrier=True)
            with pytest.raises(ValueError, match=f"^cancellable append with {next(iter(extra))}:"):
                await Recorder(j).append(_interrupted(), cancellable=True, **extra)
            assert j.events(IID)[-1].kind is E.DISPATCH_STARTED


async def test_the_writer_refuses_a_cancellable_checked_write(tmp_path: Path) -> None:
    """``Writer.submit``: a write with an ``op`` (a lease's or an expiry's check in the
    transaction) or a ``meanwhile`` is never answered unread either."""
    with trio.fail_after(WAIT):
        async with Journal.open(tmp_path / "j.db") as j:
            writer = j._writer
            with pytest.raises(ValueError, match=r"^a cancellable write"):
                await writer.submit(lambda txn: None, barrier=True, cancellable=True)
            with pytest.raises(ValueError, match=r"^a cancellable write"):
                await writer.submit(
                    None, (), barrier=True, meanwhile=lambda: None, cancellable=True
                )
