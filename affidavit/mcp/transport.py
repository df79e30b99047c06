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
  input ended first (the client hung up), or the server settled the request without answering
  it (the client cancelled it: MCP forbids an answer then).

Stray output is kept off the wire: while serving, fd 0 reads /dev/null and fd 1 is stderr, and
the protocol runs on private duplicates (as the SDK's ``stdio_server`` does).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Hashable
from typing import Any

import anyio
import mcp_types as types
import trio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage

__all__ = ["MAX_LINE", "Outcome", "StdioTransport"]

log = logging.getLogger("affidavit.mcp")

MAX_LINE = 64 * 1024 * 1024
"""The longest message read until the catalog says how large an action may be
(``max_action_bytes``, the bound ``affidavit call`` and the daemon apply to an action's JSON)."""
ENVELOPE = 64 * 1024
"""Room for JSON-RPC's own fields around a tool's arguments."""


class Outcome:
    """Whether one expected answer was written; ``wait`` returns the verdict."""

    __slots__ = ("_done", "written")

    def __init__(self) -> None:
        self._done = trio.Event()
        self.written = False

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


class StdioTransport:
    def __init__(self, reader: trio.abc.ReceiveStream, writer: trio.abc.SendStream) -> None:
        self._reader = reader
        self._writer = writer
        self._expected: dict[Hashable, Outcome] = {}
        self.hung_up = trio.Event()
        """The input ended or the output broke: the client is gone."""
        self.broken = False
        self.max_line = MAX_LINE
        """A longer message is read past and dropped, never held: memory stays bounded."""

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

    def expect(self, request_id: Hashable) -> Outcome:
        """Watch for the answer to ``request_id``; settled once it is written or cannot be."""
        outcome = self._expected[request_id] = Outcome()
        if self.hung_up.is_set():
            outcome.settle(False)
        return outcome

    def forget(self, request_id: Hashable) -> None:
        """The request settled without an answer of ours (cancelled): not written."""
        outcome = self._expected.pop(request_id, None)
        if outcome is not None:
            outcome.settle(False)

    def _hang_up(self) -> None:
        self.hung_up.set()
        expected, self._expected = self._expected, {}
        for outcome in expected.values():
            outcome.settle(False)

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
            try:
                yield from_stdin, to_stdout
            finally:
                nursery.cancel_scope.cancel()
                self._hang_up()

    async def _read(self, out: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
        buffer = bytearray()
        dropping = False
        async with out:
            try:
                while True:
                    data = await self._reader.receive_some(65536)
                    if not data:
                        break
                    buffer += data
                    while (end := buffer.find(b"\n")) >= 0:
                        line, buffer = bytes(buffer[:end]), buffer[end + 1 :]
                        if dropping:
                            dropping = False  # the end of the oversized message
                        elif line.strip():
                            await out.send(_parse(line))
                    if len(buffer) > self.max_line:
                        if not dropping:
                            log.warning("a message over %d bytes: dropped unread", self.max_line)
                        dropping = True
                        buffer.clear()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
        log.info("the client closed its end")
        self._hang_up()

    async def _write(self, source: MemoryObjectReceiveStream[SessionMessage]) -> None:
        async with source:
            async for item in source:
                message = item.message
                answer_to = (
                    message.id
                    if isinstance(message, types.JSONRPCResponse | types.JSONRPCError)
                    else None
                )
                outcome = self._expected.pop(answer_to, None) if answer_to is not None else None
                line = message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                written = False
                if not self.broken:
                    try:
                        await self._writer.send_all(line.encode("utf-8"))
                        written = True
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        self.broken = True
                        log.info("stdout is closed: the client is gone")
                        self._hang_up()
                    except BaseException:
                        # Cancelled part-way: how much of the line left is unknown.
                        self.broken = True
                        if outcome is not None:
                            outcome.settle(False)
                        raise
                if outcome is not None:
                    outcome.settle(written)


def _parse(line: bytes) -> Any:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except Exception as exc:  # the dispatcher logs a malformed message and reads on
        return exc
