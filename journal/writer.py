"""The single writer task and group commit.

Seed, "Dispatch shifts the burden of proof": DISPATCH_STARTED must be durable before the first
byte reaches the transport, and RESULT_COMMITTED before delivery.  A barrier's submitter waits
until the commit that makes its write durable (SQLite: WAL with ``synchronous=FULL``;
PostgreSQL: ``synchronous_commit=on``).  Everything queued while the writer is busy, or within
one iteration of the trio loop while it is idle, goes into one transaction (``_hand_off_idle``),
so concurrent invocations share one fsync (group commit; DESIGN, "Durability barriers").  A
batch with no barrier commits without waiting for its flush (``NORMAL``, ``off``): it survives a
process crash and becomes power-loss durable with the next barrier's flush, which covers every
earlier log record -- recovery never depends on such events.  Every backend's
``begin`` holds the chain head for the transaction (``backend.py``), so one writer per process
is also one chain across processes and, on PostgreSQL, across brokers.

Each transaction that appends rows also writes a checkpoint signed with the broker's signing
key -- the seq and hash of its last row -- before its ``COMMIT`` (``signing.py``): every committed
row is covered, and a crash cannot leave unsigned rows.  The cost is one Ed25519 signature and one
small row per transaction, so group commit keeps it per batch, not per row.  Before extending a
head it did not write itself, the writer checks that a valid checkpoint covers it
(``checkpoints.require_covered``): it never signs over rows someone else appended to the file.

The writer also keeps each invocation's projection as of its last commit (``projectors``), so
``Journal.record`` can answer without reading the events back while no other process writes;
when another writer appended, it forgets what that writer touched (``_catch_up``).  A lost
connection is handled in ``_attempts``: never a success the database cannot prove.
"""

from __future__ import annotations

import collections
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import trio

from affidavit.statemachine import Projector

from . import checkpoints
from .backend import Backend
from .connect import recorded_keys
from .errors import (
    CommitUnknown,
    HeadHeld,
    JournalError,
    JournalWriteError,
    ResultStoreFailed,
)
from .signing import SigningKey
from .tables import Tables
from .txn import Txn

__all__ = ["Batch", "Fail", "Posted", "Writer"]

T = TypeVar("T")

MAX_BATCH = 2048
MAX_QUEUED = MAX_BATCH * 4
_PROJECTOR_CACHE = 50_000


@dataclass(frozen=True, slots=True)
class Batch:
    """One writer transaction as ``Journal.before_commit`` and ``Journal.around_transaction``
    see it."""

    writes: int
    """Queued writes (appends, posts, result chunks, lease and idempotency operations) in it."""
    barrier: bool
    """Whether any of them asked for a durability barrier."""
    synchronous: str
    """The durability it commits under: ``FULL`` for a barrier (SQLite's ``PRAGMA
    synchronous=FULL``, PostgreSQL's ``synchronous_commit=on``), else ``NORMAL`` (``off``)."""


Hook = Callable[[Batch], None]
Around = Callable[[Batch], AbstractContextManager[object]]


@dataclass(eq=False)
class Fail:
    """An op's answer when it wrote something (LEASE_LOST) but must still raise to the caller."""

    error: BaseException


class _Req(Generic[T]):
    """One queued write: ``op`` runs in the writer's transaction, or, for a plain append
    (``op`` None), ``Txn.insert(*args)`` does without a closure -- or, with ``many``, one
    ``Txn.insert`` per tuple in ``args`` (several rows computed by their submitter, one
    request: issue 15, "one journal submission per barrier carrying its rows precomputed")."""

    __slots__ = (
        "args",
        "barrier",
        "error",
        "finished",
        "many",
        "meanwhile",
        "op",
        "parked",
        "result",
        "result_store",
        "task",
    )

    def __init__(
        self,
        op: Callable[[Txn], T | Fail] | None,
        args: tuple[Any, ...] | None,
        barrier: bool,
        result_store: bool,
        task: trio.lowlevel.Task | None,
        many: bool = False,
    ) -> None:
        self.op = op
        self.args = args
        self.many = many
        self.barrier = barrier
        self.result_store = result_store
        self.task = task
        self.parked = False
        self.finished = False
        self.result: T | None = None
        self.error: BaseException | None = None
        self.meanwhile: Callable[[], None] | None = None


class Posted(Generic[T]):
    """A write queued by ``Journal.post`` whose commit its author did not wait for."""

    __slots__ = ("_req",)

    def __init__(self, req: _Req[T]) -> None:
        self._req = req

    @property
    def finished(self) -> bool:
        return self._req.finished

    async def wait(self) -> T:
        """The write's answer once its transaction ended (raising its error, if it failed).
        Not cancellable, like every journal write; one task at a time may wait."""
        req = self._req
        if not req.finished:
            assert not req.parked, "another task already waits for this write"
            req.task = trio.lowlevel.current_task()
            req.parked = True
            await trio.lowlevel.wait_task_rescheduled(_cannot_abort)
        if req.error is not None:
            raise req.error
        return req.result  # type: ignore[return-value]


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
        self.busy = False
        """A batch is in the writer thread: the cached projectors may be mid-change."""
        self.loop_thread: int | None = None
        """The thread running the trio loop (the only one that may read the caches)."""
        self.before_commit: Hook | None = None
        """See ``Journal.before_commit``."""
        self.around_transaction: Around | None = None
        """See ``Journal.around_transaction``."""
        self._committing = False
        """The COMMIT of the current transaction was sent: if the connection is lost now, only
        a re-read can tell whether it landed."""
        self._head_held = False
        """The last re-read after a lost connection had a new connection but found the chain
        head still held when its wait ran out (``HeadHeld``): said so, not "no connection"."""
        self._pending: collections.deque[_Req[Any]] = collections.deque()
        """Queued writes, oldest first (each hand-off takes up to ``MAX_BATCH`` at once)."""
        self._space = trio.lowlevel.ParkingLot()
        """Writers waiting for room in a full queue (``MAX_QUEUED``)."""
        self._idle: trio.lowlevel.Task | None = None
        """The writer task, while no batch is in the writer thread (``_hand_off_idle``)."""
        self._closed = True
        """No writes taken: not started yet, or stopping."""
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery_mgr: contextlib.AbstractAsyncContextManager[trio.Nursery] | None = None
        self._nursery: trio.Nursery | None = None
        self._batches: queue.SimpleQueue[_Handoff | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._instrument: _HandOffAtIoWait | None = None
        self._inflight: _Handoff | None = None
        """The batch ``_hand_off_idle`` handed over for the idle writer task, until it wakes."""
        self._dead: BaseException | None = None
        """What stopped the writer thread (not an ``Exception``: a ``KeyboardInterrupt``, a
        ``SystemExit``...): every write queued then was failed, and none is taken since."""

    # -- the task -------------------------------------------------------------------------------

    async def start(self) -> None:
        self.loop_thread = threading.get_ident()
        self._token = trio.lowlevel.current_trio_token()
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
            args=(self._token, self._batches),
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
        writers and the writer task in this same scheduling pass, rather than waking the
        writer task to wake them one pass later (issue 15: each pass of the loop between a
        COMMIT and the next batch's hand-off is latency at concurrency 1).  Raises nothing:
        it runs as a ``run_sync_soon`` callback."""
        batch, error = handoff.batch, handoff.error
        if error is not None and not isinstance(error, Exception):  # the writer thread stopped
            self._die(error, handoff)
            return
        if error is not None:  # a bug, not a storage fault: fail the batch
            self.forget()
            for r in batch:
                r.error = JournalError(f"journal writer failed: {error!r}")
            if isinstance(error, Exception):  # and go on (anything else ends the writer task)
                handoff.error = None
        self.busy = False
        for r in batch:
            r.finished = True
            if r.parked:
                assert r.task is not None
                trio.lowlevel.reschedule(r.task)
        trio.lowlevel.reschedule(handoff.task)

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
        self.forget()
        self.busy = False
        where, name = self.backend.where, type(error).__name__
        committing, self._committing = self._committing, False
        if handoff is not None:
            if committing:
                why = (
                    f"journal {where}: the writer stopped ({name}) while committing: whether "
                    "the write is durable is unknown until the journal is read again"
                )
            else:
                why = f"journal {where}: the writer stopped ({name}): write not committed"
            for r in handoff.batch:
                r.error = CommitUnknown(why) if committing else _write_error(r, why)
            self._answer(handoff.batch)
        queued = list(self._pending)
        self._pending.clear()
        why = f"journal {where}: the writer stopped ({name}) before this write: not committed"
        for r in queued:
            r.error = _write_error(r, why)
        self._answer(queued)
        self._space.unpark_all()
        if handoff is not None:
            handoff.error = error
            trio.lowlevel.reschedule(handoff.task)
        else:
            self._wake_runner()

    @staticmethod
    def _answer(batch: list[_Req[Any]]) -> None:
        for r in batch:
            r.result = None
            r.finished = True
            if r.parked:
                assert r.task is not None
                trio.lowlevel.reschedule(r.task)

    def _wake_runner(self) -> None:
        task, self._idle = self._idle, None
        if task is not None:
            trio.lowlevel.reschedule(task)

    def _hand_off_idle(self) -> None:
        """At the end of each loop iteration, just before the loop waits for I/O (and lets go
        of the GIL): hand what was queued to the writer thread if it is idle.  Every task of
        the iteration has run, so whatever they queued -- the writers a commit woke included --
        shares one transaction.  Issue 15: the writer task took each batch one loop iteration
        after it was queued (two after a commit: a ``sleep(0)`` to let the woken writers queue
        up), and the thread, woken while the loop still ran the rest of that iteration, then
        waited for the GIL -- a second wake-up.  Raises nothing (an instrument that raised
        would be removed): ``put`` on an unbounded queue does not."""
        task = self._idle
        if task is None or not self._pending:
            return
        self._idle = None
        handoff = _Handoff(self._take(), task)
        self._inflight = handoff
        self._batches.put(handoff)

    def _take(self) -> list[_Req[Any]]:
        pending = self._pending
        n = min(len(pending), MAX_BATCH)
        batch = [pending.popleft() for _ in range(n)]
        self._space.unpark_all()
        self.busy = True
        return batch

    async def _run(self) -> None:
        pending = self._pending
        with trio.CancelScope(shield=True):
            while pending or not self._closed:
                # ``_hand_off_idle`` hands what is queued to the thread at the end of the loop
                # iteration that queued it, and ``_done`` wakes us once it is committed; or
                # ``stop`` does, and what is still queued is handed off the same way.
                self._idle = trio.lowlevel.current_task()
                await trio.lowlevel.wait_task_rescheduled(_cannot_abort)
                handoff, self._inflight = self._inflight, None
                if handoff is not None and handoff.error is not None:
                    raise handoff.error
                if self._dead is not None:  # the thread stopped between batches (``_die``)
                    raise self._dead
            if self._dead is not None:
                raise self._dead

    def forget(self) -> None:
        self.projectors.clear()
        self.sessions.clear()
        self.known_head = None

    # -- one batch, one transaction (writer thread) --------------------------------------------

    def _run_batch(self, batch: list[_Req[Any]]) -> None:
        barrier = any(r.barrier for r in batch)
        around = self.around_transaction
        if around is None:
            self._attempts(batch, barrier)
        else:
            want = "FULL" if barrier else "NORMAL"
            with around(Batch(len(batch), barrier, want)):
                self._attempts(batch, barrier)

    def _attempts(self, batch: list[_Req[Any]], barrier: bool) -> None:
        """Run the batch in one transaction.  A storage fault fails every write in it.  A lost
        connection (a shared database restarted, the network cut) is not a fault of the
        writes: the writer reconnects -- within ``Backend.reconnect_within`` -- and, if the
        transaction had not committed, runs the batch again from the head it then finds.  If
        the COMMIT had been sent, the new connection first reads whether its last row is
        there: the writes succeed only if a re-read proves them durable (so the engine never
        dispatches on a DISPATCH_STARTED it cannot prove), and fail with ``CommitUnknown`` when
        no re-read is possible."""
        backend = self.backend
        errors: tuple[type[BaseException], ...] = (*backend.errors, JournalError)
        deadline: float | None = None
        while True:
            proof: list[tuple[int, str]] = []
            try:
                self._transaction(batch, barrier, proof)
                return
            except errors as exc:
                if not backend.lost(exc):
                    self._fail(batch, exc)
                    return
                committing = self._committing
            self.forget()
            if deadline is None:
                deadline = time.monotonic() + backend.reconnect_within
            last = proof[-1] if committing and proof else None
            durable = self._reconnect_and_check(deadline, last)
            if durable is None:
                self._fail_unavailable(batch, committing)
                return
            if durable:
                head = proof[-1]
                self.signed_head = head
                return
            for r in batch:
                r.result = None
                r.error = None

    def _reconnect_and_check(self, deadline: float, proof: tuple[int, str] | None) -> bool | None:
        """Reconnect; then whether the row ``proof`` names is durable (False without one: run
        the batch again).  None: no connection before ``deadline``."""
        backend = self.backend
        errors: tuple[type[BaseException], ...] = (*backend.errors, JournalError)
        delay = 0.05
        self._head_held = False
        while True:
            with contextlib.suppress(Exception):
                backend.close(self.conn)
            try:
                self.conn = backend.connect("writer")
                self.tables = backend.tables(self.conn)
                if proof is None:
                    return False
                # The lost session may still be inside the transaction, its COMMIT on its way
                # (a network cut: the server has not noticed yet).  Read only once that
                # transaction ended: it holds the chain head until then (``Backend.begin``),
                # so taking the head waits for it -- on PostgreSQL up to the lost session's
                # ``idle_in_transaction_session_timeout``, so no longer than ``deadline``
                # (``reconnect_within``): past it, whether the batch landed is unknown
                # (``CommitUnknown``).  A row read before could be missing and land a moment
                # later: the batch run again would append it twice.
                left = deadline - time.monotonic()
                backend.begin(self.conn, barrier=False, wait=max(left, 0.001))
                backend.rollback(self.conn)
                return self.tables.hash_at(proof[0]) == proof[1]
            except errors as exc:
                # The wait ran out (PostgreSQL's lock_timeout aborts the transaction it began):
                # end it, or the connection kept for the next write is stuck in it -- every
                # later write refused ("current transaction is aborted").
                self._head_held = isinstance(exc, HeadHeld)
                with contextlib.suppress(Exception):
                    backend.rollback(self.conn)
            if time.monotonic() + delay > deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _fail(self, batch: list[_Req[Any]], exc: BaseException) -> None:
        # A storage fault, or a head this writer must not sign over: nothing is kept.
        self.forget()
        if isinstance(exc, JournalError):
            why = f"write refused: {exc}"
        else:
            why = f"journal {self.backend.where}: write not committed: {self.backend.describe(exc)}"
        for r in batch:
            r.result = None
            cls = ResultStoreFailed if r.result_store else JournalWriteError
            r.error = cls(why)

    def _fail_unavailable(self, batch: list[_Req[Any]], committing: bool) -> None:
        where, within = self.backend.where, self.backend.reconnect_within
        if committing and self._head_held:
            # A new connection was made: the lost session's transaction, its COMMIT perhaps
            # still on its way, held the chain head for the whole window (``HeadHeld``).
            why = (
                f"journal {where}: the connection was lost while committing, and the lost "
                f"session still held the journal's chain head when [journal] reconnect "
                f"({within:g}s) ran out: whether the write is durable is unknown until the "
                "journal is read again"
            )
        elif committing:
            why = (
                f"journal {where}: the connection was lost while committing and no new one "
                f"could be made within {within:g}s: whether the write is durable is unknown "
                "until the journal is read again"
            )
        else:
            why = (
                f"journal {where}: the connection was lost and no new one could be made within "
                f"{within:g}s: write not committed"
            )
        for r in batch:
            r.result = None
            if r.result_store:
                r.error = ResultStoreFailed(why)
            else:
                r.error = CommitUnknown(why) if committing else JournalWriteError(why)

    def _transaction(
        self, batch: list[_Req[Any]], barrier: bool, proof: list[tuple[int, str]]
    ) -> None:
        """One transaction over the batch; appends (seq, hash) of its last row to ``proof``
        just before its COMMIT is sent."""
        backend = self.backend
        conn, tables = self.conn, self.tables
        errors = backend.errors
        self._committing = False
        try:
            # Inside the try: a begin refused while it waits for the head (a lock_timeout or
            # statement_timeout the database applies) leaves its transaction aborted, and the
            # rollback below ends it -- else every later write on this connection is refused.
            # On a shared journal the wait is bounded by ``reconnect_within`` (``[journal]
            # reconnect``), as the re-read after a lost commit is: another session holding the
            # head longer -- a broker's lost session, its COMMIT never arriving, holds it until
            # the server ends it -- is a database that does not answer this write.  Unbounded,
            # every call waited that long (its dispatch gate included).  Past it, the write
            # fails, not committed (``JournalWriteError``): nothing of it is durable, so
            # nothing it would have preceded is sent.
            wait = backend.reconnect_within if backend.shared else None
            want = backend.begin(conn, barrier=barrier, wait=wait)
            seq, h = tables.head()
            if seq != self.known_head or len(self.projectors) > _PROJECTOR_CACHE:
                self._catch_up(tables, seq)
            signer = self.signer
            assert signer is not None, "the journal binds its signing key before writing"
            if seq and (seq, h) != self.signed_head:
                self._require_covered(tables, seq, h)
                self.signed_head = (seq, h)
            txn = Txn(self, tables, seq, h)
            txn.preload(
                {
                    (r.args[0][0] if r.many else r.args[0]).invocation_id
                    for r in batch
                    if r.op is None and r.args
                }
            )
            insert = txn.insert
            for r in batch:
                # Ops raise their refusals (ImpossibleEvent, JournalError...) before they
                # write anything, so a refusal needs no savepoint; one that wrote first is a
                # bug, and the whole batch is rolled back rather than half-kept.
                op = r.op
                if op is None:  # a plain append: its row joins the pending executemany
                    if r.many:
                        r.result = self._insert_each(insert, r, errors)
                        continue
                    try:
                        r.result = insert(*r.args)  # type: ignore[misc]
                    except errors:
                        raise
                    except Exception as exc:  # refused before queueing a row
                        r.error = exc
                    continue
                txn.flush()  # other ops may read or write rows (results, leases...)
                mark = txn.seq
                try:
                    out = op(txn)
                except errors:
                    raise
                except Exception as exc:
                    if txn.seq != mark:
                        raise
                    r.error = exc
                else:
                    if isinstance(out, Fail):
                        r.error = out.error
                    else:
                        r.result = out
            txn.flush()
            cp = None
            if txn.seq != seq:
                # prev = seq: the head this transaction extended is covered by a checkpoint
                # at exactly that seq (checked above, or this writer's own last commit).
                cp = checkpoints.sign(tables, signer, txn.seq, txn.hash, seq, self.clock())
                proof.append((txn.seq, txn.hash))
            if barrier:
                self._signal_meanwhile(batch)
            hook = self.before_commit
            if hook is not None:
                hook(Batch(len(batch), barrier, want))
            self._committing = True
            backend.commit(conn)
            self._committing = False
            self.known_head = txn.seq
            if cp is not None:
                self.signed_head = (cp.seq, cp.hash)
                checkpoints.remember(self.signed, cp)
        except BaseException:
            # Also after a failed COMMIT: a database may keep the transaction open (SQLite) or
            # aborted (PostgreSQL) until told.  On a lost connection this fails, harmlessly.
            with contextlib.suppress(Exception):
                backend.rollback(conn)
            raise

    def _signal_meanwhile(self, batch: list[_Req[Any]]) -> None:
        """Writer thread, every row of a barrier's transaction written, its COMMIT (the fsync)
        about to be sent: run the ``meanwhile`` of each write in it not refused so far on the
        loop -- the loop, idle while its submitter waits, works during the fsync instead of
        after it.  Once per write (a transaction tried again does not repeat it); a write
        refused or failed later still answers with its error, ``meanwhile`` having run."""
        ready = [r for r in batch if r.meanwhile is not None and r.error is None]
        if not ready or self._token is None:
            return
        fns: list[Callable[[], None]] = []
        for r in ready:
            fns.append(r.meanwhile)  # type: ignore[arg-type]
            r.meanwhile = None
        # FIFO with the ``_done`` queued after the COMMIT: every ``meanwhile`` has run before
        # its submitter is woken.
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(_run_meanwhile, fns)

    @staticmethod
    def _insert_each(
        insert: Callable[..., Any], r: _Req[Any], errors: tuple[type[BaseException], ...]
    ) -> list[Any]:
        """The rows of a ``many`` request, each as its own plain append would be: a row
        refused (before it queued anything) does not stop the others; the request answers
        with the first refusal, as the first of separate appends would have."""
        out = []
        for args in r.args or ():
            try:
                out.append(insert(*args))
            except errors:
                raise
            except Exception as exc:
                if r.error is None:
                    r.error = exc
        return out

    def _catch_up(self, tables: Tables, seq: int) -> None:
        """The head is not the one this writer committed: another writer appended.  On a
        shared journal, forget only the invocations it touched; otherwise start over (the
        projections reload lazily)."""
        known = self.known_head
        if (
            known is None
            or known > seq
            or not self.backend.shared
            or len(self.projectors) > _PROJECTOR_CACHE
        ):
            self.forget()
            return
        for iid in tables.touched_after(known):
            self.projectors.pop(iid, None)
            self.sessions.pop(iid, None)

    def _require_covered(self, tables: Tables, seq: int, h: str) -> None:
        try:
            checkpoints.require_covered(tables, self.backend.where, seq, h, self.keys)
        except JournalError:
            if not self.backend.multi_signer:
                raise
            # A broker that registered its key after this writer last looked.
            self.keys = {**recorded_keys(tables), **self.keys}
            checkpoints.require_covered(tables, self.backend.where, seq, h, self.keys)

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
    ) -> _Req[T]:
        self._refuse_if_closed()
        while len(self._pending) >= MAX_QUEUED:  # back-pressure: wait for the writer
            await self._space.park()
            self._refuse_if_closed()
        req: _Req[T] = _Req(op, args, barrier, result_store, task, many)
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
        if self._token is None:
            raise JournalError("journal is not open for writing (use `async with Journal.open`)")
        raise JournalError(f"journal {self.backend.where} is closed")

    async def post(
        self,
        op: Callable[[Txn], T | Fail] | None,
        args: tuple[Any, ...] | None = None,
        *,
        result_store: bool = False,
        many: bool = False,
        shield: bool = False,
    ) -> Posted[T]:
        """Queue a non-barrier write; return without waiting for its commit.  ``shield``: the
        wait for room in a full queue, its one checkpoint, is not cancellable (``submit``)."""
        if shield and (self._closed or len(self._pending) >= MAX_QUEUED):
            with trio.CancelScope(shield=True):
                req = await self.enqueue(
                    op, args, barrier=False, result_store=result_store, many=many
                )
        else:
            req = await self.enqueue(op, args, barrier=False, result_store=result_store, many=many)
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
    ) -> T:
        """Queue a write and wait for its transaction's answer.  ``shield``: a wait for room in
        a full queue is not cancellable either, so the whole call is -- a shielded cancel scope
        only on that rare path, instead of one the caller enters on every call (issue 15).
        ``meanwhile`` (a barrier's): run on the loop, as a callback, while the transaction's
        COMMIT is under way -- once its rows are written and none of them refused, before its
        answer (``_signal_meanwhile``); or not at all (refused, failed first).  It must not
        raise and must not depend on the write being durable: work the submitter would do
        right after it (issue 15, c=1: the loop is idle during the fsync)."""
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
            req = _Req(op, args, barrier, result_store, task)
            pending.append(req)
        if meanwhile is not None:
            req.meanwhile = meanwhile
        # Once queued, the write will happen: wait for its answer without being cancellable,
        # so a caller never loses track of a barrier that did commit (seed: classify by the
        # last proven boundary).  A pending cancellation is delivered at the next checkpoint.
        # (Posted.wait inlined: this runs once per append.)
        if not req.finished:
            req.parked = True
            await trio.lowlevel.wait_task_rescheduled(_cannot_abort)
        if req.error is not None:
            raise req.error
        return req.result  # type: ignore[return-value]

    # -- the cached projections ----------------------------------------------------------------

    def committed_projector(self, invocation_id: str) -> Projector | None:
        """The invocation's projection as of this writer's last commit, when the writer may
        vouch for it: called on the trio thread while no batch is in the writer thread, with a
        committed head known.  (The caller still checks that the file's last seq is that head:
        another process may append to the same file.)"""
        p = self.projectors.get(invocation_id)
        if (
            p is not None
            and not self.busy
            and self.known_head is not None
            and threading.get_ident() == self.loop_thread
        ):
            return p
        return None


class _HandOffAtIoWait(trio.abc.Instrument):
    """Calls ``Writer._hand_off_idle`` as the loop is about to wait for I/O."""

    __slots__ = ("_writer",)

    def __init__(self, writer: Writer) -> None:
        self._writer = writer

    def before_io_wait(self, timeout: float) -> None:
        self._writer._hand_off_idle()


class _Handoff:
    """One batch handed to the writer thread, the writer task waiting for it, and what the
    thread raised."""

    __slots__ = ("batch", "error", "task")

    def __init__(self, batch: list[_Req[Any]], task: trio.lowlevel.Task) -> None:
        self.batch = batch
        self.task = task
        self.error: BaseException | None = None


def _run_meanwhile(fns: list[Callable[[], None]]) -> None:
    """On the loop (a ``run_sync_soon`` callback, which must not raise): each ``meanwhile``.
    One that raises anyway only loses its head start -- its submitter does the work after the
    write, as without one; the exception (which may quote what it was working on) is dropped
    unlogged."""
    for fn in fns:
        with contextlib.suppress(Exception):
            fn()


def _cannot_abort(_: Any) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.FAILED


def _write_error(r: _Req[Any], why: str) -> JournalWriteError:
    """The error a write failed by a stopped writer gets (``Writer._fail``'s classes)."""
    return ResultStoreFailed(why) if r.result_store else JournalWriteError(why)
