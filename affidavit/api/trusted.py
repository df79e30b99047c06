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
group or others may write it or a directory above it that is not sticky (the journal's
``CONFIG`` and ``DIRECTORY`` rules, ``journal.exposure``).  ``--allow-exposed-files`` does not
lift it: the other files it excuses are the broker's own to keep; this one is where its secrets
go.  The password a ``[journal] url`` holds is ``serve``'s ``FILES_EXPOSED`` check, as before.
"""

from __future__ import annotations

from pathlib import Path

from affidavit.config import Config, ConfigError
from affidavit.journal import Exposure, directory_exposures, exposure
from affidavit.journal.exposure import CONFIG
from affidavit.privatefile import serving

__all__ = ["CONFIG_EXPOSED", "config_exposures", "refuse_exposed_config"]

CONFIG_EXPOSED = "CONFIG_EXPOSED"


def config_exposures(path: Path) -> list[Exposure]:
    """What lets another user change the config file at ``path``: its owner or write bits
    (``CONFIG``), and those of each directory (or link) on the path to it, up to ``/``.  Judged
    as the broker this process is (``serving``): the fix of a config another user owns is the
    ``chown`` to this user or root, which root may own."""
    with serving():
        found = exposure(path, "config file", CONFIG)
        return ([found] if found is not None else []) + directory_exposures([(path, "config file")])


def refuse_exposed_config(config: Config) -> None:
    """Raise ``ConfigError`` (CONFIG_EXPOSED, the file named) when another user can change
    ``config``'s file (``config_exposures``); a config built from a mapping has none."""
    if config.path is None:
        return
    found = config_exposures(config.path)
    if found:
        said = "; ".join(map(str, found))
        raise ConfigError(
            "",
            f"refused: another user can change what this config says, and so where its "
            f"credentials are sent: {said}",
            config.path,
            CONFIG_EXPOSED,
        )
