"""The journal as one call uses it: shielded appends, diagnostic events riding along with the
next barrier, and envelopes rendered from the durable record.

Seed, "The error envelope must contain evidence": every path of a call ends by appending its
last event as a barrier and rendering the envelope from the projected journal -- never from an
exception or from what the engine holds in memory.
"""

from __future__ import annotations

import base64
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import trio

from affidavit.journal import Journal, JournalReader, JournalUnavailable, Posted, ResultStream
from affidavit.statemachine import (
    BARRIER_KINDS,
    Event,
    HolderTag,
    Record,
    in_progress_error,
    lease_lost_error,
    project,
    render_envelope,
)

__all__ = [
    "Deferred",
    "Recorder",
    "reference_payload",
    "result_payload",
    "resume_table",
    "stored_envelope",
    "stored_payload",
]

T = TypeVar("T")

log = logging.getLogger("affidavit.engine")


class Recorder:
    """Writes and reads one engine's calls.  The per-call state it keeps: each running call's
    posted-but-unsettled diagnostic events (by trio task), the invocation it last wrote for,
    and the RESULT_DELIVERED writes queued after a hand-over until a read has seen them land
    (by invocation; ``deliver_later``)."""

    def __init__(self, journal: Journal, inline_limit: int | None = None) -> None:
        self.journal = journal
        self.inline_limit = inline_limit
        """A call's answer carries a stored result larger than this by reference (as the call
        that stored it did); None: always whole."""
        self._posted: dict[trio.lowlevel.Task, list[Posted[Any]]] = {}
        """Diagnostic events each running call posted and has not yet settled (see write)."""
        self._writing: dict[trio.lowlevel.Task, str] = {}
        """The invocation each running call last wrote for (``writing``)."""
        self._attempts: dict[trio.lowlevel.Task, tuple[str, int]] = {}
        """The attempt (invocation, lease generation) each running call holds (``attempting``)."""
        self._live: Counter[tuple[str, int]] = Counter()
        """How many of this broker's calls run each attempt (``running``)."""
        self._doubted: set[str] = set()
        """Invocations whose DISPATCH_STARTED may yet land (``doubt``)."""
        self._delivering: dict[str, _Delivery] = {}
        """RESULT_DELIVERED writes ``deliver_later`` queued (or is queueing) whose commit nobody
        has seen yet, by invocation (the writer's queue is FIFO: they commit in that order)."""
        self._delivery_turn = trio.Lock()
        """One task at a time waits for a queued write (``Posted.wait``)."""

    def writing(self) -> str | None:
        """The invocation this call last wrote an event for: whose record a journal failure
        interrupted."""
        return self._writing.get(trio.lowlevel.current_task())

    def attempting(self, iid: str, generation: int) -> None:
        """This call now runs the attempt of ``generation`` of ``iid``: taken as its first
        attempt (generation 0) or under a lease this broker won.  What closes a call's attempt
        from inside (``journal_refused``, ``internal_close``) closes only that one: the broker's
        holder names every task of it, and a record's current attempt may be another task's, or
        another broker's that took the invocation over.  Forgotten with the call (``done``)."""
        task = trio.lowlevel.current_task()
        self._release(self._attempts.get(task))
        self._attempts[task] = (iid, generation)
        self._live[iid, generation] += 1

    def attempt(self) -> tuple[str, int] | None:
        """The attempt this call runs (``attempting``), or None: it took none."""
        return self._attempts.get(trio.lowlevel.current_task())

    def running(self, iid: str, generation: int) -> bool:
        """A call of this broker runs the attempt of ``generation`` of ``iid``: it is live,
        whatever a clock says of its lease -- recovery never closes it (``recover_stale``).  A
        wall clock stepped forward made a lease look run out while its attempt, timed by trio's
        monotonic clock, was still sending."""
        return self._live[iid, generation] > 0

    def _release(self, attempt: tuple[str, int] | None) -> None:
        if attempt is not None:
            self._live[attempt] -= 1
            if self._live[attempt] <= 0:
                del self._live[attempt]

    def doubt(self, iid: str) -> None:
        """``iid``'s DISPATCH_STARTED was submitted and its commit is unknown
        (``CommitUnknown``): the lost session may still hold the chain head, its COMMIT on its
        way -- or, on SQLite, the COMMIT raised with its frames in the -wal, which an open after
        a crash recovers -- so a read that finds no DISPATCH_STARTED does not prove it will
        not land.  Until a write of the call commits again (taking the head; on SQLite,
        written over those frames), nothing may close the record ``not_attempted`` from such a
        read (``recovery.journal_refused``).  Forgotten with the call (``done``)."""
        self._doubted.add(iid)

    def doubted(self, iid: str) -> bool:
        return iid in self._doubted

    async def append(
        self,
        event: Event,
        *,
        barrier: bool = False,
        lapsed: bool = False,
        deadline: float | None = None,
        valid_until: float | None = None,
        cancellable: bool = False,
        unleased: bool = False,
    ) -> None:
        """``lapsed``/``deadline``: a recovery's closing event; ``valid_until``: an approval's
        expiry; ``unleased``: no live lease (an operator's revoke) -- each checked in the
        writing transaction (``Journal.append``).  ``cancellable``: a
        barrier whose answer may be given up, the write going on (``Journal.append``): a close
        recovery would make all the same (``internal_close``), never a call's own boundary --
        the journal refuses (``ValueError``) any other event, and ``lapsed`` or
        ``valid_until`` with it."""
        if cancellable:
            await self._checked(event, lapsed, deadline, valid_until, cancellable=True)
            return
        # Shielded: a caller's cancellation must not leave it unclear whether a record landed.
        with trio.CancelScope(shield=True):
            if lapsed or unleased or valid_until is not None:
                await self._checked(event, lapsed, deadline, valid_until, unleased=unleased)
                return
            await self.write(event, barrier=barrier)

    async def _checked(
        self,
        event: Event,
        lapsed: bool,
        deadline: float | None,
        valid_until: float | None,
        *,
        cancellable: bool = False,
        unleased: bool = False,
    ) -> None:
        """A barrier whose condition the writing transaction checks (``Journal.append``)."""
        task = trio.lowlevel.current_task()
        self._writing[task] = event.invocation_id
        await self.journal.append(
            event,
            barrier=True,
            lapsed=lapsed,
            deadline=deadline,
            valid_until=valid_until,
            cancellable=cancellable,
            after=self._posted.get(task, ()),
            unleased=unleased,
        )

    async def write(
        self,
        event: Event,
        *,
        barrier: bool = False,
        payload: Mapping[str, Any] | None = None,
    ) -> None:
        """``append`` for a caller already inside a shielded section.  ``payload`` is sealed
        (broker copy, and an auditor copy when an auditor key is configured), never plaintext."""
        task = trio.lowlevel.current_task()  # looked up once per write (issue 15)
        self._writing[task] = event.invocation_id
        # Each write presupposes this call's posted ones not yet settled: one of them refused
        # (its ACTION_ACCEPTED, when another call won the record's first event) refuses it too
        # (``Journal.append``'s ``after``) -- never a later fact written into a record whose
        # earlier facts were not this call's.
        mine = self._posted.get(task)
        if barrier or event.kind in BARRIER_KINDS:
            await self.journal.append(event, barrier=True, payload=payload, after=mine or ())
            return
        # A diagnostic event rides along with the next barrier's transaction instead of costing
        # a writer round trip of its own (DESIGN, "Durability barriers"; recovery never depends
        # on it).  Queue order puts it before every later write of this call; ``record``
        # settles it before the journal is read for the envelope.
        posted = await self.journal.post(event, payload=payload, after=mine or ())
        mine = self._posted.get(task)
        if mine is None:
            self._posted[task] = [posted]
        else:
            mine.append(posted)

    async def write_many(
        self, items: Sequence[tuple[Event, Mapping[str, Any] | None]], *, shield: bool = False
    ) -> None:
        """``write`` of several diagnostic events (each with its payload or None) as one queued
        write -- one request for the single writer instead of one per event (issue 15); the
        same rows, in the same order, in the same transaction as separate writes queued
        without a checkpoint between them.  Rows about several invocations (a linked call's claim,
        then the call's preamble: ``takeup.py``) are ``joined``: all written or none.  Rows
        about one invocation are not: once one is refused the later ones are, but those before
        it stand, as separate writes would.  The caller holds a shield -- or passes ``shield``
        when this is the section's one write: then nothing in it is cancellable (its one
        checkpoint, a wait for room in a full queue, is shielded there)."""
        if not items:
            return
        task = trio.lowlevel.current_task()
        self._writing[task] = items[-1][0].invocation_id
        mine = self._posted.get(task)
        first = items[0][0].invocation_id
        joined = any(event.invocation_id != first for event, _ in items)
        posted = await self.journal.post_many(items, shield=shield, after=mine or (), joined=joined)
        mine = self._posted.get(task)
        if mine is None:
            self._posted[task] = [posted]
        else:
            mine.append(posted)

    def unsettled(self) -> Sequence[Posted[Any]]:
        """This call's posted writes not yet settled: what a write it makes directly through
        the journal presupposes (``Journal.append``'s ``after``), as ``write`` passes them."""
        return self._posted.get(trio.lowlevel.current_task(), ())

    async def settle(self, *, cancellable: bool = False) -> None:
        """Wait for this call's posted events (committed by now, unless the write that follows
        them has not returned yet); raise the first one's failure, as ``append`` would have.
        ``cancellable``: the wait may be given up (``Posted.wait``), the writes going on."""
        posted = self._posted.pop(trio.lowlevel.current_task(), None)
        error: BaseException | None = None
        for p in posted or ():
            try:
                await p.wait(cancellable=cancellable)
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error

    def forget(self) -> None:
        """Drop this call's unsettled events: the call is over (after an exception), or the
        batch that carried them failed and said so."""
        self._posted.pop(trio.lowlevel.current_task(), None)

    def done(self) -> None:
        """The call is over: forget everything kept for it (its task looked up once)."""
        task = trio.lowlevel.current_task()
        self._posted.pop(task, None)
        self._release(self._attempts.pop(task, None))
        iid = self._writing.pop(task, None)
        if iid is not None:
            self._doubted.discard(iid)

    async def deliver_later(self, event: Event) -> None:
        """Queue ``event`` -- an in-process return's RESULT_DELIVERED, written after the
        envelope was handed back -- without waiting for its commit (issue 15: not a barrier,
        and a transaction on the caller's path for nothing).  Every read of this broker waits
        for it first (``delivered``); a write that fails is logged, never raised into a later
        call: the result stays stored and undelivered (fetchable)."""
        pending = self._delivering
        for key, entry in list(pending.items()):  # the answered ones: failures logged
            if entry.posted is not None and entry.posted.finished:
                del pending[key]
                await _answered(key, entry.posted)  # (finished: no checkpoint)
        # Registered before the post, which waits while the writer's queue is full: a read in
        # that wait (a fetch on another connection) must find the delivery to wait for, or
        # it would record a second one.
        entry = pending[event.invocation_id] = _Delivery()
        try:
            entry.posted = await self.journal.post(event)
        finally:
            entry.queued.set()  # (a post that raised: nothing to wait for, see ``_answered``)

    async def delivered(self, iid: str | None = None, *, cancellable: bool = False) -> None:
        """Wait for the queued RESULT_DELIVERED writes (``deliver_later``): ``iid``'s, else
        all of them -- so a read sees what this broker told its callers.  Free when none is
        queued.  A write that failed is logged (the invocation, the error's class), never
        raised.  Uncancellable once waiting, as every journal write is -- unless
        ``cancellable`` (a view bounds its wait): the writes go on, unwaited."""
        pending = self._delivering
        if not pending or (iid is not None and iid not in pending):
            return
        async with self._delivery_turn:  # ``Posted.wait``: one waiter at a time
            for key, entry in list(pending.items()):
                if iid is None or key == iid:
                    with trio.CancelScope(shield=not cancellable):
                        await entry.queued.wait()
                    if entry.posted is not None:
                        await _answered(key, entry.posted, cancellable=cancellable)
                    if pending.get(key) is entry:
                        del pending[key]

    async def record(
        self, iid: str, now: float | None = None, *, as_committed: bool = False
    ) -> Record:
        """The invocation's record, its hint computed at ``now``, else now by the clock its
        idempotency key's retention is recorded in: the database's on a shared journal
        (docs/journal.md, "Clocks"), this broker's own on SQLite.  A delivery of it still
        queued (``deliver_later``) is waited for first: the record shows it.
        ``as_committed``: a call's own record right after the barrier that made it final -- a
        snapshot as of this broker's last commit, no read of the journal's head, on SQLite
        (``Journal.record`` says when it is taken)."""
        await self.settle()
        if self._delivering:
            await self.delivered(iid)
        journal = self.journal
        record = await self.read(lambda: journal.record(iid, now=now, as_committed=as_committed))
        assert record is not None, iid
        return record

    def projected(self, events: Sequence[Event], now: float) -> Record:
        """The record ``events`` fold to, its hint computed at ``now`` and its key-bound hints
        judged as every read judges them (``JournalReader.current``: by the lease a same-key
        retry takes under today's settings) -- for a record rendered from events in hand (as it
        will stand once delivered, or as a journal that refused a write leaves it), never read
        back through ``record``."""
        return self.journal.current(project(events, now), now)

    def hint_now(self) -> float:
        """Now, for a retry hint: by the clock an idempotency key's retention is recorded in
        -- the database's on a shared journal (a read; call it inside ``read``), this broker's
        own on SQLite."""
        return self.journal.now()

    async def read(self, fn: Callable[[], T]) -> T:
        """``fn()`` -- a journal read -- tried again while a shared journal's connection is
        lost (``JournalUnavailable``), for as long as its writer would wait to reconnect
        (``[journal] reconnect``): a database restart inside that window is invisible to a
        call, reads included.  Waits on trio, never blocking the event loop."""
        deadline: float | None = None
        delay = 0.05
        while True:
            try:
                return fn()
            except JournalUnavailable:
                now = trio.current_time()
                if deadline is None:
                    deadline = now + self.journal.backend.reconnect_within
                if now + delay > deadline:
                    raise
            await trio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def finish(self, iid: str, event: Event) -> dict[str, Any]:
        """Append the call's last event as a barrier and render the durable record."""
        await self.append(event, barrier=True)
        return self.envelope(await self.record(iid, as_committed=True))

    def envelope(
        self,
        record: Record,
        *,
        lost: int | None = None,
        dispatched: bool = False,
        from_chunk: int | None = None,
        to_chunk: int | None = None,
        in_progress: bool = False,
        whole: bool = False,
        defer: bool = False,
    ) -> dict[str, Any]:
        """The envelope of ``record`` with its stored result (verified; ``JournalError`` if it
        fails).  ``from_chunk``: each stream from that chunk on, plus a ``resume`` table of
        every stream's whole size and hash (seed: "The caller may resume delivery from the
        last verified chunk").  ``in_progress``: another worker holds the invocation's lease
        and is running a new attempt -- the record's last attempt is not the answer, and its
        result (if any) not the result.  A result larger than ``inline_limit`` is rendered by
        reference, as the call that stored it answered (a same-key call gets the same answer),
        unless ``whole`` -- a fetch, which is what the reference names.  ``to_chunk``: with
        ``from_chunk``, a page -- each stream's chunks up to that one, excluded.  ``defer``:
        each stream a ``Deferred``, unread (``stored_payload``).

        ``lost``: the generation of this caller's worker, whose lease is no longer the
        invocation's -- refused at a dispatch gate, or (``dispatched``) after its dispatch.
        The record is rendered with LEASE_LOST (``lease_lost_error``: the record's phase and
        outcome, fetch_result while it runs or holds a result, else its own hint) and without
        its result, items or job: another attempt's, or none, never this caller's."""
        if in_progress:
            env = self.render(record)
            env.pop("result", None)
            env["error"] = in_progress_error(record)
            return env
        if lost is not None:
            env = self.render(record)
            for own in ("result", "items", "operation"):
                env.pop(own, None)
            env["error"] = lease_lost_error(record, lost, dispatched=dispatched)
            return env
        if from_chunk is not None:
            tag = self.journal.holder_tag
            return stored_envelope(
                self.journal, record, from_chunk, to_chunk, holder=tag, defer=defer
            )
        if record.evidence.get("result") is None:
            # No RESULT_COMMITTED on record: no result is this record's, and the result tables
            # are not read for it.  Read anyway, a refusal there (no file descriptor left)
            # failed the answer of a call whose closing event was written (audit 53b: EMFILE,
            # exit 2 with no envelope after a durable SETUP_FAILED).
            return self.render(record)
        iid = record.invocation_id
        stream = self.journal.result_stream(iid)  # the marker and summary, verified
        limit = self.inline_limit
        payload: dict[str, Any] | None
        if stream is None:
            payload = None
        elif whole or limit is None or sum(s.bytes for s in stream.streams.values()) <= limit:
            payload = stored_payload(stream, defer=defer)
        else:
            payload = reference_payload(iid, stream.summary, stream.sha256, limit)
        return self.render(record, payload)

    def render(self, record: Record, result: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``render_envelope`` with the lease holder as this journal tags it for a caller
        (``JournalReader.holder_tag``): every envelope the engine answers is rendered here."""
        return render_envelope(record, result, holder=self.journal.holder_tag)


class _Delivery:
    """A RESULT_DELIVERED write ``deliver_later`` queues: ``queued`` is set once the post
    returned (``posted``: None if it raised -- its error went to the call that posted it)."""

    __slots__ = ("posted", "queued")

    def __init__(self) -> None:
        self.posted: Posted[Any] | None = None
        self.queued = trio.Event()


async def _answered(iid: str, posted: Posted[Any], *, cancellable: bool = False) -> None:
    """Wait for a queued delivery write; log its failure (no secret: the invocation and the
    error's class), never raise it."""
    try:
        await posted.wait(cancellable=cancellable)
    except Exception as exc:
        log.warning(
            "recording the delivery of %s failed (%s): its result stays stored, undelivered",
            iid,
            type(exc).__name__,
        )


def stored_envelope(
    journal: JournalReader,
    record: Record,
    from_chunk: int,
    to_chunk: int | None = None,
    *,
    holder: HolderTag | None = None,
    defer: bool = False,
) -> dict[str, Any]:
    """The envelope of ``record`` with each stream of its stored result from ``from_chunk`` on
    -- up to ``to_chunk`` (excluded) when given: a page -- (verified; ``JournalError`` if it
    fails) and a ``resume`` table -- a resumed read, which records nothing: the broker's own
    (``Recorder.envelope``) or a view's, on a reader of its own in a worker thread (the
    console's).  Its lease holder as ``holder`` tags it (``render_envelope``): a caller's
    resumed read shows the tag its whole fetch shows.  ``defer``: see ``stored_payload``."""
    stream = journal.result_stream(record.invocation_id)  # the marker and summary, verified
    payload: dict[str, Any] | None = None
    if stream is not None:
        payload = stored_payload(stream, from_chunk, to_chunk, defer=defer)
        payload["resume"] = resume_table(stream, from_chunk, to_chunk)
    return render_envelope(record, payload, holder=holder)


@dataclass(frozen=True, slots=True)
class Deferred:
    """A stream of a stored result left unread in its envelope: the chunks ``from_chunk`` to
    ``to_chunk`` (excluded) of stream ``name``, which a writer reads, verifies and encodes a
    few at a time as it writes the answer (the daemon's, ``affidavit/daemon/results.py``), so
    that no answer holds a whole result.  Never JSON itself: rendered only by that writer."""

    invocation_id: str
    name: str
    from_chunk: int
    to_chunk: int
    sha256: str
    """The whole result's hash: the writer reads the same stored result (results never
    change; a different one is refused)."""


def stored_payload(
    stream: ResultStream, from_chunk: int = 0, to_chunk: int | None = None, *, defer: bool = False
) -> dict[str, Any]:
    """``result_payload`` of the stored result's streams from ``from_chunk`` (to ``to_chunk``,
    excluded, when given), read whole -- or, ``defer``, each stream a ``Deferred`` under its
    own name (text or ``_base64`` is its writer's to decide), read by nobody yet."""
    if not defer:
        return result_payload(
            stream.read(from_chunk) if to_chunk is None else stream.read(from_chunk, to_chunk)
        )
    out: dict[str, Any] = dict(stream.summary)
    out.pop("streams", None)
    for name, info in sorted(stream.streams.items()):
        end = info.chunks if to_chunk is None else min(to_chunk, info.chunks)
        start = min(from_chunk, end)
        out[name] = Deferred(stream.invocation_id, name, start, end, stream.sha256)
    out["sha256"] = stream.sha256
    return out


class _StoredLike(Protocol):
    @property
    def summary(self) -> Mapping[str, Any]: ...
    @property
    def streams(self) -> Mapping[str, bytes]: ...
    @property
    def sha256(self) -> str: ...


def resume_table(
    stream: ResultStream, from_chunk: int, to_chunk: int | None = None
) -> dict[str, Any]:
    """Where a resumed read starts, where the next page starts (``next_chunk``: ``to_chunk``
    while a stream has chunks from there on, else null -- nothing left), and each stream's
    whole extent (to check the reassembled bytes against)."""
    more = to_chunk is not None and any(i.chunks > to_chunk for i in stream.streams.values())
    return {
        "from_chunk": from_chunk,
        "next_chunk": to_chunk if more else None,
        "streams": {
            name: {"chunks": info.chunks, "bytes": info.bytes, "sha256": "sha256:" + info.sha256}
            for name, info in sorted(stream.streams.items())
        },
    }


def result_payload(result: _StoredLike) -> dict[str, Any]:
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


def reference_payload(
    iid: str, summary: Mapping[str, Any], sha256: str, limit: int
) -> dict[str, Any]:
    """The caller-facing result of a call whose result is larger than the inline limit: the
    stored summary (status, headers...), the whole result's hash, and ``by_reference`` -- each
    stream's size, chunk count and hash, and where to fetch it (``fetch_result``, ``affidavit
    result ID [--from-chunk N]``), never the bytes."""
    out: dict[str, Any] = dict(summary)
    streams = out.pop("streams", None) or {}
    out["sha256"] = sha256
    out["by_reference"] = {
        "reason": f"larger than the inline limit of {limit} bytes",
        "bytes": sum(int(s["bytes"]) for s in streams.values()),
        "streams": {name: dict(info) for name, info in sorted(streams.items())},
        "fetch": {"invocation_id": iid, "from_chunk": 0},
    }
    return out
