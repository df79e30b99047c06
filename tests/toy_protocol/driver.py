"""The toy protocol's trio driver, following the contract in ``adapters/base.py``: fire and
observe every step, call the gate immediately before the RUN line, stream OUT lines to the sink,
and end with a ``RemoteResult`` (only after END), ``SetupError`` (only before the gate) or
``AttemptInterrupted`` (after it)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import trio

from affidavit.adapters.base import AttemptContext, AttemptInterrupted, RemoteResult, SetupError
from affidavit.schema import Timeouts
from affidavit.statemachine import Code, Outcome

MAX_LINE = 4096
MAX_LINES = 10_000


@dataclass(frozen=True)
class ToyRequest:
    host: str
    port: int
    token: bytes = field(repr=False)
    line: bytes
    timeout: Timeouts


class Lines:
    """``\\n``-terminated lines from a stream; ``None`` at EOF (a partial line is dropped)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = b""

    async def next(self) -> bytes | None:
        while b"\n" not in self.buf:
            if len(self.buf) > MAX_LINE:
                raise ValueError("line too long")
            data = await self.stream.receive_some(MAX_LINE)
            if not data:
                return None
            self.buf += data
        line, _, self.buf = self.buf.partition(b"\n")
        return line


async def perform(req: ToyRequest, ctx: AttemptContext) -> RemoteResult:
    def fire(event: str, **facts: Any) -> None:
        ctx.observe(ctx.machine.fire(event), facts)

    try:
        with trio.fail_after(req.timeout.connect):
            stream = await trio.open_tcp_stream(req.host, req.port)
    except (OSError, trio.TooSlowError) as exc:
        fire("connect_failed")
        timed_out = isinstance(exc, trio.TooSlowError)
        code = Code.CONNECT_TIMEOUT if timed_out else Code.CONNECTION_REFUSED
        raise SetupError(code, "connect") from exc
    async with stream:
        fire("connected", peer=f"{req.host}:{req.port}")
        lines = Lines(stream)
        await _setup(req, lines, fire)
        # The dispatch boundary: DISPATCH_STARTED is durable before the RUN line is written.
        assert ctx.machine.crosses_dispatch("run")
        await ctx.gate({"line_sha256": hashlib.sha256(req.line).hexdigest()})
        fire("run")
        try:
            with trio.fail_after(req.timeout.total):
                await stream.send_all(b"RUN " + req.line + b"\n")
                return await _collect(lines, ctx, fire)
        except (trio.TooSlowError, trio.BrokenResourceError, OSError, ValueError) as exc:
            receiving = ctx.machine.state == "receiving"
            fire("close", reason=type(exc).__name__)
            code = Code.REMOTE_RESULT_INCOMPLETE if receiving else Code.REMOTE_OUTCOME_UNKNOWN
            raise AttemptInterrupted(code, "no END from the server") from exc


async def _setup(req: ToyRequest, lines: Lines, fire: Any) -> None:
    try:
        with trio.fail_after(req.timeout.connect):
            if await lines.next() != b"TOY 1":
                fire("close")
                raise SetupError(Code.SETUP_FAILED, "banner")
            fire("greeted")
            await lines.stream.send_all(b"AUTH " + req.token + b"\n")
            reply = await lines.next()
    except (trio.TooSlowError, trio.BrokenResourceError, OSError, ValueError) as exc:
        fire("close")
        raise SetupError(Code.SETUP_FAILED, "auth") from exc
    if reply != b"OK":
        fire("auth_denied")
        raise SetupError(Code.REMOTE_AUTH_FAILED, "auth")
    fire("auth_ok")


async def _collect(lines: Lines, ctx: AttemptContext, fire: Any) -> RemoteResult:
    for _ in range(MAX_LINES):
        line = await lines.next()
        if line is None:
            raise trio.BrokenResourceError("closed before END")
        verb, _, rest = line.partition(b" ")
        if verb == b"OUT":
            fire("out", bytes=len(rest))
            await ctx.sink("stdout", rest + b"\n")
        elif verb == b"END" and rest.isdigit():
            status = int(rest)
            fire("end", status=status)
            code = None if status == 0 else Code.REMOTE_COMMAND_FAILED
            return RemoteResult(Outcome.COMMITTED, code, {"status": status}, {"status": status})
        else:
            raise ValueError("not a toy result line")
    raise ValueError("too many result lines")
