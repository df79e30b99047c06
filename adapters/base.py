"""What every adapter's trio driver receives from the engine and hands back.

The engine (``affidavit/engine/``) owns the journal; adapters never touch it.  A driver gets an
``AttemptContext`` and must:

1. Drive its ``ProtocolMachine`` (``ctx.machine``) through its declared table, calling
   ``ctx.observe(step, facts)`` after every fired step (facts: secret-free, JSON-able).
2. Immediately *before* handing the first byte of the application request (HTTP) or the SSH
   ``exec`` request to the transport, check ``ctx.machine.crosses_dispatch(event)`` and
   ``await ctx.gate(facts)``.  The gate journals DISPATCH_STARTED as a durable barrier; it may
   raise (lease lost, config changed) and then nothing may be written.  ``meanwhile``
   (optional, synchronous, must not raise): work the driver would do right after the gate that
   does not depend on the barrier -- making the request's bytes -- which the engine runs while
   the barrier commits, before the gate returns, or not at all.  It writes nothing to the
   transport; what it made is dropped unsent if the gate then raises.
3. Stream the remote result's bytes to ``await ctx.sink(stream, data)`` as they arrive (the
   engine redacts and journals them as uncommitted result chunks), never holding a large result
   whole in memory.  Once a result grows past the target's ``max_result`` the sink raises
   ``ResultTooLarge`` (and stores nothing more): stop reading, close the connection or channel
   (never pool it), fire the table's abort step and raise it on (``AttemptInterrupted``), with
   the driver's own facts added if it likes.
4. Finish with exactly one of:
   * return a ``RemoteResult`` — only when the machine reached a completes transition;
   * raise ``SetupError(code, stage)`` — only while ``ctx.machine.dispatched`` is False;
   * raise ``AttemptInterrupted(code)`` — after dispatch without a complete result.
   Any other exception (and ``trio.Cancelled``) propagates; the engine then classifies by
   ``ctx.machine.dispatched`` alone — the last proven boundary, never the exception's name.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from affidavit.statemachine import Code, Outcome, ProtocolMachine, Step

__all__ = [
    "AttemptContext",
    "AttemptInterrupted",
    "DispatchGate",
    "RemoteResult",
    "ResultSink",
    "ResultTooLarge",
    "SetupError",
]


class DispatchGate(Protocol):
    async def __call__(
        self, facts: Mapping[str, Any], meanwhile: Callable[[], None] | None = None
    ) -> None: ...


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
    result_limit: int | None = None
    """The target's ``max_result``: the most bytes of a result ``sink`` takes (all its streams
    together) before it raises ``ResultTooLarge``.  A layer that turns received bytes into others
    before the sink (HTTP's decoding) holds what it receives to it as well."""
    withhold: Callable[[str], None] | None = None
    """If set, ``withhold(stream)``: a layer between the driver and ``sink`` (HTTP's decoding)
    passes ``stream`` on not scanned whole (a ``br`` body): the engine then treats it as a
    stream redaction replaced something in -- none of its sizes or hashes reach a caller,
    ``received_withheld: "unscanned"`` (``engine/echoed.py``)."""
    holds: Callable[[Iterable[str]], bool] | None = None
    """If set, ``holds(texts)``: whether any of a remote's texts holds any form of the secrets
    the streams are redacted of (``Redactor.holds_any``: base64, hex, escaped, in either case) --
    what
    a driver asks of a response head before it calls the bytes received an echo or not (HTTP's
    ``_head_echoed``)."""
    head_word: Callable[[Iterable[str]], str] | None = None
    """If set, ``head_word(texts)``: the record's word for texts ``holds`` found a form in --
    ``short_redacted`` when scrubbing them replaces only whole forms of a value under 8 bytes
    (ordinary text, a year in ``Date``, may be one), else ``redacted`` (the sink's
    ``head_word``).  Unset, a driver says ``redacted``."""
    deadline: float | None = None
    """If set, the trio time at which the target's own total timeout ends the attempt (the
    engine's deadline for it, which began before connection setup): an adapter whose own
    timeout rule records more than the engine's ending would (an SSH exit-status seen) ends
    a little before it.  None when the caller's shorter deadline ends the call: that stop is
    a cancellation whose cause the engine records."""


class SetupError(Exception):
    """Connection setup failed before dispatch.  ``code`` must be a connection_setup code (or a
    credential_injection code when the remote-side credential use failed before dispatch), or
    CONFIG_CHANGED when a setting's content read at set-up (``setting``) is not the one the
    call's validation recorded: the engine refuses the call as its dispatch gate does.

    ``setting``: the target's config key (``ca_file``) when its value -- not the remote, the
    route or the moment -- is why setup failed and fixing it is the way on (a CA file that no
    longer loads).  The engine reports it as the envelope's ``field``
    (``targets.<name>.ca_file``): the key only, never the value (a path, a secret); with
    ``setting`` set, ``detail`` is the adapter's own fixed words, shown in the message."""

    def __init__(
        self, code: Code, stage: str, detail: str = "", *, setting: str | None = None
    ) -> None:
        self.code = code
        self.stage = stage
        self.detail = detail
        self.setting = setting
        super().__init__(f"{code.value} at {stage}" + (f": {detail}" if detail else ""))


class AttemptInterrupted(Exception):
    """The attempt was dispatched and ended without a complete, authentic result."""

    def __init__(self, code: Code, detail: str = "", facts: Mapping[str, Any] | None = None):
        self.code = code
        self.detail = detail
        self.facts = dict(facts or {})
        super().__init__(f"{code.value}" + (f": {detail}" if detail else ""))


class ResultTooLarge(AttemptInterrupted):
    """The result grew past the target's ``max_result`` (``limit``): ``received`` bytes had
    arrived -- ``decoded`` besides, when a layer decoded them before the sink.  Dispatched and
    not complete: outcome unknown, RESULT_SIZE_LIMIT; nothing of it is a result."""

    def __init__(self, limit: int, received: int, decoded: int | None = None) -> None:
        evidence = {"limit": limit, "received_bytes": received}
        if decoded is not None:
            evidence["decoded_bytes"] = decoded
        self.limit, self.received, self.decoded = limit, received, decoded
        super().__init__(
            Code.RESULT_SIZE_LIMIT,
            f"the result passed max_result ({limit} bytes)",
            {"result_size_limit": evidence},
        )


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
    hop: int | None = None
    """The hop whose response this is, when the adapter follows redirects and an earlier hop's
    answer stands as the result (an HTTP 3xx whose next hop was refused or failed after its
    gate): the engine then records that hop's milestones, not the later hop's.  None: the last
    hop dispatched."""
