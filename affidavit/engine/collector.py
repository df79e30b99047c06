"""Cyclic garbage collection for a process that runs calls at concurrency (issue 15).

With 64 calls in flight, CPython's default young-generation threshold (700 net allocations of
container objects) runs a collection several times per call: each one traverses every young
object of every call in flight, and whatever survives -- most of them, the calls being still
in flight -- is promoted and traversed again by the older generations, together with everything
start-up allocated (config, modules, keys).  ``tests/benchmarks/http_overhead.py`` measured
11-12% of the broker's time at concurrency 64 inside the collector.  Nothing the engine keeps
needs the cycle collector to be freed promptly: its per-call state is released by reference
counting when the call ends, and result bytes are not tracked by the collector at all.

The collector's settings are the process's, not one broker's: ``affidavit serve`` tunes its own
process, as does ``affidavit mcp`` without ``--socket`` (it runs the calls itself); an
embedding application decides for its own (``tune_collector`` is public for it).
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "tune_collector"]

YOUNG_THRESHOLD = 20_000
"""Net container allocations between young-generation collections (CPython's default: 700)."""


def tune_collector() -> None:
    """Freeze what start-up allocated (``gc.freeze``: never traversed again) and collect the
    young generation every ``YOUNG_THRESHOLD`` allocations.  Process-wide; call once, after
    start-up and before serving."""
    gc.collect()  # garbage start-up left is freed, not frozen
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
