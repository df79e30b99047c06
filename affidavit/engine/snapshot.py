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

Beside it PREFLIGHT_VALIDATED records ``account_hash``, the keyed hash of the part of the snapshot
that decides which remote account a call reaches (``affidavit.schema.account``: its origin, base
path, credential reference, idempotency scope, and whom it trusts to answer: CA file content,
pinned host keys, proxy).  A reconciliation query or an operation's
poll is sent with the target as configured *now*, and speaks for a record only if that is the
account the record's dispatch reached (``moved``): a query of another origin that finds nothing
would settle as "rejected" an effect the first origin holds.  The whole snapshot is not required
to match -- a timeout, or the ``reconcile`` setting itself, may be added or changed since.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from affidavit.config import Config, ConfigError, account, canonical_json, load_config, snapshot
from affidavit.statemachine import KEYED_PREFIX, Event, EventKind

__all__ = ["ConfigSnapshot"]

_PURPOSE = "config-snapshot"
_ACCOUNT = "config-account"


class ConfigSnapshot:
    """The config an engine was started with, and whether its file still says the same.
    ``digest`` is the journal's ``keyed_digest``."""

    def __init__(self, config: Config, digest: Callable[[str, bytes], str]) -> None:
        self.config = config
        self._digest = digest
        self._stat = self._file_stat()
        self._hashes: dict[str, tuple[Any, str]] = {}
        self._accounts: dict[str, tuple[Any, str]] = {}
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

    def account_hash(self, target: Any) -> str:
        """The keyed hash of the account ``target`` reaches (``affidavit.schema.account``),
        computed once per target value, like ``hash``."""
        cached = self._accounts.get(target.name)
        if cached is not None and cached[0] is target:
            return cached[1]
        value = KEYED_PREFIX + self._digest(_ACCOUNT, canonical_json(account(target)))
        self._accounts[target.name] = (target, value)
        return value

    def moved(self, events: Iterable[Event], target: Any) -> str | None:
        """Why ``target`` as configured now may reach another account than the record of
        ``events`` dispatched to -- its origin, base path, credential reference, idempotency
        scope or whom it trusts to answer (CA file, pinned host keys, proxy) changed since -- or
        None when it reaches the same.  A record written before ``account_hash`` was recorded
        proves its account only through the whole snapshot: it is the same only while that is
        (a CA file edited in place under the same path is not seen then)."""
        validated = None
        for event in events:
            if event.kind is EventKind.PREFLIGHT_VALIDATED:
                validated = event.attrs
        if validated is None:
            return "the record binds no configuration"
        recorded = validated.get("account_hash")
        if recorded is not None:
            if recorded == self.account_hash(target):
                return None
            return (
                "its origin, base path, credential, idempotency scope or whom it trusts to "
                "answer (CA file, host keys, proxy) changed since the dispatch"
            )
        if validated.get("config_hash") == self.hash(target):
            return None
        return (
            "its configuration changed since the dispatch, and the record (written before the "
            "account was recorded apart) cannot tell whether what decides the account it "
            "reaches did"
        )

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
