"""Where protocols are found: Python entry points, or ``register()`` in-process.

Every protocol — HTTP and SSH included — is an installed distribution's entry point in the group
``affidavit.protocols``, named by its ``kind`` and pointing at a ``ProtocolSpec``::

    [project.entry-points."affidavit.protocols"]
    http = "affidavit.protocols.http:PROTOCOL"

Entry points are the packaging standard for plugins: a protocol shipped in its own distribution
is found by a fresh process (``affidavit call``, a daemon) with no edit to this package and no
import-time side effect, and the built-ins prove that path on every run.  ``register()`` adds a
spec in-process (tests, embedding code).

Nothing is imported until asked for: ``get(kind)`` scans the entry-point metadata once and
imports only that protocol, so ``affidavit --help`` imports no protocol and a config naming only
HTTP targets never imports the SSH library.  ``registered()`` loads all of them.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

from affidavit.statemachine import register as register_table
from affidavit.statemachine import unregister as unregister_table

from .spec import Binding, ProtocolSpec

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = [
    "GROUP",
    "ProtocolLoadError",
    "get",
    "kinds",
    "load_bindings",
    "register",
    "registered",
    "unregister",
]

GROUP = "affidavit.protocols"

_specs: dict[str, ProtocolSpec] = {}
_entry_points: dict[str, list[EntryPoint]] | None = None


class ProtocolLoadError(Exception):
    """An installed protocol cannot be used (import failed, not a ``ProtocolSpec``, declared
    twice).  An installation problem, reported with the protocol's kind."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        self.message = message
        super().__init__(f'protocol "{kind}": {message}')


def register(spec: ProtocolSpec) -> ProtocolSpec:
    """Make ``spec`` known under its kind, and its table to the diagrams and model checks.
    Registering the same spec again is a no-op; another spec under a taken kind is an error."""
    existing = _specs.get(spec.kind)
    if existing is not None and existing is not spec:
        raise ValueError(f"another protocol is already registered as {spec.kind!r}")
    register_table(spec.table)
    _specs[spec.kind] = spec
    return spec


def unregister(kind: str) -> None:
    """Forget a registered protocol and its table (an installed one is found again by ``get``)."""
    spec = _specs.pop(kind, None)
    _judged.pop(kind, None)
    if spec is not None:
        unregister_table(spec.table.name)


def _discovered() -> dict[str, list[EntryPoint]]:
    global _entry_points
    if _entry_points is None:
        # Deferred: scanning the installed distributions costs milliseconds nobody should pay
        # for `--help`.
        from importlib.metadata import entry_points

        found: dict[str, list[EntryPoint]] = {}
        for ep in entry_points(group=GROUP):
            found.setdefault(ep.name, []).append(ep)
        _entry_points = found
    return _entry_points


def kinds() -> list[str]:
    """Every kind that ``get`` can return, without importing any protocol."""
    return sorted({*_specs, *_discovered()})


def get(kind: str) -> ProtocolSpec | None:
    """The protocol registered as ``kind``, loading its entry point on first use; ``None`` if no
    protocol has that kind.  Raises ``ProtocolLoadError`` for a broken installation."""
    spec = _specs.get(kind)
    if spec is not None:
        # Registered in-process (``register()``): judged as an installed one is, so a config
        # naming it is refused CONFIG_INVALID rather than a call raising TypeError.
        if _judged.get(kind) is not spec:
            _judge(spec)
        return spec
    eps = _discovered().get(kind)
    if not eps:
        return None
    if len({ep.value for ep in eps}) > 1:
        where = ", ".join(sorted(ep.value for ep in eps))
        raise ProtocolLoadError(kind, f"declared more than once ({where})")
    try:
        loaded = eps[0].load()
    except Exception as exc:
        raise ProtocolLoadError(kind, f"cannot load {eps[0].value} ({exc!r})") from exc
    if not isinstance(loaded, ProtocolSpec) or loaded.kind != kind:
        raise ProtocolLoadError(kind, f"{eps[0].value} is not a ProtocolSpec of that kind")
    _judge(loaded)
    return register(loaded)


def _judge(spec: ProtocolSpec) -> None:
    """Refuse a protocol written against an older interface -- a binding whose ``prepare``
    takes no ``trusted`` (``OLD_PREPARE``), a reconcile ``verdict`` that takes no ``values``
    (``OLD_VERDICT``) -- when its kind is first asked for (a config naming it is refused
    CONFIG_INVALID, never a TypeError mid-call), and remember a spec judged fine: ``get`` runs
    several times a call (the engine's contracts, approvals), and reading a signature costs ~60
    us (issue 15: judging it each time cost a sixth of a call's CPU at c=64).  A refused spec
    is judged, and refused, again each time."""
    made = spec.binding
    if isinstance(made, type) and not _takes_trusted(*_prepare_of(made)):
        raise ProtocolLoadError(spec.kind, OLD_PREPARE)
    if spec.reconcile is not None:
        try:
            inspect.signature(spec.reconcile.verdict).bind(None, {}, {}, {})
        except (TypeError, ValueError):
            raise ProtocolLoadError(spec.kind, OLD_VERDICT) from None
    _judged[spec.kind] = spec


_judged: dict[str, ProtocolSpec] = {}
"""By kind, the spec ``_judge`` found fine (another spec registered under the kind is judged)."""

OLD_VERDICT = (
    "its reconcile contract's verdict(target, summary, streams) takes no fourth argument, "
    "values (the bound values its query was filled with: a condition compares an echo of the "
    "key to them): make it verdict(target, summary, streams, values) "
    "(docs/adding-a-protocol.md)"
)


def registered() -> dict[str, ProtocolSpec]:
    """Every protocol, installed or registered in-process, by kind (loads them all)."""
    for kind in kinds():
        get(kind)
    return dict(sorted(_specs.items()))


def load_bindings(kinds_wanted: set[str] | frozenset[str] | None = None) -> dict[str, Binding]:
    """One binding per protocol (or per kind in ``kinds_wanted``), keyed by target kind."""
    out: dict[str, Binding] = {}
    specs = registered() if kinds_wanted is None else {k: get(k) for k in sorted(kinds_wanted)}
    for kind, spec in specs.items():
        if spec is None:
            continue
        binding = spec.binding()
        if binding.kind != kind or binding.table is not spec.table:
            raise ProtocolLoadError(kind, "its binding serves another kind or table")
        if not _takes_trusted(binding.prepare):  # a binding made by a factory, not a class
            raise ProtocolLoadError(kind, OLD_PREPARE)
        out[kind] = binding
    return out


OLD_PREPARE = (
    "its binding's prepare(action, target, credential, idempotency_key) takes no fifth "
    "argument, trusted (each file the target trusts -> the sha256 of the bytes the call "
    "recorded): add it (docs/adding-a-protocol.md)"
)


def _prepare_of(cls: type) -> tuple[object, ...]:
    """A binding class's ``prepare`` as ``_takes_trusted`` checks it: a plain function after
    ``self``; a ``staticmethod`` or ``classmethod`` (its class bound) as a call through an
    instance sees it, with no ``self`` before the five arguments."""
    found = inspect.getattr_static(cls, "prepare", None)
    if isinstance(found, (staticmethod, classmethod)):
        return (found.__get__(None, cls),)
    return (getattr(cls, "prepare", None), None)


def _takes_trusted(prepare: object, *leading: object) -> bool:
    """Whether ``Binding.prepare`` (after ``leading``: ``self`` for a class's function)
    accepts its five arguments -- an out-of-tree protocol written before ``trusted`` was added
    takes four: refused when it is loaded (the config naming its kind), never a TypeError at
    a call."""
    try:
        signature = inspect.signature(prepare)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    try:
        signature.bind(*leading, None, None, None, None, {})
    except TypeError:
        return False
    return True
