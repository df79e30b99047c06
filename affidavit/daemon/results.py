"""A stored result's answer, written chunk by chunk (``GET /v1/invocations/{id}/result``).

The envelope comes from the engine with each stream unread (``engine.Deferred``); nothing of a
stream is held whole, and nothing of it is read on the event loop.  Two passes, each a few
chunks per trip to one of the views' threads (``Api.read``, the journal's own reader):

1. ``_scan``: every chunk of the range read and verified (``ResultStream.chunks``) -- so a
   stored result that fails verification is answered RESULT_UNVERIFIED before a byte is
   written -- while it is decided whether the range is text (strict UTF-8, as
   ``result_payload`` decides it) or ``_base64``, and how long its JSON string is: the answer
   carries its ``Content-Length``, as every other;
2. ``_pieces``: read, verified and encoded again, ``PIECE_CHUNKS`` at a time, each piece
   written before the next is read.  The JSON is ``result_payload``'s, byte for byte: a string
   encoded piece by piece is the string encoded whole (a decoder carries a character cut
   between chunks over; base64 carries up to two bytes).

A stream stored before per-chunk hashes can only be verified whole, and each read of it
decrypts it whole: it is read once per answer instead (``_Plan.legacy``), its size held.

Memory: each answer holds ``PIECE_HOLD`` bytes of the server's answer budget
(``admission.ANSWER_BUDGET``), and its envelope's text beside them, taken in one hold before
its first chunk is read until its last byte is written -- past the budget, 503
``ANSWERS_IN_FLIGHT`` with ``Retry-After`` (``AnswersInFlight``: the engine's ``NotAnswered``,
so a refused fetch records no delivery failure): a client that does not read holds one piece,
not its result three times over.  Not held across the record's own journal reads (the
engine's, before ``respond_result``): a journal away would hold the budget for as long, and
turn its outage into ``ANSWERS_IN_FLIGHT`` for every other answer.  A piece is written
within ``WRITE_WAIT``; a reader slower than that loses its answer (cut short: never
delivered).
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import dataclasses
import functools
import hashlib
import json
import secrets
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from affidavit.engine import RESULT_CHUNK, Deferred, NotAnswered
from affidavit.journal import JournalReader, ResultStream, ResultUnverified

from .http import ApiProblem, Request, json_body

if TYPE_CHECKING:
    from .app import Api
    from .shares import Asker

__all__ = [
    "ANSWER_RETRY",
    "PARTS",
    "PIECE_CHUNKS",
    "PIECE_HOLD",
    "AnswersInFlight",
    "held",
    "respond_result",
]

PIECE_CHUNKS = 4
"""Chunks read, verified and encoded per trip to a view thread while an answer is written."""
SCAN_CHUNKS = 64
"""Chunks verified per trip in the first pass (4 MiB: a trip is short, the threads shared)."""
PIECE_HOLD = PIECE_CHUNKS * RESULT_CHUNK * 6 + 64 * 1024
"""What one answer holds of the answer budget from before it is read: a piece's worst case --
a JSON string escapes a byte into at most 6 (``\\u00XX``) -- and 64 KiB for what else is read
meanwhile; its envelope's text is held beside it (``respond_result``)."""
ANSWER_RETRY = 5
"""``Retry-After`` of a 503 ``ANSWERS_IN_FLIGHT``."""


class AnswersInFlight(ApiProblem, NotAnswered):
    """503 ``ANSWERS_IN_FLIGHT``: refused before a byte was read or written -- to the engine a
    ``NotAnswered`` (no delivery failed), to the client an API problem with ``Retry-After``.
    Also 413 ``ANSWER_TOO_LARGE`` (no ``Retry-After``): an answer no wait could let in."""


PARTS = "ask for less of it at once (a smaller limit=, or chunks=)"
"""How to read an answer too large to be held whole, unless the route says better."""


@contextlib.contextmanager
def held(req: Request, n: int, parts: str = PARTS) -> Iterator[None]:
    """Hold ``n`` bytes of the server's answer budget while the block runs; 503
    ``ANSWERS_IN_FLIGHT`` (nothing read, nothing written) when they do not fit in it, in the
    peer uid's share of it, or in the share of the peers who are not operators
    (``Server.hold_answer``).  When they could never fit (``Server.answer_most``), 413
    ``ANSWER_TOO_LARGE`` instead, without ``Retry-After``, its message saying how to read it
    in parts (``parts``): telling such a client to try again later would be a lie it believed
    forever (audit 50: a record grown by polls past its uid's share was 503 on every read)."""
    server, uid, other = req.server, req.peer.uid, req.other
    most = server.answer_most(other)
    if n > most:
        raise AnswersInFlight(
            413,
            "ANSWER_TOO_LARGE",
            f"the answer is {n} bytes, more than the daemon ever holds for one answer to this "
            f"peer ({most} bytes): asking again cannot help; {parts}",
        )
    full = server.hold_answer(n, uid, other)
    if full is not None:
        most, whose = {
            "all": (server.answer_shares.budget, "others fill it"),
            "uid": (server.answer_share(other), f"for uid {uid}, and its other answers fill it"),
            "others": (
                server.answer_shares.others,
                "for peers who are not operators, and theirs fill it",
            ),
        }[full]
        raise AnswersInFlight(
            503,
            "ANSWERS_IN_FLIGHT",
            f"the daemon holds {most} bytes of answers at most, at once, {whose}: nothing was "
            "read; try again later",
            retry_after=ANSWER_RETRY,
        )
    try:
        yield
    finally:
        server.drop_answer(n, uid, other)


@dataclass
class _Plan:
    """One deferred stream: as text or base64, and its JSON string's length (no quotes)."""

    deferred: Deferred
    text: bool = True
    length: int = 0
    size: int = 0
    decoder: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")())
    plain: Any = None
    """SHA-256 of the plaintext, when the range is the whole stream (checked at its end, as
    ``ResultStream.chunks`` checks a whole read)."""
    legacy: int | None = None
    """For a stream stored before per-chunk hashes (``StreamInfo.sealed`` None): the bytes
    reading it holds.  Each ``chunks`` call of such a stream decrypts and hashes it whole --
    read a few chunks a trip, the answer was quadratic in its size and each trip held it all
    -- so it is read once per answer (``whole``), that size held of the budget first."""
    whole: list[bytes] | None = None
    """That stream's chunks of the range, read and verified once (``_read_whole``)."""


def _opened(r: JournalReader, d: Deferred) -> ResultStream:
    """The stored result on a view's reader: the one the envelope was rendered from."""
    stream = r.result_stream(d.invocation_id)
    if stream is None or stream.sha256 != d.sha256:
        raise ResultUnverified(
            f"stored result of invocation {d.invocation_id} fails verification: it changed "
            "while its answer was read"
        )
    return stream


def _range(r: JournalReader, plan: _Plan, start: int, end: int) -> Iterable[bytes]:
    """The range's chunks ``start`` to ``end`` (excluded), each verified: read from the
    stored result on ``r`` -- or, for a stream from before per-chunk hashes, from the chunks
    read once (``whole``), the stored result still checked to be the one rendered."""
    d = plan.deferred
    stream = _opened(r, d)
    if plan.whole is not None:
        return plan.whole[start - d.from_chunk : end - d.from_chunk]
    return stream.chunks(d.name, start, end)


def _read_whole(r: JournalReader, plan: _Plan) -> list[bytes]:
    d = plan.deferred
    return list(_opened(r, d).chunks(d.name, d.from_chunk, d.to_chunk))  # one whole read


def _scan_some(r: JournalReader, plan: _Plan, start: int) -> int:
    d = plan.deferred
    info = _opened(r, d).streams[d.name]
    if info.sealed is None and plan.whole is None:
        # Its chunks, plus their join for the stream's hash (``ResultStream._legacy_stream``).
        plan.legacy = 2 * info.bytes
        return start  # read once ``_scan`` holds that much
    if start == d.from_chunk == 0 and d.to_chunk == info.chunks:
        plan.plain = hashlib.sha256()
    end = min(start + SCAN_CHUNKS, d.to_chunk)
    # Each chunk is verified by ``chunks``; a range of a few is no whole read, so the whole
    # stream's plaintext hash is checked here.
    for chunk in _range(r, plan, start, end):
        plan.size += len(chunk)
        if plan.plain is not None:
            plan.plain.update(chunk)
        if plan.text:
            try:
                plan.length += len(json.dumps(plan.decoder.decode(chunk))) - 2
            except UnicodeDecodeError:
                plan.text = False
    if end == d.to_chunk:
        if plan.plain is not None and plan.plain.hexdigest() != info.sha256:
            raise ResultUnverified(
                f"stored result of invocation {d.invocation_id} fails verification: stream "
                f"{d.name!r} is incomplete or altered (plaintext hash differs)"
            )
        if plan.text:
            try:
                plan.decoder.decode(b"", final=True)
            except UnicodeDecodeError:
                plan.text = False
        if not plan.text:
            plan.length = (plan.size + 2) // 3 * 4
    return end


async def _scan(api: Api, asker: Asker, d: Deferred, hold: Callable[[int], object]) -> _Plan:
    """The plan of ``d``'s answer; ``hold(n)``: hold ``n`` more bytes of the budget while the
    answer lasts (a stream from before per-chunk hashes, read whole), or ``AnswersInFlight``."""
    plan = _Plan(d)
    at = d.from_chunk
    while True:
        at = await api.read(functools.partial(_scan_some, plan=plan, start=at), asker)
        if plan.legacy is not None and plan.whole is None:
            hold(plan.legacy)
            plan.whole = await api.read(functools.partial(_read_whole, plan=plan), asker)
            continue
        if at >= d.to_chunk:
            plan.decoder = codecs.getincrementaldecoder("utf-8")()  # fresh for the writing
            return plan


async def _pieces(api: Api, asker: Asker, plan: _Plan) -> AsyncGenerator[bytes, None]:
    """The stream's JSON string (no quotes), a piece per trip; the same bytes the scan
    measured, or ``ResultUnverified``."""
    d, carry, sent = plan.deferred, b"", 0

    def piece(r: JournalReader, start: int) -> bytes:
        nonlocal carry
        end = min(start + PIECE_CHUNKS, d.to_chunk)
        data = b"".join(_range(r, plan, start, end))
        last = end == d.to_chunk
        if plan.text:
            return json.dumps(plan.decoder.decode(data, final=last))[1:-1].encode("ascii")
        data = carry + data
        cut = len(data) if last else len(data) // 3 * 3  # base64 of whole 3-byte groups
        carry = data[cut:]
        return base64.b64encode(data[:cut])

    for start in range(d.from_chunk, d.to_chunk, PIECE_CHUNKS):
        out = await api.read(functools.partial(piece, start=start), asker)
        sent += len(out)
        yield out
    if sent != plan.length:
        raise ResultUnverified(
            f"stored result of invocation {d.invocation_id} fails verification: stream "
            f"{d.name!r} read differently twice"
        )


def _shown(envelope: dict[str, Any], token: str, text: list[bool]) -> bytes:
    """The envelope's text with each ``Deferred`` stream a mark (``token`` and its index) under
    its key -- ``{key}_base64`` where ``text`` says it is not text."""
    result = envelope["result"]
    shown: dict[str, Any] = {}
    at = 0
    for key, value in result.items():
        if isinstance(value, Deferred):
            shown[key if text[at] else f"{key}_base64"] = f"{token}{at}"
            at += 1
        else:
            shown[key] = value
    return json_body({**envelope, "result": shown})


def _hold_more(stack: contextlib.ExitStack[Any], req: Request, n: int) -> None:
    stack.enter_context(held(req, n))


async def respond_result(api: Api, req: Request, envelope: dict[str, Any]) -> None:
    """Answer with ``envelope``, its ``Deferred`` streams read as they are written (a plain
    envelope: at once), holding its share of the answer budget (``held``) from before the
    first chunk is read: ``AnswersInFlight`` when it does not fit, nothing read or written.
    ``JournalError`` (``ResultUnverified`` among them) from the scan before anything is
    written; from the writing, after the answer was cut short."""
    result = envelope.get("result")
    deferred = [v for v in result.values() if isinstance(v, Deferred)] if result else []
    if not deferred:
        data = json_body(envelope)
        with held(req, len(data)):
            await req.respond(200, data)
        return
    token = secrets.token_hex(16)  # unguessable: no summary text can hold it
    # The envelope's own text (its summary: status, headers) is held while the answer is
    # written, beside the piece: counted too (a remote's headers may be large) -- at its
    # longest (every key ``_base64``) before the scan says which streams are text.
    with (
        held(req, PIECE_HOLD + len(_shown(envelope, token, [False] * len(deferred)))),
        contextlib.ExitStack() as more,
    ):
        hold = functools.partial(_hold_more, more, req)
        asker = api.asker(req)  # each read in the fetching uid's share of the view threads
        plans = [await _scan(api, asker, d, hold) for d in deferred]
        asker = dataclasses.replace(asker, answering=True)  # its pieces: the answer is under way
        body = _shown(envelope, token, [p.text for p in plans])
        marks = [b'"%s%d"' % (token.encode(), i) for i in range(len(plans))]
        length = len(body) + sum(p.length + 2 - len(m) for p, m in zip(plans, marks, strict=True))

        async def parts() -> AsyncGenerator[bytes, None]:
            at = 0
            for plan, mark in zip(plans, marks, strict=True):
                cut = body.index(mark, at)
                yield body[at:cut] + b'"'
                async with contextlib.aclosing(_pieces(api, asker, plan)) as pieces:
                    async for piece in pieces:
                        yield piece
                yield b'"'
                at = cut + len(mark)
            yield body[at:]

        async with contextlib.aclosing(parts()) as written:
            await req.respond_parts(200, length, written)
