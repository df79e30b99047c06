"""One batch, one transaction: what the writer thread does with each batch handed to it.

Seed, "Dispatch shifts the burden of proof": a barrier's transaction commits under the
durability it asked for (SQLite: ``synchronous=FULL``; PostgreSQL: ``synchronous_commit=on``)
before its submitter is answered (``writer.py`` answers it, on the loop).  Every backend's
``begin`` holds the chain head for the transaction (``backend.py``), so one writer per process
is also one chain across processes and, on PostgreSQL, across brokers.

Each transaction that appends rows also writes a checkpoint signed with the broker's signing
key -- the seq and hash of its last row -- before its ``COMMIT`` (``signing.py``): every committed
row is covered, and a crash cannot leave unsigned rows.  The cost is one Ed25519 signature and
one small row per transaction, so group commit keeps it per batch, not per row.  Before
extending a head it did not write itself, the writer checks that a valid checkpoint covers it
(``checkpoints.require_covered``): it never signs over rows someone else appended to the file.
When another writer appended, the writer's cached projections of what it touched are forgotten
(``_catch_up``).  A lost connection is handled in ``attempts``: never a success the database
cannot prove.

These functions run on the writer thread only, and read and write the ``Writer`` they are given
(its connection, its signing state, its cached projections, ``committing``/``head_held``): the
writer's state stays in one object, the code that runs a transaction over it here.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from . import checkpoints
from .connect import recorded_keys
from .errors import (
    CommitUnknown,
    HeadHeld,
    JournalError,
    JournalReplaced,
    JournalWriteError,
    ResultStoreFailed,
    ResultStoreReplaced,
)
from .requests import Batch, Fail, Req, write_error
from .tables import Tables
from .txn import Txn

if TYPE_CHECKING:
    from .writer import Writer

__all__ = ["attempts"]

log = logging.getLogger("affidavit.journal")

LOST_RUNS = 20
"""At most this many runs of one batch may lose their connection (``attempts``).  A restart or a
cut costs a batch one lost run, however long the reconnect takes; a batch whose every run loses
its session while new connections succeed (a backend killed by what it writes -- out of memory,
a trigger, a middlebox dropping it) is not run again without end.  Lost runs are spaced as
reconnects are (``RERUN_DELAY`` doubling to ``RERUN_DELAY_MAX``): 20 runs span about 15 s, so
``[journal] reconnect`` (10 s by default) is normally the bound that ends a flapping outage,
the count only a short window's backstop."""

RERUN_DELAY = 0.05
RERUN_DELAY_MAX = 1.0
"""The first wait before a connect is tried again, or a lost batch run again, and the most it
doubles to."""

_PROJECTOR_CACHE = 50_000
"""Past this many cached projections, the writer starts over (``_catch_up``)."""


def attempts(w: Writer, batch: list[Req[Any]], barrier: bool) -> None:
    """Run the batch in one transaction.  A storage fault fails every write in it.  A lost
    connection (a shared database restarted, the network cut) is not a fault of the
    writes: the writer reconnects -- within ``Backend.reconnect_within`` -- and, if the
    transaction had not committed, runs the batch again from the head it then finds -- while
    ``reconnect_within`` from the first loss lasts (a rerun's wait for the head included), at
    most ``LOST_RUNS`` runs, spaced as reconnects are from the second lost run on.  If the
    COMMIT had been sent, the new connection first waits for the head (the lost session's
    transaction ended, its COMMIT landed or not) and reads whether its last row is there: the
    writes succeed only if a re-read proves them durable (so the engine never dispatches on a
    DISPATCH_STARTED it cannot prove), and fail with ``CommitUnknown`` when no re-read is
    possible.  A COMMIT sent with no row to read back (a batch of result chunks, auditor
    copies, ``chunk_owners``, a reclaim -- a lease always writes an event row) leaves a doubt
    no later run clears but its own commit: the batch, run again, fails ``CommitUnknown``
    however its later runs end, and a later run that commits answers the writes it refused (a
    chunk whose attempt closed meanwhile) unknown too.  A COMMIT that raised on SQLite fails
    its writes ``CommitUnknown`` too, unless its error says the -wal write failed
    (``Backend.commit_may_have_landed``): no re-read can tell, the frames it wrote to the -wal
    being visible only to the open after a crash."""
    backend = w.backend
    errors: tuple[type[BaseException], ...] = (*backend.errors, JournalError)
    deadline: float | None = None
    lost = 0
    doubt = False  # a run's COMMIT was sent, and no row of it could be read back
    delay = RERUN_DELAY
    while True:
        proof: list[tuple[int, str]] = []
        try:
            _transaction(w, batch, barrier, proof, deadline)
            if doubt:
                _refusals_in_doubt(w, batch)
            return
        except errors as exc:
            if not backend.lost(exc):
                if doubt:
                    _fail_in_doubt(w, batch, exc)
                elif w.committing and backend.commit_may_have_landed(exc):
                    _fail_unknown(w, batch, exc)
                else:
                    _fail(w, batch, exc)
                if backend.renew_after_refusal and isinstance(exc, backend.errors):
                    _renew(w)
                return
            committing = w.committing
            lost += 1
            words = backend.describe(exc)  # the driver's, never the rows
        w.forget()
        if deadline is None:
            deadline = time.monotonic() + backend.reconnect_within
        last = proof[-1] if committing and proof else None
        doubt = doubt or (committing and last is None)
        durable = _reconnect_and_check(w, deadline, last, wait_head=committing)
        if durable is None:
            _fail_unavailable(w, batch, committing=committing, doubt=doubt)
            return
        if durable:
            head = proof[-1]
            w.signed_head = head
            return
        # A new connection, and the batch not committed on the lost one.  One lost run is a
        # restart or a cut ridden out (the reconnect loop waited it out): said by nothing --
        # an embedded ``affidavit call``'s stderr is its one line.  From the second lost run
        # on, which batch keeps losing its session, one warning per run, with the driver's
        # words.  Not when a re-read proved the lost COMMIT landed.
        if lost >= 2:
            log.warning(
                "journal %s: the connection was lost %s (%s): run %d of at most %d",
                backend.where, "while committing" if committing else "during a write",
                words, lost, LOST_RUNS,
            )  # fmt: skip
        left = deadline - time.monotonic()
        if lost >= LOST_RUNS or left <= 0:
            # Reconnecting succeeds, the batch's session is lost again: the bound is
            # ``reconnect`` from the first loss, and ``LOST_RUNS`` runs.  A re-read that found
            # the batch's last row absent proves that run not committed; a COMMIT sent with no
            # row to read back, on this run or an earlier one, is unknown.
            _fail_lost_again(w, batch, lost, unknown=doubt)
            return
        if lost >= 2:
            # Spaced as reconnects are: a network or proxy whose sessions pass the connect and
            # drop is waited out within ``reconnect``, not run through in a tenth of a second.
            # Not after the first loss: the reconnect that followed it already waited.
            time.sleep(min(delay, left))
            delay = min(delay * 2, RERUN_DELAY_MAX)
        for r in batch:
            r.result = None
            r.error = None


def _reconnect_and_check(
    w: Writer, deadline: float, proof: tuple[int, str] | None, *, wait_head: bool
) -> bool | None:
    """Reconnect; then whether the row ``proof`` names is durable (False without one: run
    the batch again -- after waiting for the head when ``wait_head``, a COMMIT having been
    sent).  None: no connection before ``deadline``, or the head still held at it."""
    backend = w.backend
    errors: tuple[type[BaseException], ...] = (*backend.errors, JournalError)
    delay = RERUN_DELAY
    w.head_held = False
    while True:
        with contextlib.suppress(Exception):
            backend.close(w.conn)
        try:
            w.conn = backend.connect("writer")
            w.tables = backend.tables(w.conn)
            if proof is None and not wait_head:
                return False
            # The lost session may still be inside the transaction, its COMMIT on its way
            # (a network cut: the server has not noticed yet).  Read only once that
            # transaction ended: it holds the chain head until then (``Backend.begin``),
            # so taking the head waits for it -- on PostgreSQL up to the lost session's
            # ``idle_in_transaction_session_timeout``, so no longer than ``deadline``
            # (``reconnect_within``): past it, whether the batch landed is unknown
            # (``CommitUnknown``).  A row read before could be missing and land a moment
            # later: the batch run again would append it twice.  With no row to read (a
            # batch of chunks), the wait still orders the rerun after the lost COMMIT.
            left = deadline - time.monotonic()
            backend.begin(w.conn, barrier=False, wait=max(left, 0.001))
            backend.rollback(w.conn)
            return proof is not None and w.tables.hash_at(proof[0]) == proof[1]
        except errors as exc:
            # The wait ran out (PostgreSQL's lock_timeout aborts the transaction it began):
            # end it, or the connection kept for the next write is stuck in it -- every
            # later write refused ("current transaction is aborted").
            w.head_held = isinstance(exc, HeadHeld)
            with contextlib.suppress(Exception):
                backend.rollback(w.conn)
        if time.monotonic() + delay > deadline:
            return None
        time.sleep(delay)
        delay = min(delay * 2, RERUN_DELAY_MAX)


def _renew(w: Writer) -> None:
    """A new connection for the writer after the database refused its transaction
    (``Backend.renew_after_refusal``): the next write runs on a session with nothing of the
    refused one.  None to be had: the closed connection is found lost by the next write, which
    reconnects within ``reconnect_within`` (``attempts``)."""
    backend = w.backend
    w.forget()
    with contextlib.suppress(Exception):
        backend.close(w.conn)
    with contextlib.suppress(*backend.errors, JournalError):
        w.conn = backend.connect("writer")
        w.tables = backend.tables(w.conn)


def _met(w: Writer, exc: BaseException) -> str:
    """What a write that failed met, in the words ``_fail`` and ``_fail_in_doubt`` both print:
    the journal's refusal as it says it, or the storage fault described."""
    if isinstance(exc, JournalError):
        return f"write refused: {exc}"
    return f"write not committed: {w.backend.describe(exc)}"


def _fail(w: Writer, batch: list[Req[Any]], exc: BaseException) -> None:
    # A storage fault, or a head this writer must not sign over: nothing is kept.
    w.forget()
    why = _met(w, exc)
    if not isinstance(exc, JournalError):  # a storage fault: say which journal
        why = f"journal {w.backend.where}: {why}"
    replaced = isinstance(exc, JournalReplaced)  # kept: answered as itself (503, no retry)
    for r in batch:
        r.result = None
        if r.result_store:
            cls: type[JournalWriteError] = ResultStoreReplaced if replaced else ResultStoreFailed
        else:
            cls = JournalReplaced if replaced else JournalWriteError
        r.error = cls(why)


def _fail_unknown(w: Writer, batch: list[Req[Any]], exc: BaseException) -> None:
    # SQLite's COMMIT raised (the -wal's sync failed, say): its frames may be in the file.
    w.forget()
    _answer_failed(
        batch,
        f"journal {w.backend.where}: the commit failed ({w.backend.describe(exc)}): whether "
        "the write is durable is unknown -- what SQLite wrote of it to the -wal before failing "
        "is recovered by an open after a crash, unless the journal's next commit overwrites it",
        unknown=True,
    )


def _fail_in_doubt(w: Writer, batch: list[Req[Any]], exc: BaseException) -> None:
    # A rerun refused after an earlier run's COMMIT was lost with no row to read back: that
    # COMMIT may have landed, whatever this run met.
    w.forget()
    met = _met(w, exc)
    _answer_failed(
        batch,
        f"journal {w.backend.where}: the connection was lost while committing an earlier run "
        f"of this write, then its run again failed ({met}): whether the write is durable is "
        "unknown until the journal is read again",
        unknown=True,
    )


def _refusals_in_doubt(w: Writer, batch: list[Req[Any]]) -> None:
    """A run committed after an earlier run's COMMIT was lost with no row to read back: a write
    it refused (a chunk whose attempt recovery closed meanwhile, say) may be durable from that
    earlier COMMIT -- unknown, never "not stored"."""
    for r in batch:
        if r.error is not None and not isinstance(r.error, CommitUnknown):
            why = (
                f"journal {w.backend.where}: the connection was lost while committing an "
                f"earlier run of this write, then its run again refused it ({r.error}): "
                "whether the write is durable is unknown until the journal is read again"
            )
            r.error = write_error(r, why, unknown=True)


def _answer_failed(batch: list[Req[Any]], why: str, *, unknown: bool) -> None:
    """Fail every write of ``batch`` with ``why``: ``CommitUnknown`` when ``unknown`` (a
    result's write: ``ResultStoreUnknown``, a ``ResultStoreFailed`` that carries the doubt),
    else not committed."""
    for r in batch:
        r.result = None
        r.error = write_error(r, why, unknown=unknown)


def _fail_unavailable(w: Writer, batch: list[Req[Any]], *, committing: bool, doubt: bool) -> None:
    """``committing``: the last run's COMMIT was sent; ``doubt``: an earlier run's COMMIT was
    sent that no re-read could prove (``attempts``)."""
    where, within = w.backend.where, w.backend.reconnect_within
    if committing and w.head_held:
        # A new connection was made: the lost session's transaction, its COMMIT perhaps
        # still on its way, held the chain head for the whole window (``HeadHeld``).
        why = (
            f"journal {where}: the connection was lost while committing, and the lost "
            f"session still held the journal's chain head when [journal] reconnect "
            f"({within:g}s) ran out: whether the write is durable is unknown until the "
            "journal is read again"
        )
    elif committing or doubt:
        run = "" if committing else " an earlier run of this write"
        why = (
            f"journal {where}: the connection was lost while committing{run} and no new "
            f"one could be made within {within:g}s: whether the write is durable is unknown "
            "until the journal is read again"
        )
    else:
        why = (
            f"journal {where}: the connection was lost and no new one could be made within "
            f"{within:g}s: write not committed"
        )
    _answer_failed(batch, why, unknown=committing or doubt)


def _fail_lost_again(w: Writer, batch: list[Req[Any]], runs: int, *, unknown: bool) -> None:
    where, within = w.backend.where, w.backend.reconnect_within
    if runs >= LOST_RUNS:
        bound = "the most a write is run"
    else:
        bound = f"until [journal] reconnect ({within:g}s) ran out"
    why = (
        f"journal {where}: the connection was lost on each of {runs} runs of this write "
        f"(new connections succeeding), {bound}: "
    )
    why += (
        "whether the write is durable is unknown until the journal is read again"
        if unknown
        else "write not committed"
    )
    _answer_failed(batch, why, unknown=unknown)


def _transaction(
    w: Writer,
    batch: list[Req[Any]],
    barrier: bool,
    proof: list[tuple[int, str]],
    deadline: float | None,
) -> None:
    """One transaction over the batch; appends (seq, hash) of its last row to ``proof``
    just before its COMMIT is sent.  ``deadline``: a rerun's (``attempts``), which also
    bounds its wait for the head."""
    backend = w.backend
    conn, tables = w.conn, w.tables
    errors = backend.errors
    w.committing = False
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
        # A rerun waits only for what is left of the window from the first loss: a failing
        # write is bounded by ``reconnect`` after it, not by one more ``reconnect`` per run.
        wait = backend.reconnect_within if backend.shared else None
        if wait is not None and deadline is not None:
            wait = max(deadline - time.monotonic(), 0.001)
        want = backend.begin(conn, barrier=barrier, wait=wait)
        seq, h = tables.head()
        if seq != w.known_head or len(w.projectors) > _PROJECTOR_CACHE:
            _catch_up(w, tables, seq)
        signer = w.signer
        assert signer is not None, "the journal binds its signing key before writing"
        if seq and (seq, h) != w.signed_head:
            _require_covered(w, tables, seq, h)
            w.signed_head = (seq, h)
        txn = Txn(w, tables, seq, h)
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
            if r.after is not None:  # earlier writes of its task it presupposes
                refused = _refused_before(r.after)
                if refused is not None:
                    r.error = refused
                    continue
            op = r.op
            if op is None:  # a plain append: its row joins the pending executemany
                if r.many:
                    each = _insert_joined if r.joined else _insert_each
                    r.result = each(txn, r, errors)
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
            cp = checkpoints.sign(tables, signer, txn.seq, txn.hash, seq, w.clock())
            proof.append((txn.seq, txn.hash))
        if barrier:
            _signal_meanwhile(w, batch)
        hook = w.before_commit
        if hook is not None:
            hook(Batch(len(batch), barrier, want))
        w.committing = True
        backend.commit(conn)
        w.committing = False
        w.known_head = txn.seq
        if cp is not None:
            w.appended += 1
            w.signed_head = (cp.seq, cp.hash)
            checkpoints.remember(w.signed, cp)
    except BaseException:
        # Also after a failed COMMIT: a database may keep the transaction open (SQLite) or
        # aborted (PostgreSQL) until told.  On a lost connection this fails, harmlessly.
        with contextlib.suppress(Exception):
            backend.rollback(conn)
        raise


def _signal_meanwhile(w: Writer, batch: list[Req[Any]]) -> None:
    """Writer thread, every row of a barrier's transaction written, its COMMIT (the fsync)
    about to be sent: run the ``meanwhile`` of each write in it not refused so far on the
    loop -- the loop, idle while its submitter waits, works during the fsync instead of
    after it.  Once per write (a transaction tried again does not repeat it); a write
    refused or failed later still answers with its error, ``meanwhile`` having run."""
    ready = [r for r in batch if r.meanwhile is not None and r.error is None]
    if not ready or w.token is None:
        return
    fns: list[Callable[[], None]] = []
    for r in ready:
        fns.append(r.meanwhile)  # type: ignore[arg-type]
        r.meanwhile = None
    # FIFO with the ``_done`` queued after the COMMIT: every ``meanwhile`` has run before
    # its submitter is woken.
    with contextlib.suppress(trio.RunFinishedError):
        w.token.run_sync_soon(_run_meanwhile, fns)


def _refused_before(after: tuple[Req[Any], ...]) -> BaseException | None:
    """The first error among ``after`` -- writes queued before the one that presupposes
    them, so answered by now, in this transaction or an earlier one (``requests.presupposed``):
    a refusal, or a failure to store one (its rows are not on record either)."""
    for a in after:
        if a.error is not None:
            return a.error
    return None


def _insert_each(txn: Txn, r: Req[Any], errors: tuple[type[BaseException], ...]) -> list[Any]:
    """The rows of a ``many`` request, each validated, chained and written as its own plain
    append would be -- but one submission's rows are one task's consecutive facts about an
    invocation, each presupposing those before it: once a row is refused (before it queued
    anything), the later rows for the same invocation are refused too, not written (a late
    binder's PREFLIGHT_VALIDATED and CREDENTIAL_AUTHORIZED, after its refused ACTION_ACCEPTED,
    landed in the record of the taker that won that first event).  Rows for another
    invocation are not stopped.  The request answers with the first refusal."""
    insert = txn.insert
    out = []
    refused: set[str] | None = None
    for args in r.args or ():
        if refused is not None and args[0].invocation_id in refused:
            continue
        try:
            out.append(insert(*args))
        except errors:
            raise
        except Exception as exc:
            if r.error is None:
                r.error = exc
            if refused is None:
                refused = set()
            refused.add(args[0].invocation_id)
    return out


def _insert_joined(txn: Txn, r: Req[Any], errors: tuple[type[BaseException], ...]) -> list[Any]:
    """The rows of a ``joined`` request: one fact about several invocations (a linked call's
    claim on the record it serves, then the call's own first rows: ``engine/takeup.py``) --
    all of them or none.  A row refused (``ImpossibleEvent``, a ``JournalError``), the rows
    queued before it are dropped too: none of them reached the database (the rows pending
    before the request were inserted first, so this request's are the only ones queued), the
    chain head is the request's start again, and the writer's projections of its invocations
    are forgotten -- folded again from the rows this transaction holds (``Txn.projector``),
    never served with a dropped row applied.  The request answers with the refusal."""
    txn.flush()
    start = (txn.seq, txn.hash, txn.digest)
    out = []
    for args in r.args or ():
        try:
            out.append(txn.insert(*args))
        except errors:
            raise
        except Exception as exc:
            r.error = exc
            txn.rows = []
            txn.seq, txn.hash, txn.digest = start
            w = txn.writer
            for iid in {a[0].invocation_id for a in r.args or ()}:
                w.projectors.pop(iid, None)
                w.sessions.pop(iid, None)
            return []
    return out


def _catch_up(w: Writer, tables: Tables, seq: int) -> None:
    """The head is not the one this writer committed: another writer appended.  On a
    shared journal, forget only the invocations it touched; otherwise start over (the
    projections reload lazily)."""
    known = w.known_head
    if known is None or known > seq or not w.backend.shared or len(w.projectors) > _PROJECTOR_CACHE:
        w.forget()
        return
    for iid in tables.touched_after(known):
        w.projectors.pop(iid, None)
        w.sessions.pop(iid, None)


def _require_covered(w: Writer, tables: Tables, seq: int, h: str) -> None:
    try:
        checkpoints.require_covered(tables, w.backend.where, seq, h, w.keys)
    except JournalError:
        if not w.backend.multi_signer:
            raise
        # A broker that registered its key after this writer last looked.
        w.keys = {**recorded_keys(tables), **w.keys}
        checkpoints.require_covered(tables, w.backend.where, seq, h, w.keys)


def _run_meanwhile(fns: list[Callable[[], None]]) -> None:
    """On the loop (a ``run_sync_soon`` callback, which must not raise): each ``meanwhile``.
    One that raises anyway only loses its head start -- its submitter does the work after the
    write, as without one; the exception (which may quote what it was working on) is dropped
    unlogged."""
    for fn in fns:
        with contextlib.suppress(Exception):
            fn()
