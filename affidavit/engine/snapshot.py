"""The bound config snapshot: the hash PREFLIGHT_VALIDATED records for a target, and the re-check
the dispatch gate makes against the config file right before the first byte.

Seed: the action is bound to a config snapshot; "re-check it immediately before the write", and
"if any bound value changes, create a new invocation; do not edit the previous record".

The hash is a digest keyed by the journal's key (``Journal.keyed_digest``), not a plain SHA-256:
the snapshot holds the credential *reference* (``env:NAME``, ``file:/path``), which the caller
is not told, and the rest of it is mostly defaults and what the catalog shows -- a plain hash in
the caller's evidence (``config_hash``, and the request fingerprint built on it) would confirm a
guessed reference offline.  Keyed by the journal's key, it is the same on every broker of a
shared journal and across restarts, so a same-key retry elsewhere still matches.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from affidavit.config import Config, ConfigError, canonical_json, load_config, snapshot
from affidavit.statemachine import KEYED_PREFIX

__all__ = ["ConfigSnapshot"]

_PURPOSE = "config-snapshot"


class ConfigSnapshot:
    """The config an engine was started with, and whether its file still says the same.
    ``digest`` is the journal's ``keyed_digest``."""

    def __init__(self, config: Config, digest: Callable[[str, bytes], str]) -> None:
        self.config = config
        self._digest = digest
        self._stat = self._file_stat()
        self._hashes: dict[str, tuple[Any, str]] = {}
        self._seen: tuple[tuple[int, int] | None, Config | None, dict[str, str]] | None = None
        """The file as last read after it changed: its stat, the config it held (None: not a
        valid one) and the keyed hashes of its targets asked so far -- one read and one hash
        per edit, not per dispatch."""

    def hash(self, target: Any) -> str:
        """The keyed hash of one of ``self.config``'s (frozen) targets, computed once per target
        value (``fingerprint()`` needs it on every call: tests/benchmarks/http_overhead.py)."""
        cached = self._hashes.get(target.name)
        if cached is not None and cached[0] is target:
            return cached[1]
        value = self.hash_of(target)
        self._hashes[target.name] = (target, value)
        return value

    def hash_of(self, target: Any) -> str:
        """The keyed hash of any target's canonical snapshot, not remembered."""
        return KEYED_PREFIX + self._digest(_PURPOSE, canonical_json(snapshot(target)))

    def changed(self, target_name: str, expected_hash: str) -> bool:
        """Whether the config file now binds ``target_name`` to anything but ``expected_hash``
        (an unreadable or invalid file counts as changed).  Cheap while the file's mtime and
        size are those seen at start, or those it had when last read."""
        path = self.config.path
        if path is None:
            return False
        current = self._file_stat()
        if current == self._stat:
            return False
        seen = self._seen
        if seen is None or seen[0] != current or current is None:
            try:
                fresh: Config | None = load_config(path)
            except (ConfigError, OSError):
                fresh = None
            seen = self._seen = (current, fresh, {})
        _, fresh, hashes = seen
        if fresh is None:
            return True
        value = hashes.get(target_name)
        if value is None:
            target = fresh.targets.get(target_name)
            if target is None:
                return True
            value = hashes[target_name] = self.hash_of(target)
        return value != expected_hash

    def _file_stat(self) -> tuple[int, int] | None:
        path = self.config.path
        if path is None:
            return None
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)
