"""Where the tools' work is done: an embedded ``Broker``, or the daemon through ``Client``.

Both answer the same questions; they differ in who records a delivery:

* **Embedded** (``Broker``): this process is the broker.  A call runs in a task of its own; the
  engine hands its stored result to ``Exchange.deliver``, which waits for the transport's word
  -- RESULT_DELIVERED once the answer's line was written whole, RESULT_DELIVERY_FAILED when it
  was not (the client hung up, cancelled, or the pipe broke).  A client gone before the dispatch
  gate withdraws the call (CALLER_CANCELLED, not_attempted).
* **Daemon** (``Client``): the daemon is the broker and its caller is this proxy.  A client
  gone or cancelling makes the proxy hang up on the daemon, which then applies its own rules
  (docs/deployment.md): withdrawn before dispatch; after it, run on, stored,
  RESULT_DELIVERY_FAILED.  An answer the daemon wrote to the proxy counts there as delivered;
  if the proxy then cannot write it to the client, that is logged on stderr, not journaled
  (the journal is the daemon's), and ``fetch_result`` still returns it.

Only ``Embedded`` imports the engine; ``Daemon`` keeps the proxy free of the engine, the
journal, the config and the credentials (tests/mcp/test_modes.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, Protocol

import trio

from .tools import NOT_SENT, act_refused, api_error, refusal, visible_name

if TYPE_CHECKING:
    from affidavit.api.broker import Broker
    from affidavit.api.client import Client
    from affidavit.config import Config

__all__ = ["Backend", "Daemon", "Embedded", "Exchange", "Undelivered"]

log = logging.getLogger("affidavit.mcp")

FETCH_RESULT = "the fetch_result tool (invocation_id {})"
"""How an agent reads an invocation's result (``internal_failure``): it has no CLI."""
GET_RECORD = "the get_record tool (invocation_id {})"
"""How it reads an invocation's record, a reconciliation's or a poll's included
(``reconcile.service.failure``, ``poll_failure``)."""


class Undelivered(Exception):
    """The answer was not written to the client (raised into the engine's ``deliver``)."""


class Exchange:
    """One tool request: the answer handed to the waiting handler, and the transport's verdict
    on whether that answer reached the client."""

    def __init__(self) -> None:
        self.ready = trio.Event()
        self.answer: dict[str, Any] | None = None
        self.gone = False
        """The handler stopped waiting (the client cancelled or hung up)."""
        self.written: Any = None
        """The transport's ``Outcome`` for this request's answer, once expected."""
        self._on_gone: list[Callable[[], object]] = []

    def on_gone(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` (synchronously) when the handler stops waiting."""
        if self.gone:
            callback()
        else:
            self._on_gone.append(callback)

    def abandon(self) -> None:
        if not self.gone:
            self.gone = True
            for callback in self._on_gone:
                callback()

    def hand_over(self, answer: dict[str, Any]) -> None:
        if not self.ready.is_set():
            self.answer = answer
            self.ready.set()

    async def deliver(self, envelope: dict[str, Any]) -> None:
        """The engine's ``Deliver``: hand the envelope to the handler and return once it was
        written whole; ``Undelivered`` otherwise."""
        if self.gone:
            raise Undelivered("the client stopped waiting before the answer")
        self.hand_over(envelope)
        if self.written is None or not await self.written.wait():
            raise Undelivered("the answer was not written to the client")


class Backend(Protocol):
    async def catalog(self) -> dict[str, Any]: ...
    async def call(self, action: Mapping[str, Any], exchange: Exchange) -> dict[str, Any]: ...
    async def fetch_result(
        self, invocation_id: str, from_chunk: int | None, chunks: int | None, exchange: Exchange
    ) -> dict[str, Any]:
        """The stored envelope; ``from_chunk`` with ``chunks``: a page of it."""
        ...

    async def record(self, invocation_id: str) -> dict[str, Any]: ...
    async def actions(self, session: str | None, outcome: str | None, limit: int) -> dict[str, Any]:
        """The newest ``limit`` records, oldest first: ``{"actions", "total", "truncated"}``
        (or an ``api_error``)."""
        ...

    async def poll_operation(
        self, operation_id: str, exchange: Exchange | None = None
    ) -> dict[str, Any]: ...
    async def reconcile_query(
        self, invocation_id: str, exchange: Exchange | None = None
    ) -> dict[str, Any]:
        """``poll_operation``'s and this answer carry a linked call's result: embedded, it is
        written through ``exchange.deliver``, which records that result delivered, or not."""
        ...

    def stop(self) -> None: ...


def _deliver(exchange: Exchange | None) -> Any:
    """The ``deliver`` of a linked call's asker: ``exchange``'s; none, returned in-process."""
    return None if exchange is None else exchange.deliver


def _unknown_id(invocation_id: str) -> dict[str, Any]:
    return refusal("INVALID_FIELD", "invocation_id", "no such invocation in the journal")


VIEW_THREADS = 2
"""Worker threads the embedded broker's views (``record``, ``actions``) hold at once: their
own, never trio's default ones -- which the calls' journal opens share."""


class Embedded:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._controls: set[Any] = set()
        self._stopped = False
        self._view_threads = trio.CapacityLimiter(VIEW_THREADS)
        """The views' threads (``Broker.view``): a database slow to answer a view stalls that
        view alone, never the calls running on the event loop."""

    @classmethod
    @asynccontextmanager
    async def open(
        cls, config_path: str | None = None, *, config: Config | None = None
    ) -> AsyncIterator[Embedded]:
        """The broker on ``config`` as loaded already, else on the file ``config_path``."""
        from affidavit.api.broker import Broker

        async with Broker.open(config_path, config=config) as broker:
            yield cls(broker)

    async def catalog(self) -> dict[str, Any]:
        return self.broker.catalog()

    async def call(self, action: Mapping[str, Any], exchange: Exchange) -> dict[str, Any]:
        from affidavit.engine import call_failure, carries_key
        from affidavit.journal import JournalError

        with self._control() as control:
            # Refused, and nothing happens, once the call passed its dispatch gate.
            exchange.on_gone(control.withdraw)
            try:
                return await self.broker.call(action, deliver=exchange.deliver, control=control)
            except JournalError as exc:
                # No durable record to render an envelope from: the daemon's answer to the
                # same, so that a client hears the same whichever broker it has.
                # No invocation id: the engine dispatches only once it named one to
                # ``control`` (``invocation.run``, the same key's ``resume``) -- this request
                # sent nothing.  With an idempotency_key an earlier one under it may have run
                # (its binding unread): unknown, as the key's action is.
                keyed = carries_key(action)
                _, code, message = call_failure(exc, control.invocation_id, keyed)
                sent = control.invocation_id is not None or keyed
                return self._api_error(code, message, sent=sent)
            except Exception as exc:
                return self._internal(exc, control, "a call")

    def running_ids(self) -> list[str]:
        """The invocation id of each call running (a poll, a query: its own linked call), or
        "none accepted" -- read from the stop's watchdog thread (``stop.EmbeddedStop``)."""
        return [c.invocation_id or "none accepted" for c in list(self._controls)]

    @contextmanager
    def _control(self) -> Iterator[Any]:
        """A control for a call (or a poll, a reconciliation query: a linked call of its own)
        that ``stop`` stops with the rest: the grace's end stops each where it is, recorded
        BROKER_SHUTDOWN -- none runs on, to be cut off later as if its caller had left."""
        from affidavit.engine import CallControl

        control = CallControl()
        if self._stopped:  # started just as the process was told to stop: never dispatched
            control.stop()
        self._controls.add(control)
        try:
            yield control
        finally:
            self._controls.discard(control)

    async def fetch_result(
        self, invocation_id: str, from_chunk: int | None, chunks: int | None, exchange: Exchange
    ) -> dict[str, Any]:
        from affidavit.engine import result_failure
        from affidavit.journal import JournalError

        try:
            # This process's uid reads (``requested_by``): on a journal shared with the
            # daemon, a call another uid made through it is only read here.
            envelope = await self.broker.fetch_result(
                invocation_id,
                from_chunk=from_chunk,
                chunks=chunks,
                deliver=exchange.deliver,
                reader=os.getuid(),
            )
        except JournalError as exc:  # as the daemon answers it (``result_failure``)
            _status, code, message = result_failure(exc, invocation_id)
            return self._api_error(code, message, invocation_id, sent=False)
        return _unknown_id(invocation_id) if envelope is None else envelope

    async def record(self, invocation_id: str) -> dict[str, Any]:
        from affidavit.journal import JournalError, JournalReader
        from affidavit.views import record_view

        tag = self.broker.journal.holder_tag  # (the broker's own reader holds the broker key)

        def both(j: JournalReader) -> dict[str, Any] | None:
            rec = j.record(invocation_id)
            if rec is None or not self.broker.callable_by_caller(rec):
                return None  # as an unknown id: neither read nor probed for (``fetch_result``)
            return record_view(rec, j.events(invocation_id), holder=tag)

        try:
            view = await self.broker.view(both, self._view_threads)
        except JournalError as exc:
            return self._journal_error(exc, f"the record of {invocation_id}", invocation_id)
        # A caller's: its lease holder tagged, plain hashes withheld.
        return _unknown_id(invocation_id) if view is None else view

    async def actions(self, session: str | None, outcome: str | None, limit: int) -> dict[str, Any]:
        from affidavit.journal import JournalError, JournalReader
        from affidavit.views import actions_page, record_to_json

        tag = self.broker.journal.holder_tag  # (the broker's own reader holds the broker key)

        def page(j: JournalReader) -> dict[str, Any]:
            # The newest ``limit``: memory O(limit).  No kept view (the daemon's
            # ``Api.summary``): ``list_actions`` always names a session (the connection's by
            # default), and a session's page streams that session -- work O(the session),
            # never the whole journal's fold a kept view starts with (``views.actions_page``).
            found = actions_page(
                j,
                limit,
                session=session,
                outcome=outcome,
                readable=self.broker.callable_target,  # only what fetch_result reads
            )
            actions = [record_to_json(r, holder=tag) for r in found.records]
            return {"actions": actions, "total": found.total, "truncated": found.truncated}

        try:
            return await self.broker.view(page, self._view_threads)
        except JournalError as exc:
            return self._journal_error(exc, "the actions view")

    async def poll_operation(
        self, operation_id: str, exchange: Exchange | None = None
    ) -> dict[str, Any]:
        """A journal that could not take the poll is answered as the daemon answers it (its
        503 JOURNAL_UNAVAILABLE: ``poll_failure``), never as INTERNAL."""
        from affidavit.engine import OperationError, poll_failure
        from affidavit.journal import JournalError

        try:
            with self._control() as control:
                return await self.broker.poll_operation(
                    operation_id, control=control, deliver=_deliver(exchange)
                )
        except OperationError as exc:  # the id sent, echoed as sent: no journal words to unplace
            return act_refused(exc.code, str(exc), exc.field, "operation_id", exc.retry_after)
        except JournalError as exc:
            # Its polls are on its submission's record: get_record of that tells what was.
            _status, code, message = poll_failure(exc, operation_id, check=GET_RECORD)
            return self._api_error(code, message, operation_id, sent=True, retry="backoff")
        except Exception as exc:
            return self._internal(exc, control, "a poll", retry="backoff")

    async def reconcile_query(
        self, invocation_id: str, exchange: Exchange | None = None
    ) -> dict[str, Any]:
        """The query form only (``affidavit.reconcile``): attesting is an operator's.  A
        journal that could not take it is answered as the daemon answers it (its 503
        JOURNAL_UNAVAILABLE: ``reconcile.service.failure``), never as INTERNAL."""
        from affidavit.approvals import OperatorError
        from affidavit.journal import JournalError
        from affidavit.reconcile import service

        try:
            with self._control() as control:
                return await self.broker.reconcile(
                    invocation_id, query=True, control=control, deliver=_deliver(exchange)
                )
        except OperatorError as exc:  # its words name the id sent, echoed as sent
            return act_refused(exc.code, exc.message, exc.field, "invocation_id")
        except JournalError as exc:
            _status, code, message = service.failure(exc, invocation_id, check=GET_RECORD)
            return self._api_error(code, message, invocation_id, sent=True, retry="backoff")
        except Exception as exc:
            return self._internal(exc, control, "a reconciliation", retry="backoff")

    def stop(self) -> None:
        """The process is told to stop: every call is stopped where it is, recorded
        BROKER_SHUTDOWN with what its evidence proves (unknown once dispatched)."""
        self._stopped = True
        for control in list(self._controls):
            control.stop()

    def _internal(
        self, exc: Exception, control: Any, what: str, retry: str = "reconcile"
    ) -> dict[str, Any]:
        """A call, a poll or a query that failed inside the broker (a bug, not the journal's),
        answered as the daemon answers it: the type only (its text may quote remote bytes) and
        the invocation the engine recorded for it, closed at once (``Engine._answered``).
        ``retry``: a poll or a query (which never repeats the call) is asked again, ``backoff``
        as docs/mcp.md says; a call is never resent blindly (``reconcile``)."""
        from affidavit.engine import internal_failure

        name = type(exc).__name__
        iid = control.invocation_id  # set by the engine once it wrote for one
        log.error("%s ended without an answer (%s): %s", what, iid or "none recorded", name)
        _, code, message = internal_failure(name, iid, FETCH_RESULT)
        return self._api_error(code, message, sent=True, retry=retry)

    def _journal_error(self, exc: Exception, what: str, echoed: str = "") -> dict[str, Any]:
        """A read the journal could not answer, as the daemon answers it
        (``app._journal_problem``): JOURNAL_UNAVAILABLE naming ``what`` when a shared journal
        is away, else JOURNAL_UNREADABLE with the journal's own words (altered, refused) --
        never the one for the other."""
        from affidavit.engine import read_failure

        _status, code, message = read_failure(exc, what)
        return self._api_error(code, message, echoed, sent=False)

    def _api_error(
        self, code: str, message: str, echoed: str = "", *, sent: bool, retry: str | None = None
    ) -> dict[str, Any]:
        """An answer without where the journal lives, as the daemon's (``engine.unplaced``):
        this process is the config owner's, but its caller is an agent.  ``echoed``: the id
        the caller sent, which the journal's words may quote."""
        from affidavit.engine import unplaced

        journal = self.broker.config.journal
        message = unplaced(
            code, message, journal.location, (echoed,), journal.key_files, self.broker.journal.path
        )
        return api_error(code, message, sent=sent, retry=retry)


class Daemon:
    def __init__(self, client: Client) -> None:
        self.client = client
        self._scopes: set[trio.CancelScope] = set()
        self._stopped = False

    @classmethod
    @asynccontextmanager
    async def open(cls, socket: str, daemon_uid: int | None = None) -> AsyncIterator[Daemon]:
        """A proxy to the daemon at ``socket``, trusting ``daemon_uid`` (``--daemon-uid``)
        as its user, else the one ``$AFFIDAVIT_DAEMON_UID`` names."""
        from affidavit.api.client import Client

        async with Client.open(socket, daemon_uid=daemon_uid) as client:
            yield cls(client)

    async def catalog(self) -> dict[str, Any]:
        found: dict[str, Any] = await self._ask(self.client.catalog())
        return found

    async def call(self, action: Mapping[str, Any], exchange: Exchange) -> dict[str, Any]:
        # The client gone: hang up on the daemon (closing the connection mid-request), which
        # withdraws the call before its dispatch gate and records a failed delivery after it.
        if self._stopped:
            return api_error(
                "SHUTTING_DOWN", "affidavit mcp is stopping; nothing was sent", sent=False
            )
        lost = _lost_call(action.get("session"))
        with trio.CancelScope() as scope:
            exchange.on_gone(scope.cancel)
            self._scopes.add(scope)
            try:
                answer: dict[str, Any] = await self._ask(self.client.call(action), lost)
                return answer
            finally:
                self._scopes.discard(scope)
        if self.stopped():  # the grace ran out, not the client's patience
            return _stopped_before_answer(lost)
        return api_error(
            "CALLER_GONE", "the client stopped waiting; the daemon keeps the call", sent=True
        )

    async def fetch_result(
        self, invocation_id: str, from_chunk: int | None, chunks: int | None, exchange: Exchange
    ) -> dict[str, Any]:
        found = await self._ask(
            self.client.fetch_result(invocation_id, from_chunk=from_chunk, chunks=chunks)
        )
        return _unknown_id(invocation_id) if found is None else found

    async def record(self, invocation_id: str) -> dict[str, Any]:
        found = await self._ask(self.client.invocation(invocation_id))
        return _unknown_id(invocation_id) if found is None else found

    async def actions(self, session: str | None, outcome: str | None, limit: int) -> dict[str, Any]:
        page: dict[str, Any] = await self._ask(
            self.client.actions(session=session, outcome=outcome, limit=limit)
        )
        if "actions" not in page:  # an api_error, or an argument refused (``_client_failure``)
            return page
        return {"actions": page["actions"], "total": page["total"], "truncated": page["truncated"]}

    async def poll_operation(
        self, operation_id: str, exchange: Exchange | None = None
    ) -> dict[str, Any]:
        return await self._linked(
            lambda: self.client.poll_operation(operation_id), _LOST_POLL, "operation_id"
        )

    async def reconcile_query(
        self, invocation_id: str, exchange: Exchange | None = None
    ) -> dict[str, Any]:
        return await self._linked(
            lambda: self.client.reconcile(invocation_id, query=True), _LOST_QUERY, "invocation_id"
        )

    async def _linked(
        self,
        ask: Callable[[], Awaitable[dict[str, Any] | None]],
        lost: Lost,
        argument: str,
    ) -> dict[str, Any]:
        """A poll or a reconciliation query through the daemon: its answer; the daemon's own
        refusal (OVERLOADED too) as embedded; any other failure -- a 5xx, a lost answer -- as
        one after which the linked call may have queried the remote (``lost``'s hint)."""
        from affidavit.api.wire import ApiError

        try:
            answer: dict[str, Any] | None = None
            with self._hung_up_at_stop():
                answer = await ask()
            return _stopped_before_answer(lost) if answer is None else answer
        except ApiError as exc:
            if _refused(exc):
                return act_refused(exc.code, exc.message, exc.field, argument, exc.retry_after)
            return _client_failure(exc, lost)
        except Exception as exc:
            return _client_failure(exc, lost)

    def stopped(self) -> bool:
        """Whether ``stop`` was called (a method: it may turn true across an ``await``)."""
        return self._stopped

    @contextmanager
    def _hung_up_at_stop(self) -> Iterator[trio.CancelScope]:
        """A poll or a reconciliation query (a linked call the daemon runs): ``stop`` hangs up
        on the daemon for it as for a call, at the grace's end -- not later, unanswered."""
        with trio.CancelScope() as scope:
            if self._stopped:
                scope.cancel()
            self._scopes.add(scope)
            try:
                yield scope
            finally:
                self._scopes.discard(scope)

    def stop(self) -> None:
        """Hang up on the daemon for every call: it decides what each one becomes."""
        self._stopped = True
        for scope in list(self._scopes):
            scope.cancel()

    async def _ask(self, request: Any, lost: Lost | None = None) -> Any:
        try:
            return await request
        except Exception as exc:
            return _client_failure(exc, lost)


Lost = tuple[str, str]
"""What a request lost on its way may have done, for the agent: (the words, the retry hint)."""


def _lost_call(session: object) -> Lost:
    """A call whose answer was lost: it may have run, in the session the action named (the
    connection's unless it named its own) -- never to be resent blindly (``reconcile``)."""
    named = session if isinstance(session, str) and visible_name(session) else None
    where = f"session {named}" if named is not None else "the session the action named"
    return (
        f" The call may have run: the daemon keeps it -- list_actions ({where}) finds it, "
        "fetch_result reads it; a call with an idempotency_key resumes the same invocation.",
        "reconcile",
    )


_LOST_POLL: Lost = (
    " The poll may have run (a query of the job's state, never the job again): the daemon "
    "records it -- poll_operation with the same operation_id asks again.",
    "backoff",
)
_LOST_QUERY: Lost = (
    " The query may have run (a read of the remote state, never the call again): the daemon "
    "records it -- get_record shows it, reconcile_query with the same invocation_id asks again.",
    "backoff",
)


def _stopped_before_answer(lost: Lost) -> dict[str, Any]:
    words, retry = lost
    return api_error(
        "SHUTTING_DOWN",
        "affidavit mcp stopped before the daemon answered." + words,
        sent=True,
        retry=retry,
    )


def _refused(exc: Any) -> bool:
    """Whether the daemon's ``ApiError`` for a poll or a query proves nothing was sent: a code
    of ``NOT_SENT`` or a 4xx refusal.  Any other (500 INTERNAL, 503 JOURNAL_UNAVAILABLE, 500
    RESULT_UNVERIFIED) may come after the linked invocation queried the remote: ``unknown``."""
    return exc.code in NOT_SENT or 400 <= exc.status < 500


_BAD_PARAMETER = frozenset({"BAD_REQUEST", "INVALID_FIELD"})
"""The daemon's codes for a query parameter it refuses (docs/deployment.md)."""


def _bad_json(exc: Any) -> bool:
    """The daemon's 400 BAD_JSON: an action refused before it was journaled."""
    return bool(exc.status == 400 and exc.code == "BAD_JSON")


def _client_failure(exc: Exception, lost: Lost | None) -> dict[str, Any]:
    """A request the client could not complete.  ``lost``: what it may have done if it was
    sent (an action, a poll, a query); None for a read, which sends nothing to any remote."""
    from affidavit.api.wire import AnswerLost, ApiError, ClientError, DaemonUnavailable, NotSent

    if isinstance(exc, ApiError) and exc.action_code is not None and _bad_json(exc):
        # The action's JSON refused before it was journaled: the embedded broker's code and
        # field for the same fault, in the validation error it answers (with no record here).
        # Only a 400 BAD_JSON says so: an action_code on another answer proves nothing.
        return refusal(exc.action_code, exc.field or "action", exc.message)
    if isinstance(exc, ApiError) and lost is None and exc.code in _BAD_PARAMETER and exc.field:
        # A read's parameter the daemon refused (its socket API's codes): the tool's argument
        # of that name, answered as the tools refuse one, alike for both backends.
        return refusal("INVALID_FIELD", exc.field, exc.message)
    if isinstance(exc, ApiError):
        sent = lost is not None and exc.code not in NOT_SENT
        retry = lost[1] if lost is not None and sent else None
        return api_error(
            exc.code, exc.message, exc.field, sent=sent, retry=retry, retry_after=exc.retry_after
        )
    if isinstance(exc, AnswerLost):
        words, retry = lost if lost is not None else ("", "backoff")
        return api_error("ANSWER_LOST", str(exc) + words, sent=lost is not None, retry=retry)
    if isinstance(exc, DaemonUnavailable):
        return api_error(getattr(exc, "code", "DAEMON_UNAVAILABLE"), str(exc), sent=False)
    if isinstance(exc, NotSent):
        # Refused by the client before a byte went out (a timeout, 1e400, a page's bounds).
        return api_error("CLIENT_ERROR", str(exc), sent=False, retry="after_correction")
    if isinstance(exc, ClientError | ValueError):  # an answer not JSON, or a fault past sending
        words, retry = lost if lost is not None else ("", "backoff")
        return api_error("CLIENT_ERROR", str(exc) + words, sent=lost is not None, retry=retry)
    raise exc
