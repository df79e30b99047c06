"""A real daemon for the fuzz tests (tests/daemon/test_fuzz_*.py, tests/mcp/test_fuzz.py,
tests/console/test_fuzz.py) and the raw client that checks its answers.

``fuzz_daemon`` runs ``affidavit serve`` with a canary credential (its target ``api`` a remote
that echoes the ``Authorization`` it got, ``ssh`` one nobody listens for), on a SQLite or a
PostgreSQL journal; ``exchange`` sends raw bytes on its socket and parses every answer back with
h11, failing on a connection still open after ``READ_WAIT``; ``check`` holds what every answer
must be.  Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h11

from tests.broker.helpers import TOKEN_ENV
from tests.broker.server_process import server_process

from .kit import PYTHON, WAIT, api_target, daemon_env, write_daemon_config

__all__ = [
    "CANARY",
    "ECHO_SERVER",
    "READ_WAIT",
    "Answer",
    "Daemon",
    "check",
    "exchange",
    "fuzz_daemon",
    "parse_answers",
]

CANARY = "canary-fuzz-" + "Q7x" * 8

ECHO_SERVER = r"""
import sys, trio
from tests.http.hostile import HostileServer, Reply, scripts

def reply(req):
    seen = req.header("authorization") or ""
    return Reply(200, headers=[("Content-Type", "text/plain")], body=f"saw {seen}".encode())

async def main():
    async with HostileServer.running(scripts.serve(reply)) as srv:
        print(srv.url, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)

trio.run(main)
"""

CODE = re.compile(r"[A-Z][A-Z0-9_]*")
IDEMPOTENCY = {"header": "Idempotency-Key", "scope": "fuzz", "retention": "24h"}
"""The target ``api`` honours a key: a caller's idempotency_key becomes a header."""
READ_WAIT = 15.0
"""Seconds an answer may take (a call to the local echo remote takes milliseconds)."""


@dataclass
class Daemon:
    socket: Path
    journal: Path
    log: Path
    proc: subprocess.Popen[bytes]
    journal_url: str | None = None
    """A PostgreSQL journal's URL (its password a canary too), else the SQLite ``journal``."""
    secrets: tuple[str, ...] = (CANARY,)
    _pg: Any = None
    """One autocommit connection for ``events`` (a connection per count costs more than the
    request it checks)."""

    def alive(self) -> None:
        assert self.proc.poll() is None, self.log.read_text(errors="replace")[-3000:]

    def log_is_clean(self) -> None:
        text = self.log.read_text(encoding="utf-8", errors="replace")
        assert "Traceback" not in text, text[-3000:]
        assert not any(secret in text for secret in self.secrets)
        assert "failed inside the daemon" not in text, text[-3000:]

    def events(self) -> int:
        """How many events the journal holds (read beside the daemon: WAL) -- but a delivery's:
        that one is recorded *after* its answer was written, so an earlier call's may land
        while a later request is being checked."""
        query = (
            "SELECT count(*) FROM events"
            " WHERE kind NOT IN ('RESULT_DELIVERED', 'RESULT_DELIVERY_FAILED')"
        )
        if self.journal_url is not None:
            import psycopg

            if self._pg is None:
                self._pg = psycopg.connect(self.journal_url, autocommit=True)
            row = self._pg.execute(query).fetchone()
            assert row is not None
            return int(row[0])
        if not self.journal.exists():
            return 0
        with sqlite3.connect(f"file:{self.journal}?mode=ro", uri=True, timeout=WAIT) as db:
            (n,) = db.execute(query).fetchone()
        return int(n)

    def holds_no_secret(self, data: bytes) -> None:
        for secret in self.secrets:
            assert secret.encode() not in data


def _ssh_target() -> dict[str, Any]:
    """An SSH target nobody listens for (connections are refused): its actions are checked, and
    the canary is its password."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    pin = (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH)
    )
    return {
        "kind": "ssh",
        "host": "127.0.0.1",
        "port": 9,
        "user": "fuzz",
        "host_key": pin.decode(),
        "auth": "password",
        "credential": f"env:{TOKEN_ENV}",
        "idempotent_commands": ["uptime"],
        "timeout": {"connect": 2, "total": 5},
    }


@contextlib.contextmanager
def fuzz_daemon(
    tmp: Path, *, journal_url: str | None = None, password: str = "", **service: Any
) -> Iterator[Daemon]:
    """``affidavit serve`` with the canary credential, its target ``api`` the echo remote, this
    uid an operator (more ``[service]`` settings: ``service``); its journal a SQLite file, or
    the PostgreSQL database at ``journal_url`` (whose ``password`` is a canary too); its log
    checked clean once it stopped."""
    journal = None
    if journal_url is not None:
        keys = {"key_file": str(tmp / "shared.key"), "signing_key": str(tmp / "signing.key")}
        journal = {"url": journal_url, **keys}
    with server_process(ECHO_SERVER) as (url, _):
        sock = tmp / "s.sock"
        config = write_daemon_config(
            tmp,
            {**api_target(url, idempotency=IDEMPOTENCY), "ssh": _ssh_target()},
            socket=sock,
            service={"operator_uids": [os.geteuid()], **service},
            journal=journal,
        )
        log = tmp / "daemon.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [PYTHON, "-m", "affidavit", "serve", "--config", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=daemon_env(CANARY),
            )
        secrets = (CANARY, password) if password else (CANARY,)
        d = Daemon(sock, tmp / "journal.db", log, proc, journal_url, secrets)
        try:
            deadline = time.monotonic() + WAIT
            while not _answers(sock):
                d.alive()
                assert time.monotonic() < deadline, "the daemon did not answer in time"
                time.sleep(0.05)
            yield d
        finally:
            if d._pg is not None:
                d._pg.close()
            proc.terminate()
            try:
                proc.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=WAIT)
    d.log_is_clean()


def _answers(sock: Path) -> bool:
    try:
        exchange(sock, b"GET /v1/health HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n")
    except OSError:
        return False
    return True


@dataclass
class Answer:
    status: int
    headers: dict[bytes, bytes]
    body: bytes


def exchange(
    sock: Path, data: bytes, *, half_close: bool = False, head: bool = False
) -> list[Answer]:
    """Send ``data``, read until the daemon closes (bounded by ``READ_WAIT``): every answer.
    A connection still open after that is a hung one -- a failure."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(READ_WAIT)
    raw = bytearray()
    try:
        s.connect(str(sock))
        try:
            s.sendall(data)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered and closed before all of it was read: allowed
        deadline = time.monotonic() + READ_WAIT
        while True:
            try:
                chunk = s.recv(1 << 16)
            except ConnectionResetError:
                break
            except TimeoutError:
                raise AssertionError(f"hung: no close within {READ_WAIT} s") from None
            if not chunk:
                break
            raw += chunk
            assert time.monotonic() < deadline, "hung: the answer never ended"
    finally:
        s.close()
    return parse_answers(bytes(raw), head=head)


def parse_answers(raw: bytes, *, head: bool = False) -> list[Answer]:
    """The answers in ``raw``; ``head``: the first answers a HEAD (no body follows)."""
    conn = h11.Connection(h11.CLIENT)
    answers: list[Answer] = []
    conn.receive_data(raw)
    conn.receive_data(b"")
    while True:
        # The client's side of h11 wants a request sent for each answer it parses.
        if answers and not conn.trailing_data[0]:
            return answers  # nothing more came
        if conn.our_state is h11.IDLE:
            method = "HEAD" if head and not answers else "GET"
            conn.send(h11.Request(method=method, target="/", headers=[("host", "a")]))
            conn.send(h11.EndOfMessage())
        head = conn.next_event()
        if head is h11.PAUSED or isinstance(head, h11.ConnectionClosed):
            return answers
        assert isinstance(head, h11.Response), (head, raw[:300])
        body = bytearray()
        while True:
            event = conn.next_event()
            if isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                raise AssertionError(f"a cut answer: {event!r} {raw[:300]!r}")
        answers.append(Answer(head.status_code, dict(head.headers), bytes(body)))
        if conn.their_state is not h11.DONE:
            return answers
        try:
            conn.start_next_cycle()
        except h11.LocalProtocolError:
            return answers


_PATH_FIELDS = frozenset({(404, "invocation_id"), (404, "name"), (422, "operation_id")})
"""The refusals that name a path parameter, not a body field, as the part to fix."""


def check(answer: Answer, route: str = "", *, head: bool = False) -> Any:
    """The invariants of one answer; its JSON when it is JSON (``head``: a HEAD's, no body)."""
    assert answer.status != 500 and answer.status < 600, (answer.status, answer.body[:400])
    assert CANARY.encode() not in answer.body
    assert all(CANARY.encode() not in v for v in answer.headers.values())
    kind = answer.headers.get(b"content-type", b"")
    if head:
        assert not answer.body
        return None
    if kind.startswith(b"text/plain") and answer.status == 200:
        return None  # the Prometheus metrics
    assert kind == b"application/json", (answer.status, kind, answer.body[:200])
    value = json.loads(answer.body)  # strict: the daemon never writes NaN
    if answer.status >= 400:
        assert set(value) == {"api_error"}, value
        error = value["api_error"]
        assert set(error) in ({"code", "message"}, {"code", "message", "field"}) or (
            # an action refused before it was journaled: the broker's code for it
            error["code"] == "BAD_JSON"
            and set(error) == {"code", "message", "field", "action_code"}
        ), value
        assert CODE.fullmatch(error["code"]), value
        assert CODE.fullmatch(error.get("action_code", "X")), value
        assert isinstance(error["message"], str) and error["message"], value
        assert "Traceback" not in error["message"]
        if "field" in error and answer.status != 400:
            # An id in the path that names nothing: a record's, a result's or a reconcile's
            # 404 NO_SUCH_INVOCATION, NO_SUCH_APPROVAL, a content's NO_SUCH_CONTENT (``name``),
            # a poll's 422 OPERATION_ERROR (docs/deployment.md) -- the path's own parameter.
            assert (answer.status, error["field"]) in _PATH_FIELDS, value
        elif "field" in error:  # the part to fix, named where the message starts
            assert isinstance(error["field"], str), value
            assert error["field"] and error["field"] in error["message"], value
    elif route == "/v1/calls" and answer.status == 200:
        assert isinstance(value.get("invocation_id"), str), value
        if "error" in value:
            err = value["error"]
            assert CODE.fullmatch(err["code"]) and isinstance(err["phase"], str), value
            if err["phase"] == "validation":
                assert isinstance(err.get("field"), str) and err["field"], value
    return value


# -- what a hostile caller sends -----------------------------------------------------------------
