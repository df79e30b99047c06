"""The engine's own numbers: what no target's config decides.

``Engine(..., settings=EngineSettings(...))`` and ``Broker.open(..., settings=...)`` take them;
the defaults are what ships.  They are constructor arguments rather than module constants so an
embedding application (or a test) changes them for one broker without patching module globals
that every broker in the process shares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["EngineSettings"]


@dataclass(frozen=True, slots=True)
class EngineSettings:
    lease_margin: float = 30.0
    """Seconds a record's lease outlives its call's total timeout (design-notes, "Leases for the
    first attempt"): until ``timeout + lease_margin`` a resuming caller is answered from the
    record; after it, the holder is presumed gone and the stale attempt is closed with what the
    journal proves.  It is also how long before its lease ends a worker stops dispatching
    (``attempt.py``): on a shared journal, the clock skew tolerated between the hosts.  Any
    value >= 0 is taken here (a test, or one host's journal, may want 0); the daemon's ``[service]
    lease_margin`` refuses less than ``MIN_SHARED_LEASE_MARGIN`` on a shared journal."""
    inline_result_limit: int = 1024 * 1024
    """Results up to this many (redacted) bytes are kept in memory while they are journaled, so
    the envelope carries them without reading them back; a larger one is returned by reference
    (its size, hash and where to fetch it: docs/journal.md, "Large results are returned by
    reference")."""

    peer_askers: bool = False
    """Every call, poll, reconciliation query and whole fetch names its asker or reader (the
    daemon: its socket peer's uid, the kernel's): one naming none is refused (``asker.NoAsker``)
    before anything is recorded, never taken as this process's uid -- the daemon's own user,
    which a peer may also be, so a route that forgot its peer would pass unnoticed.  False (an
    in-process broker): none named is this process's user."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lease_margin) and self.lease_margin >= 0):
            raise ValueError("lease_margin must be a finite number of seconds >= 0")
        if isinstance(self.inline_result_limit, bool) or not (
            isinstance(self.inline_result_limit, int) and self.inline_result_limit >= 0
        ):
            raise ValueError("inline_result_limit must be an integer number of bytes >= 0")
