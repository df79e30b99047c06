"""MCP over stdio, with the one fact the SDK's stdio transport cannot give: whether an answer
was written.

The SDK answers a request by sending it into a memory stream; its stdio writer writes it later
and, if the write fails, the exception ends the writer -- the handler has long returned and
nobody learns which answer was lost.  Delivery needs exactly that fact (seed: "Mark
RESULT_DELIVERED only after the protocol has confirmed complete transfer"), so this transport
writes each outgoing message itself and reports, per request id the server ``expect``s, whether
its answer went out:

* **written**: every byte of the answer's line was accepted into the stdout pipe (``send_all``
  returned).  That is the last instant this process can observe: a client killed after it loses
  the answer unread -- JSON-RPC has no receipt -- and the result stays fetchable.
* **not written**: the write failed or was interrupted, the output was already broken, the
  session ended first (the streams closed: after the input's end answers are still written
  while the server runs -- a client may close stdin and read on), or the server settled the
  request without answering it (the client cancelled it: MCP forbids an answer then -- the
  SDK says so through the request's ``on_request_unanswered``).

An answer is matched to its request by id, so an id is the request's until it is settled
(answered, or settled unanswered): a second request with an id still in flight is refused here
with a JSON-RPC error (-32600) and never reaches the server -- nothing runs for it, and the
first keeps its own verdict.  (The SDK would overwrite its record of the first.)

A line that is not a valid JSON-RPC message is answered here too, never dropped in silence: a
parse error (-32700, id null) when no id can be read, else an invalid request (-32600) or
invalid params (-32602) naming the fault -- invalid UTF-8, a lone surrogate, nesting or a
number beyond the parser's limits, an id that is no id, a ``tools/call`` whose ``arguments``
are no object (``INVALID_FIELD at params.arguments``) -- and never quoting the message.  A
message with an id is a request whatever else it holds: one whose id is not a string or an
integer (true, 1.5, null, an object...) is answered under id null, though the SDK's parser reads
it as a notification and drops the id.  A notification or a response is not answered
(JSON-RPC); every such fault is logged, the first few one line each, then one line per
``FAULT_LOG_EVERY`` (a hostile client cannot flood the log).

What a client that does not read cannot do: hold this process's memory without bound.  At most
``max_open`` requests are open at once (read and not yet settled -- whatever their method: tool
calls, reads, ``tools/list``, ``ping``, ones the server refuses), their lines ``OPEN_BYTES`` in
all (one longer alone); one more request is answered here at once with a JSON-RPC error
(``OVERLOADED``, its ``data`` the tools' ``api_error`` OVERLOADED with ``retry_after``), nothing
run, its line dropped once its id is read (a request held open keeps its bytes: 60 refused 5 MiB
requests held 324 MB, 6,000 ``list_actions`` 1.1 GB, before these bounds).  The reader never
waits for room, nor writes: every refusal goes to its own writer through a small bounded queue
(``REFUSALS``, ``REFUSAL_BYTES``; only when it is full does the reader wait), so a
``notifications/cancelled`` or a response behind a request past the bounds is still read while
a long answer is being written -- waiting for room, then for the write lock, held the reader
once, and a cancel behind it was never read.  What the reader
itself holds is one line at most (``max_line``, and one read past it).  The server sets
``max_open`` to its ``max_calls`` plus ``OPEN_MARGIN``, room for the cheap requests beside the
calls (``limit_open``).  And each write must make progress within ``write_wait``
(``WRITE_WAIT``, 30 s, as the daemon's answers): a line is written in slices of ``WRITE_SLICE``
bytes, each taken within it, and the whole line within ``write_wait`` plus its length at
``MIN_RATE`` (64 KiB/s: an answer to a slow reader holds every other one back that long at
most), so a steady reader at that rate takes a line of any length, while a client that reads
nothing for ``write_wait``, or too slowly, breaks the output -- the line was perhaps cut, so
nothing more is written; every answer not written is settled not written (recorded
RESULT_DELIVERY_FAILED by the backend, as when the client hangs up) and stdin is read no
further, which ends the session.  Every write -- the refusals too -- is
bounded so; the reader itself never waits for one.

Stray output is kept off the wire: while serving, fd 0 reads /dev/null and fd 1 is stderr, and
the protocol runs on private duplicates (as the SDK's ``stdio_server`` does).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import anyio
import mcp_types as types
import trio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.message import ServerMessageMetadata, SessionMessage

from affidavit import strictjson  # a leaf: the proxy loads no broker code

__all__ = ["FAULT_LOG_EVERY", "MAX_LINE", "BoundedLog", "Outcome", "StdioTransport", "shown_id"]

log = logging.getLogger("affidavit.mcp")

MAX_LINE = 64 * 1024 * 1024
"""The longest message read until the catalog says how large an action may be
(``max_action_bytes``, the bound ``affidavit call`` and the daemon apply to an action's JSON)."""
ENVELOPE = 64 * 1024
"""Room for JSON-RPC's own fields around a tool's arguments."""

PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS = -32700, -32600, -32602
OVERLOADED = -32000
"""JSON-RPC's first implementation-defined server error: a request past the open bounds, its
``data`` the tools' ``{"api_error": {"code": "OVERLOADED", ...}}``."""
FAULT_LOG_FIRST = 5
"""Protocol faults logged one line each; after them, one line per ``FAULT_LOG_EVERY``."""
FAULT_LOG_EVERY = 1000
MAX_DEPTH = 200
"""The SDK's parser (pydantic's) refuses deeper nesting."""
MAX_NODES = strictjson.ACTION_NODES + 1_000
"""Values a message may hold: an action's (10,000, ``protocols.actions.MAX_NODES``: the broker
refuses more, journaled) and room for JSON-RPC's own members.  Counted before any
parser runs (``strictjson.prescan``): a 7 MiB ``[{},{},...]`` took 2.0 s of the loop, 0.013 s
refused so (tests/benchmarks/mcp_lines.py)."""
OFF_LOOP = 256 * 1024
"""A longer message is read -- bounded, parsed, diagnosed (``_read_line``) -- in a worker
thread: a hostile 64 MiB line takes seconds to read for its id (``strictjson.members``), or to
parse (2.8 s of ``\u0041`` escapes), which on the event loop stalled every embedded call, lease
and answer meanwhile.  A shorter one takes the loop for about 20 ms at most (18 ms for 256 KiB
of ``[[],[],...]``): it stays there, sparing the common small message a thread's hop.  In the
thread one parser's call still holds the GIL throughout, the loop waiting: pydantic's parse of
64 MiB of escapes 0.16 s, ``json``'s 0.12 s (a ticker's largest gap 0.14 s,
tests/mcp/test_members.py); what is decoded only to answer an oversized message -- its id, a
member's name -- is bounded (``ID_TEXT``, ``strictjson.MEMBER_NAME``)."""
ID_TEXT = strictjson.SCAN_CHUNK
"""Characters of an oversized message's id (as JSON) decoded at most (``_too_large``): a longer
one is answered under null, read no further."""
MAX_DIGITS = 4300
"""Nor does it read longer integers (Python's own bound for ``int(str)``)."""
OPEN_BYTES = MAX_LINE
"""Bytes of the requests open at once, at most (one longer message is let in alone): as many as
the longest message read before the catalog says how large an action may be.  The count alone
let 272 requests of ``max_line`` each be held."""
OPEN_MARGIN = 16
"""Requests open beyond the server's ``max_calls``: room for the cheap ones (``tools/list``,
``ping``, a refusal) while every call is taken, and for the one more a full server answers
OVERLOADED."""
OPEN_RETRY = 1
"""Seconds after which a request refused past the open bounds may be sent again (its
``retry_after``, as the daemon's views say past their queue)."""
WRITE_WAIT = 30.0
"""Seconds one slice of a line (``WRITE_SLICE``) may take to be written: a client that reads
nothing for that long has broken its output (the daemon's ``WRITE_WAIT``, the same bound for
the same client)."""
WRITE_SLICE = 64 * 1024
"""Bytes written under one ``WRITE_WAIT``: a pipe's buffer (Linux's default), so a slice is
taken as soon as the client has read what came before it."""
MIN_RATE = 64 * 1024
"""Bytes per second a line must be taken at, at least, beyond one ``write_wait``: a line of n
bytes has ``write_wait + n / MIN_RATE`` seconds in all (``_send_slices``) -- a slice every
29 s held a 100 MiB line (and every answer behind it) about 13 hours; now 27 minutes at most."""
REFUSALS = 8
"""Refusals the reader hands to their writer (``_write_refusals``) and not yet written, at
most: the reader never writes -- a refusal waiting for the write lock, held by a long answer to
a client not reading now, stopped the reader and a cancel behind it was not read.  Past this
(or ``REFUSAL_BYTES``) the reader waits for room: only then does it stop reading -- a client
that sends faster than it reads is still held back by its own pipe, and no refusal is dropped
(a client whose request goes unanswered waits for ever): at the input's end the reader waits
until those queued are written (or the output breaks) before the server hears of it."""
REFUSAL_BYTES = 1024 * 1024
"""Bytes of those refusals at most (one longer alone: an id may be long)."""


class Outcome:
    """Whether one expected answer was written; ``wait`` returns the verdict."""

    __slots__ = ("_done", "cancelled", "written")

    def __init__(self) -> None:
        self._done = trio.Event()
        self.written = False
        self.cancelled = False
        """The client cancelled the request (``notifications/cancelled``): MCP forbids its
        answer, so an unwritten one is no sign the client is gone."""

    def settle(self, written: bool) -> None:
        if not self._done.is_set():
            self.written = written
            self._done.set()

    @property
    def settled(self) -> bool:
        return self._done.is_set()

    async def wait(self) -> bool:
        await self._done.wait()
        return self.written


class _Request:
    """A request read and not yet settled; ``outcome`` once the server expects its answer."""

    __slots__ = ("cancelled", "outcome", "size")

    def __init__(self, size: int) -> None:
        self.outcome: Outcome | None = None
        self.size = size
        """Bytes of its line: what holding it open costs (``OPEN_BYTES``)."""
        self.cancelled = False
        """The client cancelled it (``notifications/cancelled``): it is never answered."""

    def cancel(self) -> None:
        self.cancelled = True
        if self.outcome is not None:
            self.outcome.cancelled = True


class StdioTransport:
    def __init__(self, reader: trio.abc.ReceiveStream, writer: trio.abc.SendStream) -> None:
        self._reader = reader
        self._writer = writer
        self._writing = trio.Lock()
        self._open: dict[Any, _Request] = {}
        """Requests in flight by id (as the SDK correlates them: "7" is 7), until answered or
        settled unanswered."""
        self.hung_up = trio.Event()
        """The input ended or the output broke: the client is gone.  (Answers are still written
        after the input's end, while the server runs: a client may close stdin and read on.)"""
        self.broken = False
        self._closed = False
        """The streams are closed (``streams``): nothing more is written."""
        self.max_line = MAX_LINE
        """A longer message is read past and dropped, never held: memory stays bounded."""
        self.faults = 0
        """Protocol faults seen: malformed, oversized, or a duplicate request id."""
        self.max_open = OPEN_MARGIN
        """Requests open at once at most: ``OPEN_MARGIN`` until the server says how many calls
        it runs (``limit_open``)."""
        self.open_requests = 0
        """Requests open now: read, and not yet settled (each counted by ``_room``, uncounted
        by ``_settled``); past a bound, one more is answered OVERLOADED (``_overloaded``)."""
        self.open_bytes = 0
        """The bytes of their lines."""
        self.max_open_bytes = OPEN_BYTES
        self._reading = trio.CancelScope()
        """The reader's: cancelled when the output breaks, which ends the session."""
        self.write_wait = WRITE_WAIT
        self._refusals_in, self._refusals = trio.open_memory_channel[bytes](REFUSALS)
        self.refusal_bytes = 0
        """Bytes of the refusals queued and not yet written (or found unwritable)."""
        self._refusal_room = trio.Event()
        """Set (and replaced) each time a refusal leaves the queue."""

    def limit_open(self, max_calls: int) -> None:
        """At most ``max_calls`` plus ``OPEN_MARGIN`` requests open at once (the module
        docstring)."""
        self.max_open = max_calls + OPEN_MARGIN

    def limit_actions(self, max_action_bytes: int) -> None:
        """Messages may be as large as the largest action the targets accept, and no larger."""
        self.max_line = max_action_bytes + ENVELOPE

    @classmethod
    @contextlib.asynccontextmanager
    async def claim(cls) -> AsyncIterator[StdioTransport]:
        """The process's stdin and stdout, moved off fd 0 and 1 while serving."""
        wire_in, wire_out = os.dup(0), os.dup(1)
        saved_in, saved_out = os.dup(0), os.dup(1)
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            os.dup2(null, 0)
            os.dup2(2, 1)
        finally:
            os.close(null)
        reader, writer = trio.lowlevel.FdStream(wire_in), trio.lowlevel.FdStream(wire_out)
        try:
            yield cls(reader, writer)
        finally:
            with trio.CancelScope(shield=True):
                for stream in (reader, writer):
                    with contextlib.suppress(OSError, trio.BrokenResourceError):
                        await stream.aclose()
            os.dup2(saved_in, 0)
            os.dup2(saved_out, 1)
            os.close(saved_in)
            os.close(saved_out)

    def expect(self, request_id: Any) -> Outcome:
        """Watch for the answer to ``request_id`` (a request in flight, read here); settled once
        it is written or cannot be.  Settled not written at once when nothing here could see its
        answer written: the output is broken or closed, or no such request is in flight."""
        outcome = Outcome()
        request = self._open.get(coerce_request_id(request_id))
        if request is None or request.outcome is not None or self.broken or self._closed:
            outcome.settle(False)
        else:
            request.outcome = outcome
            outcome.cancelled = request.cancelled
        return outcome

    @staticmethod
    def forget(outcome: Outcome) -> None:
        """The server stopped waiting for the answer (cancelled): whatever it writes for the
        request now -- an error, if anything -- is not this answer.  Not written."""
        outcome.settle(False)

    def _hang_up(self) -> None:
        """Nothing more is written: every answer not written yet never will be."""
        self.hung_up.set()
        self._reading.cancel()  # (a no-op once the input ended)
        for request in self._open.values():
            if request.outcome is not None:
                request.outcome.settle(False)

    async def _unanswered(self, key: Any, request: _Request) -> None:
        """The SDK settled the request without writing anything (a cancel, or the SDK's own
        drop of it)."""
        if self._open.get(key) is request:
            del self._open[key]
            self._settled(request)
        # Not marked cancelled: only a ``notifications/cancelled`` is (``_cancelled``); an
        # answer the SDK dropped for another reason is no cancel of the client's.
        if request.outcome is not None:
            request.outcome.settle(False)

    @contextlib.asynccontextmanager
    async def streams(
        self,
    ) -> AsyncIterator[
        tuple[
            MemoryObjectReceiveStream[SessionMessage | Exception],
            MemoryObjectSendStream[SessionMessage],
        ]
    ]:
        """The stream pair ``Server.run`` takes, pumped to and from stdio while open."""
        to_server, from_stdin = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        to_stdout, from_server = anyio.create_memory_object_stream[SessionMessage](0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read, to_server)
            nursery.start_soon(self._write, from_server)
            nursery.start_soon(self._write_refusals)
            try:
                yield from_stdin, to_stdout
            finally:
                # Nothing more is written; a line under way is cut (its answer settled not
                # written by ``_write``): the stop's bound has no wait for answers.
                self._closed = True
                nursery.cancel_scope.cancel()
                self._hang_up()

    async def _read(self, out: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
        async with out:
            with self._reading:
                try:
                    await self._lines(out)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    pass
                # The server's run ends once it hears of the input's end, and the streams
                # close then: the refusals queued go out first (REFUSALS: none is dropped),
                # each write bounded by its own deadline.  A broken output ends the wait.
                while self.refusal_bytes and not self.broken:
                    await self._refusal_room.wait()
        if self._reading.cancelled_caught:
            log.info("stdin is read no further: the output is broken")
        else:
            # Not settled yet: answers handed over still go out, each recorded as it went.
            log.info("the client closed its end")
        self.hung_up.set()

    async def _lines(self, out: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
        """Read stdin to its end, taking each line in turn."""
        buffer = bytearray()
        dropping = False
        while True:
            data = await self._reader.receive_some(65536)
            if not data:
                # A last line with no newline before the end of input is a line all the
                # same (as the SDK reads it), never dropped in silence; the tail of an
                # oversized one was answered with it.
                if not dropping and buffer.strip():
                    await self._take(_cut(buffer, 0, len(buffer)), out)
                return
            searched = len(buffer)  # held no newline: searched again per read, a
            buffer += data  # 64 MiB line took 1,024 searches, 2.95 s of the loop
            start = 0  # lines found by offset: one copy of the rest, not one per line
            while (end := _newline(buffer, searched)) >= 0:
                if dropping:
                    dropping = False  # the end of the oversized message
                elif end - start > self.max_line:
                    # Over the bound whatever the reads it came in: never cut or parsed.
                    await self._oversized()
                else:
                    line = _cut(buffer, start, end)
                    if line.strip():
                        await self._take(line, out)
                start = searched = end + 1
            del buffer[:start]
            if len(buffer) > self.max_line:
                if not dropping:
                    await self._oversized()
                dropping = True
                buffer.clear()

    async def _oversized(self) -> None:
        """Answer a line over ``max_line`` bytes, as JSON-RPC answers what it cannot read: its
        id unread."""
        what = f"a message over {self.max_line} bytes: dropped unread"
        await self._fault(INVALID_REQUEST, None, what)

    async def _take(
        self, line: bytes, out: MemoryObjectSendStream[SessionMessage | Exception]
    ) -> None:
        """Pass one line to the server, or answer it here: malformed, or a duplicate id."""
        if len(line) > OFF_LOOP:  # abandoned if cancelled: it only reads bytes of its own
            read = await trio.to_thread.run_sync(_read_line, line, abandon_on_cancel=True)
        else:
            read = _read_line(line)
        if isinstance(read, str):
            self._note(read)
            return
        if isinstance(read, tuple):
            await self._refuse(*read)
            return
        message = read
        if not isinstance(message, types.JSONRPCRequest):
            self._cancelled(message)
            await out.send(SessionMessage(message))
            return
        key = coerce_request_id(message.id)
        if key in self._open:
            await self._refuse(INVALID_REQUEST, message.id, "a second request")
            return
        request = _Request(len(line))
        if not self._room(request):
            await self._overloaded(message.id)
            return
        self._open[key] = request
        settled = partial(self._unanswered, key, request)
        await out.send(
            SessionMessage(message, ServerMessageMetadata(on_request_unanswered=settled))
        )

    def _cancelled(self, message: Any) -> None:
        """Mark the request in flight a ``notifications/cancelled`` names: it is never answered
        (MCP), which a reuse of its id is told (``_refuse``) and its log line says."""
        if not isinstance(message, types.JSONRPCNotification):
            return
        if message.method != "notifications/cancelled" or not isinstance(message.params, dict):
            return
        named = message.params.get("requestId")
        if isinstance(named, (str, int)) and not isinstance(named, bool):
            request = self._open.get(coerce_request_id(named))
            if request is not None:
                request.cancel()

    def _room(self, request: _Request) -> bool:
        """Count ``request`` open, if there is room: fewer than ``max_open`` requests are, and
        their lines and its own stay within ``max_open_bytes`` (one alone is let in: a message
        may be as long as ``max_line``)."""
        if self.open_requests >= self.max_open or (
            self.open_requests and self.open_bytes + request.size > self.max_open_bytes
        ):
            return False
        self.open_requests += 1
        self.open_bytes += request.size
        return True

    async def _overloaded(self, request_id: Any) -> None:
        """Answer a request past the bounds at once, nothing run: the reader never waits for
        room, so a cancel or a response behind it is still read.  Its line is dropped here."""
        what = (
            f"OVERLOADED: {self.open_requests} requests ({self.open_bytes} bytes) are open; "
            f"send it again in {OPEN_RETRY} s (nothing was run)"
        )
        overloaded = {
            "code": "OVERLOADED",
            "message": what,
            "outcome": "not_attempted",
            "retry": "backoff",
            "retry_after": OPEN_RETRY,
        }
        await self._fault(OVERLOADED, request_id, what, {"api_error": overloaded})

    def _settled(self, request: _Request) -> None:
        """``request`` is no longer open (counted by ``_room``)."""
        self.open_requests -= 1
        self.open_bytes -= request.size

    async def _refuse(self, code: int, request_id: Any, what: str) -> None:
        """Answer a request the server never sees.  Under an id still in flight the error
        carries that id, so a client may take it for the first request's answer: it then says
        that one runs on, and that its answer is still to come -- never that it failed."""
        request = None if request_id is None else self._open.get(coerce_request_id(request_id))
        if request is not None and request.cancelled:
            what = (
                f"request id {shown_id(request_id)} was cancelled by the client and is still "
                f"being settled: this one ({what}) was refused and nothing ran for it; the "
                "cancelled one is never answered -- send it again under another id"
            )
        elif request is not None:
            what = (
                f"request id {shown_id(request_id)} is already in flight: this one ({what}) was "
                "refused and nothing ran for it; the first one runs on and is answered under "
                "the same id"
            )
        await self._fault(code, request_id, what)

    async def _fault(
        self, code: int, request_id: Any, what: str, data: dict[str, Any] | None = None
    ) -> None:
        """Answer a message the server never sees with a JSON-RPC error."""
        self._note(f"{what} (answered {code})")
        body: dict[str, Any] = {"code": code, "message": what}
        if data is not None:
            body["data"] = data
        error = {"jsonrpc": "2.0", "id": request_id, "error": body}
        answer = (json.dumps(error) + "\n").encode("ascii")
        # Handed to ``_write_refusals``, never written here: the reader waits only for room.
        while self.refusal_bytes and self.refusal_bytes + len(answer) > REFUSAL_BYTES:
            await self._refusal_room.wait()
        self.refusal_bytes += len(answer)
        await self._refusals_in.send(answer)

    async def _write_refusals(self) -> None:
        """Write the refusals the reader queued (``_fault``), in turn with the server's
        answers."""
        async for data in self._refusals:
            try:
                await self._send(data)
            finally:
                self.refusal_bytes -= len(data)
                self._refusal_room.set()
                self._refusal_room = trio.Event()

    def _note(self, what: str) -> None:
        self.faults += 1
        if self.faults <= FAULT_LOG_FIRST:
            log.warning("protocol fault: %s", what)
            if self.faults == FAULT_LOG_FIRST:
                log.warning("further protocol faults are logged one line per %d", FAULT_LOG_EVERY)
        elif self.faults % FAULT_LOG_EVERY == 0:
            log.warning("%d protocol faults so far; the latest: %s", self.faults, what)

    async def _send(self, data: bytes) -> bool:
        """Write ``data`` whole; False if the output is (or now is) broken."""
        async with self._writing:
            if self.broken or self._closed:
                return False
            try:
                late = await self._send_slices(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                self.broken = True
                log.info("stdout is closed: the client is gone")
                self._hang_up()
                return False
            except BaseException:
                # Cancelled part-way: how much of the line left is unknown.
                self.broken = True
                raise
            if late:  # part of the line may be out: nothing can follow it
                self.broken = True
                log.warning(
                    "a line of %d bytes was not taken in time (%d bytes within %gs, all at "
                    "%d bytes/s at least): the client reads no more; ending the session",
                    len(data),
                    WRITE_SLICE,
                    self.write_wait,
                    MIN_RATE,
                )
                self._hang_up()
                return False
            return True

    async def _send_slices(self, data: bytes) -> bool:
        """Write ``data`` in slices of ``WRITE_SLICE`` bytes, each within ``write_wait``, the
        whole within ``write_wait`` plus its length at ``MIN_RATE``: True if either was not met
        (then part of the line may be out).  The tight deadline is each slice's -- a 100 MiB
        ``fetch_result`` line to a client reading a steady 4 MB/s takes 25 s and more; a
        client that takes nothing is still cut after ``write_wait`` (as the daemon bounds each
        part of an answer, ``h11server.py``)."""
        view = memoryview(data)  # (slices, not copies; a stream may keep one it was given)
        with trio.move_on_after(self.write_wait + len(data) / MIN_RATE) as whole:
            for start in range(0, len(view), WRITE_SLICE):
                with trio.move_on_after(self.write_wait) as late:
                    await self._writer.send_all(view[start : start + WRITE_SLICE])
                if late.cancelled_caught:
                    return True
        return whole.cancelled_caught

    async def _write(self, source: MemoryObjectReceiveStream[SessionMessage]) -> None:
        async with source:
            async for item in source:
                message = item.message
                request = None
                if (
                    isinstance(message, types.JSONRPCResponse | types.JSONRPCError)
                    and message.id is not None
                ):
                    request = self._open.pop(coerce_request_id(message.id), None)
                outcome = request.outcome if request is not None else None
                line = message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                written = False
                try:
                    written = await self._send(line.encode("utf-8"))
                finally:
                    if outcome is not None:
                        outcome.settle(written)
                    if request is not None:
                        self._settled(request)


def _newline(buffer: bytearray, start: int) -> int:
    """Where the first newline at or after ``start`` is, or -1."""
    return buffer.find(b"\n", start)


def _cut(buffer: bytearray, start: int, end: int) -> bytes:
    """``buffer[start:end]`` as bytes, copied once: ``bytes(buffer[start:end])`` made a
    bytearray first, a second transient copy of a line of up to ``max_line`` bytes."""
    with memoryview(buffer) as view:
        return bytes(view[start:end])


class _Huge:
    """An integer longer than ``MAX_DIGITS``."""


class _Unread:
    """An id of an oversized message whose JSON text is no value of at most ``ID_TEXT``
    characters (``_too_large``): not decoded further."""


class _NotNumber:
    """``NaN``, ``Infinity`` or ``-Infinity`` where a value stands: not JSON, though the SDK's
    parser takes it (``_ambiguous`` refuses it then) -- read on, so that a line refused for
    another fault too still has its id read."""

    def __init__(self, name: str) -> None:
        self.what = f"holds {name}, which is not a JSON number"


def _int(digits: str) -> Any:
    return _Huge if len(digits) > MAX_DIGITS else int(digits)


SHOWN_ID = 40
"""Characters of a request id (as JSON) quoted whole in a message or a log line."""
SHOWN_PATH = 200
"""Characters of a field's path quoted whole (a duplicate field's, ``_ambiguous``)."""
SHOWN_LOG = 2000
"""Characters of an SDK log record's message written whole (``BoundedLog``)."""


def bounded(text: str, limit: int, what: str, keep: int = 0) -> str:
    """``text`` whole when at most ``limit`` characters, else its first ``keep`` ones, its
    length and a short hash: a client chooses what it sends (up to the message limit, MiBs) --
    echoed whole per line it would write MiBs of log per request, and a cut alone would not
    tell two apart."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    head = f"{text[:keep]}... " if keep else ""
    return f"{head}<{what} of {len(text)} characters, sha256 {digest}>"


def shown_id(request_id: Any) -> str:
    """A client's request id as a message or a log line quotes it: as JSON (escaped, ASCII)
    when at most ``SHOWN_ID`` characters, else its length and a short hash (``bounded``)."""
    return bounded(json.dumps(request_id), SHOWN_ID, "an id")


class BoundedLog(logging.Filter):
    """Bounds the message of each record of the MCP SDK's loggers (``mcp.*``), which quote a
    client's request id whole (``%r``: "shutdown error response for request ...", at
    WARNING): ``SHOWN_LOG`` characters, else its start, length and hash (``bounded``).  A
    handler's filter -- a logger's would not see its children's records."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "mcp" or record.name.startswith("mcp."):
            message = record.getMessage()
            if len(message) > SHOWN_LOG:
                record.msg, record.args = bounded(message, SHOWN_LOG, "a message", 200), None
        return True


def _id_fault(value: Any) -> str | None:
    """What makes ``value`` no request id (MCP: a string or an integer, never null); None if it
    is one.  Names the kind of value, never its text."""
    kind = "a string or an integer"
    if value is None:
        return f"its id is null: a request id is {kind}, never null"
    if isinstance(value, bool):
        return f"its id is a boolean: a request id is {kind}"
    if value is _Huge:
        return f"its id is a number longer than {MAX_DIGITS} digits"
    if value is _Unread:
        return f"its id is no JSON value of at most {ID_TEXT} characters"
    if isinstance(value, _NotNumber):
        return f"its id {value.what}: a request id is {kind}"
    if isinstance(value, int):
        return None
    if isinstance(value, float):
        return f"its id is a number with a fraction or an exponent: a request id is {kind}"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "its id holds a lone surrogate (\\ud800-\\udfff): not Unicode"
        return None
    if isinstance(value, dict):
        return f"its id is an object: a request id is {kind}"
    return f"its id is an array: a request id is {kind}"


def _read_line(line: bytes) -> types.JSONRPCMessage | tuple[int, Any, str] | str:
    """What ``line`` is, read by the parsers alone (no state of the transport's: a long line is
    read in a worker thread): a message for the server, the error that answers it here (code,
    id, what was wrong), or -- a notification or a response at fault, never answered -- what
    the log says of it."""
    # Bounded before any parser builds it: pydantic's and ours (``_ambiguous``) each read it.
    refused, fault = _over_bounds(line.decode("utf-8", "surrogateescape"))
    if refused:
        return fault if fault is not None else "an oversized notification or response: ignored"
    try:
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except Exception:
        return _diagnose(line) or "a malformed notification or response: ignored"
    if isinstance(message, types.JSONRPCNotification) and _has_id(line):
        # The parser reads a request whose id it cannot take (true, 1.5, null...) as a
        # notification, dropping the id: the client would wait for an answer forever.
        fault = _diagnose(line)
        if fault is not None:
            return fault
    if not isinstance(message, types.JSONRPCRequest):
        return message
    ambiguous = _ambiguous(line)
    if ambiguous is None:
        shape = _arguments_fault(message)
        return message if shape is None else (INVALID_PARAMS, message.id, shape)
    field, what = ambiguous
    if field == "message.id":  # which of its ids? neither: answered under null
        return INVALID_REQUEST, None, what
    in_params = field.startswith(("action", "message.params"))
    return (INVALID_PARAMS if in_params else INVALID_REQUEST), message.id, what


def _arguments_fault(message: types.JSONRPCRequest) -> str | None:
    """What is wrong with a ``tools/call`` request's shape: its ``name`` a string, its
    ``arguments``, when given, a JSON object (MCP; null reads as none given, as the SDK reads
    it); of any request, ``_meta`` an object and its ``progressToken`` a string or an integer.
    The SDK's own refusal of these (-32602 "Invalid request parameters") names no field; this
    one does, as every refusal here does."""
    params = message.params
    if not isinstance(params, dict):
        return None
    meta = params.get("_meta")
    if meta is not None and not isinstance(meta, dict):
        return f"INVALID_FIELD at params._meta: {_kind(meta)}, not a JSON object"
    if meta is not None and "progressToken" in meta and not _token(meta["progressToken"]):
        # (null too: the SDK refuses it with its bare -32602.)
        what = f"{_kind(meta['progressToken'])}, not a string or an integer"
        return f"INVALID_FIELD at params._meta.progressToken: {what}"
    if message.method != "tools/call":
        return None
    name = params.get("name")
    if name is None:
        return "MISSING_FIELD at params.name: a tools/call names its tool (tools/list)"
    if not isinstance(name, str):
        return f"INVALID_FIELD at params.name: {_kind(name)}, not a string"
    arguments = params.get("arguments")
    if arguments is None or isinstance(arguments, dict):
        return None
    return f"INVALID_FIELD at params.arguments: {_kind(arguments)}, not a JSON object"


def _token(value: Any) -> bool:
    """A progress token: a string or an integer -- a finite float with no fraction (5.0) is
    one (JSON has one number type; the SDK reads it as 5), as F5's integer arguments are."""
    if isinstance(value, float):
        return math.isfinite(value) and value.is_integer()
    return isinstance(value, (str, int)) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    """What kind of JSON value ``value`` is, in words (never its text)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "a number"


def _has_id(line: bytes) -> bool:
    """Whether the JSON object on ``line`` has an ``id`` member (escaped or not)."""
    try:
        found = json.loads(line.decode("utf-8", "surrogateescape"), parse_int=_int)
    except (ValueError, RecursionError):
        return False
    return isinstance(found, dict) and "id" in found


def _ambiguous(line: bytes) -> tuple[str, str] | None:
    """What makes a request the SDK's parser accepted mean two things: a field named twice in
    one object (pydantic keeps the last one, a proxy reading the first sees another action)
    or ``NaN``/``Infinity`` (not JSON): (the field's path, the fault in ``affidavit call``'s
    words).  Read again, strictly, for requests only -- the daemon and ``affidavit call`` read
    an action's JSON as strictly (``strict_json``); a tool's arguments are ``action``."""
    from affidavit import strictjson  # a leaf: the proxy loads no broker code

    try:
        # 1e400 read as infinity: the action's field refuses it at its own path (strict_json)
        strictjson.loads(line.decode("utf-8", "surrogateescape"), "message", finite=False)
    except strictjson.DuplicateField as exc:
        field = exc.path.replace("message.params.arguments", "action", 1)
        field = bounded(field, SHOWN_PATH, "a path", 64)  # nested ~200 deep: KBs per line
        return field, f"INVALID_FIELD at {field}: {exc.what}"
    except strictjson.NotJsonNumber as exc:
        return "message", f"INVALID_FIELD at message: {exc.what}"
    except (ValueError, RecursionError):
        pass  # the SDK's parser read it: its own reading stands
    return None


def _over_bounds(text: str) -> tuple[bool, tuple[int, Any, str] | None]:
    """Whether ``strictjson.prescan`` refuses the message, and if so the error that answers it
    (``_too_large``)."""
    try:
        strictjson.prescan(text, MAX_DEPTH, MAX_NODES)
    except strictjson.TooLarge as exc:
        return True, _too_large(text, exc)
    return False, None


_MEMBER_END = re.compile(r'[ \t\n\r]*+(?:\}|,[ \t\n\r]*+")')
"""What JSON has after a top-level member's value: the object's end, or the next name."""


def _too_large(text: str, exc: strictjson.TooLarge) -> tuple[int, Any, str] | None:
    """The error that answers a message ``strictjson.prescan`` refused, read without a parse
    (Python's recurses: past ~1000 levels a RecursionError, once answered under id null though
    the id was readable -- the client waited for ever): the id from its top-level members
    when they were read to the object's end (``Members.end`` ``closed``), the part at fault
    the member in whose value the scan passed its bound.  None for a notification."""
    scan = strictjson.members(text)
    if scan.end == "more":  # a second value after the object, or no end: as the small one
        return PARSE_ERROR, None, "not valid JSON"
    found = scan.found
    names = {name for name, _ in found}
    ids = [at for name, at in found if name == "id"]
    what = _passed(exc.deep, MAX_NODES)
    if len(ids) > 1:  # which of its ids? neither: under null, as a message in bounds
        return (
            INVALID_REQUEST,
            None,
            f"INVALID_FIELD at message.id: {strictjson.DuplicateField.what}",
        )
    if scan.end == "cut":
        # Its id may lie past the strings read -- or a second id, or a second value after the
        # object (the small one is then answered under null): answered, under null.
        if not ids:
            return (
                INVALID_REQUEST,
                None,
                f"{what}; no id in its first {strictjson.MEMBER_STRINGS} strings",
            )
        return (
            INVALID_REQUEST,
            None,
            f"{what}; read no further than its first {strictjson.MEMBER_STRINGS} strings, "
            "where another id or a second value may follow: answered under null",
        )
    if not ids:
        return None if "method" in names else (INVALID_REQUEST, None, "not a JSON-RPC request")
    # Decoded from its first ``ID_TEXT`` characters only: decoded whole, 32 Mi characters of
    # escapes held the GIL -- and the loop -- for 0.32 s in one call.
    window = text[ids[0] : ids[0] + ID_TEXT + 1]
    after: int | None = None
    try:
        value, end = json.JSONDecoder(parse_int=_int, parse_constant=_NotNumber).raw_decode(window)
    except RecursionError:
        value = []  # nested past the parser: answered under null
    except ValueError:
        if len(window) <= ID_TEXT:  # ``nul``: no JSON text, as the small one
            return PARSE_ERROR, None, "not valid JSON"
        value = _Unread  # broken, or longer: answered under null
    else:
        value, after = (_Unread, None) if end > ID_TEXT else (value, ids[0] + end)
    if after is not None and _MEMBER_END.match(text, after) is None:
        # ``5x``, ``5 6``, ``5,,``: the text breaks off right after the id -- no JSON text, as
        # the small one.  A break elsewhere goes unseen (``prescan`` skips commas and colons
        # unchecked, nothing is parsed): answered under the id read (docs/mcp.md).
        return PARSE_ERROR, None, "not valid JSON"
    request_id = value if _id_fault(value) is None else None
    # The part at fault: the member whose value holds where the scan passed its bound.
    where = next((name for name, at in reversed(found) if at <= exc.at), None)
    in_params = where == "params" and "method" in names
    own = _action_at_fault(text, found, exc) if in_params else None
    if own is not None:
        what = f"PAYLOAD_LIMIT at action: {own}"  # a tool's arguments are ``action``
    return (INVALID_PARAMS if in_params else INVALID_REQUEST), request_id, what


def _action_at_fault(
    text: str, found: list[tuple[str | None, int]], exc: strictjson.TooLarge
) -> str | None:
    """What makes the ``arguments`` of a ``tools/call`` request's ``params`` (read from its
    members, as ``_too_large`` reads them) refused on their own, when ``exc`` was passed in
    them: nested past the bound inside them, or -- counted alone -- nested past it, or holding
    more values than an action may (``strictjson.ACTION_NODES``): a count passed in them may
    be mostly the rest of the message's.  None when they are not at fault.  Answered with the
    code an action's limits have (``PAYLOAD_LIMIT``)."""
    values = dict((name, at) for name, at in found)  # one method, one params: else unparsed
    if len(values) != len(found) or "method" not in values or "params" not in values:
        return None
    # Read only to tell ``tools/call`` (an escaped one too): from its first ``MEMBER_NAME``
    # characters, as a member's name -- decoded whole, a method of 4 Mi characters of escapes
    # was one call holding the GIL, for a name that could not be ``tools/call``.
    window = text[values["method"] : values["method"] + strictjson.MEMBER_NAME + 1]
    try:
        method = json.JSONDecoder().raw_decode(window)[0]
    except (ValueError, RecursionError):  # longer, broken, or nested past the parser
        return None
    # Only members before the bound can hold it: the scan stops there (the text past it was
    # read once already, by ``_too_large``'s).
    inner = strictjson.members(text, values["params"], until=exc.at).found
    where = next(((name, start) for name, start in reversed(inner) if start <= exc.at), None)
    if method != "tools/call" or where is None or where[0] != "arguments":
        return None
    if exc.deep:
        return _passed(True, MAX_NODES)
    try:  # the arguments counted alone: at most about 3 * ACTION_NODES tokens (``prescan``)
        strictjson.prescan(text, MAX_DEPTH, strictjson.ACTION_NODES, where[1])
    except strictjson.TooLarge as alone:
        return _passed(alone.deep, strictjson.ACTION_NODES)
    return None


def _passed(deep: bool, nodes: int) -> str:
    """A bound ``prescan`` found passed, in the words of the answer: ``MAX_DEPTH``, or
    ``nodes`` values."""
    return f"nested deeper than {MAX_DEPTH} levels" if deep else f"more than {nodes} values"


def _diagnose(line: bytes) -> tuple[int, Any, str] | None:
    """The error that answers a line the SDK's parser refused, or read as a notification though
    it has an id: (code, id, what was wrong), the id when it can be read (else None); None for a
    notification or a response (no answer)."""
    try:
        text, utf8 = line.decode("utf-8"), True
    except UnicodeDecodeError:
        text, utf8 = line.decode("utf-8", "surrogateescape"), False
    try:
        found = json.loads(text, parse_int=_int, parse_constant=_NotNumber)
    except (ValueError, RecursionError):
        return PARSE_ERROR, None, "not valid JSON" if utf8 else "not valid UTF-8"
    if not isinstance(found, dict):
        return INVALID_REQUEST, None, "not a JSON-RPC message (a JSON object)"
    if "method" in found and "id" not in found:
        return None  # a notification
    if "method" not in found and ("result" in found or "error" in found):
        return None  # a response to a request of ours
    # An id makes it a request (JSON-RPC), answered under that id if it is one, else under null.
    id_fault = _id_fault(found["id"]) if "id" in found else None
    request_id = found["id"] if "id" in found and id_fault is None else None
    fault, where = (id_fault, "id") if id_fault is not None else _fault_in(found)
    if not utf8:
        fault = "the message is not valid UTF-8"
    if fault is None:
        return INVALID_REQUEST, request_id, f"not a valid JSON-RPC 2.0 request{_shape_fault(found)}"
    in_params = where == "params" and "method" in found
    return (INVALID_PARAMS if in_params else INVALID_REQUEST), request_id, fault


def _shape_fault(found: dict[str, Any]) -> str:
    """Which of a request's members has the wrong shape, as ``: ...`` (empty if none does)."""
    if found.get("jsonrpc") != "2.0":
        return ': jsonrpc is not "2.0"'
    if "method" not in found:
        return ": it has no method"
    if not isinstance(found["method"], str):
        return ": its method is not a string"
    if found.get("params") is not None and not isinstance(found["params"], dict):
        return ": its params member is not a JSON object"
    return ""


def _fault_in(found: dict[str, Any]) -> tuple[str | None, str | None]:
    """What the parser refused in ``found`` and under which top-level key; never its text."""
    stack: list[tuple[Any, int, str | None]] = [(found, 1, None)]
    while stack:
        value, depth, where = stack.pop()
        if depth > MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH} levels", where
        if value is _Huge:
            return f"a number longer than {MAX_DIGITS} digits", where
        if isinstance(value, _NotNumber):
            return f"INVALID_FIELD at message: {value.what}", None
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return "a string holds a lone surrogate (\\ud800-\\udfff): not Unicode", where
        elif isinstance(value, dict):
            for k, v in value.items():
                stack.append((k, depth, where or k))
                stack.append((v, depth + 1, where or k))
        elif isinstance(value, list):
            stack.extend((v, depth + 1, where) for v in value)
    return None, None
