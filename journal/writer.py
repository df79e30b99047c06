"""The single writer task and group commit.

Seed, "Dispatch shifts the burden of proof": DISPATCH_STARTED must be durable before the first
byte reaches the transport, and RESULT_COMMITTED before delivery.  A barrier's submitter waits
until the commit that makes its write durable (SQLite: WAL with ``synchronous=FULL``;
PostgreSQL: ``synchronous_commit=on``).  Everything queued while the writer is busy, or within
one iteration of the trio loop while it is idle, goes into one transaction (``_hand_off_idle``),
so concurrent invocations share one fsync (group commit; DESIGN, "Durability barriers").  A
batch with no barrier commits without waiting for its flush (``NORMAL``, ``off``): it survives a
process crash and becomes power-loss durable with the next barrier's flush, which covers every
earlier log record -- recovery never depends on such events.

A refused write is not written and answers with its refusal; the other writes of its
transaction are unaffected (one refused submission never affects another's rows).  The rows of
one submission (``Journal.post_many``) are one task's consecutive facts about an invocation,
each presupposing those before it: once one is refused, its later rows for that invocation are
refused too (``commit._insert_each``); a ``joined`` one's rows, about several invocations (a
linked call's claim on the record it serves, then the call's own first rows), are all written
or none (``commit._insert_joined``).

This module is the loop's side: the queue, the hand-off of each batch to one long-lived writer
thread, and waking each write's submitter with its answer.  What a queued write is and what it
answers live in ``requests.py``; the transaction the thread runs over each batch -- the signed
checkpoint, catching up with another writer, a lost connection survived -- in ``commit.py``,
over this ``Writer``'s state: its connection, signing state and the projections it keeps of
each invocation as of its last commit (``projectors``), so ``Journal.record`` can answer
without reading the events back while no other process writes.
"""

from __future__ import annotations

import collections
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import trio

from affidavit.statemachine import Projector

from . import checkpoints
from .backend import Backend
from .commit import attempts
from .errors import JournalError, JournalWriteError
from .requests import Around, Batch, Fail, Hook, Posted, Req, cannot_abort, write_error
from .signing import SigningKey
from .txn import Txn

__all__ = ["Around", "Batch", "Fail", "Hook", "Posted", "Req", "Writer"]

T = TypeVar("T")

MAX_BATCH = 2048
MAX_QUEUED = MAX_BATCH * 4
UNANSWERED_TRIES = 100
"""Reads of the queue ``unanswered`` tries before it names what it read (hand-offs are
microseconds of Python on the loop: a reader that meets one a hundred times is not met)."""


class Writer:
    """Owns the writer connection, the queue of writes and the task that commits them."""

    def __init__(self, backend: Backend, conn: Any, clock: Callable[[], float]) -> None:
        self.backend = backend
        self.conn = conn
        self.tables = backend.tables(conn)
        self.clock = clock
        self.signer: SigningKey | None = None
        """Signs each transaction's checkpoint (set by ``Journal`` once the keys are bound)."""
        self.keys: dict[str, bytes] = {}
        """The keys a head this writer extends must be signed with: its own; on a shared
        journal, every registered broker's (reloaded when a checkpoint names a new one)."""
        self.signed_head: tuple[int, str] | None = None
        """(seq, hash) of the head this writer last committed or checked as covered."""
        self.signed: checkpoints.Known = {}
        """Checkpoints this writer committed, by seq (shared with the journal's reads, which
        then need not verify a row equal to one of them again)."""
        self.projectors: dict[str, Projector] = {}
        self.sessions: dict[str, str | None] = {}
        self.known_head: int | None = None
        """The seq this writer last committed (None: unknown; the caches are empty)."""
        self.appended = 0
        """Transactions this writer committed that appended rows.  On SQLite each is written
        over the frames a COMMIT that raised before it left in the -wal (``CommitUnknown``):
        those are recovered by no open after it (``SegmentStore.doubt``)."""
        self._handoffs = 0
        """Hand-offs begun and ended (odd: one under way): ``unanswered`` reads a consistent
        pair of ``_inflight`` and ``_pending`` from another thread by it."""
        self.answered_at: float | None = None
        """``time.monotonic()`` when the writer thread last finished a transaction (None: not
        yet): how long a stop that ran out of time waited on a journal that stopped answering."""
        self.busy = False
        """A batch is in the writer thread: the cached projectors may be mid-change."""
        self.loop_thread: int | None = None
        """The thread running the trio loop (the only one that may read the caches)."""
        self.before_commit: Hook | None = None
        """See ``Journal.before_commit``."""
        self.around_transaction: Around | None = None
        """See ``Journal.around_transaction``."""
        self.committing = False
        """The COMMIT of the current transaction was sent: if the connection is lost now, only
        a re-read can tell whether it landed (``commit.attempts``)."""
        self.head_held = False
        """The last re-read after a lost connection had a new connection but found the chain
        head still held when its wait ran out (``HeadHeld``): said so, not "no connection"."""
        self._pending: collections.deque[Req[Any]] = collections.deque()
        """Queued writes, oldest first (each hand-off takes up to ``MAX_BATCH`` at once)."""
        self._space = trio.lowlevel.ParkingLot()
        """Writers waiting for room in a full queue (``MAX_QUEUED``)."""
        self._runner: trio.lowlevel.Task | None = None
        """The writer task while it waits to be told to stop (``stop``), or that the writer
        thread stopped (``_die``): not woken per batch (``_done``)."""
        self._closed = True
        """No writes taken: not started yet, or stopping."""
        self.token: trio.lowlevel.TrioToken | None = None
        """The loop's token, once started (the writer thread calls back through it)."""
        self._nursery_mgr: contextlib.AbstractAsyncContextManager[trio.Nursery] | None = None
        self._nursery: trio.Nursery | None = None
        self._batches: queue.SimpleQueue[_Handoff | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._instrument: _HandOffAtIoWait | None = None
        self._inflight: _Handoff | None = None
        """The batch in the writer thread, from ``_hand_off_idle`` until ``_done`` (None: the
        thread is idle)."""
        self._woken = False
        """``_done`` woke writers in this loop iteration: they run in the next one, and what
        they queue there joins what was queued meanwhile."""
        self._dead: BaseException | None = None
        """What stopped the writer thread (not an ``Exception``: a ``KeyboardInterrupt``, a
        ``SystemExit``...): every write queued then was failed, and none is taken since."""

    # -- the task -------------------------------------------------------------------------------

    async def start(self) -> None:
        self.loop_thread = threading.get_ident()
        self.token = trio.lowlevel.current_trio_token()
        self._closed = False
        mgr = trio.open_nursery()
        nursery = await mgr.__aenter__()
        self._nursery_mgr = mgr
        self._nursery = nursery
        nursery.start_soon(self._run)
        # The first write after an idle spell leaves in the loop iteration that queued it,
        # at its end (``_hand_off_idle``).
        self._instrument = _HandOffAtIoWait(self)
        trio.lowlevel.add_instrument(self._instrument)
        # One long-lived thread runs every transaction, fed through a queue: a
        # ``trio.to_thread.run_sync`` per batch cost ~160 us of hand-off here against ~50 us
        # (issue 15), three times per call at concurrency 1.
        self._thread = threading.Thread(
            target=self._thread_main,
            args=(self.token, self._batches),
            name="affidavit-journal-writer",
            daemon=True,
        )
        self._thread.start()

    async def stop(self) -> None:
        """Stop taking writes and wait until everything queued is committed (or failed)."""
        self._closed = True
        self._wake_runner()
        self._space.unpark_all()
        # The writer drains what is queued even if our caller was cancelled: a queued
        # barrier's submitter is waiting (shielded) for its answer.
        assert self._nursery_mgr is not None and self._nursery is not None
        self._nursery.cancel_scope.shield = True
        try:
            await self._nursery_mgr.__aexit__(None, None, None)
        finally:
            if self._instrument is not None:
                with contextlib.suppress(KeyError):  # (gone if it ever raised: it does not)
                    trio.lowlevel.remove_instrument(self._instrument)
                self._instrument = None
            self._batches.put(None)  # the thread ends once idle (it is, the task having ended)
            if self._thread is not None:
                self._thread.join()
                self._thread = None

    def _thread_main(self, token: trio.lowlevel.TrioToken, batches: queue.SimpleQueue[Any]) -> None:
        """The writer thread: run each handed-off batch, then have the loop wake its writers.
        Stopped by anything but an ``Exception`` (a ``KeyboardInterrupt``, a ``SystemExit``
        delivered to it), it first has the loop fail the batch it had and every write queued
        (``_die``) -- else they would wait for it for ever, uncancellably -- then re-raises."""
        handoff: _Handoff | None = None
        try:
            while True:
                handoff = batches.get()
                if handoff is None:
                    return
                fatal: BaseException | None = None
                try:
                    self._run_batch(handoff.batch)
                    self.answered_at = time.monotonic()
                except Exception as exc:  # reported to the writer task, which decides
                    handoff.error = exc
                except BaseException as exc:  # the writer stops: ``_done`` fails everything
                    handoff.error = fatal = exc
                try:
                    token.run_sync_soon(self._done, handoff)
                except trio.RunFinishedError:  # the loop is gone; nobody waits any more
                    return
                handoff = None
                if fatal is not None:
                    raise fatal
                # The next batch waits in ``batches`` meanwhile; this one's writers need not.
                with contextlib.suppress(Exception):
                    self.backend.between(self.conn)
        except BaseException as exc:
            # Between batches, or handing one back: the loop still fails what waits for us.
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._die, exc, handoff)
            raise

    def _done(self, handoff: _Handoff) -> None:
        """On the trio thread, as soon as the loop learns a batch ended: wake its waiting
        writers in this same scheduling pass, rather than waking the writer task to wake them
        one pass later (issue 15: each pass of the loop between a COMMIT and the next batch's
        hand-off is latency at concurrency 1).  The writer task is not woken either (a task
        step per batch, run before the submitter's in half the passes): the thread being idle
        again (``_inflight`` None) is all ``_hand_off_idle`` needs to hand it the next batch.
        Raises nothing: it runs as a ``run_sync_soon`` callback."""
        batch, error = handoff.batch, handoff.error
        if error is not None and not isinstance(error, Exception):  # the writer thread stopped
            self._die(error, handoff)
            return
        if error is not None:  # a bug, not a storage fault: fail the batch, and go on
            self.forget()
            for r in batch:
                r.error = JournalError(f"journal writer failed: {error!r}")
        self.busy = False
        self._inflight = None
        for r in batch:
            r.finished = True
            if r.parked:
                assert r.task is not None
                trio.lowlevel.reschedule(r.task)
                # They run in the next iteration (so there is one: never set with nobody
                # woken, or what is queued would wait in the loop's sleep).
                self._woken = True
        if self._closed:  # ``stop`` waits for the queue to drain
            self._wake_runner()

    def _die(self, error: BaseException, handoff: _Handoff | None) -> None:
        """On the trio thread, once the writer thread stopped with ``error`` (not an
        ``Exception``): fail ``handoff``'s batch (the one it had, if not answered yet) and every
        write still queued, refuse later ones, and have the writer task raise ``error`` again.
        Raises nothing: it runs as a ``run_sync_soon`` callback."""
        if self._dead is not None:
            return  # ``_done`` already did, for the batch the thread stopped in
        if handoff is None and self._inflight is not None and not self._inflight.batch[0].finished:
            handoff = self._inflight  # handed over, never taken: the thread stopped before
        self._dead = error
        self._closed = True
        self._inflight = None
        self.forget()
        self.busy = False
        where, name = self.backend.where, type(error).__name__
        committing, self.committing = self.committing, False
        if handoff is not None:
            if committing:
                why = (
                    f"journal {where}: the writer stopped ({name}) while committing: whether "
                    "the write is durable is unknown until the journal is read again"
                )
            else:
                why = f"journal {where}: the writer stopped ({name}): write not committed"
            for r in handoff.batch:
                r.error = write_error(r, why, unknown=committing)
            self._answer(handoff.batch)
        queued = list(self._pending)
        self._pending.clear()
        why = f"journal {where}: the writer stopped ({name}) before this write: not committed"
        for r in queued:
            r.error = write_error(r, why)
        self._answer(queued)
        self._space.unpark_all()
        self._wake_runner()  # which raises ``error`` again

    @staticmethod
    def _answer(batch: list[Req[Any]]) -> None:
        for r in batch:
            r.result = None
            r.finished = True
            if r.parked:
                assert r.task is not None
                trio.lowlevel.reschedule(r.task)

    def _wake_runner(self) -> None:
        task, self._runner = self._runner, None
        if task is not None:
            trio.lowlevel.reschedule(task)

    def _hand_off_idle(self, timeout: float = 0.0) -> None:
        """At the end of each loop iteration, just before the loop waits for I/O (and lets go
        of the GIL): hand what was queued to the writer thread if it is idle.  Every task of
        the iteration has run, so whatever they queued -- the writers a commit woke included --
        shares one transaction.  Issue 15: the writer task took each batch one loop iteration
        after it was queued (two after a commit: a ``sleep(0)`` to let the woken writers queue
        up), and the thread, woken while the loop still ran the rest of that iteration, then
        waited for the GIL -- a second wake-up.  Raises nothing (an instrument that raised
        would be removed): ``put`` on an unbounded queue does not."""
        woken, self._woken = self._woken, False
        if woken or self._inflight is not None or not self._pending or self._dead is not None:
            return  # (woken: the writers a commit woke have not run yet; they do next)
        # Odd while the batch is in neither ``_pending`` nor ``_inflight`` (``unanswered``).
        self._handoffs += 1
        handoff = _Handoff(self._take())
        self._inflight = handoff
        self._handoffs += 1
        self._batches.put(handoff)

    def _take(self) -> list[Req[Any]]:
        pending = self._pending
        n = min(len(pending), MAX_BATCH)
        batch = [pending.popleft() for _ in range(n)]
        self._space.unpark_all()
        self.busy = True
        return batch

    async def _run(self) -> None:
        """The writer task: holds the nursery ``stop`` waits on until what was queued is
        answered, and raises what stopped the writer thread (``_die``).  ``_hand_off_idle``
        hands what is queued to the thread at the end of the loop iteration that queued it,
        and ``_done`` answers it: neither wakes this task, but for ``stop`` or ``_die``."""
        with trio.CancelScope(shield=True):
            while self._dead is None and (
                not self._closed or self._pending or self._inflight is not None
            ):
                self._runner = trio.lowlevel.current_task()
                await trio.lowlevel.wait_task_rescheduled(cannot_abort)
            if self._dead is not None:
                raise self._dead

    def forget(self) -> None:
        self.projectors.clear()
        self.sessions.clear()
        self.known_head = None

    # -- one batch, one transaction (writer thread) --------------------------------------------

    def _run_batch(self, batch: list[Req[Any]]) -> None:
        """The batch's transaction (``commit.attempts``), inside ``around_transaction``."""
        barrier = any(r.barrier for r in batch)
        around = self.around_transaction
        if around is None:
            attempts(self, batch, barrier)
        else:
            want = "FULL" if barrier else "NORMAL"
            with around(Batch(len(batch), barrier, want)):
                attempts(self, batch, barrier)

    # -- queueing -------------------------------------------------------------------------------

    async def enqueue(
        self,
        op: Callable[[Txn], T | Fail] | None,
        args: tuple[Any, ...] | None = None,
        *,
        barrier: bool,
        result_store: bool = False,
        task: trio.lowlevel.Task | None = None,
        many: bool = False,
        joined: bool = False,
    ) -> Req[T]:
        self._refuse_if_closed()
        while len(self._pending) >= MAX_QUEUED:  # back-pressure: wait for the writer
            await self._space.park()
            self._refuse_if_closed()
        req: Req[T] = Req(op, args, barrier, result_store, task, many, joined)
        # No checkpoint between queueing and parking (``submit``).  An idle writer takes it at
        # the end of this loop iteration (``_hand_off_idle``).
        self._pending.append(req)
        return req

    def _refuse_if_closed(self) -> None:
        if not self._closed:
            return
        if self._dead is not None:
            raise JournalWriteError(
                f"journal {self.backend.where}: the writer stopped "
                f"({type(self._dead).__name__}): write not taken"
            )
        if self.token is None:
            raise JournalError("journal is not open for writing (use `async with Journal.open`)")
        raise JournalError(f"journal {self.backend.where} is closed")

    async def post(
        self,
        op: Callable[[Txn], T | Fail] | None,
        args: tuple[Any, ...] | None = None,
        *,
        result_store: bool = False,
        many: bool = False,
        joined: bool = False,
        shield: bool = False,
        after: tuple[Req[Any], ...] | None = None,
    ) -> Posted[T]:
        """Queue a non-barrier write; return without waiting for its commit.  ``shield``: the
        wait for room in a full queue, its one checkpoint, is not cancellable (``submit``).
        ``after``: earlier writes it presupposes (``Req.after``); ``joined``: ``Req.joined``."""
        if shield and (self._closed or len(self._pending) >= MAX_QUEUED):
            with trio.CancelScope(shield=True):
                req = await self.enqueue(
                    op, args, barrier=False, result_store=result_store, many=many, joined=joined
                )
        else:
            req = await self.enqueue(
                op, args, barrier=False, result_store=result_store, many=many, joined=joined
            )
        req.after = after
        return Posted(req)

    async def submit(
        self,
        op: Callable[[Txn], T | Fail] | None,
        args: tuple[Any, ...] | None = None,
        *,
        barrier: bool,
        result_store: bool = False,
        shield: bool = False,
        meanwhile: Callable[[], None] | None = None,
        cancellable: bool = False,
        after: tuple[Req[Any], ...] | None = None,
        about: tuple[str, str] | None = None,
    ) -> T:
        """Queue a write and wait for its transaction's answer.  ``shield``: a wait for room in
        a full queue is not cancellable either, so the whole call is -- a shielded cancel scope
        only on that rare path, instead of one the caller enters on every call (issue 15).
        ``cancellable``: once queued, the wait for the answer may be given up (``Posted.wait``):
        the write goes on, its answer unread -- only for a write nothing depends on landing.
        ``meanwhile`` (a barrier's): run on the loop, as a callback, while the transaction's
        COMMIT is under way -- once its rows are written and none of them refused, before its
        answer (``_signal_meanwhile``); or not at all (refused, failed first).  It must not
        raise and must not depend on the write being durable: work the submitter would do
        right after it (issue 15, c=1: the loop is idle during the fsync).  ``after``: earlier
        writes it presupposes, failed with the first's error if one failed (``Req.after``).
        ``about``: (invocation id, event kind or what it is) of a checked write, named if a stop
        finds it unanswered (``unanswered``)."""
        if cancellable and (op is not None or meanwhile is not None or result_store):
            # A checked write (a lease's, an expiry's), a result or a callback during the
            # COMMIT: each is a boundary its caller acts on -- never answered unread.
            raise ValueError("a cancellable write is a plain insert: no op, meanwhile or result")
        task = trio.lowlevel.current_task()
        pending = self._pending
        if self._closed or len(pending) >= MAX_QUEUED:  # refused, or back-pressure: wait
            with trio.CancelScope(shield=shield):
                req = await self.enqueue(
                    op, args, barrier=barrier, result_store=result_store, task=task
                )
        else:
            # ``enqueue``, inlined for a queue with room (nearly always): one coroutine fewer
            # per append, which runs once per journal row (issue 15).
            req = Req(op, args, barrier, result_store, task)
            pending.append(req)
        if meanwhile is not None:
            req.meanwhile = meanwhile
        if after is not None:
            req.after = after
        if about is not None:
            req.about = about
        if cancellable:
            return await Posted(req).wait(cancellable=True)
        # Once queued, the write will happen: wait for its answer without being cancellable,
        # so a caller never loses track of a barrier that did commit (seed: classify by the
        # last proven boundary).  A pending cancellation is delivered at the next checkpoint.
        # (Posted.wait inlined: this runs once per append.)
        if not req.finished:
            req.parked = True
            await trio.lowlevel.wait_task_rescheduled(cannot_abort)
        error = req.error
        if error is not None:
            # Nothing reads this request again (it is named by no later one's ``after``); the
            # writer thread may still hold it a moment.  Let go of the caller's op and args
            # here, and of the error -- it names, through its cause's traceback, the writer
            # thread's frames, which name the batch and so this request: a cycle -- else what
            # the call holds (a result's writer, and so its retired segment, locked) outlives
            # the call until a full collection, not until the caller lets the error go.
            req.error = req.op = req.args = None
            try:
                raise error
            finally:
                del error, req, op, args  # (this frame is in the error's traceback)
        return req.result  # type: ignore[return-value]

    # -- what a stop that ran out of time left ------------------------------------------------

    def unanswered(self) -> list[tuple[str, str]]:
        """(invocation id, what) of each write taken and not yet answered -- the batch in the
        writer thread first, then the queue: a checked write by its ``about``, a plain append
        by its rows' event kinds, and ("-", "other write") for one that is neither (a result
        chunk's): ids and kinds only, never a row's attributes.  Safe from any thread, the
        loop's hung or not (``affidavit.stopping.bound``): each container is copied in one
        step, under the GIL, and read again if a hand-off moved a batch from one to the other
        meanwhile (``_handoffs``; a few tries, then what was read)."""
        for _ in range(UNANSWERED_TRIES):
            began = self._handoffs
            inflight = self._inflight
            pending = list(self._pending)
            if began % 2 == 0 and self._handoffs == began:
                break
            time.sleep(0.001)
        reqs = [*(inflight.batch if inflight is not None else ()), *pending]
        named: list[tuple[str, str]] = []
        for r in reqs:
            if r.finished:
                continue
            if r.about is not None:
                named.append(r.about)
            elif r.op is not None or not r.args:
                named.append(("-", "other write"))
            else:
                named.extend(
                    (row[0].invocation_id, row[0].kind.value)
                    for row in (r.args if r.many else (r.args,))
                )
        return named

    # -- the cached projections ----------------------------------------------------------------

    def committed_projector(self, invocation_id: str) -> Projector | None:
        """The invocation's projection as of this writer's last commit, when the writer may
        vouch for it: called on the trio thread while no batch is in the writer thread, with a
        committed head known.  It is the journal's state only while the file's last seq is
        that head -- another process may append to the same file -- so ``Journal.record``
        checks that, except where this commit is the answer asked for (``as_committed``: a
        snapshot as of it) or no other writer can exist (``exclusive``).  Not an empty fold:
        a transaction folds an id before its first row is checked (``Txn.insert``, a batch's
        ``preload``), and a refused first row leaves that fold cached -- a record of a call
        never written, where the file has none."""
        p = self.projectors.get(invocation_id)
        if (
            p is not None
            and p.events
            and not self.busy
            and self.known_head is not None
            and threading.get_ident() == self.loop_thread
        ):
            return p
        return None


class _HandOffAtIoWait(trio.abc.Instrument):
    """Calls ``Writer._hand_off_idle`` as the loop is about to wait for I/O: its hook *is* the
    writer's bound method (trio looks the hook up on the instance), not a method that calls
    it -- one Python frame fewer at each of the ~9 I/O waits of a call (issue 15)."""

    __slots__ = ("before_io_wait",)

    def __init__(self, writer: Writer) -> None:
        self.before_io_wait = writer._hand_off_idle  # type: ignore[method-assign]


class _Handoff:
    """One batch handed to the writer thread, and what the thread raised."""

    __slots__ = ("batch", "error")

    def __init__(self, batch: list[Req[Any]]) -> None:
        self.batch = batch
        self.error: BaseException | None = None
