"""The one rule for a config file a process that holds secrets acts on: no one but this
process's user and root may be able to change what it says.

Whoever can write the config -- its file, or a directory on the path to it (``./affidavit.toml``
in a directory another user owns, a world-writable project directory) -- chooses where a
target's credential is sent: a planted ``./affidavit.toml`` would have an embedded ``affidavit
call`` hand the operator's vault secret to the planter's host.  So every process that loads a
credential from a config -- ``affidavit serve``, an embedded ``call``/``result``/``mcp``, an
embedder's ``Broker.open``, ``affidavit vault`` finding the vault through ``[vault] path`` --
refuses it (CONFIG_EXPOSED, naming each path, its owner or mode and the command that mends it;
never the file's contents) while its owner is another user than this process's or root, or
group or others may write it or a directory a name on the way to it is looked up in (inside
each link's target too) that is not sticky (the journal's ``CONFIG`` and ``DIRECTORY`` rules,
``journal.exposure``).  The bytes parsed are those of the file judged: it is opened once, from
the directories judged, and judged by ``fstat`` of that descriptor -- a link swapped between a
check and a read (the review of this rule) has nothing to win.  ``--allow-exposed-files`` does not
lift it: the other files it excuses are the broker's own to keep; this one is where its secrets
go.  The password a ``[journal] url`` holds is ``serve``'s ``FILES_EXPOSED`` check, as before.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import shlex
from pathlib import Path

from affidavit.config import Config, ConfigError, load_config, read_config
from affidavit.journal.exposure import CONFIG, Exposure, opened_exposures
from affidavit.privatefile import OPEN_FLAGS, serving

__all__ = [
    "CONFIG_EXPOSED",
    "CONFIG_FILE_CHANGED",
    "load_trusted_config",
    "open_trusted_config",
    "refuse_exposed_config",
]

CONFIG_EXPOSED = "CONFIG_EXPOSED"
CONFIG_FILE_CHANGED = "CONFIG_FILE_CHANGED"
"""The config file no longer holds the bytes a config handed over was parsed from: not the
envelope's ``CONFIG_CHANGED`` (a target's settings changed between an invocation's validation and
its dispatch) -- nothing was validated or sent; the file must be read again."""
MOVED_TO = "/etc/affidavit/affidavit.toml"
"""Where a config in another user's directory is told to live: a directory only root writes."""


def open_trusted_config(path: Path) -> int:
    """The config file at ``path`` opened read-only (``O_NONBLOCK``, the descriptor the
    caller's), once what was opened is judged (``journal.exposure.opened_exposures``): every
    directory a name was looked up in on the way, inside each link's target too, each link in
    a sticky directory, and the file's own owner and write bits by ``fstat`` of the descriptor
    -- the bytes read from it are those of the file judged.  Judged as the broker this process
    is (``serving``): the fix of a config another user owns is the ``chown`` to this user or
    root, which root may own.  ``ConfigError`` (CONFIG_EXPOSED, each path with its owner or mode
    and the fix, never the contents) when another user can change it; ``FileNotFoundError``
    when it is not there, ``OSError`` when it cannot be opened (``read_config`` says which)."""
    with serving():
        fd, found = opened_exposures(path, "config file", CONFIG, OPEN_FLAGS)
    if found:
        if fd is not None:
            os.close(fd)
        said = "; ".join(str(_advised(e, path)) for e in found)
        raise ConfigError(
            "",
            f"refused: another user can change what this config says, and so where its "
            f"credentials are sent: {said}",
            path,
            CONFIG_EXPOSED,
        )
    if fd is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
    return fd


def _advised(found: Exposure, path: Path) -> Exposure:
    """``found`` with the fix for the config at ``path``: a directory or link on the way that
    another user owns is theirs -- a ``chown`` would take their directory (a home, a shared
    project) from them -- so the config is to live where only this user or root may write.
    The file's own owner keeps its ``chown``: a config is this user's or root's to hold."""
    if found.owner is None or found.what == "config file":
        return found
    fix = (
        f"keep the config in a directory only this user or root can write ({MOVED_TO}, say, "
        f"once what {shlex.quote(str(path))} says is checked: another user could have written "
        f"it) and pass --config {MOVED_TO}; not a chown of another user's {found.what}"
    )
    return dataclasses.replace(found, fix=fix)


def load_trusted_config(path: str | Path | None = None) -> Config:
    """``load_config`` of the file ``open_trusted_config`` judged: one open, the bytes parsed
    those of the file judged.  Its ``ConfigError``s and ``OSError``s are ``load_config``'s, and
    CONFIG_EXPOSED."""
    return load_config(path, open_trusted_config)


def refuse_exposed_config(config: Config) -> None:
    """Raise ``ConfigError`` when another user can change ``config``'s file (CONFIG_EXPOSED,
    ``open_trusted_config``), or its file no longer holds the bytes ``config`` was parsed from
    (CONFIG_FILE_CHANGED: changed since, perhaps swapped; whatever was judged is not what was
    parsed -- read it again); a config built from a mapping has no file, and one not parsed
    from its file is judged alone."""
    if config.path is None:
        return
    raw, _ = read_config(config.path, open_trusted_config)
    if config.source_digest is not None and hashlib.sha256(raw).digest() != config.source_digest:
        raise ConfigError(
            "",
            "refused: the config file changed since this config was read from it (the file "
            "judged is not the one parsed): start again from the file as it is now (read it "
            "again: a new load_config, or the command run again)",
            config.path,
            CONFIG_FILE_CHANGED,
        )
