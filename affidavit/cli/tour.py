"""The tour ``affidavit demo`` runs: a scripted HTTP server on 127.0.0.1 standing in for a
payments API (``DemoServer``), the throw-away config it is reached through (``demo_config``),
the scenes and their one-line explanations.  Apart from the command (``affidavit.cli.demo``)
because it needs trio and h11, which no other command's parser may pay for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import h11
import trio

__all__ = ["SCENES", "DemoServer", "demo_config", "explain", "run_demo"]


class DemoServer:
    """A tiny scripted HTTP/1.1 server (h11, server role) standing in for a payments API.

    ``/hello`` 200; ``/forbidden`` 403; ``/charge`` reads the request, then closes without an
    answer (the effect may have happened); ``/slow`` answers after 5 s; ``/payments`` honours an
    ``Idempotency-Key``: the first request with a key is applied and the connection dropped, a
    repeat with the same key returns the stored 201."""

    def __init__(self) -> None:
        self.port = 0
        self.applied: dict[str, int] = {}
        self.requests = 0

    async def serve(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request, body = await self._read_request(conn, stream)
                if request is None:
                    return
                self.requests += 1
                keep = await self._answer(conn, stream, request, body)
                if not keep or conn.our_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return
        finally:
            await stream.aclose()

    async def _read_request(
        self, conn: h11.Connection, stream: trio.SocketStream
    ) -> tuple[h11.Request | None, bytes]:
        request: h11.Request | None = None
        body = b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                if not data:
                    return None, b""
                conn.receive_data(data)
            elif isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return request, body
            elif isinstance(event, h11.ConnectionClosed):
                return None, b""

    async def _answer(
        self, conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, body: bytes
    ) -> bool:
        path = request.target.decode().split("?", 1)[0]
        headers = {k.decode().lower(): v.decode() for k, v in request.headers}
        if path == "/hello":
            return await self._send(conn, stream, 200, b'{"hello":"world"}')
        if path == "/forbidden":
            return await self._send(conn, stream, 403, b'{"error":"not allowed"}')
        if path == "/charge":
            return False  # read the whole request, then drop the connection: effect unknown
        if path == "/slow":
            await trio.sleep(5)
            return await self._send(conn, stream, 200, b'{"slow":"done"}')
        if path == "/payments":
            key = headers.get("idempotency-key", "")
            if key in self.applied:
                return await self._send(conn, stream, 201, b'{"payment":"pay_1","replayed":true}')
            self.applied[key] = len(self.applied) + 1
            return False  # applied, but the answer never leaves: the classic duplicate trap
        return await self._send(conn, stream, 404, b'{"error":"no such path"}')

    async def _send(
        self, conn: h11.Connection, stream: trio.SocketStream, status: int, body: bytes
    ) -> bool:
        headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
        data = conn.send(h11.Response(status_code=status, headers=headers))
        data += conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
        await stream.send_all(data)
        return True


def explain(envelope: dict[str, Any]) -> str:
    """One line on why the outcome is what the evidence says (for humans; never parsed)."""
    ev = envelope.get("evidence", {})
    err = envelope.get("error")
    if err is None:
        return "committed: a complete, authentic response was recorded before you saw it."
    outcome, retry = err["outcome"], err["retry"]
    if outcome == "not_attempted":
        return f"not_attempted: the journal proves nothing was dispatched; retry={retry}."
    if outcome == "rejected":
        return f"rejected: the server answered completely and refused; retry={retry}."
    if outcome == "committed":
        return f"committed: the server answered completely (not success); retry={retry}."
    sent = "the whole request was handed over" if ev.get("request_complete") else "dispatch began"
    if retry == "same_idempotency_key":
        how = "retrying with the same key is safe under the target's idempotency contract"
    elif retry == "backoff":
        how = "the operation is configured idempotent, so a new attempt is safe"
    else:
        how = "only reconciliation with the remote can tell whether it happened"
    return f"unknown: {sent} and no complete response was recorded; {how}."


def demo_config(tmp: Path, port: int) -> str:
    """The throw-away config `affidavit demo` writes: targets `api` and `payments` on a
    `DemoServer` at `port`, a journal in `tmp`, the token from `AFFIDAVIT_DEMO_TOKEN`."""
    return f"""# throw-away config written by `affidavit demo`
[journal]
path = "{tmp / "demo.db"}"

[targets.api]
kind = "http"
url = "http://127.0.0.1:{port}"
methods = ["GET", "POST"]
idempotent = ["GET"]
credential = "env:AFFIDAVIT_DEMO_TOKEN"
inject = "bearer"
timeout = {{ connect = 2, total = 10 }}

[targets.payments]
kind = "http"
url = "http://127.0.0.1:{port}"
methods = ["POST"]
idempotent = []
credential = "env:AFFIDAVIT_DEMO_TOKEN"
inject = "bearer"
timeout = {{ connect = 2, total = 10 }}
idempotency = {{ header = "Idempotency-Key", scope = "payments.create", retention = "24h" }}
"""


SCENES: list[tuple[str, dict[str, Any], float | None]] = [
    ("a success", {"target": "api", "method": "GET", "path": "/hello"}, None),
    ("a rejection", {"target": "api", "method": "GET", "path": "/forbidden"}, None),
    (
        "a connection dropped after dispatch",
        {"target": "api", "method": "POST", "path": "/charge", "body": '{"amount": 100}'},
        None,
    ),
    ("a caller timeout", {"target": "api", "method": "POST", "path": "/slow", "body": "{}"}, 0.5),
    (
        "a payment whose answer is lost",
        {
            "target": "payments",
            "method": "POST",
            "path": "/payments",
            "body": '{"amount": 100}',
            "idempotency_key": "demo-key-1",
        },
        None,
    ),
    (
        "the same payment retried with the same idempotency key",
        {
            "target": "payments",
            "method": "POST",
            "path": "/payments",
            "body": '{"amount": 100}',
            "idempotency_key": "demo-key-1",
        },
        None,
    ),
]


async def run_demo(
    tmp: Path, out: Any, *, as_json: bool = False, keep: bool = False
) -> list[dict[str, Any]]:
    """Run every scene against a fresh server; print and return the envelopes."""
    from affidavit.api.broker import Broker
    from affidavit.config import load_config
    from affidavit.config.sample import write_config

    server = DemoServer()
    envelopes: list[dict[str, Any]] = []
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve)
        cfg = tmp / "affidavit.toml"
        write_config(cfg, demo_config(tmp, port))
        async with Broker.open(config=load_config(cfg)) as broker:
            for n, (title, action, timeout) in enumerate(SCENES, 1):
                envelope = await broker.call(action, timeout=timeout)
                envelopes.append(envelope)
                if as_json:
                    out.write(json.dumps(envelope, sort_keys=True) + "\n")
                    continue
                out.write(f"\n[{n}] {title}: {action['method']} {action['path']}\n")
                out.write(_summary(envelope) + "\n")
                out.write("    why: " + explain(envelope) + "\n")
        nursery.cancel_scope.cancel()
    if not as_json:
        out.write(f"\nThe server applied {len(server.applied)} payment(s) for one key.\n")
        if keep:
            out.write(
                f"Journal kept at {tmp / 'demo.db'}: try "
                f"`affidavit actions --journal {tmp / 'demo.db'}`.\n"
            )
    return envelopes


def _summary(envelope: dict[str, Any]) -> str:
    ev = envelope["evidence"]
    err = envelope.get("error")
    head = f"    {envelope['invocation_id']}  "
    if err:
        head += f"{err['code']}  phase={err['phase']} outcome={err['outcome']} retry={err['retry']}"
    else:
        status = (envelope.get("result") or {}).get("status")
        head += f"ok  outcome={ev['outcome']} status={status}"
    attempts = len(ev.get("attempts", []))
    return head + f"  (dispatch_started={ev.get('dispatch_started')}, attempts={attempts})"
