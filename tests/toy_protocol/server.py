"""A scripted toy server on loopback.  It checks the token, records every RUN line it acted on,
and answers as its script says: ``ok`` (echo the line, END 0), ``fail`` (END 3), ``vanish`` (act,
then close without a word) or ``echo-token`` (print the token back — a leak to redact)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial

import trio

from .driver import Lines


@dataclass
class ToyServer:
    token: bytes
    script: str = "ok"
    port: int = 0
    ran: list[bytes] = field(default_factory=list)

    async def serve(self, stream: trio.SocketStream) -> None:
        async with stream:
            with trio.move_on_after(10):
                lines = Lines(stream)
                await stream.send_all(b"TOY 1\n")
                if await lines.next() != b"AUTH " + self.token:
                    await stream.send_all(b"DENIED\n")
                    return
                await stream.send_all(b"OK\n")
                run = await lines.next()
                if run is None or not run.startswith(b"RUN "):
                    return
                self.ran.append(run[4:])
                if self.script == "vanish":
                    return
                out = self.token if self.script == "echo-token" else run[4:]
                end = b"END 3" if self.script == "fail" else b"END 0"
                await stream.send_all(b"OUT " + out + b"\n" + end + b"\n")


@asynccontextmanager
async def toy_server(token: bytes, script: str = "ok") -> AsyncIterator[ToyServer]:
    server = ToyServer(token, script)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, host="127.0.0.1"), server.serve, 0)
        server.port = listeners[0].socket.getsockname()[1]
        yield server
        nursery.cancel_scope.cancel()
