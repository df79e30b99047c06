"""A fake daemon on a Unix socket that answers with raw bytes: what a buggy, stopped or hostile
daemon (another process of the daemon's user) may send its clients (audit 51e).

    with raw_daemon(tmp_path, lambda conn, n: conn.sendall(ANSWER)) as path:
        ...  # a client of ``path``

Each connection's request (head and ``content-length`` body) is read, then ``handle(conn, n)``
writes what it likes (``n``: the connection's number from 0); at most ``MOST`` connections,
each closed once its handler returned and the client closed it (``LINGER`` seconds without a
byte at most).  One connection at a time.
Same uid as the client, in a private directory: the client's socket checks pass."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

MOST = 8
LINGER = 5.0

Handler = Callable[[socket.socket, int], None]


def answer(body: bytes | dict[str, Any], *, status: int = 200, extra: bytes = b"") -> bytes:
    """An HTTP/1.1 answer framed by ``content-length`` (``extra``: more header lines)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n"
    return head % (status, len(data), extra) + data


def envelope(iid: str = "act_FAKE", **parts: Any) -> dict[str, Any]:
    """An envelope: ``result`` ``{"status": 200}`` unless ``parts`` give ``error``/``result``."""
    if "error" not in parts and "result" not in parts:
        parts["result"] = {"status": 200}
    return {"invocation_id": iid, "evidence": {}, **parts}


def read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    while len(body) < length and (chunk := conn.recv(65536)):
        body += chunk
    return head


@contextlib.contextmanager
def raw_daemon(tmp_path: Path, handle: Handler) -> Iterator[str]:
    where = tmp_path / "rawd"
    where.mkdir(mode=0o700)
    path = str(where / "s.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(MOST)
    server.settimeout(0.1)
    stop = threading.Event()
    heads: list[bytes] = []

    def serve() -> None:
        for n in range(MOST):
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                    break
                except TimeoutError:
                    continue
            else:
                return
            with conn:
                conn.settimeout(LINGER)
                with contextlib.suppress(OSError):
                    heads.append(read_request(conn))
                    handle(conn, n)
                    while not stop.is_set() and conn.recv(65536):
                        pass  # until the client closes, LINGER at most

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        stop.set()
        thread.join(LINGER + 1)
        server.close()
