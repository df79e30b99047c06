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

import errno
import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from affidavit.adapters.filestat import SETTLED_NS
from affidavit.adapters.filestat import identity as _key
from affidavit.adapters.filestat import stat_key as _stat_key
from affidavit.adapters.filethread import off_loop
from affidavit.config import (
    Config,
    ConfigUnread,
    account,
    canonical_json,
    parse_config,
    read_config,
    snapshot,
    trust_anchors,
    trusted,
)
from affidavit.statemachine import KEYED_PREFIX, Event, EventKind

__all__ = ["ConfigSnapshot", "first_validated"]

_PURPOSE = "config-snapshot"
_ACCOUNT = "config-account"
_JUDGING = "config-reconcile"


class ConfigSnapshot:
    """The config an engine was started with, and whether its file still says the same.
    ``digest`` is the journal's ``keyed_digest``."""

    def __init__(self, config: Config, digest: Callable[[str, bytes], str]) -> None:
        self.config = config
        self._digest = digest
        self._hashes: dict[str, tuple[Any, str]] = {}
        self._accounts: dict[str, _Account] = {}
        self._trusts: dict[str, dict[str, str]] = {}
        """Per account hash ``account_hash`` computed (the last ``_TRUSTS_KEPT``), the digest
        of each file it trusts (``trusted``)."""
        self._lock = threading.Lock()
        """Guards ``_accounts`` and ``_trusts``: ``account_hash`` runs in worker threads
        (``account_hash_async``, ``trusted``) while the loop reads them.  Held for the
        dictionaries only, never across a file's read."""
        self._seen: _Seen | None = None
        """The file as ``changed`` last read it -- at first, the bytes ``config`` was parsed
        from (``Config.source_digest``), with no stat: the first re-check reads the file and
        parses it only if those bytes moved."""
        if config.source_digest is not None:
            self._seen = _Seen(None, False, config.source_digest, config)

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
        computed once per target value and content of the files it trusts: the account holds
        a CA file's digest, and the HTTP driver trusts the file as it is at each handshake
        (adapters/http/trust.py), so a file edited in place is another account from then on.
        A file's stat vouches for its bytes as the config file's does (``_stat_key``,
        ``SETTLED_NS``): an unsettled or missing one is read again at every call.  Each read is
        bounded and never waits (``adapters.filestat.read_regular``); on the event loop, use
        ``account_hash_async``, which reads in a worker thread."""
        return self._account(target)[0]

    def _account(self, target: Any) -> tuple[str, dict[str, str]]:
        """``account_hash`` and the digests of the files of that account (``trusted``), taken
        together under the lock: another thread may drop the entry between two looks."""
        held = self._held(target)
        if held is not None:
            return held
        began = time.time_ns()
        paths = tuple(path for path, _what in trust_anchors(target))
        keys = tuple(_stat_key(path) for path in paths)
        reached = account(target)
        value = KEYED_PREFIX + self._digest(_ACCOUNT, canonical_json(reached))
        anchors = trusted(target, reached)
        with self._lock:
            self._trusts.pop(value, None)  # (re-inserted last: the oldest are dropped first)
            self._trusts[value] = anchors
            while len(self._trusts) > _TRUSTS_KEPT:
                del self._trusts[next(iter(self._trusts))]
            if all(k is not None and began - k[2] > SETTLED_NS for k in keys):
                self._accounts[target.name] = _Account(target, paths, keys, value)
            else:
                self._accounts.pop(target.name, None)
        return value, dict(anchors)

    async def account_hash_async(self, target: Any) -> str:
        """``account_hash`` in a worker thread, abandoned on cancellation -- the stat that says
        whether its files moved as well as their read: a CA file on a slow disk or a hung
        network mount never stalls the event loop, and so every other call.  A target trusting
        no file costs no hop once computed (nothing to stat)."""
        cached = self._unanchored(target)
        if cached is not None:
            return cached
        return (await self._account_off_loop(target))[0]

    async def trusted(self, target: Any, recorded: str | None) -> dict[str, str]:
        """Each file ``target`` trusts -> the digest of its bytes in the account ``recorded``
        (the call's PREFLIGHT_VALIDATED ``account_hash``; None: a record from before it was
        recorded): the driver trusts exactly those bytes or refuses the call unsent
        (adapters/http/connect.py, ``_tls``).  Kept per account hash as ``account_hash``
        computed it -- by this call, not by whichever call read the file last.  A record made
        by another process, or long ago, is compared with the files as they are now (read
        here, bounded): the same account, their digests; another (a file edited since the
        call was validated), ``CHANGED`` for each, which no file's bytes match.  Awaits nothing
        when the account ``recorded`` is held (the call's own validation just computed it) or
        the target trusts no file; else stats them, and reads them when the stat does not
        vouch for the last read, in one worker thread (abandoned on cancellation)."""
        known = self._recorded(recorded)
        if known is not None:
            return known
        held = self._held(target) if self._unanchored(target) is not None else None
        if held is None:
            value, anchors = await self._account_off_loop(target)
            held = value, dict(anchors)  # (the thread's answer, shared by its waiters)
        return _pinned(recorded, *held)

    async def _account_off_loop(self, target: Any) -> tuple[str, dict[str, str]]:
        """``_account`` in a file thread (``adapters.filethread``: its own limiter, one per
        path at a time, given up on cancellation)."""
        paths = [path for path, _what in trust_anchors(target)]
        key = ("account", id(self), id(target))
        return await off_loop(key, paths, lambda: self._account(target))

    def _held(self, target: Any) -> tuple[str, dict[str, str]] | None:
        """``_account`` when its files' stat vouches for the last read (no file read)."""
        cached = self._cached_account(target)
        if cached is None:
            return None
        with self._lock:
            anchors = self._trusts.get(cached)
        return None if anchors is None else (cached, dict(anchors))

    def _recorded(self, recorded: str | None) -> dict[str, str] | None:
        if recorded is None:
            return None
        with self._lock:
            anchors = self._trusts.get(recorded)
        return None if anchors is None else dict(anchors)

    def _unanchored(self, target: Any) -> str | None:
        """The kept ``account_hash`` of ``target`` when it trusts no file: the one answer the
        loop gives itself, with no stat to make."""
        with self._lock:
            cached = self._accounts.get(target.name)
        if cached is not None and cached.target is target and not cached.paths:
            return cached.value
        return None

    def _cached_account(self, target: Any) -> str | None:
        with self._lock:
            cached = self._accounts.get(target.name)
        if (
            cached is not None
            and cached.target is target
            and (not cached.paths or tuple(_stat_key(p) for p in cached.paths) == cached.keys)
        ):
            return cached.value
        return None

    def judging_hash(self, target: Any) -> str:
        """The keyed hash of what judges a reconciliation query's answer: the target's
        ``reconcile`` section -- the request it sends (method, path), ``committed_if``,
        ``rejected_if``, ``settle`` -- and nothing else (an approval's ``wait`` is not)."""
        section = snapshot(target).get("reconcile")
        return KEYED_PREFIX + self._digest(_JUDGING, canonical_json({"reconcile": section}))

    async def moved(self, events: Iterable[Event], target: Any) -> str | None:
        """Why ``target`` as configured now may reach another account than the record of
        ``events`` dispatched to -- its origin, base path, credential reference, idempotency
        scope or whom it trusts to answer (CA file, pinned host keys, proxy) changed since -- or
        None when it reaches the same.  A record written before ``account_hash`` was recorded
        proves its account only through the whole snapshot: it is the same only while that is
        (a CA file edited in place under the same path is not seen then)."""
        validated = first_validated(events)
        if validated is None:
            return "the record binds no configuration"
        recorded = validated.get("account_hash")
        if recorded is not None:
            if recorded == await self.account_hash_async(target):
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

    async def changed(self, target_name: str, expected_hash: str) -> bool:
        """Whether the config file now binds ``target_name`` to anything but ``expected_hash``
        (an unreadable or invalid file counts as changed).  The file is read again (off the
        event loop, through ``read_config``: bounded, a FIFO refused) whenever its identity
        ``_stat_key`` moved since the last read, or that read could not vouch for it
        (``SETTLED_NS``); it is parsed and the target hashed once per content, not per
        dispatch.  The first call reads it too: the config in memory was read before this
        snapshot existed, and an edit in between would otherwise be the stat it trusts -- but
        bytes the same as those the config was parsed from are that config, not parsed again
        (a parse also judges the files the config names: a CA file removed since is not an
        edit of the configuration, and must not make every target CONFIG_CHANGED).
        ``ConfigUnread`` when the file could not be read at all: neither answer is proven."""
        path = self.config.path
        if path is None:
            return False
        seen = self._seen
        if seen is None or not seen.settled or seen.key != _stat_key(path):
            previous = seen
            seen = await off_loop(
                ("config", id(self), path), (path,), lambda: _read(path, previous)
            )
            self._seen = seen
        if seen.config is None:
            return True
        value = seen.hashes.get(target_name)
        if value is None:
            target = seen.config.targets.get(target_name)
            if target is None:
                return True
            value = seen.hashes[target_name] = self.hash_of(target)
        return value != expected_hash


def first_validated(events: Iterable[Event]) -> Mapping[str, Any] | None:
    """The attrs of the first PREFLIGHT_VALIDATED in ``events`` (what a dispatch was bound to:
    ``config_hash``, ``account_hash``), or None when there is none.  A record holds one: the
    lifecycle admits it only from ``accepted``, and the journal refuses a second
    (tests/broker/test_query_reaches_the_dispatched_account.py).  The first, as ``rebound`` and
    ``reconcile`` take it: were a second ever admitted, the first is the one the opening write
    bound the call to, and a later one must not move where a query goes."""
    for event in events:
        if event.kind is EventKind.PREFLIGHT_VALIDATED:
            return event.attrs
    return None


_TRUSTS_KEPT = 1024
"""Account hashes whose trusted files' digests are kept: each is a few paths and digests; a
call whose account fell out is compared with the files as they are (``trusted``)."""

CHANGED = "changed-since-validated"
"""The digest ``trusted`` names for a file edited since the call's account was recorded."""


@dataclass(frozen=True, slots=True)
class _Account:
    """An ``account_hash`` kept: for ``target``, while the ``paths`` it trusts keep ``keys``."""

    target: Any
    paths: tuple[Path, ...]
    keys: tuple[tuple[int, ...] | None, ...]
    value: str


@dataclass(frozen=True)
class _Seen:
    """The config file as last read: its ``_stat_key`` (None: not read), whether that stat
    vouches for the bytes (``SETTLED_NS``), their digest, the config they hold (None: not a
    valid one) and the keyed hashes of its targets asked so far."""

    key: tuple[int, ...] | None
    settled: bool
    digest: bytes
    config: Config | None
    hashes: dict[str, str] = field(default_factory=dict)


def _read(path: Path, previous: _Seen | None) -> _Seen:
    """Read and (when its bytes moved since ``previous``) parse the config at ``path``: in a
    worker thread, so nothing here touches the snapshot.  Whatever the path holds that is no
    valid config (no file, not a regular one, bytes that fail to parse in any way) is "no valid
    config": the target counts as changed (CONFIG_CHANGED, nothing sent).  A read that failed
    (``ConfigUnread``: no file descriptor left, an I/O error) proves no edit: it is raised, and
    the gate answers it as the set-up failure it is (audit 53b: EMFILE was recorded for good as
    a CONFIG_CHANGED the file never had).  So is a ``MemoryError`` while reading or parsing
    (``_no_memory``): it says nothing of the bytes, and a parse it broke is never kept as the
    ``_Seen`` of those bytes -- that would answer CONFIG_CHANGED until the file is edited
    (audit 53b r3)."""
    began = time.time_ns()
    try:
        raw, st = read_config(path)
    except ConfigUnread:
        raise
    except MemoryError:
        raise _no_memory(path) from None
    except Exception:
        return _Seen(None, False, b"", None)
    settled = began - st.st_ctime_ns > SETTLED_NS
    digest = hashlib.sha256(raw).digest()
    if previous is not None and previous.digest == digest:
        return _Seen(_key(st), settled, digest, previous.config, previous.hashes)
    try:
        fresh: Config | None = parse_config(raw, path)
    except MemoryError:
        raise _no_memory(path) from None
    except Exception:
        fresh = None
    return _Seen(_key(st), settled, digest, fresh)


def _no_memory(path: Path) -> ConfigUnread:
    """The ``ConfigUnread`` a ``MemoryError`` in ``_read`` is: transient, as ``ENOMEM`` is."""
    return ConfigUnread("cannot read config file: out of memory", path, errno.ENOMEM)


def _pinned(recorded: str | None, now: str, anchors: dict[str, str]) -> dict[str, str]:
    """The digests to trust for a call that recorded ``recorded`` when the files are now the
    account ``now``: theirs when it is the same (or nothing was recorded), else ``CHANGED``
    for each, which no file's bytes match."""
    if recorded is None or now == recorded:
        return anchors
    return {path: CHANGED for path in anchors}
