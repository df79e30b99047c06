"""Settings declared once: a ``Field`` names the attribute it fills, the TOML key it reads, how
that key is parsed and validated, its default and its documentation.  A ``Schema`` is an ordered
tuple of fields over a frozen dataclass; everything else is derived from it:

* parsing, in declaration order (a field's parser sees the values declared before it, so a
  cross-field rule — ``ca_file`` needs an ``https://`` url — lives with the later field);
* the unknown-setting error and its "allowed" list;
* the snapshot an invocation is bound to (``affidavit.schema.target``): every field, unless it is
  declared ``binding=False`` with a reason;
* the documentation table (``doc_table``), which a test compares with docs/configuration.md.

The dataclass must have exactly the declared attributes (checked on construction), so an
attribute cannot be added to a target without declaring how it is read and whether it binds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Generic, TypeVar, cast

from affidavit.adapters.filestat import read_regular

from .section import MISSING, ConfigError, Section

__all__ = ["Field", "Key", "LoadContext", "Read", "Schema", "content", "doc_table", "same"]

T = TypeVar("T")


@dataclass(frozen=True)
class LoadContext:
    """What parsing needs beyond the table itself."""

    base_dir: Path
    """Relative paths in the file resolve against its directory, not the working directory."""
    has_vault: bool = False

    def resolve_path(self, value: str) -> Path:
        """``value`` absolute as written, else against the config's directory -- never ``~``
        expanded (``Read.resolve_path`` refuses it)."""
        p = Path(value)
        return p if p.is_absolute() else self.base_dir / p


class Read:
    """A field's view of the section being read: its own key and default, the values of the
    fields declared before it, and the load context."""

    __slots__ = ("context", "default", "key", "outer", "section", "values")

    def __init__(
        self,
        section: Section,
        key: str,
        default: Any,
        values: dict[str, Any],
        context: LoadContext,
        outer: Read | None = None,
    ) -> None:
        self.section = section
        self.key = key
        self.default = default
        self.values = values
        self.context = context
        self.outer = outer
        """In a table-valued field's schema: the ``Read`` of that field (its ``values`` are the
        enclosing table's earlier fields)."""

    @property
    def path(self) -> str:
        return self.section.path(self.key)

    @property
    def present(self) -> bool:
        return self.section.has(self.key)

    def raw(self) -> Any:
        return self.section.get(self.key, self.default)

    def string(self, *, max_len: int = 4096) -> Any:
        return self.section.string(self.key, self.default, max_len=max_len)

    def integer(self, lo: int, hi: int) -> int:
        return self.section.integer(self.key, self.default, lo, hi)

    def boolean(self) -> bool:
        return self.section.boolean(self.key, self.default)

    def string_list(self) -> list[str]:
        return self.section.string_list(self.key, self.default)

    def error(self, message: str, at: str = "") -> ConfigError:
        """A ``ConfigError`` at this field's path (plus ``at``, e.g. ``"[2]"``)."""
        return ConfigError(self.path + at, message)

    def resolve_path(self, value: str) -> Path:
        """A path setting's value (``LoadContext.resolve_path``).  One starting with ``~`` is
        refused at this field: expanded, it would name a file under the ``$HOME`` of whichever
        process loads the config -- the CLI's operator's and the daemon's are not the same, so
        one config would name two vaults, two journals, two credentials."""
        if value.startswith("~"):
            raise self.error(
                'starts with "~", which is not expanded (it would be the $HOME of whichever '
                "process loads the config: the CLI's and the daemon's differ): write the path "
                "absolute, or relative to the config file's directory"
            )
        return self.context.resolve_path(value)


@dataclass(frozen=True)
class Key:
    """One TOML key as the documentation lists it."""

    name: str
    default: str
    """As the docs' default column shows it."""
    doc: str


def same(value: Any) -> Any:
    """A field's ``account`` part when the whole value decides the account."""
    return value


def content(path: Path | None) -> str | None:
    """A file field's ``account`` part: what the file holds (``sha256:`` of its bytes), not its
    name -- a CA bundle edited in place trusts other peers.  Read as the driver reads it
    (``read_regular``: a regular file, no wait on a FIFO, at most ``MAX_TRUST_FILE``).  A file
    that cannot be read proves nothing about whom it trusted: a fresh value each time, never
    the same account as any."""
    if path is None:
        return None
    try:
        return "sha256:" + hashlib.sha256(read_regular(path)[0]).hexdigest()
    except OSError:
        return "unreadable:" + secrets.token_hex(16)


def _shown(default: Any) -> str:
    if default is MISSING:
        return "required"
    if default is None:
        return "none"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, str):
        return f'`"{default}"`'
    if isinstance(default, int | float | list):
        return f"`{default}`"
    raise TypeError(f"say how the docs show the default {default!r} (Field.shown)")


@dataclass(frozen=True)
class Field:
    """One setting, declared once."""

    name: str
    """The attribute it fills (and the snapshot key)."""
    parse: Callable[[Read], Any]
    """Reads and validates the key; raises ``ConfigError`` (``Read.error``) with the path."""
    default: Any = MISSING
    """What ``Read`` hands the parser when the key is absent; ``MISSING``: the key is required."""
    doc: str = ""
    key: str | None = ""
    """The TOML key; ``""`` means the same as ``name``; ``None``: a value derived from earlier
    fields that reads no key of its own."""
    shown: str | None = None
    """The default as the docs show it, where the value alone would mislead."""
    binding: bool = True
    """Part of the snapshot an invocation is bound to (seed: "If any bound value changes, create
    a new invocation").  Only a field that cannot change what is sent, or to whom, may opt out,
    and it must say why in ``reason``."""
    reason: str = ""
    encode: Callable[[Any], Any] | None = None
    """The snapshot form of the value; default: ``affidavit.schema.target.canonical_value``."""
    unset_omitted: bool = False
    """The snapshot leaves the field out while its value is None.  For a setting added after
    journals were written: targets that do not use it keep their snapshot hash, and so every
    fingerprint (a same-key retry across the upgrade still matches); once set, it binds."""
    trust_anchor: str = ""
    """The value (a ``Path``, or None: unset) names a file that decides whom the broker trusts
    -- a CA bundle, a host key list -- and this is what a message calls it (``"CA file"``).
    Others may read such a file; whoever can write it, or own it, or a directory on its path,
    could make the broker hand the credential to them: a broker's start checks every one the
    config's targets declare (``affidavit.api.broker.exposed_files``, ``journal.exposure``)."""
    account: Callable[[Any], Any] | None = None
    """The value decides which remote account a call of the target reaches and observes -- its
    origin and base path, its credential reference, its idempotency scope, whom it trusts to
    answer (CA file content, pinned host keys, proxy) -- and this gives the part of it that
    does (the value itself: ``same``; a file's bytes: ``content``).  A reconciliation query or
    an operation's poll runs against the target as configured now: it may only speak for a
    record whose dispatch reached the same account
    (``affidavit.engine.snapshot.ConfigSnapshot.moved``), whatever else of the target changed
    since (a timeout; the ``reconcile`` setting itself)."""

    def __post_init__(self) -> None:
        if self.key == "":
            object.__setattr__(self, "key", self.name)
        if not self.binding and not self.reason.strip():
            raise ValueError(f"field {self.name!r} is declared non-binding without a reason")
        if self.binding and self.reason:
            raise ValueError(f"field {self.name!r} binds; a reason is only for binding=False")

    @property
    def keys(self) -> tuple[Key, ...]:
        """The key it reads, as the docs list it (none: a derived value).  A field reads one
        key: another key is a field of its own (SSH's ``known_hosts`` beside ``host_key``),
        which declares its default, whether it binds and whether it is a trust anchor."""
        if self.key is None:
            return ()
        shown = _shown(self.default) if self.shown is None else self.shown
        return (Key(self.key, shown, self.doc),)


class Schema(Generic[T]):
    """Ordered fields over a frozen dataclass ``cls``; ``implicit`` names attributes the caller
    supplies itself (a target's ``name`` and ``kind``)."""

    def __init__(
        self,
        cls: type[T],
        fields: Sequence[Field],
        *,
        check: Callable[[T, Section], None] | None = None,
        implicit: Collection[str] = (),
    ) -> None:
        names = [f.name for f in fields]
        keys = [k.name for f in fields for k in f.keys]
        for what, items in (("field", names), ("key", keys)):
            twice = sorted({x for x in items if items.count(x) > 1})
            if twice:
                raise TypeError(f"{cls.__name__}: {what} declared twice: {', '.join(twice)}")
        attrs = {a.name for a in dataclasses.fields(cls)}  # type: ignore[arg-type]
        undeclared = sorted(attrs - set(names) - set(implicit))
        unknown = sorted(set(names) - attrs)
        if undeclared or unknown:
            raise TypeError(
                f"{cls.__name__}: attributes without a field: {undeclared or 'none'}; "
                f"fields without an attribute: {unknown or 'none'}"
            )
        self.cls = cls
        self.fields = tuple(fields)
        self.keys = tuple(keys)
        self.check = check

    @property
    def allowed(self) -> tuple[str, ...]:
        """The keys a table may hold, in declaration order (listed in the unknown-key error)."""
        return self.keys

    def read(
        self,
        section: Section,
        context: LoadContext,
        given: Mapping[str, Any] = MappingProxyType({}),
        outer: Read | None = None,
    ) -> T:
        """Parse every field in order, refuse leftover keys, build ``cls(**given, **values)``
        and run ``check`` on it."""
        values: dict[str, Any] = {}
        for f in self.fields:
            values[f.name] = f.parse(Read(section, f.key or "", f.default, values, context, outer))
        section.finish(self.allowed)
        obj = cast(Callable[..., T], self.cls)(**given, **values)
        if self.check is not None:
            self.check(obj, section)
        return obj

    def load(self, data: object, prefix: str, context: LoadContext) -> T:
        return self.read(Section(data, prefix), context)

    def parse_table(self, r: Read) -> T:
        """A ``Field.parse`` for a key whose value is a table of this schema."""
        return self.read(Section(r.raw(), r.path), r.context, outer=r)

    def parse_optional_table(self, r: Read) -> T | None:
        """Like ``parse_table``, but an absent key is ``None``."""
        return self.parse_table(r) if r.present else None


def doc_table(fields: Iterable[Field]) -> str:
    """The Markdown table of ``fields``' keys, as docs/configuration.md shows it."""
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    for key in (k for f in fields for k in f.keys):
        cells = (f"`{key.name}`", key.default, key.doc)
        lines.append("|" + "|".join(f" {c} " if c else " " for c in cells) + "|")
    return "\n".join(lines)
