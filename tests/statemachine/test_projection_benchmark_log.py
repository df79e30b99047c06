"""tests/benchmarks/projection.py times the fold over a synthetic log: the log must name the
lease generation wherever the engine does (every ``ATTEMPT_KINDS`` event, and RECONCILED /
RECONCILE_INCONCLUSIVE), or every generation check it times takes the shortcut of journals
written before the lease series (no generation: unchecked) and the figure is of a fold the
broker no longer runs."""

from __future__ import annotations

from affidavit.statemachine import ATTEMPT_KINDS, EventKind
from tests.benchmarks.projection import synthetic_log


def test_the_projection_benchmark_s_log_names_the_generation_as_the_engine_writes_it() -> None:
    events = synthetic_log(5_000)
    stamped = ATTEMPT_KINDS | {EventKind.RECONCILED, EventKind.RECONCILE_INCONCLUSIVE}
    unstamped = sorted(
        {e.kind.value for e in events if e.kind in stamped and "generation" not in e.attrs}
    )
    assert unstamped == [], unstamped
