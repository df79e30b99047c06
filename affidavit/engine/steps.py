"""The states an attempt's protocol machine went through, kept bounded: the protocol summary's
``path`` (PROTOCOL_OBSERVED, the record's ``evidence.<protocol>``).

The peer decides how many steps a call takes: every body piece or output chunk is one, so a
response sent as 1-byte chunks made one ``"body"`` entry per byte -- a 200 KB body, a 1.4 MB
row, all of it held in memory until the attempt ended.  Here a run of one state entered again
and again (a self-loop: ``body`` -> ``body``) is one entry with its count, and past
``HEAD_RUNS + TAIL_RUNS`` runs (SSH's stdout and stderr chunks alternating, say) only the first
and the last are kept, with the number of runs and steps left out between them.  Nothing is
made up: every step is either listed, in a run's count, or in what was left out.  This is the
attempt's only record of its steps: the protocol machine keeps none (``ProtocolMachine``), so
the memory an attempt holds for them is bounded too, not only the row.

``facts()``, beside the summary's other facts -- always all three: the record's
``evidence.<protocol>`` merges a later summary's facts over an earlier one's (a retry's), and
an earlier attempt's counts must not stay beside a later attempt's path:

* ``path`` -- each run's state once, in order;
* ``path_repeats`` -- ``[index in path, steps in that run]`` per run that repeats (``[]``: none);
* ``path_left_out`` -- ``{"after": index in path, "runs", "steps", "states"}``, the runs that
  came between ``path[after - 1]`` and ``path[after]`` and their states, sorted (``None``: none
  left out).  The states let a withheld size (``engine/echoed.py``) fold what was left out into
  the runs of the streams it withholds.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["HEAD_RUNS", "TAIL_RUNS", "StepPath"]

HEAD_RUNS: Final = 32
"""Runs kept from the start: setup, dispatch and the first answer -- a call with a few
redirects fits whole."""
TAIL_RUNS: Final = 32
"""Runs kept from the end: how the attempt ended."""


class StepPath:
    """The run-length encoded, bounded path (see the module).  ``append`` is on every step's
    way: a comparison and an addition for a repeat, two appends for a new run."""

    __slots__ = ("_counts", "_left_runs", "_left_states", "_left_steps", "_repeats", "_states")

    def __init__(self) -> None:
        self._states: list[str] = []
        self._counts: list[int] = []
        self._repeats = False
        self._left_runs = 0
        self._left_steps = 0
        self._left_states: set[str] = set()  # at most the table's states

    def __bool__(self) -> bool:
        return bool(self._states)

    def append(self, state: str) -> None:
        states = self._states
        if states and states[-1] == state:
            self._counts[-1] += 1
            self._repeats = True
            return
        states.append(state)
        self._counts.append(1)
        if len(states) > HEAD_RUNS + TAIL_RUNS:  # the oldest run after the head goes
            self._left_states.add(states.pop(HEAD_RUNS))
            self._left_runs += 1
            self._left_steps += self._counts.pop(HEAD_RUNS)

    def facts(self) -> dict[str, Any]:
        repeats = [[i, n] for i, n in enumerate(self._counts) if n > 1] if self._repeats else []
        left_out = (
            {
                "after": HEAD_RUNS,
                "runs": self._left_runs,
                "steps": self._left_steps,
                "states": sorted(self._left_states),
            }
            if self._left_runs
            else None
        )
        return {"path": list(self._states), "path_repeats": repeats, "path_left_out": left_out}
