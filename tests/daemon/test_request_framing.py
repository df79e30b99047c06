"""A request the daemon cannot frame for sure is never dispatched: ``Transfer-Encoding`` in
HTTP/1.0 (RFC 9112 section 6.1: faulty framing) is 400 ``AMBIGUOUS_FRAMING``, a request line
of a version other than 1.0/1.1 is 505 ``HTTP_VERSION_UNSUPPORTED``, each before any route
runs, then the connection closes.  h11 read the chunked body of the first and took
``HTTP/2.0`` for 1.1, and the call was dispatched (audit 53)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import trio

from affidavit.journal import JournalReader

from .kit import WAIT, action_bytes, api_target, running_daemon

ACTION = action_bytes()
CHUNKED = b"%x\r\n%s\r\n0\r\n\r\n" % (len(ACTION), ACTION)


def _exchange(path: str, request: bytes) -> bytes:
    """``request`` sent whole over the daemon's socket; all it answers, until it closes."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(WAIT)
        s.connect(path)
        s.sendall(request)
        got = b""
        while data := s.recv(65536):
            got += data
        return got


@pytest.mark.parametrize(
    ("request_bytes", "status", "code", "field"),
    [
        (
            b"POST /v1/calls HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n" + CHUNKED,
            400,
            "AMBIGUOUS_FRAMING",
            "headers.transfer-encoding",
        ),
        (
            b"POST /v1/calls HTTP/2.0\r\nhost: a\r\ncontent-length: %d\r\n\r\n%s"
            % (len(ACTION), ACTION),
            505,
            "HTTP_VERSION_UNSUPPORTED",
            None,
        ),
        (
            b"POST /v1/calls HTTP/9.9\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n" + CHUNKED,
            505,
            "HTTP_VERSION_UNSUPPORTED",
            None,
        ),
    ],
    ids=["http10-chunked", "http20", "http99-chunked"],
)
async def test_an_unframeable_call_is_refused_and_never_journaled(
    tmp_path: Path, token: str, request_bytes: bytes, status: int, code: str, field: str | None
) -> None:
    async with running_daemon(tmp_path, api_target("http://127.0.0.1:9"), token=token) as d:
        # The pipelined request behind it would be a second call: neither runs.
        got = await trio.to_thread.run_sync(_exchange, str(d.socket), request_bytes + request_bytes)
        head, _, body = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 %d " % status), got
        assert b"connection: close" in head.lower(), got
        error = json.loads(body)["api_error"]
        assert (error["code"], error.get("field")) == (code, field), error
        # The same call framed right is dispatched and journaled: the check below can fail.
        proper = b"POST /v1/calls HTTP/1.1\r\nhost: a\r\nconnection: close\r\n"
        proper += b"content-length: %d\r\n\r\n%s" % (len(ACTION), ACTION)
        served = await trio.to_thread.run_sync(_exchange, str(d.socket), proper)
        assert b"invocation_id" in served, served
    with JournalReader.open(d.journal) as r:
        assert len(list(r.iter_actions())) == 1
