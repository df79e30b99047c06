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

A stamp claims no more than its lease: one whose remaining boot time exceeds the lease's own
length (its wall-clock expiry minus the time the lease was taken, plus ``SLACK``) is not judged
-- a stamp of this boot with an expiry far ahead (written by anyone who can write the journal)
would keep a record open for ever, and a process restored into another time namespace (CRIU,
``podman restore``: the boot id is not namespaced, ``CLOCK_BOOTTIME`` is) reads a clock running
behind the host's.  One running ahead only makes a lease look lapsed by it, and the wall clock
has already said so.  A host that sleeps counts the sleep as the lease's time, as the wall clock
does (the stalled worker is stopped by its generation).

Moments are marked the same way (``boot_mark``: an idempotency key's binding; an attempt's
DISPATCH_STARTED and ATTEMPT_INTERRUPTED, ``with_boot_mark``) and read back by their age
(``boot_elapsed``) or the span between two of them (``boot_between``: a reconciliation's settle
window).  A reading by them only ever makes a judgment stricter than the wall clock's alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "BOOT_ID",
    "boot_between",
    "boot_elapsed",
    "boot_lapsed",
    "boot_mark",
    "boot_stamp",
    "with_boot_mark",
]

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
SLACK = 5.0
"""Seconds a stamp's remaining boot time may exceed its lease's wall-clock length: the stamp is
taken a moment after the lease's wall-clock start (a journal read may come between).  A clock
offset within it holds a lapsed lease open at most this much longer."""

_READ: dict[str, str] = {}
"""This boot's id once read: only a success is kept -- a read that failed once (EMFILE) must not
turn the boot clock off for the process's life."""


def _boot_id() -> str | None:
    """This boot's id: None where the host has none (not Linux) or it could not be read."""
    boot = _READ.get("id")
    if boot is None:
        try:
            boot = BOOT_ID.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            return None
        if not boot:
            return None
        _READ["id"] = boot
    return boot


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


def boot_mark() -> dict[str, object] | None:
    """This moment by this boot's clock: ``{"id": boot id, "at": CLOCK_BOOTTIME seconds}`` --
    or None where the host has no such clock.  An idempotency key records it with its expiry
    (``operation.idempotency.boot``): how long ago it was bound, read back on this boot, is
    not moved by a wall clock stepped back (``boot_elapsed``)."""
    boot, now = _boot_id(), _boot_now()
    if boot is None or now is None:
        return None
    return {"id": boot, "at": now}


def with_boot_mark(attrs: dict[str, Any]) -> dict[str, Any]:
    """``attrs`` with ``boot``, this moment's ``boot_mark``, where the host has the clock: an
    attempt's DISPATCH_STARTED and ATTEMPT_INTERRUPTED, between which a reconciliation's settle
    window is measured (``boot_between``)."""
    mark = boot_mark()
    if mark is not None:
        attrs["boot"] = mark
    return attrs


def boot_elapsed(mark: object) -> float | None:
    """Seconds since ``mark`` (``boot_mark``'s, read back from a journal -- whoever wrote it) by
    this boot's clock; None when it cannot say: no mark, a malformed one, another boot's or
    host's, no such clock here, or a mark ahead of the clock (forged, or a process restored
    into another time namespace).  A mark further back than it really was only makes its key
    look older: a reader takes the larger of this and the wall clock's reading, so a mark can
    make a key's judgment stricter, never laxer."""
    if not isinstance(mark, Mapping):
        return None
    boot, at = mark.get("id"), mark.get("at")
    if type(boot) is not str or not isinstance(at, (int, float)) or isinstance(at, bool):
        return None
    now = _boot_now()
    if now is None or not math.isfinite(at) or boot != _boot_id() or at > now:
        return None
    return now - at


def boot_between(earlier: object, later: object, wall: float) -> float:
    """Seconds from the mark ``earlier`` to the mark ``later`` (``boot_mark``'s, read back from
    a journal), given ``wall``, the same span by the wall clock (the two events' ``at``): the
    smaller of the two readings when the boot clock can tell (both marks this boot's, not ahead
    of its clock: ``boot_elapsed``), else ``wall``.  A wall clock stepped forward between them
    (an NTP step, an operator's ``date``) lengthens ``wall``, not the boot clock's span: a
    window that must have *passed* (reconciliation's ``settle``) is not cut short by it.  The
    rule ``key_moment`` applies to a key's age, turned round: there the older reading counts,
    here the shorter -- a mark can make the judgment stricter, never laxer than the wall
    clock's alone."""
    since_earlier, since_later = boot_elapsed(earlier), boot_elapsed(later)
    if since_earlier is None or since_later is None:
        return wall
    return min(wall, since_earlier - since_later)


def boot_lapsed(stamp: object, length: float | None) -> bool | None:
    """Whether the lease ``stamp`` (``boot_stamp``'s, read back from a journal -- whoever wrote
    it) has run out by this boot's clock; None when it cannot say: no stamp, a malformed one,
    another boot's or host's, no such clock here, or more time left by it than the lease's own
    ``length`` (seconds: its recorded wall-clock expiry minus the time it was taken) allows."""
    if not isinstance(stamp, Mapping) or length is None or not math.isfinite(length):
        return None
    boot, expires = stamp.get("id"), stamp.get("expires_at")
    if type(boot) is not str or not isinstance(expires, (int, float)) or isinstance(expires, bool):
        return None
    now = _boot_now()
    if now is None or not math.isfinite(expires) or boot != _boot_id():
        return None
    if expires - now > max(length, 0.0) + SLACK:
        return None  # claims more than its lease: a forged stamp, or a clock running behind
    return now >= expires
