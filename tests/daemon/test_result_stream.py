"""A stored result's answer is written chunk by chunk (``affidavit/daemon/results.py``): the
daemon never holds a result whole, never reads it on the event loop, pages it on request, and
counts what its answers hold against one budget (503 ``ANSWERS_IN_FLIGHT`` past it).

The review's finding these tests hold down: one 150 MB fetch took the daemon to 502 MB and
stalled ``/v1/health`` 1.8 s; four at once, 1.79 GB and 6.1 s.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.client import Client
from affidavit.api.wire import MAX_RESULT_PAGE_CHUNKS
from affidavit.engine import RESULT_CHUNK
from affidavit.journal import ResultStream
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import Reply, scripts

from .kit import WAIT, ask, in_process, serving

TEXT = b"a" + "\u00e9".encode() * 100_000
"""Four chunks of UTF-8 text whose chunk boundaries cut a two-byte character in two."""
BINARY = os.urandom(3 * RESULT_CHUNK + 1000)
"""Bytes that are no UTF-8: base64, of a length no multiple of 3 (a group carried over)."""


async def _stored(socket: Path) -> str:
    async with Client.open(socket) as client:
        envelope = await client.call({"target": "api", "method": "GET", "path": "/r"})
    assert "error" not in envelope, envelope
    return str(envelope["invocation_id"])


def _compact(payload: bytes) -> dict[str, Any]:
    """The answer, checked to be the bytes ``respond_json`` writes for what it parses to."""
    value: dict[str, Any] = json.loads(payload)
    assert payload == json.dumps(value, separators=(",", ":")).encode() + b"\n"
    return value


def _bytes_of(result: dict[str, Any]) -> bytes:
    if "body" in result:
        return str(result["body"]).encode()
    return base64.b64decode(result["body_base64"])


@pytest.mark.parametrize(
    ("body", "key"), [(TEXT, "body"), (BINARY, "body_base64")], ids=["text", "binary"]
)
async def test_a_result_written_chunk_by_chunk_is_the_envelope_a_whole_one_is(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, body: bytes, key: str
) -> None:
    """Text cut mid-character at chunk boundaries stays text; bytes that are not UTF-8 are
    base64 carried across chunks; the answer is ``respond_json``'s bytes for that envelope."""
    monkeypatch.setenv(TOKEN_ENV, token)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=body))) as (_srv, socket):
        with trio.fail_after(WAIT):
            iid = await _stored(socket)
            status, headers, payload = await ask(socket, "GET", f"/v1/invocations/{iid}/result")
    assert status == 200 and int(headers["content-length"]) == len(payload)
    result = _compact(payload)["result"]
    assert key in result and _bytes_of(result) == body
    assert "resume" not in result


async def test_a_page_holds_its_chunks_and_names_where_the_next_starts(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    pages: list[dict[str, Any]] = []
    async with in_process(tmp_path, scripts.serve(Reply(200, body=TEXT))) as (_srv, socket):
        with trio.fail_after(WAIT):
            iid = await _stored(socket)
            path = f"/v1/invocations/{iid}/result"
            at: int | None = 0
            while at is not None and len(pages) < 8:  # four chunks: four pages of one
                status, _h, payload = await ask(socket, "GET", f"{path}?from_chunk={at}&chunks=1")
                assert status == 200, payload
                pages.append(_compact(payload)["result"])
                at = pages[-1]["resume"]["next_chunk"]
            # A default page from a chunk alone, and a page from chunk 0 for ``chunks`` alone.
            _s, _h, rest = await ask(socket, "GET", f"{path}?from_chunk=1")
            _s, _h, first = await ask(socket, "GET", f"{path}?chunks=2")
            refused = {
                value: await ask(socket, "GET", f"{path}?from_chunk=0&chunks={value}")
                for value in ("0", str(MAX_RESULT_PAGE_CHUNKS + 1), "x", "")
            }
    assert [p["resume"]["next_chunk"] for p in pages] == [1, 2, 3, None]
    assert [p["resume"]["from_chunk"] for p in pages] == [0, 1, 2, 3]
    assert b"".join(_bytes_of(p) for p in pages) == TEXT
    assert _bytes_of(json.loads(rest)["result"]) == TEXT[RESULT_CHUNK:]
    assert json.loads(rest)["result"]["resume"]["next_chunk"] is None
    head = json.loads(first)["result"]
    assert _bytes_of(head) == TEXT[: 2 * RESULT_CHUNK] and head["resume"]["next_chunk"] == 2
    for value, (status, _h, payload) in refused.items():
        error = json.loads(payload)["api_error"]
        assert (status, error["code"], error["field"]) == (400, "BAD_REQUEST", "chunks"), value
        assert f"from 1 to {MAX_RESULT_PAGE_CHUNKS}" in error["message"]


async def test_answers_past_the_budget_are_refused_answers_in_flight_not_held(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget of one answer: a client that does not read its answer holds it; a second
    fetch is refused 503 ``ANSWERS_IN_FLIGHT`` with ``Retry-After``, read once the first is
    gone.  (One uid's share is the whole budget here: this process is every client.)"""
    import functools

    from affidavit.daemon import results
    from affidavit.daemon import server as daemon_server
    from affidavit.daemon.admission import Server

    one = results.PIECE_HOLD + 64 * 1024
    budget = functools.partial(Server, answer_budget=one, answer_per_uid=one)
    monkeypatch.setattr(daemon_server, "Server", budget)
    monkeypatch.setenv(TOKEN_ENV, token)
    big = b"x" * (64 * RESULT_CHUNK)  # 4 MiB: more than the sockets' buffers take
    async with in_process(tmp_path, scripts.serve(Reply(200, body=big))) as (_srv, socket):
        with trio.fail_after(WAIT):
            iid = await _stored(socket)
            path = f"/v1/invocations/{iid}/result"
            stalled = await trio.open_unix_socket(str(socket))
            await stalled.send_all(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
            assert (await stalled.receive_some(4096)).startswith(b"HTTP/1.1 200")
            refused = await ask(socket, "GET", path)
            await stalled.aclose()
            while (again := await ask(socket, "GET", path))[0] == 503:
                await trio.sleep(0.05)  # the daemon sees the hang-up at its next write
    status, headers, payload = refused
    assert status == 503 and headers["retry-after"] == str(results.ANSWER_RETRY)
    assert json.loads(payload)["api_error"]["code"] == "ANSWERS_IN_FLIGHT"
    assert again[0] == 200 and _bytes_of(json.loads(again[2])["result"]) == big


def _peak_rss(pid: int) -> int:
    """The process's resident high-water mark (``VmHWM``), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


async def _drain(socket: Path, path: str) -> int:
    """Read a whole answer, keeping none of it: its body's length, checked against its
    ``Content-Length``."""
    stream = await trio.open_unix_socket(str(socket))
    async with stream:
        await stream.send_all(
            f"GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += await stream.receive_some(65536)
        top, _, got = head.partition(b"\r\n\r\n")
        n = len(got)
        while data := await stream.receive_some(1 << 20):
            n += len(data)
    length = next(ln for ln in top.split(b"\r\n") if ln.lower().startswith(b"content-length"))
    assert int(length.split(b":")[1]) == n
    return n


async def test_slow_readers_of_a_large_result_hold_little_and_health_answers_meanwhile(
    tmp_path: Path, token: str
) -> None:
    """A 48 MB result: four clients that stop reading their answers and two that read theirs
    whole add a few MiB to the daemon's peak memory (whole answers added three times the
    result each), and ``/v1/health`` from another client answers within a second all along
    (a liveness bound: the event loop stalled seconds)."""
    body = os.urandom(12 * 1024 * 1024).hex().encode() * 2  # 48 MiB of text
    async with serving(tmp_path, scripts.serve(Reply(200, body=body)), token=token) as (_, daemon):
        with trio.fail_after(4 * WAIT):
            iid = await _stored(daemon.socket)
            path = f"/v1/invocations/{iid}/result"
            before = _peak_rss(daemon.proc.pid)
            stalled = []
            for _ in range(4):
                stream = await trio.open_unix_socket(str(daemon.socket))
                await stream.send_all(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
                stalled.append(stream)
            sizes: list[int] = []
            waits: list[float] = []

            async def read_whole() -> None:
                sizes.append(await _drain(daemon.socket, path))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_whole)
                nursery.start_soon(read_whole)
                while len(sizes) < 2 and len(waits) < 2000:
                    start = trio.current_time()
                    status, _h, _p = await ask(daemon.socket, "GET", "/v1/health")
                    waits.append(trio.current_time() - start)
                    assert status == 200
                    await trio.sleep(0.02)
            for stream in stalled:  # each answer begun: its head is in the socket
                assert (await stream.receive_some(4096)).startswith(b"HTTP/1.1 200")
            grown = _peak_rss(daemon.proc.pid) - before
            for stream in stalled:
                await stream.aclose()
    assert sizes and all(n > len(body) for n in sizes)
    assert grown < 64 * 1024 * 1024, f"peak RSS grew {grown >> 20} MiB"
    assert len(waits) >= 3 and max(waits) < 1.0, f"health waited up to {max(waits):.2f} s"


async def test_a_fetch_cut_short_is_no_delivery_and_a_whole_one_is(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed, "Mark RESULT_DELIVERED only after the protocol has confirmed complete transfer":
    a stored result whose call's answer was never taken is fetched by a client that stops
    reading -- the streamed answer is cut after ``write_wait``, nothing recorded -- then by one
    that reads it: RESULT_DELIVERED (channel ``fetch``) once its last byte was written.  Nor is
    the result read whole (``ResultStream.read``) from the call on: not for the call's own
    failed delivery's envelope (it had the result in hand; read again, a race the first CI
    of stop 45 lost), nor for either fetch, the failed one's envelope too."""
    import functools

    from affidavit.daemon import server as daemon_server
    from affidavit.daemon.admission import Server

    monkeypatch.setattr(daemon_server, "Server", functools.partial(Server, write_wait=0.3))
    monkeypatch.setenv(TOKEN_ENV, token)
    reads: list[int] = []

    def whole_read(self: ResultStream, *args: Any) -> Any:
        reads.append(1)
        raise AssertionError("the daemon read a stored result whole")

    body = b"y" * 900_000  # inline in the call's answer, and more than a socket's buffers
    async with in_process(tmp_path, scripts.serve(Reply(200, body=body))) as (_srv, socket):
        monkeypatch.setattr(ResultStream, "read", whole_read)
        with trio.fail_after(WAIT):
            call = await trio.open_unix_socket(str(socket))
            sent = b'{"target":"api","method":"GET","path":"/r"}'
            await call.send_all(
                b"POST /v1/calls HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s"
                % (len(sent), sent)
            )  # and never read
            async with Client.open(socket) as client:
                while not (rows := (await client.actions())["actions"]) or rows[0]["state"] != (
                    "delivery_failed_committed"
                ):
                    await trio.sleep(0.05)
                iid = str(rows[0]["invocation_id"])
                path = f"/v1/invocations/{iid}/result"
                stalled = await trio.open_unix_socket(str(socket))
                await stalled.send_all(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
                unread = len(await stalled.receive_some(4096))  # the answer has begun
                await trio.sleep(1.0)  # past write_wait, not reading
                while data := await stalled.receive_some(1 << 20):  # the end: cut short
                    unread += len(data)
                cut = [e["kind"] for e in await client.events(iid)]
                fetched = await client.fetch_result(iid)
                whole = [e["kind"] for e in await client.events(iid)]
            await stalled.aclose()
            await call.aclose()
    assert reads == []  # neither answer, nor the failed one's envelope, held it whole
    assert cut[cut.index("RESULT_COMMITTED") :] == ["RESULT_COMMITTED", "RESULT_DELIVERY_FAILED"]
    assert 0 < unread < len(body)
    assert fetched is not None and fetched["result"]["body"] == body.decode()
    assert whole[whole.index("RESULT_COMMITTED") :] == [
        "RESULT_COMMITTED",
        "RESULT_DELIVERY_FAILED",
        "RESULT_DELIVERED",
    ]


@pytest.mark.parametrize("body", [TEXT, BINARY], ids=["text", "binary"])
async def test_the_client_reads_a_result_to_its_end_a_page_at_a_time(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, body: bytes
) -> None:
    """``Client.fetch_result(from_chunk=N)`` answers the streams from N to the end as
    ``Broker.fetch_result(from_chunk=N)`` does embedded: pages of one chunk here, put
    together -- the embedded result, key for key (text judged on the whole, not per page),
    from chunk 1 and from chunk 0 (where each stream's hash is checked too)."""
    from affidavit.api import client as client_module
    from affidavit.api.broker import Broker

    monkeypatch.setenv(TOKEN_ENV, token)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=body))) as (_srv, socket):
        with trio.fail_after(WAIT):
            iid = await _stored(socket)
            async with Client.open(socket) as client:
                page = await client.fetch_result(iid, from_chunk=1, chunks=1)
                monkeypatch.setattr(client_module, "MAX_RESULT_PAGE_CHUNKS", 1)
                merged = {n: await client.fetch_result(iid, from_chunk=n) for n in (0, 1)}
    # Embedded, once the daemon is gone: it owns the journal while it runs.
    async with Broker.open(tmp_path / "affidavit.toml") as broker:
        embedded = {n: await broker.fetch_result(iid, from_chunk=n) for n in (0, 1)}
    assert page is not None and page["result"]["resume"]["next_chunk"] == 2
    for n in (0, 1):
        got, want = merged[n], embedded[n]
        assert got is not None and want is not None
        assert list(got["result"]) == list(want["result"]), n
        assert got["result"] == want["result"], n
        assert _bytes_of(got["result"]) == body[n * RESULT_CHUNK :]


async def test_a_view_page_counts_against_the_answer_budget_while_it_is_written(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/v1/actions`` holds its page (up to 10000 records) until written: past the answer
    budget others fill it is 503 ``ANSWERS_IN_FLIGHT`` too, never one more page held; past
    what the budget could ever hold, 413 ``ANSWER_TOO_LARGE``."""
    from affidavit.daemon import server as daemon_server
    from affidavit.daemon.admission import Server

    made: list[Server] = []

    def make(*args: Any, **kwargs: Any) -> Server:
        made.append(Server(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(daemon_server, "Server", make)
    monkeypatch.setenv(TOKEN_ENV, token)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"ok"))) as (_srv, socket):
        with trio.fail_after(WAIT):
            await _stored(socket)  # its envelope is held in the budget too: stored first
            server = made[0]
            # two other uids' answers fill all but 200 bytes
            full = server.answer_shares.budget - 200
            for uid, n in ((os.geteuid() + 1, full // 2), (os.geteuid() + 2, full - full // 2)):
                assert server.hold_answer(n, uid, False) is None
            empty = await ask(socket, "GET", "/v1/actions?limit=0")
            status, headers, payload = await ask(socket, "GET", "/v1/actions")
            # less than one record's JSON, ever: not worth a retry
            server.answer_shares.budget = 200
            never = await ask(socket, "GET", "/v1/actions")
    assert empty[0] == 200
    assert status == 503 and headers["retry-after"] == "5"
    assert json.loads(payload)["api_error"]["code"] == "ANSWERS_IN_FLIGHT"
    assert (never[0], "retry-after" in never[1]) == (413, False)
    assert json.loads(never[2])["api_error"]["code"] == "ANSWER_TOO_LARGE"
