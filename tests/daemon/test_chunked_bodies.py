"""Chunked request bodies cost what they are sent as (audit 50, item 1): each chunk is one h11
event whatever its size, so a body of 1-byte chunks (6 bytes each on the wire) stalled the
event loop for every other client.  Its framing now counts against the limits, its events are
decoded a bounded number at a time with the loop running between, and a body of many tiny
chunks is refused.  Counts and codes only: the latency is measured by
tests/benchmarks/tiny_chunks.py, never here."""

from __future__ import annotations

import json

import trio

from affidavit.daemon.admission import Server
from affidavit.daemon.h11server import BODY_EVENTS, FREE_CHUNKS, MIN_CHUNK
from affidavit.daemon.http import FREE_BODY, ApiProblem, Request

from .kit import WAIT
from .test_http import HEAD, Routes, serving

CHUNKED = b"POST /echo HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n"


def _chunks(size: int, count: int) -> bytes:
    return (b"%x\r\n" % size + b"c" * size + b"\r\n") * count + b"0\r\n\r\n"


def _error(body: bytes) -> dict[str, str]:
    return dict(json.loads(body)["api_error"])


async def test_a_body_of_tiny_chunks_is_400_chunks_too_small_then_closed() -> None:
    """Past ``FREE_CHUNKS`` chunks averaging under ``MIN_CHUNK`` bytes: the stable code and
    the field, the rest of the body unread, the connection closed -- before, the whole body
    was read (and 200)."""
    async with serving() as client:
        await client.send(CHUNKED + _chunks(1, FREE_CHUNKS + 200))
        status, headers, body = await client.answer()
        assert await client.closed()
    error = _error(body)
    assert (status, error["code"], error["field"], headers["connection"]) == (
        400,
        "CHUNKS_TOO_SMALL",
        "body",
        "close",
    )
    assert str(MIN_CHUNK) in error["message"]


async def test_many_chunks_of_a_fair_size_and_a_few_tiny_ones_pass() -> None:
    """The rule is on the average past ``FREE_CHUNKS``: a body in ``MIN_CHUNK``-byte chunks,
    or of ``FREE_CHUNKS`` 1-byte ones, is read whole and the connection kept."""
    for size, count in ((MIN_CHUNK, 2 * FREE_CHUNKS), (1, FREE_CHUNKS)):
        async with serving() as client:
            await client.send(CHUNKED + _chunks(size, count))
            status, _, body = await client.answer()
            assert (status, body) == (200, b"c" * size * count)
            await client.send(HEAD)
            assert (await client.answer())[::2] == (200, b"/v1/health")


class Limited(Routes):
    """``POST /echo`` with a body limit of ``LIMIT`` bytes."""

    LIMIT = 1000

    async def __call__(self, req: Request) -> None:
        if req.method != "POST":
            return await super().__call__(req)
        try:
            await req.respond(200, await req.body(self.LIMIT))
        except ApiProblem as problem:
            await req.respond_problem(problem)


async def test_the_body_limit_counts_the_chunk_framing() -> None:
    """4 chunks of 250 bytes are 1000 bytes decoded but 1029 sent (``fa\\r\\n``, ``\\r\\n``
    and the last ``0\\r\\n\\r\\n``): over a limit of 1000, 413 -- before, counted decoded,
    they passed.  The same bytes under a Content-Length pass."""
    async with serving(Limited()) as client:
        await client.send(CHUNKED + _chunks(250, 4))
        status, _, body = await client.answer()
    assert (status, _error(body)["code"]) == (413, "BODY_TOO_LARGE")
    async with serving(Limited()) as client:
        await client.send(b"POST /echo HTTP/1.1\r\nhost: a\r\ncontent-length: 1000\r\n\r\n")
        await client.send(b"c" * 1000)
        assert (await client.answer())[0] == 200


async def test_the_body_budget_counts_the_chunk_framing() -> None:
    """A body of 1000 chunks of 256 bytes: 256 000 bytes decoded, 263 005 sent.  A budget
    between the two (past ``FREE_BODY``) holds the decoded bytes but not the sent ones: 503
    ``BODIES_IN_FLIGHT`` -- before, counted decoded, it passed."""
    decoded, sent = 256 * 1000, 263 * 1000 + 5
    budget = (decoded + sent) // 2 - FREE_BODY
    server = Server(keep_alive=WAIT, head_wait=WAIT, body_budget=budget)
    async with serving(server=server) as client:
        await client.send(CHUNKED + _chunks(256, 1000))
        status, _, body = await client.answer()
    assert (status, _error(body)["code"]) == (503, "BODIES_IN_FLIGHT")
    assert server.bodies == 0  # let go at the answer


async def test_a_body_already_read_is_decoded_with_the_event_loop_turning_between() -> None:
    """``FREE_CHUNKS`` 1-byte chunks arrive in one read: decoded ``BODY_EVENTS`` h11 events at
    a time, another task runs between -- before, all of them in one go, the loop never
    turning (``ticks`` stayed 0)."""
    ticks = 0
    seen: list[int] = []

    class Counting(Routes):
        async def __call__(self, req: Request) -> None:
            before = ticks
            body = await req.body()
            seen.append(ticks - before)
            await req.respond(200, body)

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0)

    async with serving(Counting()) as client, trio.open_nursery() as nursery:
        nursery.start_soon(tick)
        await client.send(CHUNKED + _chunks(1, FREE_CHUNKS))
        status, _, body = await client.answer()
        nursery.cancel_scope.cancel()
    assert (status, len(body)) == (200, FREE_CHUNKS)
    assert seen[0] >= FREE_CHUNKS // BODY_EVENTS - 1, seen
