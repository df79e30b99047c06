"""Protocol bindings: what the engine needs to run one kind of target.

A binding joins a config target kind (``"http"``, ``"ssh"``) to its adapter: it builds the
adapter's request from a validated action and a resolved credential, names the values to redact,
and performs one attempt through the adapter's driver.  Adding a protocol means adding a module
here (found by ``load_bindings()``) plus its adapter package — no edit to the engine, the
journal or the state-machine core.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from affidavit.adapters.base import AttemptContext, RemoteResult
from affidavit.statemachine import ProtocolTable

__all__ = ["Binding", "Prepared", "load_bindings"]


@dataclass
class Prepared:
    """A request ready for the adapter, plus what must never leave the broker."""

    request: Any
    secrets: tuple[bytes, ...] = field(repr=False)
    """Exact injected values (and their encodings) to redact from stored/returned results."""
    evidence: Mapping[str, Any]
    """Secret-free facts about the injection, e.g. {"inject": "bearer", "idempotency_header": …}."""


class Binding(Protocol):
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


def load_bindings() -> dict[str, Binding]:
    """One instance of every binding module's ``BINDING_CLASS``, keyed by target kind."""
    out: dict[str, Binding] = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        cls = getattr(module, "BINDING_CLASS", None)
        if cls is not None:
            binding = cls()
            out[binding.kind] = binding
    return out
