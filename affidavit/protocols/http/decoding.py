"""Compressed bodies are decoded before the redaction scan (docs/redaction.md).

A gzip body that echoes ``Authorization: Bearer …`` holds no byte of the token a scan of the
wire bytes could find.  So the HTTP binding sits between the adapter and the engine's result
sink: the response's ``content_coding`` fact (adapters/http/machine.py) says how the body was
encoded, and ``BodyDecoder`` undoes it, streaming, before the sink redacts and stores it.

What is stored and returned then (the caller reads it in the result's summary):

* codings the broker decodes (``gzip``/``x-gzip``, ``deflate`` -- zlib or raw, as servers send
  both --, ``identity``, in any stack): the decoded, redacted body, with
  ``content_encoding_decoded`` naming the codings undone.  A re-compressed redacted body would
  prove nothing more, and the wire bytes' hash stays in the evidence (``body_sha256`` on
  REMOTE_RESPONSE_COMPLETE, when it says nothing of a secret: ``engine/delivery.py``).
* a body the broker cannot scan is never passed through: ``body_withheld`` says why --
  ``unsupported_content_encoding`` (``br``, ``zstd``, anything else: nothing of the body is
  stored), ``corrupt_encoding`` (the stream does not decode, or ends early) or
  ``decoded_size_limit`` (a decompression bomb: more than ``MAX_RATIO`` times the bytes received,
  plus ``SIZE_FLOOR``).  Whatever decoded before the failure was scanned and is kept, with
  ``body_truncated``; the rest is withheld, and so is every size and hash of it a caller could
  read (``engine/echoed.py``): no ``received_bytes``/``decoded_bytes`` here.

Memory stays bounded: each step of decompression produces at most ``STEP`` bytes, which go to the
sink (and the journal) before the next step.

The target's ``max_result`` bounds both sides of a decoded body: the bytes received (counted here,
withheld or not: a body the broker does not store is still not read without end) and the decoded
bytes stored (counted by the engine's sink).  Past either, ``ResultTooLarge``: the adapter stops
reading and closes the connection (RESULT_SIZE_LIMIT, outcome unknown).  The body was then not
decoded whole, so its counts are ``unscanned`` (``_cut_unscanned``): ``result_size_limit`` says
the limit and no size.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

from affidavit.adapters.base import AttemptContext, ResultTooLarge
from affidavit.statemachine import Step

__all__ = ["MAX_RATIO", "SIZE_FLOOR", "BodyDecoder", "BodyDecoding", "Withheld"]

MAX_RATIO: Final = 200
"""Decoded bytes allowed per byte received (plus ``SIZE_FLOOR``).  Text compresses 5-20x; a
ratio past a few hundred is a bomb, not a body."""
SIZE_FLOOR: Final = 1 << 20
STEP: Final = 1 << 20
"""At most this many decoded bytes per decompression call."""

Out = Callable[[bytes], Awaitable[None]]


class Withheld(Exception):
    """The rest of the body cannot be scanned; ``reason`` is one of the documented codes."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class _Stage:
    """One coding's decompressor: gzip (members may be concatenated, RFC 1952 §2.2) or deflate
    (RFC 9110 §8.4.1.2 says zlib, RFC 1950; some servers send raw RFC 1951 -- told apart by the
    zlib header check)."""

    def __init__(self, coding: str) -> None:
        self.gzip = coding in ("gzip", "x-gzip")
        self._d: Any = zlib.decompressobj(wbits=31) if self.gzip else None
        self._head = b""
        self._fed = False

    def _start(self, data: bytes) -> bytes:
        """Pick zlib or raw deflate once two bytes are known; return what is left to feed."""
        self._head += data
        if len(self._head) < 2:
            return b""
        cmf, flg = self._head[0], self._head[1]
        zlib_header = cmf & 0x0F == 8 and (cmf << 8 | flg) % 31 == 0
        self._d = zlib.decompressobj(wbits=15 if zlib_header else -15)
        data, self._head = self._head, b""
        return data

    def decode(self, data: bytes) -> Iterator[bytes]:
        """Decoded pieces of at most ``STEP`` bytes each, produced as they are consumed (a bomb
        is stopped by the consumer after the limit, never decoded whole)."""
        if data:
            self._fed = True
        if self._d is None:
            data = self._start(data)
            if self._d is None:
                return
        while data:
            if self._d.eof:
                if not self.gzip:
                    raise Withheld("corrupt_encoding")  # bytes after the zlib stream
                self._d = zlib.decompressobj(wbits=31)  # the next gzip member
            try:
                piece = self._d.decompress(data, STEP)
            except zlib.error:
                raise Withheld("corrupt_encoding") from None
            if piece:
                yield piece
            data = self._d.unused_data if self._d.eof else self._d.unconsumed_tail

    def finish(self) -> Iterator[bytes]:
        """Nothing more to decode; raise ``Withheld`` if the stream ended early."""
        if self._fed and (self._d is None or not self._d.eof):
            raise Withheld("corrupt_encoding")  # truncated inside the stream
        yield from ()


class BodyDecoder:
    """Undoes ``codings`` (in the order they were applied) over a streamed body."""

    def __init__(self, codings: Sequence[str]) -> None:
        applied = [c for c in codings if c != "identity"]
        self.codings = applied
        self.supported = all(c in ("gzip", "x-gzip", "deflate") for c in applied)
        """False for any other coding (the adapter's ``content_coding`` calls it "other")."""
        self._stages = [_Stage(c) for c in reversed(applied)] if self.supported else []
        self.received = 0
        self.decoded = 0

    async def feed(self, data: bytes, out: Out) -> None:
        """Decode ``data`` and hand the result to ``out``; raise ``Withheld`` when the rest of
        the body cannot be scanned."""
        if not self.supported:
            raise Withheld("unsupported_content_encoding")
        self.received += len(data)
        await self._through(0, (data,), out)

    async def finish(self, out: Out) -> None:
        for i, stage in enumerate(self._stages):
            await self._through(i + 1, stage.finish(), out)

    async def _through(self, i: int, pieces: Iterable[bytes], out: Out) -> None:
        if i == len(self._stages):
            for piece in pieces:
                if self.decoded + len(piece) > SIZE_FLOOR + MAX_RATIO * self.received:
                    raise Withheld("decoded_size_limit")
                self.decoded += len(piece)
                await out(piece)
            return
        for piece in pieces:
            await self._through(i + 1, self._stages[i].decode(piece), out)


class BodyDecoding:
    """An attempt's context with a decoding sink: ``context`` goes to the adapter, ``finish``
    (after the adapter returned a result) flushes the decoder and says, for the result's
    summary, what was decoded or withheld."""

    def __init__(self, ctx: AttemptContext) -> None:
        self._ctx = ctx
        self._decoder: BodyDecoder | None = None
        self._withheld: str | None = None
        self._received = 0
        self._raw: Any = None
        """The received bytes' hasher, made only for a body that is decoded (``_observe``)."""
        self.context = AttemptContext(
            machine=ctx.machine,
            gate=ctx.gate,
            observe=self._observe,
            sink=self._sink,
            attempt=ctx.attempt,
            fed=self._fed if ctx.fed is not None else None,
            result_limit=ctx.result_limit,
            withhold=ctx.withhold,
            holds=ctx.holds,
            head_word=ctx.head_word,
        )

    def _observe(self, step: Step, facts: Mapping[str, Any]) -> None:
        coding = facts.get("content_coding")
        if coding is not None:
            # A new response (a redirect hop's, or the final one): its own codings.
            applied = [c for c in coding if c != "identity"]
            self._decoder = BodyDecoder(applied) if applied else None
            self._withheld = None
            self._received = 0
            if applied:  # only a decoded body is hashed here (``_fed``)
                self._raw = hashlib.sha256()
            if self._decoder is not None and not self._decoder.supported and self._ctx.withhold:
                # None of it will be scanned -- not even a first piece ``max_result`` refuses
                # before the decoder sees it; an empty body still says nothing withheld.
                self._ctx.withhold("body")
        self._ctx.observe(step, facts)

    async def _sink(self, name: str, data: bytes) -> None:
        if name != "body" or self._decoder is None:
            await self._ctx.sink(name, data)
            return
        self._received += len(data)
        limit = self._ctx.result_limit
        if limit is not None and self._received > limit:
            self._cut_unscanned()
            raise ResultTooLarge(limit, self._received, self._decoder.decoded)
        self._raw.update(data)
        if self._withheld is not None:
            return
        try:
            await self._decoder.feed(data, self._forward)
        except Withheld as exc:
            self._withhold(exc.reason)
        except ResultTooLarge as exc:
            # The decoded bytes passed the limit in the sink: say what was received as well.
            self._cut_unscanned()
            raise ResultTooLarge(exc.limit, self._received, exc.received) from None

    def _cut_unscanned(self) -> None:
        """Stopped at ``max_result``: the piece received last was not decoded (the bytes
        received passed the limit) or not to its end (the decoded ones did), so the body was
        not scanned whole -- its counts, a CRIME-style oracle beside bytes the caller chose,
        are withheld as ``unscanned`` (``engine/echoed.py``), ``result_size_limit``'s too."""
        if self._ctx.withhold is not None:
            self._ctx.withhold("body")

    def _withhold(self, reason: str) -> None:
        """The rest of the body is not scanned: the engine is told (``AttemptContext.withhold``)
        as soon as it is known, so an attempt cut off before a result -- a stall, a close --
        still measures it nowhere a caller reads (``engine/echoed.py``)."""
        self._withheld = reason
        if self._ctx.withhold is not None:
            self._ctx.withhold("body")

    def _fed(self, name: str) -> tuple[int, str]:
        """What the adapter passed to the sink: a decoded body is not the bytes received, so
        those are hashed here (as the adapter did before ``AttemptContext.fed``)."""
        if name != "body" or self._decoder is None:
            assert self._ctx.fed is not None
            return self._ctx.fed(name)
        return self._received, self._raw.hexdigest()

    async def _forward(self, data: bytes) -> None:
        await self._ctx.sink("body", data)

    async def finish(self) -> dict[str, Any]:
        decoder = self._decoder
        if decoder is None:
            return {}
        if self._withheld is None:
            try:
                await decoder.finish(self._forward)
            except Withheld as exc:
                self._withhold(exc.reason)
        if self._withheld is None:
            return {"content_encoding_decoded": ", ".join(decoder.codings)}
        # No size of it: the body was not scanned whole, so it may echo a secret, and beside
        # bytes the caller chose its size is an oracle on the secret (CRIME); the engine drops
        # the other measures of it (``engine/echoed.py``, ``received_withheld: "unscanned"``).
        out: dict[str, Any] = {
            "body_withheld": {
                "reason": self._withheld,
                "content_encoding": ", ".join(decoder.codings),
            }
        }
        if decoder.decoded:
            out["body_truncated"] = True
        return out
