"""Who asks: the uid a call, poll or query is recorded for, and a fetch reads as.

Seed, "Mark RESULT_DELIVERED only after the protocol has confirmed complete transfer": a result
is delivered when it is answered whole to the uid that asked for it (``delivery.requested_by``).
The daemon names its socket peer's uid (authenticated by the kernel); an in-process caller --
``affidavit call``, an embedded MCP server, a library -- is this process's user, and is named
so: a row naming no one would leave no uid to deliver the result to (and, before, let any
uid's read record the delivery).  A host that names every asker (``EngineSettings.peer_askers``:
the daemon) never falls back to this process's uid -- the daemon's own user, which a peer of
that uid also is: a route that forgot its peer would record the call as that peer's."""

from __future__ import annotations

import os

from .settings import EngineSettings

__all__ = ["NoAsker", "asker"]


class NoAsker(ValueError):
    """A host that names every asker (``EngineSettings.peer_askers``) named none: a bug in that
    host's route, refused before anything is recorded."""


def asker(uid: int | None, settings: EngineSettings) -> int:
    """``uid``, or this process's user when the caller (in-process) names none -- unless the
    host names every asker (``settings.peer_askers``): then ``NoAsker``."""
    if uid is not None:
        return uid
    if settings.peer_askers:
        raise NoAsker("this broker names every asker (its socket peer's uid); none was named")
    return os.getuid()
