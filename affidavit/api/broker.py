"""The Python API.

    async with affidavit.Broker.open("affidavit.toml") as broker:
        envelope = await broker.call({"target": "billing", "method": "GET", "path": "/v1/x"})
        again = await broker.fetch_result(envelope["invocation_id"])   # a read, never a re-run
        record = broker.record(envelope["invocation_id"])              # the projected record

Runs under trio.  ``call`` never raises for preflight, connection or remote trouble — those are
envelopes whose phase, outcome and retry hint come from the journal.  Exceptions are for misuse
(bad config file, journal unusable).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from affidavit.config import Config, load_config
from affidavit.engine import Deliver, Engine, EngineSettings
from affidavit.journal import Journal
from affidavit.protocols import Binding, load_bindings
from affidavit.secrets.vault import Vault
from affidavit.statemachine import Event, Record

__all__ = ["Broker"]


class Broker:
    def __init__(self, config: Config, journal: Journal, engine: Engine) -> None:
        self.config = config
        self.journal = journal
        self._engine = engine

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        config_path: str | Path | None = None,
        *,
        config: Config | None = None,
        holder: str | None = None,
        settings: EngineSettings | None = None,
    ) -> AsyncIterator[Broker]:
        """Open the journal named by the config and the protocol bindings; close both after.
        ``settings`` overrides the engine's own numbers (lease margin, inline result limit)."""
        if config is None:
            config = load_config(config_path)
        # A configured vault is handed over even before its file exists: a lookup then says
        # the vault file is missing (CREDENTIAL_MISSING), not that no vault is configured.
        vault = Vault(config.vault_path) if config.vault_path else None
        # Only the configured kinds: an HTTP-only config never imports the SSH library.
        bindings: dict[str, Binding] = load_bindings({t.kind for t in config.targets.values()})
        try:
            async with Journal.open(
                config.journal.path,
                key_file=config.journal.key_file,
                auditor_public_key=config.journal.auditor_public_key,
            ) as journal:
                engine = Engine(
                    config, journal, bindings, holder=holder, vault=vault, settings=settings
                )
                yield cls(config, journal, engine)
        finally:
            for binding in bindings.values():
                await binding.aclose()

    async def call(
        self,
        action: Mapping[str, Any],
        *,
        timeout: float | None = None,
        deliver: Deliver | None = None,
    ) -> dict[str, Any]:
        """Perform one action; return its envelope (``invocation_id``, ``error`` or ``result``,
        ``evidence``)."""
        return await self._engine.call(action, timeout=timeout, deliver=deliver)

    async def fetch_result(self, invocation_id: str) -> dict[str, Any] | None:
        """The recorded envelope of an invocation — never a re-execution.  None if unknown id."""
        return await self._engine.fetch_result(invocation_id)

    def record(self, invocation_id: str) -> Record | None:
        return self.journal.record(invocation_id)

    def events(self, invocation_id: str) -> list[Event]:
        return self.journal.events(invocation_id)
