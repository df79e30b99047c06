"""The engine: runs one invocation through the lifecycle, journaling every transition.

accept → validate against a bound config snapshot → resolve the credential → connection setup
with bounded in-broker retries (each attempt recorded) → DISPATCH_STARTED as a durable barrier →
send → classify the complete result → store it and RESULT_COMMITTED as a barrier → deliver.

Three rules shape this module (seed sections in brackets):

* The envelope is rendered from the projected *durable* record, never from an exception
  ["The error envelope must contain evidence"].  Every path ends by appending its last event as a
  barrier and projecting the journal.
* DISPATCH_STARTED is durable before the adapter writes the first byte ["Dispatch shifts the
  burden of proof"].  The adapter calls our gate; the gate's append is shielded from
  cancellation so that, afterwards, the journal alone says whether dispatch was recorded.
* After a failure the outcome follows the last proven boundary — ``ctx.machine.dispatched`` or
  the journal's own DISPATCH_STARTED — not the exception's type ["Classify the error by the last
  proven boundary, not by the function in whose stack the exception was caught"].
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from affidavit.adapters.base import AttemptContext, AttemptInterrupted, RemoteResult, SetupError
from affidavit.config import Config, ConfigError, load_config, snapshot_hash
from affidavit.journal import (
    IdempotencyMismatch,
    Journal,
    LeaseBusy,
    LeaseLost,
    Posted,
    ResultStoreFailed,
)
from affidavit.protocols import Binding, Prepared
from affidavit.protocols.actions import ActionInvalid, fingerprint, is_idempotent, parse_action
from affidavit.secrets.credentials import CredentialError, redactor, resolve
from affidavit.statemachine import (
    BARRIER_KINDS,
    CODES,
    Code,
    Decision,
    Event,
    EventKind,
    EvidenceSource,
    ImpossibleEvent,
    Operation,
    Outcome,
    Phase,
    ProtocolMachine,
    Record,
    Retry,
    Step,
    decide,
    project,
    render_envelope,
)

__all__ = ["Engine", "new_invocation_id"]

log = logging.getLogger("affidavit.engine")

E = EventKind
CHUNK = 64 * 1024
SETUP_ATTEMPTS = 2
"""In-broker connection attempts per try (seed: "Limit the number of attempts and show them in
a single action record"); only codes whose hint is backoff are retried."""
SETUP_RETRY_DELAY = 0.05
INLINE_RESULT_LIMIT = 1024 * 1024
"""Results up to this many (redacted) bytes are kept in memory while they are journaled, so the
envelope is rendered without reading them back; larger ones are read from the store."""
LEASE_MARGIN = 30.0
_PRE_DISPATCH_RETRYABLE = frozenset(
    code
    for code, info in CODES.items()
    if info.phase is Phase.CONNECTION_SETUP and info.retry is Retry.BACKOFF
) - {Code.SETUP_FAILED}
"""Setup failures worth a second in-broker try: the contract's connection_setup codes whose hint
is backoff, except the catch-all SETUP_FAILED (a bad URL or a closed pool fails the same way
twice)."""
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_TO_CROCKFORD = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", _CROCKFORD.encode("ascii"))


def new_invocation_id() -> str:
    """``act_`` + 26 Crockford base32 characters: 48-bit ms time + 80 random bits (sortable)."""
    value = (int(time.time() * 1000) << 80) | int.from_bytes(secrets.token_bytes(10), "big")
    return _encode_id(value)


def _encode_id(value: int) -> str:
    """``act_`` + the 26 Crockford base32 characters of ``value`` (< 2**130), most significant
    first.  Shifted left by 30, the value fills 20 bytes whose first 26 base32 characters are
    exactly those 130 bits (RFC 4648 alphabet, translated to Crockford's) -- one C call instead
    of a 26-step loop on every invocation."""
    raw = base64.b32encode((value << 30).to_bytes(20, "big"))[:26]
    return "act_" + raw.translate(_TO_CROCKFORD).decode("ascii")


class _ConfigChanged(Exception):
    """The gate found the bound target config changed; nothing was written."""


class _LeaseRefusal(Exception):
    """The gate was refused for a stale lease generation; nothing was written to the remote.
    ``recorded``: the journal already wrote LEASE_LOST in the refusing transaction."""

    def __init__(self, recorded: bool) -> None:
        self.recorded = recorded
        super().__init__("lease lost")


_CONFIG_CHANGED_ATTRS = {"code": Code.CONFIG_CHANGED.value, "field": "target"}


@dataclass
class _Attempt:
    """Per-try bookkeeping shared between the engine and the gate/observer/sink closures."""

    iid: str
    generation: int
    holder: str
    lease: tuple[str, int] | None
    target_name: str
    expected_hash: str
    machine: ProtocolMachine
    n: int
    gate_entered: bool = False
    dispatch_recorded: bool = False
    hops: int = 0
    milestones_seen: set[str] = field(default_factory=set)
    pending: list[Event] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)


class _StreamSink:
    """Redacts, hashes and journals result streams in chunks as they arrive (never whole).

    A copy of the redacted bytes is kept while the whole result stays within
    ``INLINE_RESULT_LIMIT``, for the envelope (``kept``)."""

    def __init__(self, journal: Journal, iid: str, secret_values: tuple[bytes, ...]) -> None:
        self._journal = journal
        self._iid = iid
        self._secrets = secret_values
        self._streams: dict[str, dict[str, Any]] = {}
        self._kept = 0
        self._keep = True

    def _stream(self, name: str) -> dict[str, Any]:
        st = self._streams.get(name)
        if st is None:
            st = self._streams[name] = {
                "redactor": redactor(self._secrets),
                "buf": bytearray(),
                "index": 0,
                "sha": hashlib.sha256(),
                "bytes": 0,
                "kept": [],
            }
        return st

    async def __call__(self, name: str, data: bytes) -> None:
        st = self._stream(name)
        st["buf"] += st["redactor"].feed(data)
        while len(st["buf"]) >= CHUNK:
            await self._put(name, st, bytes(st["buf"][:CHUNK]))
            del st["buf"][:CHUNK]

    async def _put(
        self, name: str, st: dict[str, Any], chunk: bytes, *, last: bool = False
    ) -> None:
        st["sha"].update(chunk)
        st["bytes"] += len(chunk)
        if self._keep:
            self._kept += len(chunk)
            if self._kept <= INLINE_RESULT_LIMIT:
                st["kept"].append(chunk)
            else:
                self._keep = False
                for other in self._streams.values():
                    other["kept"].clear()
        if last:
            # The tail rides along with commit_result's transaction; that commit checks
            # ``expected()``, so a tail lost with a failed batch fails it (ResultStoreFailed).
            await self._journal.post_result_chunk(self._iid, name, st["index"], chunk)
        else:
            await self._journal.put_result_chunk(self._iid, name, st["index"], chunk)
        st["index"] += 1

    def expected(self) -> dict[str, str]:
        """{stream: hex SHA-256 of the redacted bytes written}, for ``commit_result(expect=)``."""
        return {name: st["sha"].hexdigest() for name, st in self._streams.items()}

    async def finish(self) -> dict[str, dict[str, Any]]:
        """Flush every stream; return per-stream {sha256, bytes, chunks} (redacted bytes)."""
        out: dict[str, dict[str, Any]] = {}
        for name, st in sorted(self._streams.items()):
            st["buf"] += st["redactor"].flush()
            if st["buf"]:
                await self._put(name, st, bytes(st["buf"]), last=True)
                st["buf"].clear()
            out[name] = {
                "sha256": "sha256:" + st["sha"].hexdigest(),
                "bytes": st["bytes"],
                "chunks": st["index"],
            }
        return out

    def kept(self) -> dict[str, bytes] | None:
        """After ``finish``: every stored stream's redacted bytes, as the journal holds them
        (streams that stored no chunk are not part of a stored result), or None if the result
        was too large to keep."""
        if not self._keep:
            return None
        return {n: b"".join(st["kept"]) for n, st in self._streams.items() if st["index"]}

    def digest(self) -> str:
        whole = hashlib.sha256()
        for name, st in sorted(self._streams.items()):
            whole.update(name.encode() + b"\0" + st["sha"].digest())
        return "sha256:" + whole.hexdigest()


@dataclass(frozen=True, slots=True)
class _Stored:
    """A just-committed result in the shape of ``StoredResult``, for ``_result_payload``."""

    summary: Mapping[str, Any]
    streams: dict[str, bytes]
    sha256: str


Deliver = Callable[[dict[str, Any]], Awaitable[None]]


class Engine:
    """Runs invocations for one broker process.  Holds no outcome state of its own: every
    decision re-reads the journal (seed: in-memory state "gives no grounds for a retry")."""

    def __init__(
        self,
        config: Config,
        journal: Journal,
        bindings: Mapping[str, Binding],
        *,
        holder: str | None = None,
        vault: Any = None,
    ) -> None:
        self.config = config
        self.journal = journal
        self.bindings = dict(bindings)
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.vault = vault
        self._config_stat = self._stat()
        self._snapshots: dict[str, tuple[Any, str]] = {}
        self._posted: dict[trio.lowlevel.Task, list[Posted[Event]]] = {}
        """Diagnostic events each running call posted and has not yet settled (see _append)."""

    # -- public ---------------------------------------------------------------------------------

    async def call(
        self,
        action: object,
        *,
        timeout: float | None = None,
        deliver: Deliver | None = None,
    ) -> dict[str, Any]:
        """Run one action; return its envelope.  Never raises for remote or preflight trouble:
        those are envelopes.  ``deliver`` (optional) sends the envelope to the caller; a failure
        there is recorded as RESULT_DELIVERY_FAILED and the result stays fetchable.

        ``timeout`` must be ``None`` or seconds >= 0: NaN or a negative value is a caller bug,
        refused before anything is journaled (it used to fail mid-call, inside trio)."""
        if timeout is not None and not timeout >= 0:
            raise ValueError("timeout must be None or a number of seconds >= 0")
        try:
            return await self._call(action, timeout, deliver)
        finally:
            # Normally settled already; after an exception, forget what is left.
            self._posted.pop(trio.lowlevel.current_task(), None)

    async def _call(
        self, action: object, timeout: float | None, deliver: Deliver | None
    ) -> dict[str, Any]:
        now = time.time()
        iid = new_invocation_id()
        session = action.get("session") if isinstance(action, Mapping) else None
        if session is not None and not isinstance(session, str):
            session = None
        try:
            parsed = parse_action(action, self.config)
        except ActionInvalid as exc:
            return await self._refuse_new(iid, session, None, exc.code, exc.field, exc.message)

        target = self.config.targets[parsed.target]
        binding = self.bindings.get(target.kind)
        if binding is None:  # a configured kind with no binding cannot be run
            return await self._refuse_new(
                iid,
                session,
                target,
                Code.UNSUPPORTED_ACTION,
                "target",
                "no adapter for this kind",
            )
        idempotent = is_idempotent(parsed, target)
        fp = fingerprint(parsed, target)
        contract = getattr(target, "idempotency", None)
        key: str | None = getattr(parsed, "idempotency_key", None)
        if contract is not None and key is None and not idempotent:
            # A declared remote contract makes an unknown outcome retryable with the same key;
            # the broker mints one so the caller can use it (seed: "Idempotency is defined by
            # the remote contract").
            key = "idem_" + secrets.token_urlsafe(18)
        idem: dict[str, Any] | None = None
        if contract is not None and key is not None:
            expires = now + contract.retention_s
            idem = {
                "key": key,
                "scope": contract.scope,
                "header": contract.header,
                "retention_s": contract.retention_s,
                "expires_at": expires,
            }
            try:
                bound = await self.journal.bind_idempotency(contract.scope, key, fp, iid, expires)
            except IdempotencyMismatch:
                return await self._refuse_new(
                    iid,
                    session,
                    target,
                    Code.IDEMPOTENCY_MISMATCH,
                    "idempotency_key",
                    "this idempotency key is bound to a request with a different fingerprint",
                )
            if bound.invocation_id != iid and self.journal.record(bound.invocation_id) is not None:
                op = Operation(idempotent=idempotent, fingerprint=fp)
                return await self._resume(
                    bound.invocation_id, parsed, target, binding, op, key, timeout, deliver
                )
            iid = bound.invocation_id
        operation = {
            "target": target.name,
            "protocol": target.kind,
            "idempotent": idempotent,
            "fingerprint": fp,
            "idempotency": idem,
            "budget": target.budget,
        }
        # Written in the credential step's shielded section (one cancel scope for the three
        # preflight events, instead of one per event).
        preamble = (
            Event(
                E.ACTION_ACCEPTED,
                iid,
                {
                    "operation": operation,
                    "session": session,
                    "holder": self.holder,
                    "lease_expires_at": now + self._lease_ttl(target, timeout),
                },
            ),
            Event(E.PREFLIGHT_VALIDATED, iid, {"config_hash": self._snapshot_hash(target)}),
        )
        return await self._run_attempt(
            iid,
            parsed,
            target,
            binding,
            key,
            timeout,
            deliver,
            generation=0,
            lease=None,
            preamble=preamble,
        )

    async def fetch_result(self, invocation_id: str) -> dict[str, Any] | None:
        """The stored envelope of an invocation: a read, never a re-execution."""
        record = self.journal.record(invocation_id)
        if record is None:
            return None
        if not record.final:
            # A record whose holder's lease ran out belongs to a broker that stopped mid-call:
            # close it with what the journal proves, so the answer is unknown/reconcile rather
            # than "in progress" forever.  Still a read of the remote: nothing is sent.
            record = await self._recover_stale(record)
        return self._envelope(record)

    # -- the attempt ------------------------------------------------------------------------------

    async def _run_attempt(
        self,
        iid: str,
        action: Any,
        target: Any,
        binding: Binding,
        key: str | None,
        timeout: float | None,
        deliver: Deliver | None,
        *,
        generation: int,
        lease: tuple[str, int] | None,
        preamble: tuple[Event, ...] = (),
        bound_version: str | None = None,
    ) -> dict[str, Any]:
        # One shielded section for the preflight events and the credential step: a caller's
        # cancellation must not leave it unclear which of them landed, and one cancel scope per
        # section is far cheaper than one per event (tests/benchmarks/http_overhead.py).
        with trio.CancelScope(shield=True):
            for event in preamble:
                await self._write(event)
            # Credential injection (seed: still preflight while no byte of the request has
            # left).
            try:
                credential = resolve(
                    target.credential,
                    vault=self.vault,
                    base_dir=self.config.path.parent if self.config.path else None,
                )
                prepared = binding.prepare(action, target, credential, key)
            except CredentialError as exc:
                return await self._finish(
                    iid, Event(E.CREDENTIAL_FAILED, iid, {"code": exc.code.value})
                )
            if bound_version is not None and credential.version != bound_version:
                # Seed: the credential version is bound to the invocation; "if any bound value
                # changes, create a new invocation; do not edit the previous record".  A retry
                # under the old invocation must not silently act with a rotated credential.
                return await self._finish(
                    iid,
                    Event(
                        E.PREFLIGHT_FAILED,
                        iid,
                        {
                            "code": Code.CONFIG_CHANGED.value,
                            "field": "credential",
                            "message": "The credential's version changed since this invocation "
                            "was bound; reconcile, then start a new invocation.",
                        },
                    ),
                )
            await self._write(
                Event(
                    E.CREDENTIAL_AUTHORIZED,
                    iid,
                    {
                        "credential": target.credential,
                        "version": credential.version,
                        **prepared.evidence,
                    },
                )
            )

        expected = self._snapshot_hash(target)
        total = target.timeout.total if timeout is None else min(timeout, target.timeout.total)
        # Who gave up decides the code: the caller's shorter deadline is a cancellation; the
        # target's own total timeout is the remote failing to answer in time.
        timeout_code = (
            Code.CALLER_CANCELLED if total < target.timeout.total else Code.REMOTE_OUTCOME_UNKNOWN
        )
        sink = _StreamSink(self.journal, iid, prepared.secrets)
        attempt = self._new_attempt(iid, generation, lease, target.name, expected, binding, 1)
        result: RemoteResult | None = None
        failure: Event | _LeaseRefusal | None = None
        try:
            with trio.move_on_after(total) as scope:
                for n in range(1, SETUP_ATTEMPTS + 1):
                    if n > 1:
                        attempt = self._new_attempt(
                            iid, generation, lease, target.name, expected, binding, n
                        )
                    result, failure, again = await self._try_once(binding, prepared, attempt, sink)
                    if not again:
                        break
                    await trio.sleep(SETUP_RETRY_DELAY)
        except BaseException:
            # The caller's own cancellation (or an interrupt) after we started: record what the
            # boundary proves, shielded, then let it propagate.
            closing = self._boundary_failure(
                attempt, after=Code.CALLER_CANCELLED, before=Code.CONNECT_TIMEOUT
            )
            with trio.CancelScope(shield=True):
                await self._record_observed(attempt)
                await self._write(closing, barrier=True)
            raise
        if scope.cancelled_caught and result is None and failure is None:
            failure = self._boundary_failure(
                attempt, after=timeout_code, before=Code.CONNECT_TIMEOUT
            )
        # The journal-only tail runs in one shielded section (see above); delivery to a caller's
        # channel is outside it, so a stuck channel stays cancellable.
        with trio.CancelScope(shield=True):
            await self._record_observed(attempt)
            if isinstance(failure, _LeaseRefusal):
                return await self._lease_refused(attempt, failure)
            if failure is not None:
                return await self._finish(iid, failure)
            assert result is not None
            envelope, committed = await self._commit(iid, result, sink)
            if not committed:
                return envelope
            if deliver is None:
                # In-process return: handing the dict back is the complete transfer.
                await self._write(Event(E.RESULT_DELIVERED, iid, {"channel": "return"}))
                await self._settle()  # whoever reads the journal next sees the delivery
                return envelope
        assert deliver is not None  # (the scope cannot swallow a return; mypy cannot tell)
        return await self._deliver(iid, envelope, deliver)

    def _new_attempt(
        self,
        iid: str,
        generation: int,
        lease: tuple[str, int] | None,
        target_name: str,
        expected: str,
        binding: Binding,
        n: int,
    ) -> _Attempt:
        return _Attempt(
            iid=iid,
            generation=generation,
            holder=self.holder,
            lease=lease,
            target_name=target_name,
            expected_hash=expected,
            machine=ProtocolMachine(binding.table),
            n=n,
        )

    async def _try_once(
        self, binding: Binding, prepared: Prepared, attempt: _Attempt, sink: _StreamSink
    ) -> tuple[RemoteResult | None, Event | _LeaseRefusal | None, bool]:
        """One connection attempt: (result, failure event, whether to try setup again)."""
        iid = attempt.iid
        ctx = AttemptContext(
            machine=attempt.machine,
            gate=self._gate(attempt),
            observe=self._observer(attempt),
            sink=sink,
            attempt=attempt.n,
        )
        try:
            return await binding.perform(prepared, ctx), None, False
        except SetupError as exc:
            if self._dispatched(attempt):
                # An adapter bug must never turn a dispatched attempt into not_attempted.
                return None, self._interrupted(iid, Code.REMOTE_OUTCOME_UNKNOWN), False
            attrs = {"stage": exc.stage, "code": exc.code.value}
            if exc.code in _PRE_DISPATCH_RETRYABLE and attempt.n < SETUP_ATTEMPTS:
                await self._append(Event(E.SETUP_ATTEMPT_FAILED, iid, attrs))
                return None, None, True
            if attempt.n > 1:
                # The last try is an attempt of its own (seed: "show them in a single action
                # record ... The final error must not erase the earlier evidence").  SETUP_FAILED
                # alone would be folded into the previous attempt when stage and code repeat.
                await self._append(Event(E.SETUP_ATTEMPT_FAILED, iid, attrs))
            return None, Event(E.SETUP_FAILED, iid, attrs), False
        except _ConfigChanged:
            return None, Event(E.PREFLIGHT_FAILED, iid, _CONFIG_CHANGED_ATTRS), False
        except _LeaseRefusal as exc:
            return None, exc, False
        except AttemptInterrupted as exc:
            if not self._dispatched(attempt):
                # Only a dispatched attempt can be interrupted; before the gate it is setup.
                attrs = {"stage": attempt.machine.state, "code": Code.SETUP_FAILED.value}
                return None, Event(E.SETUP_FAILED, iid, attrs), False
            return None, self._interrupted(iid, exc.code), False
        except Exception as exc:  # classify by the boundary, never by the exception
            # Type name only: library messages may quote remote bytes or request lines.
            log.warning("attempt %s of %s ended by %s", attempt.n, iid, type(exc).__name__)
            failure = self._boundary_failure(
                attempt, after=Code.REMOTE_OUTCOME_UNKNOWN, before=Code.SETUP_FAILED
            )
            return None, failure, False

    def _boundary_failure(self, attempt: _Attempt, after: Code, before: Code) -> Event:
        """The failure the last proven boundary supports: ``after`` once dispatch may have
        happened (outcome unknown), ``before`` otherwise (not_attempted)."""
        if self._dispatched(attempt):
            return self._interrupted(attempt.iid, after)
        attrs = {"stage": attempt.machine.state, "code": before.value}
        return Event(E.SETUP_FAILED, attempt.iid, attrs)

    def _dispatched(self, attempt: _Attempt) -> bool:
        # The gate was entered: its shielded append decides; machine flag as a second witness.
        return attempt.dispatch_recorded or attempt.gate_entered or attempt.machine.dispatched

    def _interrupted(self, iid: str, code: Code) -> Event:
        return Event(E.ATTEMPT_INTERRUPTED, iid, {"code": code.value})

    async def _lease_refused(self, attempt: _Attempt, refusal: _LeaseRefusal) -> dict[str, Any]:
        if not refusal.recorded:
            # The projection refused our stale generation; record that we were stopped.
            with contextlib.suppress(ImpossibleEvent):
                await self._append(
                    Event(E.LEASE_LOST, attempt.iid, {"generation": attempt.generation}),
                    barrier=True,
                )
        return self._envelope(await self._record(attempt.iid), busy=True)

    def _gate(self, attempt: _Attempt) -> Any:
        async def gate(facts: Mapping[str, Any]) -> None:
            hop = int(facts.get("hop", 1) or 1)
            if attempt.dispatch_recorded or hop > 1:
                # A redirect hop is a new dispatch boundary with its own durable evidence.
                attempt.hops = max(attempt.hops, hop)
                with trio.CancelScope(shield=True):
                    await self.journal.append(
                        Event(
                            E.PROTOCOL_OBSERVED,
                            attempt.iid,
                            {
                                "protocol": attempt.machine.table.name,
                                "state": "hop_dispatch",
                                "facts": {f"hop{hop}": dict(facts)},
                            },
                        ),
                        barrier=True,
                    )
                return
            # Re-check the bound config immediately before the write (seed: "re-check it
            # immediately before the write"); a change means a new invocation.
            if self._config_changed(attempt.target_name, attempt.expected_hash):
                raise _ConfigChanged
            attrs: dict[str, Any] = {"generation": attempt.generation, "attempt": attempt.n}
            for k in ("connection", "reused_connection", "peer", "hop", "origin", "via_proxy"):
                if k in facts:
                    attrs[k] = facts[k]
            attempt.gate_entered = True
            try:
                with trio.CancelScope(shield=True):
                    await self.journal.append(
                        Event(E.DISPATCH_STARTED, attempt.iid, attrs),
                        barrier=True,
                        lease=attempt.lease,
                    )
            except LeaseLost:
                attempt.gate_entered = False
                raise _LeaseRefusal(recorded=True) from None
            except ImpossibleEvent:
                attempt.gate_entered = False
                raise _LeaseRefusal(recorded=False) from None
            except BaseException:
                # Unknown whether the barrier landed; the journal will tell (see _dispatched).
                rec = self.journal.record(attempt.iid)
                attempt.gate_entered = rec is not None and rec.evidence.get(
                    "dispatch_started", False
                )
                raise
            attempt.dispatch_recorded = True

        return gate

    def _observer(self, attempt: _Attempt) -> Callable[[Step, Mapping[str, Any]], None]:
        milestones = attempt.machine.table.milestones

        def observe(step: Step, facts: Mapping[str, Any]) -> None:
            attempt.steps.append(step.dest)
            attempt.facts.update(facts)
            kind = milestones.get(step.dest)
            if (
                kind is not None
                and kind not in attempt.milestones_seen
                and attempt.dispatch_recorded
            ):
                attempt.milestones_seen.add(kind)
                # The observer is synchronous (adapters call it inside their I/O loop), so the
                # milestone waits on the attempt and is appended, in order, when it ends; it is
                # diagnostic-grade evidence that recovery never depends on.
                attempt.pending.append(Event(EventKind(kind), attempt.iid, _milestone_attrs(facts)))

        return observe

    async def _record_observed(self, attempt: _Attempt) -> None:
        """Queue the attempt's milestones and protocol summary (caller holds a shield)."""
        for ev in attempt.pending:
            await self._write(ev)
        if attempt.steps:
            facts = {k: v for k, v in attempt.facts.items() if _jsonable(v)}
            facts["path"] = attempt.steps
            await self._write(
                Event(
                    E.PROTOCOL_OBSERVED,
                    attempt.iid,
                    {
                        "protocol": attempt.machine.table.name,
                        "state": attempt.machine.state,
                        "facts": facts,
                    },
                )
            )

    # -- completion ---------------------------------------------------------------------

    async def _commit(
        self, iid: str, result: RemoteResult, sink: _StreamSink
    ) -> tuple[dict[str, Any], bool]:
        """Store the result and RESULT_COMMITTED (a barrier); return the envelope rendered from
        the durable record and whether the result was committed.  Caller holds a shield."""
        streams = await sink.finish()
        digest = sink.digest()
        attrs: dict[str, Any] = {
            "outcome": result.outcome.value,
            "code": result.code.value if result.code else None,
            "response_sha256": digest,
        }
        for k in ("status", "exit_status", "exit_signal", "remote_request_id", "hop"):
            if k in result.facts:
                attrs[k] = result.facts[k]
        if result.retry_after is not None:
            attrs["retry_after"] = result.retry_after
        await self._write(
            Event(E.REMOTE_RESPONSE_COMPLETE, iid, attrs, source=EvidenceSource.REMOTE_RESPONSE)
        )
        summary = {**result.summary, "streams": streams}
        try:
            committed = await self.journal.commit_result(
                Event(E.RESULT_COMMITTED, iid, {"sha256": digest}),
                summary=summary,
                expect=sink.expected(),
            )
        except ResultStoreFailed:
            # Render only what the durable record proves, plus the failure itself.
            self._posted.pop(trio.lowlevel.current_task(), None)  # that batch failed with it
            durable = self.journal.events(iid)
            rec = project([*durable, Event(E.RESULT_STORE_FAILED, iid, {})])
            return render_envelope(rec), False
        record = await self._record(iid)
        kept = sink.kept()
        if kept is None:
            return self._envelope(record), True
        # The result the journal just stored: commit_result(expect=) verified, in the committing
        # transaction, that the stored streams hash to exactly these bytes, and its event
        # carries the stored result's hash -- reading it back would only decrypt and re-hash the
        # same bytes.  The summary goes through JSON as the stored copy did, so this payload
        # equals what fetch_result reads (tests/broker/test_http_e2e.py).
        stored = _Stored(json.loads(json.dumps(summary)), kept, committed.attrs["sha256"])
        return render_envelope(record, _result_payload(stored)), True

    async def _deliver(
        self, iid: str, envelope: dict[str, Any], deliver: Deliver
    ) -> dict[str, Any]:
        try:
            await deliver(envelope)
        except Exception as exc:
            log.warning("delivery of %s failed: %s", iid, type(exc).__name__)
            await self._append(
                Event(E.RESULT_DELIVERY_FAILED, iid, {"channel": "deliver"}), barrier=True
            )
            return self._envelope(await self._record(iid))
        await self._append(Event(E.RESULT_DELIVERED, iid, {"channel": "deliver"}), barrier=True)
        return envelope

    async def _finish(self, iid: str, event: Event) -> dict[str, Any]:
        """Append the call's last event as a barrier and render the durable record."""
        await self._append(event, barrier=True)
        return self._envelope(await self._record(iid))

    async def _refuse_new(
        self,
        iid: str,
        session: str | None,
        target: Any,
        code: Code,
        field_path: str,
        message: str,
    ) -> dict[str, Any]:
        operation = {
            "target": target.name if target is not None else None,
            "protocol": target.kind if target is not None else None,
            "idempotent": False,
            "fingerprint": None,
        }
        await self._append(
            Event(E.ACTION_ACCEPTED, iid, {"operation": operation, "session": session})
        )
        return await self._finish(
            iid,
            Event(
                E.PREFLIGHT_FAILED,
                iid,
                {"code": code.value, "field": field_path, "message": message},
            ),
        )

    # -- resuming an invocation (same idempotency key) ---------------------------------------------

    async def _resume(
        self,
        iid: str,
        action: Any,
        target: Any,
        binding: Binding,
        op: Operation,
        key: str | None,
        timeout: float | None,
        deliver: Deliver | None,
    ) -> dict[str, Any]:
        record = await self._record(iid)
        if not record.final:
            record = await self._recover_stale(record)
            if not record.final:
                # Another worker is running it: IN_PROGRESS, fetch later (rendered as such).
                return self._envelope(record)
        decision = decide(record, op)
        if decision in (Decision.RETRY_SAME_KEY, Decision.RETRY_NEW_ATTEMPT):
            if record.budget.left <= 0:
                return await self._finish(iid, Event(E.RETRY_BUDGET_EXHAUSTED, iid, {}))
            try:
                lease = await self.journal.acquire_lease(
                    iid, self.holder, self._lease_ttl(target, timeout)
                )
            except LeaseBusy:
                # Another worker took the lease between our read and our acquire.
                return self._envelope(await self._record(iid))
            except ImpossibleEvent:
                return self._envelope(await self._record(iid))
            return await self._run_attempt(
                iid,
                action,
                target,
                binding,
                key,
                timeout,
                deliver,
                generation=lease.generation,
                lease=(self.holder, lease.generation),
                bound_version=(record.evidence.get("credential") or {}).get("version"),
            )
        # FETCH, RETURN_RECORDED_RESULT, RECONCILE, STOP_FOR_CORRECTION, RETRY_WHEN_ALLOWED:
        # answer from the record; nothing is sent again.
        return self._envelope(record)

    async def _recover_stale(self, record: Record) -> Record:
        """A non-final record whose holder's lease expired: its broker stopped mid-call.
        Close the stale attempt with what the durable record proves."""
        events = self.journal.events(record.invocation_id)
        expires = None
        for ev in events:
            if ev.kind is E.ACTION_ACCEPTED:
                expires = ev.attrs.get("lease_expires_at")
            elif ev.kind is E.RETRY_LEASE_ACQUIRED:
                expires = ev.attrs.get("expires_at")
        if expires is not None and time.time() < float(expires):
            return record
        if record.state == "authorized" or record.state == "retry_pending":
            # The current attempt never reached its own DISPATCH_STARTED (that would have moved
            # the state to ``dispatched``).  In ``retry_pending`` an *earlier* attempt did, so
            # ``dispatch_started`` is already true and the outcome stays unknown
            # (retry_setup_failed); ATTEMPT_INTERRUPTED is impossible there and would leave the
            # record IN_PROGRESS for ever.
            closing = Event(
                E.SETUP_FAILED,
                record.invocation_id,
                {"code": Code.SETUP_FAILED.value, "stage": "broker_stopped"},
            )
        elif record.evidence.get("dispatch_started") and record.outcome is Outcome.UNKNOWN:
            closing = Event(
                E.ATTEMPT_INTERRUPTED,
                record.invocation_id,
                {
                    "code": Code.REMOTE_OUTCOME_UNKNOWN.value,
                    "message": "The broker stopped after dispatch, before a result was recorded.",
                },
            )
        elif record.state == "completed_committed" or record.state == "completed_rejected":
            # A complete result was recorded but never stored (the broker stopped before
            # RESULT_COMMITTED): keep the proven outcome, never re-run (seed: "Storing the
            # result can fail after remote execution ... not a retry of the remote action").
            closing = Event(
                E.RESULT_STORE_FAILED, record.invocation_id, {"stage": "broker_stopped"}
            )
        else:
            return record
        with contextlib.suppress(ImpossibleEvent):  # someone closed it first; the journal knows
            await self._append(closing, barrier=True)
        return await self._record(record.invocation_id)

    # -- helpers ------------------------------------------------------------------------

    async def _append(self, event: Event, *, barrier: bool = False) -> None:
        # Shielded: a caller's cancellation must not leave it unclear whether a record landed.
        with trio.CancelScope(shield=True):
            await self._write(event, barrier=barrier)

    async def _write(self, event: Event, *, barrier: bool = False) -> None:
        """``_append`` for a caller already inside a shielded section."""
        if barrier or event.kind in BARRIER_KINDS:
            await self.journal.append(event, barrier=True)
            return
        # A diagnostic event rides along with the next barrier's transaction instead of costing
        # a writer round trip of its own (DESIGN, "Durability barriers"; recovery never depends
        # on it).  Queue order puts it before every later write of this call; _record settles
        # it before the journal is read for the envelope.
        posted = await self.journal.post(event)
        task = trio.lowlevel.current_task()
        mine = self._posted.get(task)
        if mine is None:
            self._posted[task] = [posted]
        else:
            mine.append(posted)

    async def _settle(self) -> None:
        """Wait for this call's posted events (committed by now, unless the write that follows
        them has not returned yet); raise the first one's failure, as ``append`` would have."""
        posted = self._posted.pop(trio.lowlevel.current_task(), None)
        error: BaseException | None = None
        for p in posted or ():
            try:
                await p.wait()
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error

    async def _record(self, iid: str) -> Record:
        await self._settle()
        record = self.journal.record(iid, now=time.time())
        assert record is not None, iid
        return record

    def _envelope(self, record: Record, *, busy: bool = False) -> dict[str, Any]:
        result = self.journal.read_result(record.invocation_id)
        payload = _result_payload(result) if result is not None else None
        env = render_envelope(record, payload)
        if busy:
            # This worker's lease was lost at its dispatch gate: another worker holds a newer
            # one.  The record is rendered as is; the error says why this caller did not act.
            env["error"] = {
                "code": Code.LEASE_LOST.value,
                "phase": record.phase.value,
                "outcome": record.outcome.value,
                "retry": "reconcile" if record.outcome is Outcome.UNKNOWN else record.retry.value,
                "message": "Another worker holds this invocation's lease; nothing was sent.",
            }
        return env

    def _snapshot_hash(self, target: Any) -> str:
        """``snapshot_hash`` of one of ``self.config``'s (frozen) targets, computed once."""
        cached = self._snapshots.get(target.name)
        if cached is not None and cached[0] is target:
            return cached[1]
        value = snapshot_hash(target)
        self._snapshots[target.name] = (target, value)
        return value

    def _lease_ttl(self, target: Any, timeout: float | None) -> float:
        total = target.timeout.total if timeout is None else min(timeout, target.timeout.total)
        return float(total) + LEASE_MARGIN

    def _stat(self) -> tuple[int, int] | None:
        path = self.config.path
        if path is None:
            return None
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def _config_changed(self, target_name: str, expected_hash: str) -> bool:
        path = self.config.path
        if path is None:
            return False
        current = self._stat()
        if current == self._config_stat:
            return False
        try:
            fresh = load_config(path)
        except (ConfigError, OSError):
            return True
        target = fresh.targets.get(target_name)
        return target is None or snapshot_hash(target) != expected_hash


def _milestone_attrs(facts: Mapping[str, Any]) -> dict[str, Any]:
    return {k: facts[k] for k in ("status",) if k in facts}


_JSONABLE = (str, int, float, bool, type(None), list, dict)


def _jsonable(value: Any) -> bool:
    return isinstance(value, _JSONABLE)  # a tuple: isinstance with a union type is slower


def _result_payload(result: Any) -> dict[str, Any]:
    """The caller-facing result: the stored summary plus each stream, text when it decodes."""
    out: dict[str, Any] = dict(result.summary)
    out.pop("streams", None)
    for name, data in sorted(result.streams.items()):
        try:
            out[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            out[f"{name}_base64"] = base64.b64encode(data).decode("ascii")
    out["sha256"] = result.sha256
    return out
