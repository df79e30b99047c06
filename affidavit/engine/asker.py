"""Who asks: the uid a call, poll or query is recorded for, and a fetch reads as.

Seed, "Mark RESULT_DELIVERED only after the protocol has confirmed complete transfer": a result
is delivered when it is answered whole to the uid that asked for it (``delivery.requested_by``).
The daemon names its socket peer's uid (authenticated by the kernel); an in-process caller --
``affidavit call``, an embedded MCP server, a library -- is this process's user, and is named
so: a row naming no one would leave no uid to deliver the result to (and, before, let any
uid's read record the delivery)."""

from __future__ import annotations

import os

__all__ = ["asker"]


def asker(uid: int | None) -> int:
    """``uid``, or this process's user when the caller (in-process) names none."""
    return os.getuid() if uid is None else uid
