"""What every adapter's trio driver receives from the engine and hands back.

The engine (``affidavit/engine/``) owns the journal; adapters never touch it.  A driver gets an
``AttemptContext`` and must:

1. Drive its ``ProtocolMachine`` (``ctx.machine``) through its declared table, calling
   ``ctx.observe(step, facts)`` after every fired step (facts: secret-free, JSON-able).
2. Immediately *before* handing the first byte of the application request (HTTP) or the SSH
   ``exec`` request to the transport, check ``ctx.machine.crosses_dispatch(event)`` and
   ``await ctx.gate(facts)``.  The gate journals DISPATCH_STARTED as a durable barrier; it may
   raise (lease lost, config changed) and then nothing may be written.
3. Stream the remote result's bytes to ``await ctx.sink(stream, data)`` as they arrive (the
   engine redacts and journals them as uncommitted result chunks), never holding a large result
   whole in memory.
4. Finish with exactly one of:
   * return a ``RemoteResult`` — only when the machine reached a completes transition;
   * raise ``SetupError(code, stage)`` — only while ``ctx.machine.dispatched`` is False;
   * raise ``AttemptInterrupted(code)`` — after dispatch without a complete result.
   Any other exception (and ``trio.Cancelled``) propagates; the engine then classifies by
   ``ctx.machine.dispatched`` alone — the last proven boundary, never the exception's name.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from affidavit.statemachine import Code, Outcome, ProtocolMachine, Step

__all__ = [
    "AttemptContext",
    "AttemptInterrupted",
    "DispatchGate",
    "RemoteResult",
    "ResultSink",
    "SetupError",
]


class DispatchGate(Protocol):
    async def __call__(self, facts: Mapping[str, Any]) -> None: ...


ResultSink = Callable[[str, bytes], Awaitable[None]]
Observer = Callable[[Step, Mapping[str, Any]], None]


@dataclass
class AttemptContext:
    machine: ProtocolMachine
    gate: DispatchGate
    observe: Observer
    sink: ResultSink
    attempt: int = 1
    """1-based number of the in-broker connection attempt (setup retries) within this try."""
    fed: Callable[[str], tuple[int, str]] | None = None
    """If set, ``fed(stream)``: (bytes, hex SHA-256) of everything passed to ``sink(stream,
    ...)`` so far, which the sink hashes anyway -- so an adapter that records the hash of the
    bytes it sank (HTTP's ``body_sha256``) need not hash them a second time (issue 15)."""


class SetupError(Exception):
    """Connection setup failed before dispatch.  ``code`` must be a connection_setup code (or a
    credential_injection code when the remote-side credential use failed before dispatch)."""

    def __init__(self, code: Code, stage: str, detail: str = "") -> None:
        self.code = code
        self.stage = stage
        self.detail = detail
        super().__init__(f"{code.value} at {stage}" + (f": {detail}" if detail else ""))


class AttemptInterrupted(Exception):
    """The attempt was dispatched and ended without a complete, authentic result."""

    def __init__(self, code: Code, detail: str = "", facts: Mapping[str, Any] | None = None):
        self.code = code
        self.detail = detail
        self.facts = dict(facts or {})
        super().__init__(f"{code.value}" + (f": {detail}" if detail else ""))


@dataclass
class RemoteResult:
    """A complete, authentic remote result and how the adapter classifies it.

    ``outcome`` is committed or rejected; ``code`` None means success.  ``facts`` are secret-free
    (status, exit_status, exit_signal, selected headers, hop); the bytes went through the sink.
    ``summary`` is the JSON-able, non-sensitive part of the result the caller sees beside the
    streams (e.g. HTTP status and selected headers, SSH exit status)."""

    outcome: Outcome
    code: Code | None
    facts: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    retry_after: float | None = None
