"""A large result's buffers reused, not faulted in afresh (issue 15; docs/deployment.md, "Memory
for large results").

Every read of a large response passes through a few buffers of up to 1 MiB (the read, h11's,
the redactor's, its lower-cased copy).  glibc hands a buffer that size out of a fresh ``mmap``
or a heap top it trimmed back to the system, so freeing one and allocating the next faulted in
new zeroed pages: 2k to 43k page faults on the reading thread over a 50 MiB body, varying from
run to run with the order buffers were freed in (measured: a 50 MiB call to the
``large_result.py`` server, ``ru_minflt``), and up to ~0.08 s of system time.  Two ``mallopt``
settings keep freed buffers for the next read instead (2.1k-2.4k faults, the call's own):

* ``M_MMAP_THRESHOLD`` 16 MiB: a buffer below it comes from the heap (glibc's own threshold
  moves up to 32 MiB by itself; this fixes it where reads need it from the start);
* ``M_TRIM_THRESHOLD`` 32 MiB: free memory at the heap's top is given back to the system only
  past that -- what one large result's reads need stays mapped, and is reused.

Process-wide, so only ``affidavit serve`` and ``affidavit mcp`` without ``--socket`` (it runs
the calls itself) call it, as they forbid core dumps: a broker embedded in another program
leaves its host's allocator as it is.  Environment settings
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``GLIBC_TUNABLES``) are the operator's
and win: nothing is set then.  Not glibc (musl, macOS): nothing to do.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_buffers"]

MMAP_THRESHOLD = 16 << 20
TRIM_THRESHOLD = 32 << 20
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_OPERATOR = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def keep_freed_buffers() -> list[str]:
    """Set the two thresholds; return what was not done, as words for the operator's log (empty:
    both set, or nothing to set).  Never raises."""
    if not sys.platform.startswith("linux"):
        return []
    if any(name in os.environ for name in _OPERATOR):
        return []  # the operator's allocator settings stand
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl's mallopt does nothing
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return []
    mallopt.restype = ctypes.c_int
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    missing = []
    for param, value, name in (
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD, "M_MMAP_THRESHOLD"),
        (_M_TRIM_THRESHOLD, TRIM_THRESHOLD, "M_TRIM_THRESHOLD"),
    ):
        if mallopt(param, value) != 1:
            missing.append(f"mallopt({name}) refused")
    return missing
