"""No core file of a process that holds credentials and keys (docs/security.md, "Memory").

A crash of ``affidavit serve``, ``affidavit mcp``, an embedded ``affidavit call`` or a command
reading a key -- a signal, an abort in a C library -- would have the kernel write the process's
memory to a core file: every credential it resolved, the broker key, the signing key, the
vault's key.  The command line calls ``forbid_core_dumps`` before any such command runs (its
``holds_secrets``, ``affidavit.cli``).  A library never does it for its host (``Broker.open``
leaves the embedding process as it is: process-wide state is its owner's choice,
docs/deployment.md says how).

Two settings, each on its own:

* ``RLIMIT_CORE`` 0 (soft and hard): the kernel writes no core file -- except to a
  ``core_pattern`` pipe (systemd-coredump, apport), which ignores the limit.
* Linux ``prctl(PR_SET_DUMPABLE, 0)``: no core at all, pipe included, and another process of
  the same user can no longer ``ptrace`` it or read its ``/proc/<pid>/environ``, ``mem``,
  ``fd``..., which root then owns.  The process itself keeps every access it uses: its own
  ``/proc/self/fd``, ``status``, ``stat``, ``limits`` (the kernel lets a thread group into
  them), ``/proc/net/tcp`` (the console's peer check; mode 0444), ``SO_PEERCRED`` -- all but
  its own ``/proc/self/environ`` (root's 0400 now), which nothing here reads (``os.environ``
  is the process's memory).  A debugger of the same user
  (``py-spy``, ``gdb -p``) needs root for it too.  An ``execve`` resets the flag; the broker
  runs no program.
"""

from __future__ import annotations

import ctypes
import resource
import sys

__all__ = ["forbid_core_dumps"]

_PR_SET_DUMPABLE = 4
_PR_GET_DUMPABLE = 3


def forbid_core_dumps() -> list[str]:
    """Turn core dumps off for this process; return what could not be done, as words for the
    operator's log (empty: both done).  Never raises: a platform without ``prctl`` (or one that
    refuses it) keeps the limit alone."""
    missing: list[str] = []
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (OSError, ValueError) as exc:
        missing.append(f"RLIMIT_CORE not set to 0 ({exc})")
    if not sys.platform.startswith("linux"):
        return missing
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        missing.append("prctl unavailable: the process stays dumpable")
        return missing
    prctl.restype = ctypes.c_int
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    if prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 or prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) != 0:
        missing.append(f"PR_SET_DUMPABLE refused (errno {ctypes.get_errno()})")
    return missing
