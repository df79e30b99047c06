"""What a protocol brings to the service, as one value: ``ProtocolSpec``.

A protocol is its target schema (config keys and validation, ``affidavit.schema``), its action
schema (the caller's JSON fields, their parser, and what identifies a request: fingerprint and
idempotency by configuration), its binding to an adapter, and its protocol table.  Config loading,
action parsing, the engine, the diagrams and the model checks all reach a protocol through this
value; see ``affidavit.protocols.registry`` for how specs are found.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from affidavit.adapters.base import AttemptContext, RemoteResult
from affidavit.schema import TargetSchema
from affidavit.statemachine import ProtocolTable

__all__ = ["Action", "ActionSpec", "Binding", "Prepared", "ProtocolSpec"]


class Action(Protocol):
    """What the service reads of any parsed action."""

    kind: ClassVar[str]

    @property
    def target(self) -> str: ...
    @property
    def session(self) -> str | None: ...


@dataclass(frozen=True)
class ActionSpec:
    """The caller's side of a protocol."""

    fields: frozenset[str]
    """The action's JSON fields besides the common ``target`` and ``session``.  A field another
    protocol accepts is UNSUPPORTED_ACTION here; any other unknown field is INVALID_FIELD."""
    parse: Callable[[Mapping[str, Any], str, Any], Action]
    """``(action object, target name, target) -> action``; raises ``ActionInvalid`` only.  Runs
    after the common checks (an object, a configured target, no foreign fields) and must read
    ``session`` last with ``affidavit.protocols.actions.session``."""
    fingerprint: Callable[[Any, Any], Mapping[str, Any]]
    """``(action, target) -> JSON-able request identity``: what is sent, without secrets and
    without the session.  The target snapshot hash is added by the service."""
    idempotent: Callable[[Any, Any], bool]
    """``(action, target) -> bool``: safe to repeat *by the target's configuration*, never by a
    method's or command's name (seed: "The method name serves as evidence, but not as a
    guarantee")."""


@dataclass
class Prepared:
    """A request ready for the adapter, plus what must never leave the broker."""

    request: Any
    secrets: tuple[bytes, ...] = field(repr=False)
    """Exact injected values (and their encodings) to redact from stored/returned results."""
    evidence: Mapping[str, Any]
    """Secret-free facts about the injection, e.g. {"inject": "bearer", "idempotency_header": …}."""


class Binding(Protocol):
    """Turns a validated action, its target and a resolved credential into one adapter attempt."""

    kind: str
    table: ProtocolTable

    def prepare(
        self, action: Any, target: Any, credential: Any, idempotency_key: str | None
    ) -> Prepared:
        """Build the adapter request.  Raises ``CredentialError`` if the credential cannot be
        used (credential_injection phase) — before any connection exists."""
        ...

    def connect_timeout(self, target: Any) -> float: ...

    async def perform(self, prepared: Prepared, ctx: AttemptContext) -> RemoteResult: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class ProtocolSpec:
    """One protocol, registered under ``kind`` (the targets' ``kind = "…"``)."""

    kind: str
    target: TargetSchema[Any]
    action: ActionSpec
    binding: Callable[[], Binding]
    """Called once per broker; the instance keeps its pools until ``aclose()``."""
    table: ProtocolTable
    """The protocol machine's table: registered for the diagrams and the model checks, and the
    one the binding's driver runs."""

    def __post_init__(self) -> None:
        if self.target.kind != self.kind:
            raise ValueError(f"protocol {self.kind!r} has a target schema of {self.target.kind!r}")
