"""The bound config snapshot: the hash PREFLIGHT_VALIDATED records for a target, and the re-check
the dispatch gate makes against the config file right before the first byte.

Seed: the action is bound to a config snapshot; "re-check it immediately before the write", and
"if any bound value changes, create a new invocation; do not edit the previous record".
"""

from __future__ import annotations

import os
from typing import Any

from affidavit.config import Config, ConfigError, load_config, snapshot_hash

__all__ = ["ConfigSnapshot"]


class ConfigSnapshot:
    """The config an engine was started with, and whether its file still says the same."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._stat = self._file_stat()
        self._hashes: dict[str, tuple[Any, str]] = {}

    def hash(self, target: Any) -> str:
        """``snapshot_hash`` of one of ``self.config``'s (frozen) targets, computed once."""
        cached = self._hashes.get(target.name)
        if cached is not None and cached[0] is target:
            return cached[1]
        value = snapshot_hash(target)
        self._hashes[target.name] = (target, value)
        return value

    def changed(self, target_name: str, expected_hash: str) -> bool:
        """Whether the config file now binds ``target_name`` to anything but ``expected_hash``
        (an unreadable or invalid file counts as changed).  Cheap while the file's mtime and
        size are those seen at start."""
        path = self.config.path
        if path is None:
            return False
        current = self._file_stat()
        if current == self._stat:
            return False
        try:
            fresh = load_config(path)
        except (ConfigError, OSError):
            return True
        target = fresh.targets.get(target_name)
        return target is None or snapshot_hash(target) != expected_hash

    def _file_stat(self) -> tuple[int, int] | None:
        path = self.config.path
        if path is None:
            return None
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)
