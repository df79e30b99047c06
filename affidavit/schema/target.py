"""What every target has, how a protocol declares the rest, and the snapshot derived from it.

Seed, "Validation and credential injection finish before dispatch": "If validation used one route
definition and an already modified one was read before dispatch, the evidence does not describe
the action that was actually performed.  Before approval, bind the normalized target, the
credential version, the resolved injection method, and the request fingerprint to the
invocation."  So a target is loaded once into a frozen, normalized value; ``snapshot()`` is its
canonical, secret-free description; the engine records a digest of it keyed by the journal's key
and re-checks it before the write (CONFIG_CHANGED; ``affidavit.engine.snapshot``).
``snapshot_hash()`` is its plain SHA-256, as records written before that digest was keyed hold.
The snapshot is derived from the target's schema: every declared field is in it unless declared
``binding=False`` with a reason, so a new setting cannot be left out of the binding by
forgetting to list it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from affidavit.bounds import MAX_TOTAL
from affidavit.secrets.credentials import REFERENCE_FORMS, CredentialError, parse_ref
from affidavit.strictjson import compact_encoder

from .fields import Field, LoadContext, Read, Schema, same
from .section import ConfigError, Section, kind_of

__all__ = [
    "BUDGET",
    "COMMON",
    "CREDENTIAL",
    "DEFAULT_MAX_RESULT",
    "MAX_RESULT",
    "TIMEOUT",
    "Target",
    "TargetSchema",
    "Timeouts",
    "account",
    "canonical_json",
    "canonical_value",
    "result_limit",
    "schema_of",
    "snapshot",
    "snapshot_hash",
    "trust_anchors",
    "trusted",
]

MAX_BUDGET = 100
T = TypeVar("T")


@dataclass(frozen=True)
class Timeouts:
    connect: float
    total: float


class Target(Protocol):
    """What the engine reads of any target; a protocol's target class adds its own fields."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def credential(self) -> str: ...
    @property
    def budget(self) -> int: ...
    @property
    def timeout(self) -> Timeouts: ...
    @property
    def max_result(self) -> int | None: ...


# --- the common fields ----------------------------------------------------------------------------


def _credential(r: Read) -> str:
    ref: str = r.string()
    try:
        kind, name = parse_ref(ref)
    except CredentialError as exc:
        # Not parse_ref's "credential reference must be ...": the field path names it already.
        # (A systemd: reference with a bad NAME keeps its own words: what a NAME may be.)
        named = ref.partition(":")[0] == "systemd"
        raise r.error(exc.message if named else f"must be {REFERENCE_FORMS}") from None
    if kind == "vault" and not r.context.has_vault:
        raise r.error("a vault: reference needs a [vault] section")
    if kind == "file":
        ref = f"file:{r.resolve_path(name)}"
    return ref


def _seconds(r: Read) -> float:
    v = r.raw()
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise r.error(f"must be a number of seconds, not {kind_of(v)}")
    if not math.isfinite(v) or v <= 0 or v > MAX_TOTAL:
        raise r.error(f"must be > 0 and at most {MAX_TOTAL:.0f} seconds")
    return float(v)


def _connect_within_total(timeouts: Timeouts, section: Section) -> None:
    if timeouts.connect > timeouts.total:
        raise ConfigError(section.path("connect"), "must not exceed timeout.total")


TIMEOUTS = Schema(
    Timeouts,
    (
        Field("connect", _seconds, default=10.0, doc="connection setup, seconds"),
        Field("total", _seconds, default=60.0, doc="the whole attempt, seconds"),
    ),
    check=_connect_within_total,
)

CREDENTIAL = Field(
    "credential",
    _credential,
    doc="`env:NAME`, `file:PATH`, `systemd:NAME` or `vault:NAME` (see below)",
    account=same,
)
BUDGET = Field(
    "budget",
    lambda r: r.integer(1, MAX_BUDGET),
    default=3,
    doc=f"attempts per invocation (1–{MAX_BUDGET}), stored in the journal, not in memory",
)
TIMEOUT = Field(
    "timeout",
    TIMEOUTS.parse_table,
    default={},
    shown="`{ connect = 10, total = 60 }`",
    doc="seconds; `connect` ≤ `total`",
)
DEFAULT_MAX_RESULT = 1 << 30
"""1 GiB: what a result may hold when its target does not say (``max_result``)."""


def _max_result(r: Read) -> int | None:
    # Unset stays None (the default applies): targets written before this setting keep their
    # snapshot hash (``Field.unset_omitted``); once set, it binds.
    return r.integer(1, 1 << 40) if r.present else None


MAX_RESULT = Field(
    "max_result",
    _max_result,
    default=None,
    unset_omitted=True,
    shown=f"`{DEFAULT_MAX_RESULT}` (1 GiB)",
    doc="bytes of a result the broker receives and stores (HTTP: the final response's body, "
    "as received and as decoded; SSH: stdout and stderr together); past it the broker stops "
    "reading and closes the connection: `unknown`, `RESULT_SIZE_LIMIT` (see below)",
)
COMMON: tuple[Field, ...] = (CREDENTIAL, BUDGET, TIMEOUT, MAX_RESULT)
"""Every target's schema includes these (a protocol places them among its own fields)."""


def result_limit(target: Target) -> int:
    """The most bytes of a result ``target`` takes: its ``max_result``, else the default."""
    limit = target.max_result
    return DEFAULT_MAX_RESULT if limit is None else limit


# --- target schemas -------------------------------------------------------------------------------

_SCHEMAS: dict[type, TargetSchema[Any]] = {}


class TargetSchema(Schema[T]):
    """The settings of one kind of target: ``COMMON`` plus the protocol's own fields, over a
    frozen dataclass with those attributes plus ``name`` and ``kind`` (defaulting to ``kind``)."""

    def __init__(self, kind: str, cls: type[T], fields: Sequence[Field]) -> None:
        left_out = [f.name for f in COMMON if not any(f is g for g in fields)]
        if left_out:
            raise TypeError(f"target schema {kind!r} leaves out common fields {left_out}")
        super().__init__(cls, fields, implicit=("name", "kind"))
        declared = {a.name: a.default for a in dataclasses.fields(cls)}  # type: ignore[arg-type]
        if declared.get("kind") != kind or "name" not in declared:
            raise TypeError(f"{cls.__name__} needs `name: str` and `kind: ... = {kind!r}`")
        if cls in _SCHEMAS:
            raise TypeError(f"{cls.__name__} already has a target schema")
        _SCHEMAS[cls] = self
        self.kind = kind
        self._bound = tuple(
            (f.name, f.encode or canonical_value, f.unset_omitted) for f in self.fields if f.binding
        )
        self._account = tuple((f.name, f.account) for f in self.fields if f.account is not None)

    @property
    def allowed(self) -> tuple[str, ...]:
        # ``kind`` and ``description`` are read by the config loader for every kind of target.
        return ("kind", "description", *self.keys)

    @property
    def own_fields(self) -> tuple[Field, ...]:
        """The fields besides ``COMMON``, as the protocol's docs table lists them."""
        return tuple(f for f in self.fields if not any(f is c for c in COMMON))

    def trust_anchors(self, target: T) -> tuple[tuple[Path, str], ...]:
        """The files ``target`` names in its fields declared ``trust_anchor``, each with what
        that field calls it (an unset field names none)."""
        found: list[tuple[Path, str]] = []
        for f in self.fields:
            if f.trust_anchor:
                value = getattr(target, f.name)
                if value is not None and not isinstance(value, Path):
                    raise TypeError(f"trust anchor field {f.name!r} holds no Path")
                if value is not None:
                    found.append((value, f.trust_anchor))
        return tuple(found)

    def trusted(self, target: T, account: Mapping[str, Any]) -> dict[str, str]:
        """Each file ``trust_anchors`` names (as a string) whose content the account holds ->
        what ``account`` (this target's ``account``) holds for it: the digest of the bytes that
        account was computed from.  (A file read once at load, its content bound another way
        -- an SSH target's ``known_hosts``, whose keys are ``host_keys`` -- is not named.)"""
        return {
            str(getattr(target, f.name)): account[f.name]
            for f in self.fields
            if f.trust_anchor and f.name in account and getattr(target, f.name) is not None
        }

    def read_target(self, name: str, section: Section, context: LoadContext) -> T:
        """``section`` is ``targets.<name>``, whose ``kind`` chose this schema."""
        section.seen.add("kind")
        return self.read(section, context, {"name": name})

    def snapshot(self, target: T) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "name": getattr(target, "name")}  # noqa: B009
        for name, encode, unset_omitted in self._bound:
            value = getattr(target, name)
            if value is None and unset_omitted:
                continue
            out[name] = encode(value)
        return out

    def account(self, target: T) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        for name, part in self._account:
            out[name] = canonical_value(part(getattr(target, name)))
        return out


def schema_of(target: object) -> TargetSchema[Any]:
    try:
        return _SCHEMAS[type(target)]
    except KeyError:
        raise TypeError(f"no target schema declares {type(target).__name__}") from None


# --- snapshot -------------------------------------------------------------------------------------


_PLAIN = frozenset({str, int, float, bool, type(None)})


def canonical_value(value: Any) -> Any:
    """A JSON form of a setting's value: sets sorted, paths as strings, dataclasses as objects."""
    # Exact-type checks first: the engine hashes a target's snapshot once per config load.
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is frozenset or kind is set:
        return sorted([canonical_value(v) for v in value])
    if kind is tuple or kind is list:
        return [canonical_value(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): canonical_value(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: canonical_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
    raise TypeError(f"no canonical form for {type(value).__name__}; give the field an encode")


_CANONICAL = compact_encoder(sort_keys=True, allow_nan=False)


def canonical_json(value: object) -> bytes:
    """Sorted keys, no whitespace, UTF-8: one byte string per value, for hashing."""
    return _CANONICAL(value).encode("utf-8")


def trust_anchors(target: object) -> tuple[tuple[Path, str], ...]:
    """The files that decide whom ``target`` trusts, as its schema declares them
    (``Field.trust_anchor``): each path and what it is."""
    return schema_of(target).trust_anchors(target)


def snapshot(target: object) -> dict[str, Any]:
    """The normalized, canonical, secret-free description of ``target`` that an invocation is
    bound to.  Credential *references* are included (changing the selected secret must change
    the binding); credential values never are — they are not even loaded here."""
    return schema_of(target).snapshot(target)


def trusted(target: object, account: Mapping[str, Any]) -> dict[str, str]:
    """Each trust-anchor file of ``target`` -> its digest in ``account`` (``account(target)``)."""
    return schema_of(target).trusted(target, account)


def account(target: object) -> dict[str, Any]:
    """What of ``target`` decides which remote account a call of it reaches and observes (the
    fields declared ``account``: the credential reference, and the protocol's origin, base
    path, idempotency scope and whom it trusts to answer), canonical and secret-free like
    ``snapshot()`` (which holds a file's path where this holds its content's digest).  Not the
    target's name: a renamed target is not found at all."""
    return schema_of(target).account(target)


_HASHES: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def snapshot_hash(target: object) -> str:
    """``sha256:`` of the canonical snapshot: the hash records written before it was keyed
    hold (``legacy_fingerprint``), never evidence a caller reads -- the snapshot holds the
    credential reference, which a plain hash would confirm to a guesser.  Remembered per target
    value (targets are frozen)."""
    try:
        return _HASHES[target]
    except KeyError:
        pass
    except TypeError:  # unhashable or not weak-referenceable: compute every time
        return _compute_hash(target)
    value = _HASHES[target] = _compute_hash(target)
    return value


def _compute_hash(target: object) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(snapshot(target))).hexdigest()
