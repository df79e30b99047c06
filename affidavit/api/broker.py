"""The Python API.

    async with affidavit.Broker.open("affidavit.toml") as broker:
        envelope = await broker.call({"target": "billing", "method": "GET", "path": "/v1/x"})
        again = await broker.fetch_result(envelope["invocation_id"])   # a read, never a re-run
        rest = await broker.fetch_result(envelope["invocation_id"], from_chunk=3)  # resume
        record = broker.record(envelope["invocation_id"])              # the projected record
        polled = await broker.poll_operation(envelope["operation"]["id"])  # after a 202

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
from affidavit.engine import CallControl, Deliver, Engine, EngineSettings
from affidavit.journal import Journal, ResultStream
from affidavit.protocols import Binding, load_bindings
from affidavit.protocols.catalog import catalog
from affidavit.secrets.vault import Vault
from affidavit.statemachine import Event, Record, operation_json

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
        owner: str | None = None,
    ) -> AsyncIterator[Broker]:
        """Open the journal named by the config and the protocol bindings; close both after.
        ``settings`` overrides the engine's own numbers (lease margin, inline result limit).
        ``owner`` (the daemon's description, naming its socket) opens the journal as its only
        writer; without it, a journal a daemon owns raises ``JournalLocked`` naming it."""
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
                signing_key=config.journal.signing_key,
                auditor_public_key=config.journal.auditor_public_key,
                owner=owner,
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
        control: CallControl | None = None,
    ) -> dict[str, Any]:
        """Perform one action; return its envelope (``invocation_id``, ``error`` or ``result``,
        ``evidence``).  ``control`` lets a host (the daemon) withdraw or stop it."""
        return await self._engine.call(action, timeout=timeout, deliver=deliver, control=control)

    async def recover(self) -> list[Record]:
        """Close every record a stopped broker left open, with what its events prove (dispatched
        without a result: unknown, never not_attempted).  Only for the journal's owner, which
        knows no other writer is alive: the daemon at start-up."""
        return await self._engine.recover_orphans()

    async def fetch_result(
        self,
        invocation_id: str,
        *,
        from_chunk: int | None = None,
        deliver: Deliver | None = None,
    ) -> dict[str, Any] | None:
        """The recorded envelope of an invocation — never a re-execution.  None if unknown id.
        ``from_chunk=N``: the result's streams from chunk N on, plus ``result.resume`` (each
        stream's chunk count, size and hash) — to resume an interrupted delivery.  Raises
        ``JournalError`` if the stored result fails verification (never altered bytes).  A whole
        result that had not reached its caller is recorded RESULT_DELIVERED by this read (after
        ``deliver``, when given, has handed the envelope over)."""
        return await self._engine.fetch_result(
            invocation_id, from_chunk=from_chunk, deliver=deliver
        )

    def result_stream(self, invocation_id: str) -> ResultStream | None:
        """The stored result, chunk by chunk: ``stream.chunks(name, from_chunk)`` yields each
        chunk of stream ``name`` (``body``; ``stdout``/``stderr``) only after verifying it,
        and raises ``JournalError`` at the first that fails.  None without a stored result."""
        return self._engine.result_stream(invocation_id)

    async def poll_operation(
        self, operation_id: str, *, timeout: float | None = None
    ) -> dict[str, Any]:
        """Query a job's status resource once, as a linked invocation of its target, and return
        ``{"operation": {...}, "poll": the poll's envelope}`` (``poll`` is None when the job had
        already succeeded or failed: nothing is sent).  A poll that gets no readable answer
        leaves the operation's state as it was; the submission is never sent again.  Raises
        ``OperationError`` for an unknown id or a job with no status resource to query.

        The seam for every interface that polls (``affidavit operation poll``, the daemon, the
        MCP tool ``poll_operation``): each calls this, none re-implements it."""
        return await self._engine.poll_operation(operation_id, timeout=timeout)

    def catalog(self) -> dict[str, Any]:
        """The configured targets as callers may know them and one action schema per protocol
        (``affidavit.protocols.catalog``): what the MCP server's tools are built from."""
        return catalog(self.config.targets, self.config.descriptions)

    def operations(self) -> list[dict[str, Any]]:
        """Every operation in the journal, oldest first (``statemachine.operation_json``)."""
        return [operation_json(r) for r in self.journal.list_actions() if r.operation is not None]

    def record(self, invocation_id: str) -> Record | None:
        return self.journal.record(invocation_id)

    def events(self, invocation_id: str) -> list[Event]:
        return self.journal.events(invocation_id)
