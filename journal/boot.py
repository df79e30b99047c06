"""A lease's end by a clock that does not step: ``CLOCK_BOOTTIME``, named by the boot it counts
from (``/proc/sys/kernel/random/boot_id``).

A lease's recorded expiry is wall-clock time (the database's on PostgreSQL, the host's on
SQLite), while the attempt under it is timed by trio's monotonic clock.  Stepped forward (an NTP
correction, an operator's ``date``) while a request is in flight, the host's wall clock made a
live lease look run out to every other broker process on the host: a same-key caller closed the
attempt and sent the request again.  So a lease also records its end by the boot clock, and a
process on the same boot judges it by that clock: it neither steps nor stops while the host
sleeps.  Another boot or host -- or a platform without the clock -- judges by the recorded
wall-clock expiry alone, as before.

What it does not cover: a process restored into another time namespace (CRIU) on the same boot
sees a ``CLOCK_BOOTTIME`` offset from the host's; a host that sleeps counts the sleep as the
lease's time, as the wall clock does (the stalled worker is fenced by its generation).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Mapping
from pathlib import Path

__all__ = ["BOOT_ID", "boot_lapsed", "boot_stamp"]

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@functools.cache
def _boot_id() -> str | None:
    """This boot's id, read once: None where the host has none (not Linux)."""
    try:
        boot = BOOT_ID.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return boot or None


def _boot_now() -> float | None:
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    return None if clock is None else time.clock_gettime(clock)


def boot_stamp(ttl: float) -> dict[str, object] | None:
    """A lease of ``ttl`` seconds from now, by this boot's clock: ``{"id": boot id,
    "expires_at": CLOCK_BOOTTIME seconds}`` -- or None where the host has no such clock."""
    boot, now = _boot_id(), _boot_now()
    if boot is None or now is None:
        return None
    return {"id": boot, "expires_at": now + ttl}


def boot_lapsed(stamp: object) -> bool | None:
    """Whether the lease ``stamp`` (``boot_stamp``'s, read back from a journal -- whoever wrote
    it) has run out by this boot's clock; None when it cannot say: no stamp, a malformed one,
    another boot's or host's, or no such clock here."""
    if not isinstance(stamp, Mapping):
        return None
    boot, expires = stamp.get("id"), stamp.get("expires_at")
    if type(boot) is not str or not isinstance(expires, (int, float)) or isinstance(expires, bool):
        return None
    now = _boot_now()
    if now is None or not math.isfinite(expires) or boot != _boot_id():
        return None
    return now >= expires
