"""The writer's requests: what is queued, what a transaction looks like to its hooks, and the
handle of a write whose commit its author did not wait for.

``writer.py`` queues a ``Req`` per write and answers it once its transaction ended
(``commit.py`` runs that transaction on the writer thread); ``Journal.post`` hands out a
``Posted`` for it.  Nothing here touches the database or the writer's state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import trio

from .errors import CommitUnknown, JournalWriteError, ResultStoreFailed, ResultStoreUnknown

if TYPE_CHECKING:
    from .txn import Txn

__all__ = [
    "Around",
    "Batch",
    "Fail",
    "Hook",
    "Posted",
    "Req",
    "cannot_abort",
    "presupposed",
    "write_error",
]

T = TypeVar("T")


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


class Req(Generic[T]):
    """One queued write: ``op`` runs in the writer's transaction, or, for a plain append
    (``op`` None), ``Txn.insert(*args)`` does without a closure -- or, with ``many``, one
    ``Txn.insert`` per tuple in ``args`` (several rows computed by their submitter, one
    request: issue 15, "one journal submission per barrier carrying its rows precomputed").
    ``after``: earlier writes of the same task about the same invocation, queued before it and
    not yet answered, that this one presupposes (``presupposed``): failed with the first's
    error, not run, if one of them was refused or failed to be stored.  ``joined`` (with
    ``many``): the rows are one fact about several invocations -- all written, or none: a row
    refused refuses the whole request (``commit._insert_joined``)."""

    __slots__ = (
        "about",
        "after",
        "args",
        "barrier",
        "error",
        "finished",
        "joined",
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
        joined: bool = False,
    ) -> None:
        self.op = op
        self.args = args
        self.many = many
        self.joined = joined
        self.barrier = barrier
        self.result_store = result_store
        self.task = task
        self.parked = False
        self.finished = False
        self.result: T | None = None
        self.error: BaseException | None = None
        self.meanwhile: Callable[[], None] | None = None
        self.after: tuple[Req[Any], ...] | None = None
        self.about: tuple[str, str] | None = None
        """A checked write's (``op``) invocation id and event kind (or what it writes), for
        naming it only (``Writer.unanswered``)."""

    def invocations(self) -> set[str]:
        """The invocations a plain append's rows are about (none for an ``op``)."""
        if self.op is not None or not self.args:
            return set()
        rows = self.args if self.many else (self.args,)
        return {row[0].invocation_id for row in rows}


class Posted(Generic[T]):
    """A write queued by ``Journal.post`` whose commit its author did not wait for."""

    __slots__ = ("_req",)

    def __init__(self, req: Req[T]) -> None:
        self._req = req

    @property
    def finished(self) -> bool:
        return self._req.finished

    async def wait(self, *, cancellable: bool = False) -> T:
        """The write's answer once its transaction ended (raising its error, if it failed).
        Not cancellable, like every journal write -- unless ``cancellable``: a reader that
        only wants to see the write (it was queued by someone else, who answers for it) may
        give up waiting; the write goes on.  One task at a time may wait."""
        req = self._req
        if not req.finished:
            assert not req.parked, "another task already waits for this write"
            req.task = trio.lowlevel.current_task()
            req.parked = True

            def leave(_: Any) -> trio.lowlevel.Abort:
                # On the loop thread, as the writer's wake-up is: either runs first, never both.
                req.parked = False
                req.task = None
                return trio.lowlevel.Abort.SUCCEEDED

            await trio.lowlevel.wait_task_rescheduled(leave if cancellable else cannot_abort)
        if req.error is not None:
            raise req.error
        return req.result  # type: ignore[return-value]


def presupposed(after: Sequence[Posted[Any]], iids: set[str]) -> tuple[Req[Any], ...] | None:
    """The writes of ``after`` (a task's posted writes it has not read the answers of) about
    one of ``iids`` that failed or are not answered yet, for the writer to check once it
    reaches the next write (``Req.after``): one of them failed fails that write with the same
    error, not run -- answered as any refusal is, by the writer (a post's ``wait`` raises it,
    never the post itself).  Why: a task's writes about an invocation are consecutive facts,
    each presupposing those before it -- a binder whose posted ACTION_ACCEPTED was refused (a
    taker won the record's first event) went on to write its SETUP_FAILED, and could write its
    DISPATCH_STARTED, into the taker's record.  A write that failed to be stored
    (``JournalWriteError``, ``CommitUnknown`` among them) counts too: the later write's
    premises are not on record either way (a binder whose preamble hit a locked database went
    on to its gate in the record a taker then won)."""
    pending: list[Req[Any]] = []
    for p in after:
        r = p._req
        # Most of them answered, unrefused, by the time the next write comes: skipped.
        if (not r.finished or r.error is not None) and iids & r.invocations():
            pending.append(r)
    return tuple(pending) or None


def cannot_abort(_: Any) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.FAILED


def write_error(r: Req[Any], why: str, *, unknown: bool = False) -> JournalWriteError:
    """The error of a write that failed: not committed, or whether it is durable ``unknown``
    (``CommitUnknown``) -- a result's write (``result_store``) a ``ResultStoreFailed`` either
    way."""
    if unknown:
        return ResultStoreUnknown(why) if r.result_store else CommitUnknown(why)
    return ResultStoreFailed(why) if r.result_store else JournalWriteError(why)
