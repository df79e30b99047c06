"""``affidavit mcp``: the broker as MCP tools over stdio, on the SDK's low-level ``Server``.

The low-level server, not ``MCPServer``: the high-level one builds each tool's schema from a
Python signature and validates arguments with pydantic before the tool runs, so a malformed
argument would become the SDK's JSON-RPC error.  Here the schemas are the catalog's (the action
parser's declarations) and every argument reaches the broker's own checks: a malformed action is
a validation envelope with a stable code and field path, journaled like any other.

One connection is one session: its broker ``session`` -- the default of every action that names
none, and of ``list_actions`` -- is ``mcp-`` plus 96 random bits, drawn when the process starts
(stable for the connection, not guessable by another agent).

Every tool request runs in a task of the process's own (``McpSession._run``), never in the SDK's
handler: a client that cancels or hangs up ends the handler, not the call (seed, "A result
delivery error must not repeat execution").  ``backends.py`` says who then records what.  At most
``max_calls`` such tasks run at once (embedded: the config's ``[service] max_calls``; the proxy,
which reads no config: its default, 256), each counted until its delivery is recorded; one more
is answered ``api_error`` OVERLOADED at once and nothing runs for it -- as the daemon answers
its 503.  The reads answered in the SDK's handler (``get_record``, ``list_actions``,
``list_targets``) are bounded apart: ``READS_AT_ONCE`` worked on at once, the others waiting
their turn (they are bounded by the transport's open requests) ``READ_TURN_WAIT`` at most, then
answered OVERLOADED, nothing read; while ``READS_OPEN`` answers
are not yet written (a ``list_actions`` page of 1,000 records held unwritten is MBs of objects)
the read whose turn came waits ``READS_WAIT``, then is answered OVERLOADED with a
``retry_after``, nothing read.  (The daemon's views give one uid two threads and refuse past
16 waiting: a wait, not unwritten answers.)  Every request at all is bounded by the transport
(``max_calls`` + ``OPEN_MARGIN`` open at once, one more answered OVERLOADED there).

Stopping: end of input (the client is gone), SIGTERM or SIGINT ends the session as the daemon's
shutdown does (``affidavit/daemon/calls.py``): no more calls are taken (one more is answered
SHUTTING_DOWN, nothing run); the calls in flight get ``grace`` seconds (``--shutdown-grace``;
else embedded: the config's ``[service] shutdown_grace``; the proxy: its default, 30) to finish
-- their results stored, an answer that cannot be written recorded RESULT_DELIVERY_FAILED; then
the rest are stopped, each recorded BROKER_SHUTDOWN with what its evidence proves (unknown once
dispatched, never not_attempted), and the process exits.  After a signal the input is still read
and answers are still written until the calls are over.  A signal once the input has ended or
the grace runs (a host that closed the input and then signals, or a second signal) stops the
rest at once.  Embedded, the signals are taken by a thread of the process's own, never on the
event loop (which a shared journal's read may hold), and the whole stop is bounded: past
``stop_bound`` (the grace, the stopped calls' recording, the journal's close) the process exits
74 with one line naming what was pending (``stop.py``).  The proxy takes them with trio's
receiver (``_stop_on_signal``): its loop waits on no storage.
"""

from __future__ import annotations

import logging
import secrets
import signal
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import mcp_types as types
import trio
from mcp.server.lowlevel import Server
from mcp.server.lowlevel.server import NotificationOptions

import affidavit
from affidavit.api.wire import RESULT_PAGE_CHUNKS
from affidavit.stopping.bound import RECORD_WAIT

from .backends import Backend, Exchange
from .render import render
from .tools import (
    CONTRACT,
    READ_TOOLS,
    WHOLE_FETCH_MOST,
    ArgumentError,
    action_tool_doc,
    api_error,
    is_error,
    non_finite,
    refusal,
    visible_name,
)
from .transport import Outcome, StdioTransport, shown_id

if TYPE_CHECKING:
    from .stop import EmbeddedStop

__all__ = ["McpSession", "new_session_id", "serve"]

log = logging.getLogger("affidavit.mcp")

Work = Callable[[Exchange], Awaitable[dict[str, Any]]]
DEFAULT_LIMIT = 50
DEFAULT_MAX_CALLS = 256
"""Tool requests running in tasks of their own at once, when no config says (``[service]
max_calls``'s default: the proxy reads no config)."""
READS_OPEN = 16
"""Answers to reads answered in the handler (``get_record``, ``list_actions``,
``list_targets``) not yet written, at most (one more read is refused OVERLOADED): a
``list_actions`` page of 1,000 records held unwritten is MBs of objects."""
READS_AT_ONCE = 2
"""Such reads worked on at once; the rest wait their turn (the embedded backend's own two view
threads; the daemon's views give one uid two threads and 16 waiting)."""
READS_WAIT = 1.0
"""Seconds a read whose turn came waits for ``READS_OPEN`` unwritten answers to drop below the
bound before it is refused."""
READ_TURN_WAIT = 10.0
"""Seconds a read waits for its turn at most, then is answered OVERLOADED (``READS_RETRY``),
nothing read: two slow reads holding both turns kept every later one waiting for good, each
holding an open request of the transport's until all were refused there.  (The daemon's views
wait as long for a thread: ``readers.VIEW_WAIT``.)"""
READS_RETRY = 1
"""The ``retry_after`` of a read refused past ``READS_OPEN`` (the daemon's views' too)."""
DEFAULT_GRACE = 30.0
"""Seconds calls in flight may finish once the session ends, when no config says (``[service]
shutdown_grace``'s default)."""


def new_session_id() -> str:
    return "mcp-" + secrets.token_hex(12)


class McpSession:
    """The tools of one MCP connection, answered by ``backend``."""

    def __init__(
        self,
        backend: Backend,
        transport: StdioTransport,
        session: str,
        max_calls: int = DEFAULT_MAX_CALLS,
    ) -> None:
        self.backend = backend
        self.transport = transport
        self.session = session
        self.max_calls = max_calls
        self.running = 0
        """Tasks of ``_run`` not yet over (a call runs on after its handler is gone)."""
        self.reads = 0
        """Reads of ``_bounded`` past their turn whose answers are not yet written (or known
        unwritten)."""
        self._reading = trio.Semaphore(READS_AT_ONCE)
        self._answer_taken = trio.Event()
        self.nursery: trio.Nursery | None = None
        self.stopping = False
        self.ending = trio.Event()
        """Set when the session ends: its input ended, or a signal arrived."""
        self.grace = trio.CancelScope()
        """The wait for calls in flight; cancelled to stop them at once."""
        self._idle = trio.Event()
        self._idle.set()
        self._catalog: dict[str, Any] | None = None

    async def catalog(self) -> dict[str, Any]:
        if self._catalog is None:
            found = await self.backend.catalog()
            if "api_error" in found:
                return found
            self._catalog = found
            self.transport.limit_actions(found["max_action_bytes"])
        return self._catalog

    # -- the SDK's handlers ------------------------------------------------------------------------

    async def list_tools(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        found = await self.catalog()
        tools = [
            types.Tool(
                name=t["name"],
                description=action_tool_doc(t["doc"]),
                input_schema=t["input_schema"],
                annotations=types.ToolAnnotations(destructive_hint=True, open_world_hint=True),
            )
            for t in found.get("tools", ())
        ]
        for read in READ_TOOLS.values():
            tools.append(
                types.Tool(
                    name=read.name,
                    description=read.doc,
                    input_schema=read.input_schema(),
                    annotations=types.ToolAnnotations(
                        read_only_hint=read.read_only, open_world_hint=not read.read_only
                    ),
                )
            )
        return types.ListToolsResult(tools=tools)

    async def call_tool(
        self, ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        answer = await self.answer(ctx.request_id, params.name, dict(params.arguments or {}))
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=render(answer))],
            structured_content=answer,
            is_error=is_error(answer),
        )

    # -- the tools ---------------------------------------------------------------------------------

    async def answer(self, request_id: Any, name: str, args: dict[str, Any]) -> dict[str, Any]:
        read = READ_TOOLS.get(name)
        if read is not None:
            try:
                checked = read.read(args)
            except ArgumentError as exc:
                return refusal(exc.code, exc.field, exc.message)
            return await self._read(request_id, name, checked)
        found = await self.catalog()
        if "api_error" in found:
            return found
        tool = next((t for t in found["tools"] if t["name"] == name), None)
        if tool is None:
            # The name is quoted only when it is short and plain: a caller's bytes are not
            # echoed back whole (a 60 MB name, control or bidi characters in a client's view).
            shown = repr(name) if visible_name(name) else "by that name"
            return refusal("UNSUPPORTED_ACTION", "name", f"no tool {shown} (tools/list)")
        overflowed = non_finite(args)
        if overflowed is not None:  # refused alike by both backends: neither can say it
            return refusal("INVALID_FIELD", overflowed, "is a number beyond JSON's range")
        target = args.get("target")
        kinds = {t["name"]: t["kind"] for t in found["targets"]}
        if isinstance(target, str) and kinds.get(target, tool["kind"]) != tool["kind"]:
            right = next(t["name"] for t in found["tools"] if t["kind"] == kinds[target])
            return refusal(
                "UNSUPPORTED_ACTION",
                "target",
                f"target {target} is of kind {kinds[target]}: call it with {right}",
            )
        if args.get("session") is None:
            args["session"] = self.session
        return await self._run(request_id, lambda ex: self.backend.call(args, ex))

    async def _read(self, request_id: Any, name: str, args: dict[str, Any]) -> dict[str, Any]:
        backend = self.backend
        if name == "fetch_result":
            # A resumed read is a page (``chunks``, by default ``RESULT_PAGE_CHUNKS``), from
            # either backend alike, and records nothing.  A whole fetch (no ``from_chunk``)
            # records delivery -- within ``WHOLE_FETCH_MOST``, else refused (``_whole``).
            iid, chunk, size = args["invocation_id"], args["from_chunk"], args["chunks"]
            if chunk is not None or size is not None:
                chunk, size = chunk or 0, size or RESULT_PAGE_CHUNKS
                return await self._run(
                    request_id, lambda ex: backend.fetch_result(iid, chunk, size, ex)
                )
            return await self._run(request_id, lambda ex: _whole(backend, iid, ex))
        if name == "poll_operation":
            op_id = args["operation_id"]
            return await self._run(request_id, lambda ex: backend.poll_operation(op_id, ex))
        if name == "reconcile_query":
            iid = args["invocation_id"]
            return await self._run(request_id, lambda ex: backend.reconcile_query(iid, ex))
        return await self._bounded(request_id, name, args)

    async def _bounded(self, request_id: Any, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """A read answered here, in the handler: ``READS_AT_ONCE`` worked on at once, the rest
        waiting their turn (as many as the transport lets be open); refused only when
        ``READS_OPEN`` answers stay unwritten ``READS_WAIT`` seconds -- the client is not
        taking them -- each counted from its turn until it is written or cannot be.  A turn
        is waited for ``READ_TURN_WAIT`` at most."""
        with trio.move_on_after(READ_TURN_WAIT) as turn:  # the wait alone, never the read
            await self._reading.acquire()
        if turn.cancelled_caught:
            return _reads_refused(
                f"{READS_AT_ONCE} reads have been worked on for {READ_TURN_WAIT:g} s and more "
                "(this one waited that long for its turn)"
            )
        try:
            if not await self._answer_room():
                return _reads_refused(
                    f"{READS_OPEN} answers to reads are not yet written (the client has not "
                    "taken them)"
                )
            self.reads += 1
            outcome = self.transport.expect(request_id) if request_id is not None else None
            try:
                answer = await self._answer_read(name, args)
            except BaseException:
                if outcome is not None:
                    self.transport.forget(outcome)
                raise
            finally:
                if outcome is None or outcome.settled or self.nursery is None:
                    self._read_over()
                else:
                    self.nursery.start_soon(self._read_taken, outcome)
            return answer
        finally:
            self._reading.release()

    async def _answer_room(self) -> bool:
        """Whether fewer than ``READS_OPEN`` answers are unwritten, or become so within
        ``READS_WAIT`` (answers given in a burst are written a moment later)."""
        with trio.move_on_after(READS_WAIT):
            while self.reads >= READS_OPEN:
                if self._answer_taken.is_set():  # (shared by the reads holding a turn)
                    self._answer_taken = trio.Event()
                await self._answer_taken.wait()
        return self.reads < READS_OPEN

    async def _read_taken(self, outcome: Outcome) -> None:
        try:
            await outcome.wait()
        finally:
            self._read_over()

    def _read_over(self) -> None:
        self.reads -= 1
        self._answer_taken.set()

    async def _answer_read(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        if name == "get_record":
            return await self.backend.record(args["invocation_id"])
        if name == "list_targets":
            found = await self.catalog()
            if "api_error" in found:
                return found
            return {"session": self.session, "targets": found["targets"]}
        assert name == "list_actions"
        session = args["session"] or self.session
        limit = DEFAULT_LIMIT if args["limit"] is None else args["limit"]
        listed = await self.backend.actions(session, args["outcome"], limit)
        if "actions" not in listed:
            return listed
        return {"session": session, **listed}

    async def _run(self, request_id: Any, work: Work) -> dict[str, Any]:
        """Run ``work`` in a task of the process's own and wait for its answer; if this wait
        ends first (the client cancelled, or hung up), the work learns it through
        ``Exchange.abandon`` and runs on."""
        if self.stopping or self.nursery is None:
            return api_error(
                "SHUTTING_DOWN", "affidavit mcp is stopping; nothing was run", sent=False
            )
        if self.running >= self.max_calls:
            return api_error(
                "OVERLOADED",
                f"{self.max_calls} calls are running; call again later (nothing was run)",
                sent=False,
            )
        exchange = Exchange()
        if request_id is not None:
            exchange.written = self.transport.expect(request_id)
        self.running += 1
        self._idle = trio.Event()
        self.nursery.start_soon(self._work, work, exchange, request_id)
        try:
            await exchange.ready.wait()
        except BaseException:
            exchange.abandon()
            if exchange.written is not None:
                self.transport.forget(exchange.written)
            raise
        assert exchange.answer is not None
        return exchange.answer

    async def _work(self, work: Work, exchange: Exchange, request_id: Any) -> None:
        try:
            try:
                answer = await work(exchange)
            except Exception as exc:
                # A journal that cannot be written, a broken binding: the type only (an
                # exception's text may quote remote bytes).
                name = type(exc).__name__
                log.error("request %s ended without an answer: %s", shown_id(request_id), name)
                answer = api_error("INTERNAL", f"the broker failed ({name})", sent=True)
            exchange.hand_over(answer)
            if exchange.written is not None and not await exchange.written.wait():
                why = "cancelled by the client" if exchange.written.cancelled else "client gone"
                log.warning(
                    "the answer to request %s was not written (%s)", shown_id(request_id), why
                )
        finally:
            self.running -= 1
            if not self.running:
                self._idle.set()

    def end(self) -> None:
        """A signal arrived: take no more calls and start the grace; if it is already running
        or the input has ended (its grace may not have begun yet), stop every call at once."""
        self.stopping = True
        if self.ending.is_set() or self.transport.hung_up.is_set():
            self.grace.cancel()
        self.ending.set()

    async def drain(self, grace: float) -> int:
        """Wait up to ``grace`` seconds for the calls in flight, then stop the rest where they
        are (each records where it stood) and wait for that.  Returns how many were stopped."""
        self.stopping = True
        self.grace.deadline = trio.current_time() + grace
        with self.grace:
            await self._idle.wait()
        left = self.running
        if left:
            self.backend.stop()
            # Stopping only records the boundary each call reached (shielded journal writes).
            with trio.move_on_after(max(grace, RECORD_WAIT)):
                await self._idle.wait()
        return left


def _reads_refused(why: str) -> dict[str, Any]:
    """The OVERLOADED answer of a read refused here, nothing read (``_bounded``)."""
    return api_error(
        "OVERLOADED",
        f"{why}; read again in {READS_RETRY} s (nothing was read)",
        sent=False,
        retry_after=READS_RETRY,
    )


def build_server(session: McpSession) -> Server[Any]:
    return Server(
        "affidavit",
        version=affidavit.__version__,
        instructions=f"Affidavit, a secrets broker: {CONTRACT} This connection's session is "
        f"{session.session}.",
        on_list_tools=session.list_tools,
        on_call_tool=session.call_tool,
    )


async def serve(
    backend: Backend,
    transport: StdioTransport,
    session_id: str,
    max_calls: int = DEFAULT_MAX_CALLS,
    grace: float = DEFAULT_GRACE,
    stop: EmbeddedStop | None = None,
) -> None:
    """Serve one MCP connection over ``transport`` until its input ends or a signal arrives;
    then let the calls in flight finish within ``grace`` seconds, stop the rest and return (the
    module docstring).  At most ``max_calls`` tool requests run at once in tasks of their own;
    one more is answered OVERLOADED at once, and nothing runs for it.  ``stop``: the embedded
    process's (its signals taken off the loop, its end bounded); None, the proxy's: trio's
    signal receiver, a task."""
    session = McpSession(backend, transport, session_id, max_calls)
    transport.limit_open(max_calls)
    if stop is not None:
        stop.attach(session)
    server = build_server(session)
    options = server.create_initialization_options(NotificationOptions())
    found = await session.catalog()  # the tools, how large a message may be (retried if failed)
    if "api_error" in found:
        # The action tools are missing from tools/list until it is read: say why where the
        # operator setting this server up looks, not only in each tool's answer.
        error = found["api_error"]
        log.warning(
            "no action tools until the catalog can be read (asked again at each tools/list): "
            "%s: %s",
            error.get("code"),
            error.get("message"),
        )
    async with trio.open_nursery() as top:
        if stop is None:
            top.start_soon(_stop_on_signal, session)
        async with trio.open_nursery() as calls:
            session.nursery = calls
            async with trio.open_nursery() as connection:
                connection.start_soon(_converse, server, transport, options, session)
                await session.ending.wait()
                if stop is not None:  # whatever ended it (a signal armed it already)
                    stop.arm_on_the_loop()
                if left := session.running:
                    log.info("the session ended; %d call(s) still running (grace %gs)", left, grace)
                stopped = await session.drain(grace)
                if stopped:
                    log.warning("the grace ran out: %d call(s) stopped (BROKER_SHUTDOWN)", stopped)
                connection.cancel_scope.cancel()
            session.nursery = None
            calls.cancel_scope.cancel()  # nothing is left running past the stop's own wait
        top.cancel_scope.cancel()


async def _converse(
    server: Server[Any], transport: StdioTransport, options: Any, session: McpSession
) -> None:
    """The connection itself; its input's end ends the session (and does not cut short a
    grace a signal started)."""
    try:
        async with transport.streams() as (read, write):
            await server.run(read, write, options)
    finally:
        session.stopping = True
        session.ending.set()


async def _stop_on_signal(session: McpSession) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("signal %d: stopping (%d call(s) running)", signum, session.running)
            session.end()


async def _whole(backend: Backend, iid: str, exchange: Exchange) -> dict[str, Any]:
    """A whole ``fetch_result``: its size read first from a one-chunk page (which records
    nothing); a result over ``WHOLE_FETCH_MOST`` bytes is refused ``WHOLE_FETCH_TOO_LARGE`` at
    ``from_chunk`` -- nothing recorded, its line never built -- else fetched whole (recorded
    delivered once written).  No stored result (an error, a record still open): fetched as is."""
    head = await backend.fetch_result(iid, 0, 1, exchange)
    result = head.get("result")
    resume = result.get("resume") if isinstance(result, dict) else None
    streams = resume.get("streams") if isinstance(resume, dict) else None
    if isinstance(streams, dict):
        size = sum(int(info.get("bytes") or 0) for info in streams.values())
        if size > WHOLE_FETCH_MOST:
            return refusal(
                "WHOLE_FETCH_TOO_LARGE",
                "from_chunk",
                f"the result is {size} bytes, more than a whole fetch answers over MCP "
                f"({WHOLE_FETCH_MOST} bytes): page it with from_chunk and chunks (pages "
                "record nothing; its delivery stays unconfirmed)",
            )
    return await backend.fetch_result(iid, None, None, exchange)
