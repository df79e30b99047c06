"""The engine's front door: ``Engine.call`` runs one action, ``Engine.fetch_result`` reads one.

Three rules shape the engine (seed sections in brackets):

* The envelope is rendered from the projected *durable* record, never from an exception
  ["The error envelope must contain evidence"].  Every path ends by appending its last event as a
  barrier and projecting the journal (``recorder.py``).
* DISPATCH_STARTED is durable before the adapter writes the first byte ["Dispatch shifts the
  burden of proof"].  The adapter calls our gate; the gate's append is shielded from
  cancellation so that, afterwards, the journal alone says whether dispatch was recorded
  (``attempt.py``).
* After a failure the outcome follows the last proven boundary -- ``ctx.machine.dispatched`` or
  the journal's own DISPATCH_STARTED -- not the exception's type ["Classify the error by the last
  proven boundary, not by the function in whose stack the exception was caught"].

The parts, in the order a call meets them: ``invocation.py`` (accept, idempotency, resume, the
credential step, with ``credential.py``), ``approval.py`` (bind, wait, claim; the grant the
gate re-checks; the dispatch of an approved invocation whose caller left), ``attempt.py``
(setup retries, gate, observer), ``sink.py`` (result streams),
``delivery.py`` (store and deliver), ``recovery.py`` (stale records), ``contracts.py`` (what a
complete result says of jobs and batch items) and ``operations.py`` (polling a job);
``recorder.py`` is how they all write the journal, ``snapshot.py`` the bound config,
``settings.py`` the engine's numbers.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import trio

from affidavit.config import Config, send_windows
from affidavit.journal import (
    Journal,
    JournalError,
    JournalUnavailable,
    JournalWriteError,
    ResultStream,
)
from affidavit.protocols import Binding
from affidavit.statemachine import Event, Record
from affidavit.text import named

from . import approval, delivery, invocation, operations
from .approval import ApprovalBoard
from .asker import asker
from .control import CallControl
from .delivery import deliver_stored
from .recorder import Recorder
from .recovery import (
    CallNotRecorded,
    carries_key,
    internal_close,
    journal_refused,
    recover_stale,
)
from .settings import EngineSettings
from .snapshot import ConfigSnapshot
from .takeup import ClaimInvalid, ClaimRefused, check_claim

__all__ = ["Deliver", "Engine"]

T = TypeVar("T")

RECOVERY_WORKERS = 32
"""Open records a recovery closes at once (``Engine._close_open``)."""

log = logging.getLogger("affidavit.engine")

Deliver = delivery.Deliver
"""Sends an envelope to the caller; raising means the transfer failed (RESULT_DELIVERY_FAILED).
``STORE_ONLY``: nobody waits; the result is stored for a later fetch."""


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
        settings: EngineSettings | None = None,
    ) -> None:
        self.config = config
        self.journal = journal
        self.bindings = dict(bindings)
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.vault = vault
        self.settings = settings if settings is not None else EngineSettings()
        # Every record this broker reads judges its key-bound hints by the lease a same-key
        # retry takes under these settings (``JournalReader.send_windows``).
        journal.send_windows = send_windows(config, self.settings.lease_margin)
        self.recorder = Recorder(journal, self.settings.inline_result_limit)
        self.snapshot = ConfigSnapshot(config, journal.keyed_digest)
        self.approvals = ApprovalBoard()
        self.poll_due: dict[str, float] = {}
        """Operation id -> when (``time.monotonic``) this broker may next ask its status
        resource (``operations.paced``)."""

    async def call(
        self,
        action: object,
        *,
        timeout: float | None = None,
        deliver: Deliver | None = None,
        link: Mapping[str, Any] | None = None,
        control: CallControl | None = None,
        requester: int | None = None,
        invocation_id: str | None = None,
        claim: Event | None = None,
    ) -> dict[str, Any]:
        """Run one action; return its envelope.  Never raises for remote or preflight trouble:
        those are envelopes.  ``deliver`` (optional) sends the envelope to the caller; a failure
        there is recorded as RESULT_DELIVERY_FAILED and the result stays fetchable.
        ``control`` (optional) lets the host running the call for a caller -- the daemon --
        withdraw or stop it, recorded with its cause at the boundary the evidence proves.
        ``requester``: the uid asking (the daemon's socket peer; default this process's:
        ``asker``), recorded on ACTION_ACCEPTED and on any lease the call takes -- the uid its
        result is delivered to (``delivery.requested_by``) -- and with an approval request: it
        may not approve itself (``affidavit.approvals``).
        ``invocation_id``: the new invocation's id, fresh from ``new_invocation_id``.
        ``claim``: the row naming it on the record it serves (a reconciliation query's, a
        poll's), written in its first journal write, before its ACTION_ACCEPTED: refused (another
        call of that record is open, or the record moved), nothing of the call is written or
        asked, and ``ClaimRefused`` is raised (``takeup.py``).  A claim that would not head a new
        invocation of ``invocation_id`` -- naming another, or the call's idempotency key
        resolving to a bound invocation -- is refused before anything is written
        (``ClaimInvalid``, a ``ValueError`` with a stable ``code``).

        ``timeout`` must be ``None`` or seconds >= 0: NaN or a negative value is a caller bug,
        refused before anything is journaled (it used to fail mid-call, inside trio).

        ``CallNotRecorded`` (a ``JournalError``) when a shared journal stayed away beyond its
        reconnect window, so that the call's record cannot be read: no envelope, only the
        invocation it names."""
        if timeout is not None and not timeout >= 0:
            raise ValueError("timeout must be None or a number of seconds >= 0")
        if claim is not None:
            check_claim(claim, invocation_id, link)
        return await self._answered(
            invocation.start(
                self,
                action,
                timeout,
                deliver,
                link,
                control,
                asker(requester, self.settings),
                invocation_id,
                claim,
            ),
            control,
            keyed=carries_key(action),
        )

    async def dispatch_approved(
        self,
        invocation_id: str,
        deliver: Deliver,
        control: CallControl | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any] | None:
        """Dispatch an approved invocation whose caller went away (``approval.dispatch_approved``:
        the daemon's dispatcher); None when there was nothing to do.  A call like any other, so
        a journal that failed it is answered as ``call`` answers: ``CallNotRecorded`` naming
        ``invocation_id`` -- never the bare ``JournalUnavailable`` of whichever read failed.
        ``timeout``: as ``call``'s."""
        return await self._answered(
            approval.dispatch_approved(self, invocation_id, deliver, control, timeout),
            control,
            invocation_id,
        )

    async def _answered(
        self,
        run: Awaitable[T],
        control: CallControl | None,
        invocation_id: str | None = None,
        *,
        keyed: bool = False,
    ) -> T | dict[str, Any]:
        """``run`` (a call), answered from the durable record when the journal fails it.
        ``keyed``: its action carries an idempotency_key (``CallNotRecorded``)."""
        try:
            try:
                return await run
            except JournalWriteError as exc:
                # The journal refused a write mid-call (disk full, I/O error): answer with what
                # the durable record proves, closed as recovery would close it.  Nothing durable
                # at all: the journal is unusable, and that is raised (the CLI's exit 2 naming
                # the path).
                return await journal_refused(
                    self.recorder, self.recorder.writing(), exc, self.holder
                )
        except CallNotRecorded:
            raise  # already says which invocation, its cause the journal's own words
        except JournalUnavailable as exc:
            # A read of the record failed, the database away beyond the reconnect window (in
            # journal_refused, in _store_failed, anywhere): nothing durable to render an envelope
            # from.  Which read it was says nothing to the caller; which invocation does.
            iid = (
                invocation_id
                or (control.invocation_id if control is not None else None)
                or self.recorder.writing()
            )
            raise CallNotRecorded(iid, keyed) from exc
        except JournalError:
            raise  # the journal's own failure: answered from what it holds (``call_failure``)
        except (ClaimRefused, ClaimInvalid):
            # Nothing of the call was written (its joined preamble is all or none): its asker
            # answers (``takeup.py``) at once -- no close of a record that does not exist, no
            # waiting on a journal for it, no line saying one was left to recovery.
            raise
        except Exception:
            # Not the journal's (a bug): the record is closed now with that cause and what
            # its events prove -- not left IN_PROGRESS until its lease runs out, then closed as
            # if the broker had stopped -- and the failure goes on to the host, which names
            # the invocation (``internal_failure``).
            iid = invocation_id or self.recorder.writing()
            if control is not None:
                iid = control.invocation_id or iid
                control.invocation_id = iid
            with trio.CancelScope(shield=True):
                await internal_close(self.recorder, iid, self.holder)
            raise
        finally:
            # Normally settled already; after an exception, forget what is left.
            self.recorder.done()

    async def fetch_result(
        self,
        invocation_id: str,
        *,
        from_chunk: int | None = None,
        chunks: int | None = None,
        deliver: Deliver | None = None,
        operator: bool = False,
        defer: bool = False,
        reader: int | None = None,
    ) -> dict[str, Any] | None:
        """The stored envelope of an invocation: a read, never a re-execution.  ``from_chunk``:
        the result's streams from that chunk on (with a ``resume`` table), for a caller resuming
        an interrupted delivery; ``chunks``: at most that many of each stream's (a page, whose
        ``resume.next_chunk`` says where the next starts).  ``defer``: the streams left unread,
        ``Deferred`` (``stored_payload``), for a ``deliver`` -- or a caller -- that reads them
        chunk by chunk as it writes (the daemon's).  ``JournalError`` if the stored result
        fails verification.  A whole stored result that had not reached its caller is
        delivered by this read: RESULT_DELIVERED once it is returned, or once ``deliver`` (the
        daemon's answer) has handed it over whole -- a ``deliver`` refused before its first
        byte (``NotAnswered``) raises that, nothing recorded; a resumed read (``from_chunk``)
        records nothing.  None for an unknown id -- and, unless ``operator`` (the console, the
        embedded CLI), for one a caller may not read (``callable_by_caller``): the same answer,
        so ids cannot be probed.  ``reader``: the uid that reads (the daemon's peer; default this
        process's: ``asker``); a read by another uid than the call's requester records nothing
        (``delivery.requested_by``)."""
        if from_chunk is not None and from_chunk < 0:
            raise ValueError("from_chunk must be >= 0")
        if chunks is not None and (chunks < 1 or from_chunk is None):
            raise ValueError("chunks must be >= 1, with from_chunk")
        # A whole read's reader, before anything is read or written: a host naming every asker
        # refuses one naming none (``NoAsker``) before recovery may close a stale record.  A
        # page (``from_chunk``) delivers nothing and reads as no one.
        whole_reader = asker(reader, self.settings) if from_chunk is None else None
        # Its in-process return's delivery, if still queued, first: never a second one here.
        await self.recorder.delivered(invocation_id)
        # Waits out a shared journal away within its reconnect window, as a write would.
        # The hint is the one at this read (docs/contract.md, "When the hint is computed").
        record = await self.recorder.read(lambda: self.journal.record(invocation_id))
        if record is None or not (operator or self.callable_by_caller(record)):
            return None  # (before anything is written: a forbidden id is closed by no one here)
        try:
            if not record.final:
                # A record whose holder's lease ran out belongs to a broker that stopped
                # mid-call: close it with what the journal proves, so the answer is
                # unknown/reconcile rather than "in progress" forever.  Still a read of the
                # remote: nothing is sent.
                try:
                    record = await recover_stale(self.recorder, record)
                except JournalWriteError:
                    # The close is recovery's, not this read's: a journal that did not take it
                    # leaves the record as it stands -- open (IN_PROGRESS, fetch again), never
                    # a JournalError (answered RESULT_UNVERIFIED) nor a close rendered in
                    # memory (the database's clock might have refused it: lease still live).
                    self.recorder.forget()
                    record = (
                        await self.recorder.read(lambda: self.journal.record(invocation_id))
                        or record
                    )
            if from_chunk is not None:
                to_chunk = None if chunks is None else from_chunk + chunks
                return self.recorder.envelope(
                    record, from_chunk=from_chunk, to_chunk=to_chunk, defer=defer
                )
            assert whole_reader is not None  # (set whenever from_chunk is None)
            return await deliver_stored(self, record, deliver, defer=defer, reader=whole_reader)
        finally:
            self.recorder.done()  # as a call's: nothing kept for this task once it is over

    def callable_by_caller(self, record: Record) -> bool:
        """A caller reads an invocation only on a target it may call: one this broker's
        configuration names (every caller of a broker may call each of its targets; a target
        removed from the configuration is no longer callable, nor its stored results readable
        -- another broker of a shared journal, with other targets, keeps its own; a fenced
        invocation names its binder's target, or ``binder.UNKNOWN_TARGET``, which none names).
        A record that names no target was refused before one was resolved: it holds no
        target's result."""
        return self.callable_target(record.target)

    def callable_target(self, target: str | None) -> bool:
        """``callable_by_caller`` of a record naming ``target``."""
        return target is None or target in self.config.targets

    def result_stream(self, invocation_id: str) -> ResultStream | None:
        """The stored result for delivery chunk by chunk (the daemon's and MCP's seam):
        ``ResultStream.chunks(stream, from_chunk)`` yields each chunk only after verifying it
        against the chained hashes and raises ``JournalError`` at the first that fails.  None
        unless a complete result (its completeness marker) is stored."""
        return self.journal.result_stream(invocation_id)

    async def poll_operation(
        self,
        operation_id: str,
        *,
        timeout: float | None = None,
        control: CallControl | None = None,
        requester: int | None = None,
        deliver: Deliver | None = None,
        operator: bool = False,
    ) -> dict[str, Any]:
        """Query an operation's status resource once as a linked invocation and fold what it
        read (``operations.py``): ``{"operation": ..., "poll": the poll's envelope or None}``.
        ``OperationError`` when there is no such operation or nothing to query -- or, unless
        ``operator``, one a caller may not read (``operations.find``).  ``control``: the
        poll's, as ``call``'s (a shutdown stops it where it is); ``requester``: as ``call``'s
        (the poll is a call, under the target's approval policy); ``deliver``: the surface's,
        which writes the answer (``operations.poll``)."""
        try:
            return await operations.poll(
                self,
                operation_id,
                timeout=timeout,
                control=control,
                requester=asker(requester, self.settings),
                deliver=deliver,
                operator=operator,
            )
        finally:
            self.recorder.done()  # the poll's call was released; the fold written after it too

    async def recover_orphans(self) -> list[Record]:
        """Close every non-final record with what its durable events prove, leases or not.
        Only for a caller that knows no other writer is alive -- the daemon, which holds the
        journal's exclusive lock: every record left open then belongs to a process that
        stopped.  Returns the records it closed, oldest first."""
        return await self._close_open(
            functools.partial(recover_stale, self.recorder, holder_gone=True)
        )

    async def recover_expired(self) -> list[Record]:
        """Close every non-final record whose holder's lease has expired -- safe with other
        brokers alive on a shared journal (theirs are unexpired while they run).  Returns the
        records it closed, oldest first."""
        return await self._close_open(functools.partial(recover_stale, self.recorder))

    async def _close_open(self, close: Callable[[Record], Awaitable[Record]]) -> list[Record]:
        """``close`` every non-final record, ``RECOVERY_WORKERS`` at a time: each record is an
        invocation of its own, and closing them together lets their writes share the writer's
        transactions (group commit) -- one after the other, a journal a crash left with many
        open records took a transaction, and its fsync, per record, and the daemon answered
        nothing until the last (minutes for tens of thousands).  The first failure stops the
        rest and is raised as itself, as the one-by-one loop raised it; stopped part-way (a
        failure, a cancellation: the daemon's start-up stopped by SIGTERM), it logs the records it
        had closed, which the caller's account of its result never names."""
        todo = [r for r in self.journal.list_actions() if not r.final]
        closed: list[Record | None] = [None] * len(todo)
        failed: list[Exception] = []
        taken = 0

        async def worker(scope: trio.CancelScope) -> None:
            nonlocal taken
            try:
                while taken < len(todo) and not failed:
                    i, taken = taken, taken + 1
                    record = todo[i]
                    try:
                        after = await close(record)
                    except Exception as exc:
                        failed.append(exc)
                        scope.cancel()
                        return
                    if after.last_seq != record.last_seq:
                        closed[i] = after
            finally:
                # The recorder keeps per-task state keyed by the task: a worker's would
                # otherwise outlive it (keyed by a dead task) for the daemon's life.
                self.recorder.done()

        try:
            async with trio.open_nursery() as nursery:
                for _ in range(min(RECOVERY_WORKERS, len(todo))):
                    nursery.start_soon(worker, nursery.cancel_scope)
            if failed:
                raise failed[0]
        except BaseException as exc:  # a cancellation (the daemon's start-up stopped) or a failure
            # What was closed before stays closed: said, or the caller's line never names it.
            _log_closed_before(exc, [r for r in closed if r is not None])
            raise
        return [r for r in closed if r is not None]

    def lease_ttl(self, target: Any, timeout: float | None) -> float:
        """How long a call on ``target`` holds its invocation: its total timeout (the caller's,
        when shorter) plus ``settings.lease_margin``."""
        total = target.timeout.total if timeout is None else min(timeout, target.timeout.total)
        return float(total) + self.settings.lease_margin


def _log_closed_before(exc: BaseException, closed: list[Record]) -> None:
    """The records a recovery that did not finish closed before it stopped (ids and outcomes
    only), each as it now stands in the journal."""
    if closed:
        log.warning(
            "recovery stopped (%s) after closing %d record(s): %s",
            _why(exc),
            len(closed),
            named([f"{r.invocation_id} {r.outcome.value}" for r in closed]),
        )


def _why(exc: BaseException) -> str:
    """``cancelled``, or the failure's type (a nursery groups what its tasks raised)."""
    if isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split(trio.Cancelled)
        return "cancelled" if rest is None else _why(rest.exceptions[0])
    return "cancelled" if isinstance(exc, trio.Cancelled) else f"failed: {type(exc).__name__}"
