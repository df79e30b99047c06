"""The API on the socket: a dict of routes, each answering what the embedded command prints.

    POST /v1/calls                     the envelope of ``affidavit call`` (HTTP 200, error or not)
    GET  /v1/invocations/{id}          {"record", "events"}, as ``affidavit record --json``
    GET  /v1/invocations/{id}/result   the envelope of ``affidavit result`` (a read, no re-run),
                                       written chunk by chunk (``results.py``);
                                       ``?from_chunk=N[&chunks=M]`` a page of it (``result``)
    POST /v1/operations/{id}/poll      ``affidavit operation poll`` (one linked query of the job)
    GET  /v1/catalog                   the targets and each protocol's action schema (MCP tools)
    GET  /v1/actions                   ``affidavit actions --json`` (same filters), the newest
                                       ``?limit=N`` only: {"actions", "limit", "total",
                                       "truncated"}
    GET  /v1/sessions                  ``affidavit sessions --json``, those seen last
                                       ``?limit=N`` only: {"sessions", "limit", "total",
                                       "truncated"}
    GET  /v1/metrics                   Prometheus text (``?format=json``: ``metrics --json``)
    GET  /v1/health                    {"ok": true, ...}; 503 JOURNAL_REPLACED when the SQLite
                                       file at the journal's path is not the one it writes
    ...  /v1/approvals[/{id}[/approve|/deny|/revoke|/content/{name}]],
         POST /v1/invocations/{id}/reconcile, POST /v1/console/login: the operator routes
         (``operators.py``)

Everything else is the API's own trouble: 400 bad JSON or query (or a malformed request, with
408, 415 for a Content-Encoding, 431, 501 for CONNECT, Upgrade or a Transfer-Encoding but
chunked and 503 for too many connections: h11server.py), 403 peer refused (on accept,
before a byte is read: ``refusal``), 404, 405, 413, 429 ``RATE_LIMITED`` (a uid past its
``[service] call_rate``: nothing journaled, ``shares.CallRate``), 503 ``VIEWS_IN_FLIGHT`` (a uid
with ``VIEW_QUEUE`` views waiting: ``shares.FairShare``), 503 overloaded, shutting down or journal
unavailable (``JOURNAL_UNAVAILABLE``: a call the journal could not record has no envelope to
render; a record or a view it could not read is named) or a read it declined this once
(``JOURNAL_READ_DECLINED``: a statement timeout, a lock not granted) -- a read's with
``Retry-After`` (``READ_RETRY``), a call's never -- or a SQLite file replaced under the daemon
(``JOURNAL_REPLACED``, no ``Retry-After``), 500 a journal that
answers but cannot be read (``JOURNAL_UNREADABLE``: altered, refused) -- ``{"api_error":
{"code", "message"}}``.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

import trio

import affidavit
from affidavit.api.broker import Broker
from affidavit.api.wire import (
    ACTIONS_LIMIT,
    EVENTS_LIMIT,
    MAX_ACTIONS_LIMIT,
    MAX_SESSIONS_LIMIT,
    RESULT_PAGE_CHUNKS,
    SESSIONS_LIMIT,
    parse_limit,
    parse_page,
    parse_time,
)
from affidavit.console import TokenStore
from affidavit.engine import (
    READ_RETRY,
    OperationError,
    call_failure,
    carries_key,
    internal_failure,
    poll_failure,
    read_failure,
    result_failure,
    unplaced,
)
from affidavit.journal import (
    AsOf,
    JournalError,
    JournalReader,
    SessionSummary,
)
from affidavit.statemachine import Outcome, Phase, Record
from affidavit.text import printable
from affidavit.views import (
    actions_page,
    metrics_key,
    metrics_of,
    prometheus_text,
    record_json_encoder,
    record_view,
)

from . import answers, operators, results
from .calls import Calls, Running, internal_problem
from .http import ApiProblem, ClientGone, Request, api_error_body, echoed, json_body, named
from .peer import Peer, PeerPolicy
from .shares import CONSOLE, Asker, CallRate, FairShare

__all__ = ["Api"]

log = logging.getLogger("affidavit.daemon")

Handler = Callable[["Api", Request], Awaitable[None]]

_INVOCATION = re.compile(r"/v1/invocations/([^/]+)(/result|/reconcile)?")
_OPERATION = re.compile(r"/v1/operations/([^/]+)/poll")
_APPROVAL = re.compile(r"/v1/approvals/([^/]+)(/approve|/deny|/revoke|/content/[^/]+)?")
_PROMETHEUS = b"text/plain; version=0.0.4; charset=utf-8"

VIEW_THREADS = 4
"""Worker threads the views (the socket's and the console's) hold at once (``Api.read``): their
own, never trio's default ones -- which the calls' journal opens and closes share -- so a caller
flooding the views waits its turn on the event loop and takes no thread a call needs.  Shared
out by asker (``shares.FairShare``): a uid that is not an operator holds at most half of them,
those uids together all but one when operators are configured.  The views that bring the kept
counts to the head have one more, their own (``Api.summary_turn``)."""

VIEW_QUEUE = 16
"""Views one uid that is not an operator may have waiting, for a thread or for the kept views'
turn: one more is answered 503 ``VIEWS_IN_FLIGHT`` at once (``shares.ViewsInFlight``)."""


class Api:
    def __init__(self, broker: Broker, policy: PeerPolicy, calls: Calls) -> None:
        self.broker = broker
        self.policy = policy
        self.calls = calls
        self.journal = broker.config.journal
        self.console_url: str | None = None
        """The operator console's base URL when the daemon serves one (``server.py``)."""
        self.tokens: TokenStore | None = None
        """Its one-time login tokens."""
        self.summary = SessionSummary(metrics_key)
        """``/v1/sessions``' and unfiltered ``/v1/metrics``' counts, brought up to date per
        request (not folded again)."""
        operators = broker.operator_policy
        reserve = 1 if operators.uids or operators.gids else 0  # none to keep one for
        self.view_share = FairShare(
            VIEW_THREADS,
            per_asker=max(1, VIEW_THREADS // 2),
            others=VIEW_THREADS - reserve,
            queue=VIEW_QUEUE,
            what="every view thread",
            theirs="every view thread this uid may use",
            keep=VIEW_THREADS + 1,
        )
        """Who may take the next of the views' ``VIEW_THREADS`` threads (``read``): a uid
        flooding the views waits behind its own, not every other asker (audit 48, #5)."""
        service = broker.config.service
        self.call_rate = CallRate(service.call_rate, service.call_burst)
        """The calls and polls each uid may start (``[service] call_rate``, ``call_burst``)."""
        self.health_said: set[str] = set()
        """The journal codes ``health`` has logged: once each, not once a probe."""
        self.summary_turn = FairShare(
            1,
            per_asker=1,
            others=1,
            queue=VIEW_QUEUE,
            what="the kept views' turn",
            keep=VIEW_THREADS + 1,  # (one pool of readers for both: ``Broker.view``)
        )
        """The views that bring ``summary`` to the head take turns here, on the event loop
        (``read_summarized``), for their own thread -- by asker, in turn
        (``shares.FairShare``): its first fold (~20 s at 1M events) holds one thread, not one
        per request waiting on its lock."""

    def asker(self, req: Request) -> Asker:
        """Whose view ``req`` asks for: its peer's uid, an operator's by the kernel's
        credentials as the operator routes decide."""
        operator = self.broker.operator_policy.is_operator(operators.operator_of(req))
        return Asker(req.peer.uid, operator)

    def take_call(self, req: Request) -> None:
        """One of the calls ``req``'s uid may start (``call_rate``), or 429 ``RATE_LIMITED``
        -- an operator's are not counted: trusted, as in the views' share and admission."""
        if not self.asker(req).operator:
            self.call_rate.take(req.peer.uid)

    def console_reads(self) -> tuple[Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]]:
        """``read`` and ``read_summarized`` for the operator console (``CONSOLE``'s share)."""
        return (
            functools.partial(self.read, asker=CONSOLE),
            functools.partial(self.read_summarized, asker=CONSOLE),
        )

    def refusal(self, peer: Peer) -> bytes | None:
        """The whole answer to a peer the policy refuses (403 ``PEER_REFUSED``, then the
        connection closes), sent as it is accepted, before a byte of it is read
        (``Server.refuse``, which logs it); None for an allowed peer."""
        if self.policy.allows(peer):
            return None
        body = api_error_body("PEER_REFUSED", _refused_message(peer))
        return (
            b"HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        )

    async def handle(self, req: Request) -> None:
        args: tuple[str, ...] = ()
        try:
            handler, args = self._route(req)
            _check_params(req, handler)
            await handler(self, req, *args)
        except ApiProblem as problem:
            if not req.answered:
                await req.respond_problem(_echo_bounded(self._unplaced(problem, args), args))
        except ClientGone:
            pass

    def _unplaced(self, problem: ApiProblem, echoed: tuple[str, ...] = ()) -> ApiProblem:
        """``problem`` without where the journal lives (``engine.unplaced``, as the embedded
        MCP server answers too): a socket caller (an agent) has no business knowing it.  The
        daemon's log keeps it.  ``echoed``: the ids of the path, the caller's own text."""
        journal = self.journal
        message = unplaced(
            problem.code,
            problem.message,
            journal.location,
            echoed,
            journal.key_files,
            self.broker.journal.path,
        )
        if message == problem.message:
            return problem
        return ApiProblem(problem.status, problem.code, message, problem.field, problem.retry_after)

    def _route(self, req: Request) -> tuple[Callable[..., Awaitable[None]], tuple[str, ...]]:
        """The handler and its arguments, matched on the path as sent (``req.target``): an id
        is one segment, unquoted after the match -- ``X%2Fresult`` is the id ``X/result``, never
        the result of ``X``."""
        path = req.target
        methods: dict[str, Callable[..., Awaitable[None]]] | None = ROUTES.get(path)
        args: tuple[str, ...] = ()
        if methods is None:
            m = _INVOCATION.fullmatch(path)
            if m is not None:
                sub = m.group(2)
                if sub == "/reconcile":
                    methods = {"POST": operators.reconcile}
                else:
                    methods = {"GET": Api.result if sub else Api.record}
                args = (m.group(1),)
        if methods is None:
            m = _OPERATION.fullmatch(path)
            if m is not None:
                methods, args = {"POST": Api.poll}, (m.group(1),)
        if methods is None:
            m = _APPROVAL.fullmatch(path)
            if m is not None:
                verb = m.group(2)
                if verb and verb.startswith("/content/"):
                    methods = {"GET": operators.content}
                    args = (m.group(1), verb.removeprefix("/content/"))
                elif verb:
                    methods = {"POST": operators.decide}
                    args = (m.group(1), verb[1:])
                else:
                    methods = {"GET": operators.approval}
                    args = (m.group(1),)
        if methods is None:
            raise ApiProblem(404, "NOT_FOUND", f"no such API path: {echoed(req.path)}")
        handler = methods.get(req.method)
        if handler is None:
            allowed = ", ".join(sorted(methods))
            raise ApiProblem(405, "METHOD_NOT_ALLOWED", f"{echoed(req.path)} takes {allowed}")
        return handler, tuple(unquote(a) for a in args)

    # -- calls ----------------------------------------------------------------------------------

    async def call(self, req: Request) -> None:
        action = await req.action()
        timeout = req.timeout_param()
        if not self.calls.accepting:
            raise ApiProblem(503, "SHUTTING_DOWN", "the broker is shutting down; call again later")

        async def deliver(envelope: dict[str, Any]) -> None:
            # Called by the engine for a stored result only -- not to a caller already
            # answered IN_PROGRESS (its deadline passed: ``_answered_by``).
            if early:
                raise ClientGone("the caller was answered when its deadline passed")
            await _deliver(req, envelope, running.hand_over())

        async def run(call: Running) -> dict[str, Any]:
            return await self.broker.call(
                action,
                timeout=timeout,
                deliver=deliver,
                control=call.control,
                requester=req.peer.uid,  # it may not approve its own request
            )

        early = False  # answered IN_PROGRESS at its deadline (``_answered_by``)
        self.take_call(req)  # or 429 RATE_LIMITED: nothing journaled, nothing run
        running = self.calls.start(run)  # or 503 OVERLOADED (``Overloaded``), nothing run
        withdraw = functools.partial(_withdraw, running)
        req.link.on_hang_up.add(withdraw)
        if req.link.hung_up.is_set():
            withdraw()  # gone while the body was read: never dispatch it
        try:
            past = not await _answered_by(running)
        finally:
            req.link.on_hang_up.discard(withdraw)
        if running.answering or req.link.hung_up.is_set():
            return
        if past:
            # Past its deadline, a call it does not bound runs on: answered as a caller that
            # ran out of time -- IN_PROGRESS, its result stored for ``fetch_result``.  Unless
            # its record is final already (a result committed, its delivery to come): then
            # that delivery answers, as to a call that ended in time.
            iid = running.control.invocation_id
            assert iid is not None
            try:
                envelope = await self.broker.in_progress(iid)
            except JournalError as exc:
                raise _journal_problem(exc, f"invocation {iid}") from None
            if envelope is not None and not (running.answering or running.done.is_set()):
                early = True  # no await since the read: ``deliver`` has not been called
                await answers.respond_delivered(req, envelope)
                return
            await running.done.wait()
            if running.answering or req.link.hung_up.is_set():
                return
        if running.envelope is None:
            if running.journal_failed is not None:
                # No envelope without a durable record to render it from.  What was recorded
                # stays: once the journal is back, the record (recovered when its lease ran
                # out) says whether anything was sent; a row proven altered is no outage
                # (``call_failure``).
                iid, keyed = running.control.invocation_id, carries_key(action)
                raise ApiProblem(*call_failure(running.journal_failed, iid, keyed))
            # Not the journal's: the invocation named, whose record says what happened.
            raise ApiProblem(*internal_failure(str(running.failure), running.control.invocation_id))
        await answers.respond_delivered(req, running.envelope)  # held in the answer budget

    def answering(self, req: Request, running: Running) -> Answering:
        """The ``deliver`` a linked call's asker answers ``req`` through (``Answering``), in
        ``running``'s delivery scope."""
        return Answering(req, running)

    async def poll(self, req: Request, operation_id: str) -> None:
        """One query of a job's status resource (``Broker.poll_operation``): a linked invocation
        of its own, whose envelope is in the answer's ``poll``."""
        timeout = req.timeout_param()
        if not self.calls.accepting:
            raise ApiProblem(503, "SHUTTING_DOWN", "the broker is shutting down; call again later")
        control = None
        self.take_call(req)  # a poll journals a linked invocation: as a call
        try:
            # Refused OVERLOADED past ``max_calls`` and stopped at the grace's end, as a call.
            with self.calls.linked() as running:
                control, deliver = running.control, self.answering(req, running)
                answer = await self.broker.poll_operation(
                    operation_id,
                    timeout=timeout,
                    control=control,
                    requester=req.peer.uid,  # it may not approve its own poll
                    deliver=deliver,  # the poll recorded delivered once this answer is written
                )
        except OperationError as exc:  # POLL_TOO_SOON: its Retry-After
            raise ApiProblem(exc.status, exc.code, str(exc), exc.field, exc.retry_after) from None
        except JournalError as exc:
            # The submission's record (its polls are on it) tells what was.
            failure = poll_failure(exc, operation_id, check=operators.RECORD_CHECK)
            raise operators.act_problem(exc, failure) from None
        except ApiProblem:
            raise  # OVERLOADED: nothing run
        except Exception as exc:  # a bug: named, as a call's (never the h11 server's traceback)
            raise internal_problem(exc, control, "a poll") from None
        await deliver.unless_tried(answer)

    # -- reads ------------------------------------------------------------------------------------

    async def catalog(self, req: Request) -> None:
        await req.respond_json(self.broker.catalog())

    async def result(self, req: Request, invocation_id: str) -> None:
        """The stored envelope, its streams read and written chunk by chunk, never held whole
        nor read on the event loop (``results.py``).  Whole (no query): recorded
        RESULT_DELIVERED once its last byte went into the socket, as ever.  ``?from_chunk=N``
        (``&chunks=M``, default ``RESULT_PAGE_CHUNKS``, at most ``MAX_RESULT_PAGE_CHUNKS``; 400
        ``BAD_REQUEST`` at ``chunks`` past it, as at ``from_chunk``): a page, each stream's
        chunks N to N+M-1, with ``result.resume.next_chunk`` -- a resumed read, which records
        nothing.  Each answer holds ``PIECE_HOLD`` and its envelope's text of the server's
        answer budget while it is read and written, or is 503 ``ANSWERS_IN_FLIGHT`` -- no
        delivery failure recorded (``results.AnswersInFlight``).  An answer the engine tried
        (``deliver``) is never written a second time here: the journal says how it ended."""
        tried = False

        async def deliver(envelope: dict[str, Any]) -> None:
            nonlocal tried
            tried = True
            await _deliver(req, envelope, trio.CancelScope(), functools.partial(write, req))

        async def write(req: Request, envelope: dict[str, Any]) -> None:
            await results.respond_result(self, req, envelope)

        from_chunk = req.count_param("from_chunk")
        chunks = _page_param(req)
        if chunks is not None and from_chunk is None:
            from_chunk = 0
        elif from_chunk is not None and chunks is None:
            chunks = RESULT_PAGE_CHUNKS
        what = f"the result of {invocation_id}"
        try:
            # No hold across the record's reads (``results.py``): only its answer holds.
            envelope = await self.broker.fetch_result(
                invocation_id,
                from_chunk=from_chunk,
                chunks=chunks,
                deliver=deliver,
                defer=True,
                # The uid the kernel names: a fetch is the delivery only by the uid that asked
                # (a session is a label any caller may send: it decides nothing).
                reader=req.peer.uid,
            )
            if req.answered or req.link.hung_up.is_set():
                return
            if tried:
                # Its answer failed before a byte, for a reason not the journal's (a bug; the
                # engine logged it and recorded the delivery failed): never written again
                # beside the record -- a whole answer the journal calls undelivered.
                raise ApiProblem(
                    500,
                    "INTERNAL",
                    f"the answer of {invocation_id} failed inside the daemon; its result "
                    "stays stored: fetch it again",
                )
            if envelope is None:
                # The words of `affidavit result` run embedded, but for where the journal
                # lives: a socket caller (an agent) has no business knowing its path or
                # database URL.
                raise ApiProblem(
                    404,
                    "NO_SUCH_INVOCATION",
                    f"no invocation {invocation_id} in the journal",
                    "invocation_id",  # the id in the path names nothing: the part to correct
                )
            await write(req, envelope)
        except JournalError as exc:  # as every surface answers it (``result_failure``)
            # (After part of the answer was written -- cut short -- only logged, by the same.)
            raise _journal_problem(exc, what, result_failure(exc, invocation_id)) from None

    async def record(self, req: Request, invocation_id: str) -> None:
        """The record and its events, read in a view thread (``read``): a database slow to
        answer this read stalls it alone, never the calls.  ``?from_seq=N[&limit=M]``: a page
        of its events -- those from seq N, at most M (``EVENTS_LIMIT``, 1 to
        ``MAX_ACTIONS_LIMIT``) -- and ``next_seq``, the seq of the first one left out (null
        when none is): a record answered whole past what the daemon ever holds for one answer
        is 413 ``ANSWER_TOO_LARGE`` (``results.held``), and any record is readable so."""

        holder = self.broker.journal.holder_tag
        from_seq = req.count_param("from_seq")
        paged = from_seq is not None or "limit" in req.params
        # At least one: a page of none would answer next_seq == from_seq, and a reader
        # following next_seq would ask the same page for ever.
        limit = _limit_param(req, EVENTS_LIMIT, MAX_ACTIONS_LIMIT, least=1)

        def both(j: JournalReader) -> tuple[Record | None, bytes]:
            # Encoded here, with the read: a record of many events is megabytes of JSON, which
            # would stall the event loop; its answer is held in the budget (``respond_page``).
            rec = j.record(invocation_id)
            # One on a target the caller may not call answers as an unknown id, word for word
            # (``Broker.callable_by_caller``, as ``fetch_result``'s), checked before its events
            # are read: neither read nor probed for -- not by an answer slower, nor one an
            # altered event row turns into JOURNAL_UNREADABLE (MCP's ``get_record`` likewise).
            if rec is None or not self.broker.callable_by_caller(rec):
                return None, b""
            if not paged:  # a caller's: its lease holder tagged, plain hashes withheld
                return rec, json_body(record_view(rec, j.events(invocation_id), holder=holder))
            # The page and one more (is there a next?), read from its seq: never the rows
            # before it, nor those past it.
            page = j.events_page(invocation_id, from_seq or 0, limit + 1)
            view = record_view(rec, page[:limit], holder=holder)
            view["next_seq"] = page[limit].seq if len(page) > limit else None
            return rec, json_body(view)

        rec, data = await self._read(both, f"the record of {invocation_id}", self.asker(req))
        if rec is None:
            raise ApiProblem(
                404,
                "NO_SUCH_INVOCATION",
                f"no invocation {invocation_id} in the journal",
                "invocation_id",  # the id in the path names nothing: the part to correct
            )
        parts = f"read its events a page at a time: ?from_seq=0&limit={EVENTS_LIMIT}, then "
        parts += "?from_seq=<next_seq> until next_seq is null"
        await answers.respond_page(req, data, parts if not paged else "ask a smaller limit=")

    async def actions(self, req: Request) -> None:
        """The newest ``limit`` records matching the filters (default ``ACTIONS_LIMIT``, at
        most ``MAX_ACTIONS_LIMIT``), oldest first, with how many matched (``total``) and
        whether some were left out (``truncated``).  The daemon holds the page, never the
        whole view (``affidavit actions`` run embedded lists it all); without a filter but
        the session it reads only the page's rows, its count kept per target, not O(journal)
        (``views.actions_page``)."""
        session = req.text_param("session")
        outcome = _enum_param(req, "outcome", Outcome)
        phase = _enum_param(req, "phase", Phase)
        since, until = _time_param(req, "since"), _time_param(req, "until")
        limit = _limit_param(req, ACTIONS_LIMIT, MAX_ACTIONS_LIMIT)

        summary = self.summary  # (its counts per target: a caller's page is read alone)
        # The broker's own journal tags the holders: it holds the broker key (a view's
        # read-only connection may not load it); the digest takes no connection.
        encode = record_json_encoder(holder=self.broker.journal.holder_tag)

        def body(j: JournalReader) -> bytes:
            # Each record as `affidavit actions --json` writes it: one C encoder call per
            # record instead of a plain copy of its tree, then one encoding of the page.
            page = actions_page(
                j,
                limit,
                session=session,
                outcome=outcome,
                phase=phase,
                since=since,
                until=until,
                summary=summary,
                readable=self.broker.callable_target,
            )
            texts = ",".join(map(encode, page.records))
            return (
                f'{{"actions":[{texts}],"limit":{limit},"total":{page.total},'
                f'"truncated":{"true" if page.truncated else "false"}}}\n'
            ).encode()

        # The page is held until its last byte is written: counted in the answer budget
        # (``results.held``; past it 503 ``ANSWERS_IN_FLIGHT``), so clients that do not read
        # their pages cannot hold 10000 records each without bound.
        # The page that makes the summary's first fold takes the kept views' turn (as
        # ``metrics``): one thread folds the journal, the others wait on the event loop.  Once
        # something is kept a page does not: it is mostly the fold of its records and their
        # encoding, outside the summary's lock (which covers the short step of bringing it up
        # and choosing the page) -- a flood of pages held the turn for their whole job (62-135
        # ms each at limit=1000) and pushed /v1/sessions and /v1/metrics past ``view_wait``.
        # A filtered page, or a session's while nothing is kept, is streamed and does not.
        plain = outcome is None and phase is None and since is None and until is None
        first_fold = plain and session is None and not summary.kept
        data = await self._read(body, "the actions view", self.asker(req), first_fold)
        await answers.respond_page(req, data)

    async def sessions(self, req: Request) -> None:
        """The ``limit`` sessions seen last (default ``SESSIONS_LIMIT``, at most
        ``MAX_SESSIONS_LIMIT``) in the reader's order, with ``total`` and ``truncated``: a
        caller names its sessions, so the view is streamed (memory O(sessions), not
        O(records)) and the answer a page.  Read from ``self.summary``: only the invocations
        with an event since the last request are folded (issue 15).  A caller's: of the
        invocations on a target the configuration names only (as ``actions``), counts too."""
        limit = _limit_param(req, SESSIONS_LIMIT, MAX_SESSIONS_LIMIT)
        summary = self.summary

        # Cut to the page in the reading thread too, from the order the summary keeps (only
        # the entries shown are built: the agents name as many sessions as they like), and the
        # event loop is every client's.
        def view(j: JournalReader) -> dict[str, Any]:
            page, as_of = j.summarized_session_page(summary, limit, self.broker.callable_target)
            return {**page, "as_of": _as_of(as_of)}

        page = await self._read(view, "the sessions view", self.asker(req), summarized=True)
        # Encoded off the loop once the kept views' turn is released (the next view's read
        # need not wait for it), then held in the answer budget until it is written
        # (``respond_page``), as an actions page is: 100 unread 3.75 MB pages grew the daemon
        # by 1.1 GB (audit 48).
        data = await answers.encoded_in_thread(req, page)
        await answers.respond_page(req, data)

    async def metrics(self, req: Request) -> None:
        session, since = req.text_param("session"), _time_param(req, "since")
        summary = self.summary

        def count(j: JournalReader) -> dict[str, Any]:
            # Every record, or a session's (since a time): kept counts (``summary``): O(what
            # was appended since + the session's invocations), not a fold of the session's
            # events per request (2.6-3.2 s for a session of 21k invocations).
            tallies, as_of = j.summarized_tallies(
                summary, since, session, self.broker.callable_target
            )
            return {**metrics_of(tallies), "as_of": _as_of(as_of)}

        # (A session's while nothing is kept is its own fold: it does not take the kept
        # views' turn -- the ``kept`` hint is read here, on the event loop.)
        kept = session is None or summary.kept
        data = await self._read(
            count, "the records the metrics count", self.asker(req), summarized=kept
        )
        fmt = req.params.get("format", "prometheus")
        if fmt == "json":
            await req.respond_json(data)
        elif fmt == "prometheus":
            await req.respond(200, prometheus_text(data).encode("utf-8"), _PROMETHEUS)
        else:
            raise ApiProblem(400, "BAD_REQUEST", "format: expected prometheus or json", "format")

    async def health(self, req: Request) -> None:
        # Not "ok" over a journal every call and view is refused: a SQLite file replaced
        # under the daemon answers 503 JOURNAL_REPLACED here too (one stat, as the writer's
        # check at each transaction; nothing on PostgreSQL) -- on a thread, so a hung mount
        # stalls this probe, not the event loop; logged once, not at every probe.
        try:
            await trio.to_thread.run_sync(self.broker.journal.backend.require_writer_file)
        except JournalError as exc:
            problem = _journal_problem(exc, "the journal's health", quiet=True)
            if problem.code not in self.health_said:
                self.health_said.add(problem.code)
                _journal_problem(exc, "the journal's health")
            raise problem from None
        await req.respond_json(
            {
                "ok": True,
                "version": affidavit.__version__,
                "calls_in_flight": len(self.calls.running),
                "accepting": self.calls.accepting,
                "peer": {"uid": req.peer.uid, "gid": req.peer.gid},
            }
        )

    async def _read(
        self,
        view: Callable[[JournalReader], Any],
        what: str,
        asker: Asker,
        summarized: bool = False,
    ) -> Any:
        """``read`` (``read_summarized`` when the view brings ``summary`` to the head), a
        ``JournalError`` answered as the API's trouble (``_journal_problem``), ``what`` naming
        the view, ``asker`` whose it is."""
        try:
            return await (self.read_summarized if summarized else self.read)(view, asker)
        except JournalError as exc:
            raise _journal_problem(exc, what) from None

    async def read(self, view: Callable[[JournalReader], Any], asker: Asker) -> Any:
        """A whole-journal view, on its own read-only connection in a worker thread: a long
        scan must not stall the calls on the event loop (the console's reads too, which answer
        a ``JournalError`` themselves) -- one of the views' own ``VIEW_THREADS``: a request
        waits for one on the event loop, holding no thread, in ``asker``'s share of them
        (``view_share``: at most the broker's ``view_wait``, then declined, ``ReadFailed``;
        ``VIEWS_IN_FLIGHT`` past its queue) -- its place held until the thread ends, a view
        abandoned by its caller's too (``shares.Place``)."""
        return await self.broker.view(view, self.view_share.place(asker, self.broker.view_wait))

    async def read_summarized(self, view: Callable[[JournalReader], Any], asker: Asker) -> Any:
        """``read``, for a view that brings ``summary`` to the head: one at a time, in the
        kept views' own thread (``summary_turn``) -- they take turns on its lock anyway, and
        one that waits for another's fold waits on the event loop, not in a thread -- each
        asker in turn, at most the broker's ``view_wait``, then declined (``ReadFailed``), as
        a wait for a thread is.  Not also in ``view_share``: the turn held while its uid's
        other views hold that uid's threads left every other asker's kept views waiting on a
        turn doing nothing (rv48 #1); the turn is one more thread, at most."""
        place = self.summary_turn.place(asker, self.broker.view_wait)
        return await self.broker.view(view, place)


def _as_of(as_of: AsOf | None) -> dict[str, Any] | None:
    """What a kept answer is as of (``AsOf``, given with it; None: folded now): the last seq
    folded, and when the last whole verify completed and its verdict."""
    return None if as_of is None else as_of.to_json()


ROUTES: dict[str, dict[str, Callable[..., Awaitable[None]]]] = {
    "/v1/calls": {"POST": Api.call},
    "/v1/catalog": {"GET": Api.catalog},
    "/v1/actions": {"GET": Api.actions},
    "/v1/sessions": {"GET": Api.sessions},
    "/v1/metrics": {"GET": Api.metrics},
    "/v1/health": {"GET": Api.health},
    "/v1/approvals": {"GET": operators.approvals},
    "/v1/console/login": {"POST": operators.console_login},
}

QUERY_PARAMS: dict[Callable[..., Awaitable[None]], tuple[str, ...]] = {
    Api.call: ("timeout",),
    Api.poll: ("timeout",),
    operators.reconcile: ("timeout",),
    Api.result: ("from_chunk", "chunks"),
    Api.record: ("from_seq", "limit"),
    Api.actions: ("session", "outcome", "phase", "since", "until", "limit"),
    Api.sessions: ("limit",),
    Api.metrics: ("session", "since", "format"),
}
"""The query parameters each handler reads; every other route takes none."""


def _check_params(req: Request, handler: Callable[..., Awaitable[None]]) -> None:
    """400 ``INVALID_FIELD`` naming the first query parameter the route does not read, or one
    sent twice, before anything runs -- as an unknown action or body field is refused:
    ``?timout=5`` silently dropped would run the call under the target's own timeout,
    ``?limt=5`` page 50 records, and of ``?timeout=1&timeout=100`` one value would be
    dropped unseen.  A name that is not short printable text is not echoed: ``query`` stands
    for it."""
    known = QUERY_PARAMS.get(handler, ())
    for name in sorted(req.params):
        shown = named(name, "query")
        if name not in known:
            takes = f"this route takes {', '.join(known)}" if known else "this route takes none"
            raise ApiProblem(
                400, "INVALID_FIELD", f"{shown}: unknown query parameter ({takes})", shown
            )
        if name in req.repeated:
            raise ApiProblem(
                400, "INVALID_FIELD", f"{shown}: query parameter given twice (give it once)", shown
            )


def _echo_bounded(problem: ApiProblem, ids: tuple[str, ...]) -> ApiProblem:
    """``problem`` quoting the ids of the request's path (``ids``) at most ``ECHO`` characters
    each, escaped (``echoed``): the handlers' words quote them whole (``no operation X in the
    journal``), and an id the broker gave is 30 printable characters -- 10 000 of the caller's
    were echoed back, a line break in one split the message."""
    message = problem.message
    for shown, text in ((echoed(i), i) for i in ids):
        if shown != text:
            message = message.replace(text, shown)
    if message == problem.message:
        return problem
    return ApiProblem(problem.status, problem.code, message, problem.field, problem.retry_after)


class Answering:
    """The ``deliver`` of a linked call's asker (a poll, a reconciliation query): the broker
    writes the answer through it (``engine.deliver_linked``), and records the linked result
    delivered only once it was written whole; ``ClientGone`` otherwise.  Written in the linked
    call's ``running.delivery`` (``Calls.linked``), which the stop bounds as it bounds a
    call's: ``ANSWER_WAIT`` from its hand-over, never past the grace's end by more -- cut off
    so, recorded RESULT_DELIVERY_FAILED, not left to the connections' close, unrecorded
    (``Running.hand_over``, ``Running.stop``)."""

    def __init__(self, req: Request, running: Running) -> None:
        self.req = req
        self.running = running

    async def __call__(self, answer: dict[str, Any]) -> None:
        await _deliver(self.req, answer, self.running.hand_over())

    async def unless_tried(self, answer: dict[str, Any]) -> None:
        """Answer with ``answer`` unless the broker tried to already: never written twice."""
        if not self.running.answering:
            await answers.respond_delivered(self.req, answer)


async def _deliver(
    req: Request,
    envelope: dict[str, Any],
    scope: trio.CancelScope,
    write: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
) -> None:
    """Answer with ``envelope`` (through ``write``, when given: a stored result's streams read
    as they are written; else whole, held in the answer budget: ``answers.respond_delivered``);
    raise ``ClientGone`` unless it was delivered -- the client had not hung up and every byte
    went into its socket (link.py says why that is the line)."""
    if req.link.hung_up.is_set():
        raise ClientGone("the client hung up before its answer")
    with scope:
        await (write or functools.partial(answers.respond_delivered, req))(envelope)
    if scope.cancelled_caught or req.link.broken:
        raise ClientGone("the answer could not be written whole")


def _journal_problem(
    exc: JournalError, what: str, failure: tuple[int, str, str] | None = None, quiet: bool = False
) -> ApiProblem:
    """A read the journal could not answer (``read_failure``): 503 JOURNAL_UNAVAILABLE when a
    shared journal is away beyond ``[journal] reconnect``, or JOURNAL_READ_DECLINED when the
    database declined it once (unread, nothing known to be wrong with it), else 500
    JOURNAL_UNREADABLE with the journal's own one-line words (altered, refused) -- never
    blurred.  One line in the daemon's log either way, never a traceback: ``what`` and the
    journal's words may name a caller's id (decoded from the path: ``%0A`` a line break), so
    both are escaped (``printable``) -- never a line of the caller's own in the log.
    ``failure``: the read's own answer (``result_failure``) instead of ``read_failure``'s;
    ``quiet``: no log line (the caller logs it once)."""
    status, code, message = failure or read_failure(exc, what)
    shown, why = printable(what), printable(str(exc))
    if quiet:
        pass
    elif status == 503:
        log.warning("%s: the journal did not answer now: %s", shown, why)
    else:
        log.error("%s: %s", shown, why)
    # Declined this once (a lock, a statement timeout, every view thread busy), or a shared
    # journal away: say when to read again (``READ_RETRY``).
    return ApiProblem(status, code, message, retry_after=READ_RETRY.get(code))


async def _answered_by(running: Running) -> bool:
    """Wait for the call to end (True), or -- once the engine runs it on past its caller's
    deadline (``CallControl.answer_by``: a joined call dispatched under the target's own
    timeout) -- for that deadline (False, the call still running).  One wait, no task of its
    own: the engine sets the scope's deadline (``CallControl.answer_within``)."""
    with trio.CancelScope() as scope:
        running.control.answer_within(scope)
        await running.done.wait()
    return running.done.is_set()


def _withdraw(running: Running) -> None:
    """The caller hung up: withdraw its call -- refused (and nothing happens) once the call has
    reached its dispatch gate; the engine decides (affidavit/engine/control.py)."""
    if running.control.withdraw():
        log.info("the client hung up before dispatch; the call is withdrawn")


def _page_param(req: Request) -> int | None:
    """``?chunks=``: a page's chunks of each stream, 1 to ``MAX_RESULT_PAGE_CHUNKS``; else --
    an empty value too, never read as absent (a whole fetch, recorded delivered) -- 400
    ``BAD_REQUEST`` naming it, as ``from_chunk`` (``count_param``) and every query parameter
    but ``timeout`` is refused."""
    raw = req.params.get("chunks")
    if raw is None:
        return None
    try:
        return parse_page(raw)  # refuses "" too
    except ValueError as exc:
        raise ApiProblem(400, "BAD_REQUEST", f"chunks: {exc}", "chunks") from None


def _enum_param(req: Request, name: str, enum: type[Outcome] | type[Phase]) -> str | None:
    raw = req.text_param(name)
    if raw is None:
        return None
    allowed = [str(v.value) for v in enum]
    if raw not in allowed:
        raise ApiProblem(400, "BAD_REQUEST", f"{name}: expected one of {', '.join(allowed)}", name)
    return raw


def _limit_param(req: Request, default: int, maximum: int, least: int = 0) -> int:
    """``?limit=``: a whole number from ``least`` to ``maximum`` (``default`` when absent);
    else -- an empty value too -- 400 ``BAD_REQUEST`` naming it."""
    raw = req.params.get("limit")
    if raw is None:
        return default
    try:
        return parse_limit(raw, maximum, least)
    except ValueError as exc:
        raise ApiProblem(400, "BAD_REQUEST", f"limit: {exc}", "limit") from None


def _time_param(req: Request, name: str) -> float | None:
    raw = req.text_param(name)
    if raw is None:
        return None
    try:
        return parse_time(raw)
    except ValueError as exc:
        raise ApiProblem(400, "BAD_REQUEST", f"{name}: {exc}", name) from None


def _refused_message(peer: Peer) -> str:
    return (
        f"uid {peer.uid} may not use this broker (the daemon's [service] allow_uids / allow_gids)"
    )
