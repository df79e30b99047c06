"""The record: the projected state of one invocation, what envelopes and ``decide()`` read.

A record is a frozen snapshot; folding further events never changes one already handed out
(``projection.py`` builds them, ``rules.py`` says what each event does to the fold).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .contract import Code, Outcome, Phase, Retry
from .events import Event, unfrozen_twin
from .lifecycle import STATES

__all__ = ["FENCE_RULES", "Budget", "ImpossibleEvent", "Record"]

FENCE_RULES = 2
"""The rules a fence writes its record under: ACTION_ACCEPTED's ``fenced.rules``.  Only a
record whose first event carries it is ``Record.fenced`` and takes no attempt of its own
(``rules_intake._on_accepted``).  A fence written before (no ``rules``) folds as it always did
-- its binder's rows then landed in it, and a journal that holds them is honest -- so it is
read for what its rows prove, never as tampered with."""


class ImpossibleEvent(ValueError):
    """An event the table (or an event rule) does not allow in the current state."""

    def __init__(self, event: Event, state: str, reason: str) -> None:
        self.event = event
        self.state = state
        self.reason = reason
        where = f" (seq {event.seq})" if event.seq is not None else ""
        super().__init__(
            f"{event.kind.value}{where} is impossible in state {state!r} of invocation "
            f"{event.invocation_id}: {reason}"
        )


@dataclass(frozen=True, slots=True)
class Budget:
    total: int
    used: int

    @property
    def left(self) -> int:
        return max(0, self.total - self.used)


@dataclass(frozen=True, slots=True)
class Record:
    """The projected state of one invocation; what envelopes and ``decide()`` read."""

    invocation_id: str
    state: str
    phase: Phase
    outcome: Outcome
    retry: Retry
    code: Code | None
    message: str
    session: str | None
    target: str | None
    protocol: str | None
    idempotent: bool
    fingerprint: str | None
    idempotency: Mapping[str, Any] | None
    generation: int
    budget: Budget
    attempts: tuple[Mapping[str, Any], ...]
    evidence: Mapping[str, Any]
    retry_after: float | None
    last_seq: int | None
    events: int
    field: str | None = None
    """For validation errors: the path of the action field to fix."""
    operation: Mapping[str, Any] | None = None
    """The job a complete 202 accepted, tracked as its own operation (``operation.py``): id,
    job_id, status_url, status_path, state, polls, last_poll, accepted_seq."""
    items: tuple[Mapping[str, Any], ...] | None = None
    """A batch's items, one per item sent: id, outcome, code, retry (``batch.py``)."""
    idempotent_recorded: bool = True
    """ACTION_ACCEPTED's ``operation`` names ``idempotent`` (``idempotent`` is then what it says,
    else False by default: the envelope leaves ``evidence.idempotent`` out)."""
    fenced: Mapping[str, Any] | None = None
    """Why its binder is gone, when a call with a different request under its idempotency key
    fenced the invocation (ACTION_ACCEPTED's ``fenced``, its first event: chained, never
    changed; ``rules`` left out): nothing was sent under the key, and no attempt of its own is
    ever taken in it.  None for a fence written without ``rules`` (``FENCE_RULES``), which
    proves neither: its record is read for what its rows prove."""
    requester: int | None = None
    """The uid that asked for the attempt whose result the record holds: ``requester.uid`` of
    the latest row starting an asker's attempt that names one (ACTION_ACCEPTED, a same-key
    retry's RETRY_LEASE_ACQUIRED, a joined waiter's DISPATCH_LEASE_ACQUIRED).  None when none
    does -- a record written before requesters were recorded (or a fence's, which holds no
    result: ``engine.binder.fence``): no read delivers its result
    (``engine.delivery.requested_by``), so a failed delivery of it says no ``fetch_result``
    (``retry.static_retry_hint``: its hint is its stored result's)."""

    @property
    def final(self) -> bool:
        return STATES[self.state].final

    @property
    def is_error(self) -> bool:
        return self.code is not None


Unsealed = unfrozen_twin(Record)
"""What ``projection.py`` builds a record in (``events.unfrozen_twin``): the frozen ``__init__``
cost ~7-11 us a record against ~1.5 us, and records were a third of ``project_all`` over a whole
journal (tests/benchmarks/projection.py)."""


_BUDGETS: dict[tuple[int, int], Budget] = {}


def shared_budget(total: int, used: int) -> Budget:
    """``Budget(total, used)``; budgets are immutable and few distinct ones exist, so records
    share them."""
    key = (total, used)
    b = _BUDGETS.get(key)
    if b is None:
        if len(_BUDGETS) > 4096:
            _BUDGETS.clear()
        b = _BUDGETS[key] = Budget(total, used)
    return b
