"""A fake engine side of ``AttemptContext``: records gate calls, observed steps and sink chunks
so tests assert on exactly what the driver handed the engine."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from affidavit.adapters.base import AttemptContext
from affidavit.adapters.http import HTTP_TABLE
from affidavit.statemachine import ProtocolMachine, Step


class FakeEngine:
    def __init__(
        self,
        *,
        gate_error: BaseException | None = None,
        on_gate: Callable[[Mapping[str, Any]], Awaitable[None]] | None = None,
        commit_error: BaseException | None = None,
    ) -> None:
        self.machine = ProtocolMachine(HTTP_TABLE)
        # ``gate_error``: refused before the barrier's rows (nothing made ahead);
        # ``commit_error``: the barrier failed at its COMMIT, after ``meanwhile`` ran.
        self.gate_error = gate_error
        self.commit_error = commit_error
        self.meanwhiles = 0
        self.on_gate = on_gate
        self.gates: list[dict[str, Any]] = []
        self.observed: list[tuple[Step, dict[str, Any]]] = []
        self.chunks: list[tuple[str, bytes]] = []
        # Snapshot of ``machine.dispatched`` at each gate call: must be False for hop 1 — the
        # gate runs *before* the boundary is crossed.
        self.dispatched_at_gate: list[bool] = []
        self.ctx = AttemptContext(
            machine=self.machine, gate=self._gate, observe=self._observe, sink=self._sink
        )

    async def _gate(
        self, facts: Mapping[str, Any], meanwhile: Callable[[], None] | None = None
    ) -> None:
        self.gates.append(dict(facts))
        self.dispatched_at_gate.append(self.machine.dispatched)
        if self.on_gate is not None:
            await self.on_gate(facts)
        if self.gate_error is not None:
            raise self.gate_error
        if meanwhile is not None:  # as the engine's: during the barrier's COMMIT
            self.meanwhiles += 1
            meanwhile()
        if self.commit_error is not None:
            raise self.commit_error

    def _observe(self, step: Step, facts: Mapping[str, Any]) -> None:
        self.observed.append((step, dict(facts)))

    async def _sink(self, stream: str, data: bytes) -> None:
        self.chunks.append((stream, data))

    @property
    def body(self) -> bytes:
        return b"".join(d for s, d in self.chunks if s == "body")

    @property
    def events(self) -> list[str]:
        return [s.event for s, _ in self.observed]

    @property
    def states(self) -> list[str]:
        return [s.dest for s, _ in self.observed]

    def facts_of(self, event: str) -> list[dict[str, Any]]:
        return [f for s, f in self.observed if s.event == event]
