"""The result sink: what an adapter hands every received byte to (``AttemptContext.sink``).

Seed, "A result delivery error must not repeat execution": "Store chunks with sequence numbers
and a final completeness marker."  Each stream is redacted (no credential echoed by the remote
reaches the journal; ``scrub`` does the same to the structured rest of a result), hashed and
journaled in ``RESULT_CHUNK``-sized chunks as it arrives -- never held whole.  The completeness
marker is written later, with RESULT_COMMITTED (``delivery.commit``), from what this sink
reports.

A result is bounded by its target's ``max_result`` (all streams together): a remote that sends
without end fills no disk.  The piece that would pass it is not stored; ``ResultTooLarge`` is
raised to the adapter, which stops reading and closes the connection -- the attempt ends
``unknown`` (RESULT_SIZE_LIMIT) and the chunks stored so far are never committed.  That piece is
still scanned (``_scan``): the count the evidence would tell includes it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from affidavit.adapters.base import ResultTooLarge
from affidavit.journal import Journal, ResultStoreFailed
from affidavit.secrets.redaction import Redactor

__all__ = ["RESULT_CHUNK", "Stored", "StreamSink"]

RESULT_CHUNK = 64 * 1024
"""Bytes per stored result chunk (the last chunk of a stream may be shorter)."""

_EMPTY_SHA256 = hashlib.sha256().hexdigest()
"""What ``fed`` says of a stream nothing was passed to yet (the adapter asks for the body's
before its first byte too): a constant, not a hash object made and finished per call."""


class StreamSink:
    """Redacts, hashes and journals result streams in chunks as they arrive (never whole).

    A copy of the redacted bytes is kept while the whole result stays within ``keep_limit``
    bytes, for the envelope (``kept``)."""

    def __init__(
        self,
        journal: Journal,
        iid: str,
        secret_values: tuple[bytes, ...],
        keep_limit: int,
        generation: int | None = None,
        max_result: int | None = None,
    ) -> None:
        self._journal = journal
        self.max_result = max_result
        """The most bytes the streams may take together (the target's ``max_result``)."""
        self._received = 0
        self._iid = iid
        self._keep_limit = keep_limit
        self.limit = keep_limit
        """The inline limit: a larger result is returned by reference (``delivery``)."""
        self._streams: dict[str, dict[str, Any]] = {}
        self._kept = 0
        self._keep = True
        self._scrubber = Redactor(secret_values)
        self.scrub = self._scrubber.scrub
        """``value`` (JSON-able: a summary, facts) with every form of the secrets redacted in
        its strings and keys -- header names and values, the reason phrase, a hop's origin --
        the same forms the streams lose (docs/redaction.md).  The redactor's own method, not
        a method of the sink that calls it: one frame less for each of the dozen values a
        call scrubs (issue 15)."""
        self.holds = self._scrubber.holds_any
        """Whether a text holds a form of the secrets (``AttemptContext.holds``)."""
        self.writer = journal.result_writer(iid, generation)
        """Where the chunks go as they are cut (``Journal.result_writer``: a long result's to
        segment files beside a SQLite journal, else to the journal's tables, a bounded number
        at a time); ``commit_result(writer=)`` takes its account of what it stored instead of
        reading the chunks back.  ``generation``: the attempt's; a chunk of a stale one is
        refused (a store failure), never written over the attempt that took over."""
        self.unscanned: list[str] = []
        """The streams a layer before the sink passed on not scanned whole (``withhold``)."""
        self.store_failed = False
        """The journal refused a chunk (disk full, I/O error): nothing more is stored, and the
        adapter reads the response to its end all the same -- its outcome is still worth
        recording (``delivery``: RESULT_STORE_FAILED, never a second dispatch)."""

    def _stream(self, name: str) -> dict[str, Any]:
        st = self._streams.get(name)
        if st is None:
            st = self._streams[name] = {
                # The plan this call began with (``Redactor.fresh``), not a cache lookup.
                "redactor": self._scrubber.fresh(),
                "buf": bytearray(),
                "index": 0,
                "sha": hashlib.sha256(),
                "bytes": 0,
                "kept": [],
                "fed": None,
                "fed_bytes": 0,
            }
        return st

    async def __call__(self, name: str, data: bytes) -> None:
        limit = self.max_result
        if limit is not None:
            received = self._received + len(data)
            self._received = received
            if received > limit:
                # Nothing of this piece is stored, nor of any after it; but the count told
                # holds it, so it is scanned (``_scan``).
                self._scan(name, data)
                raise ResultTooLarge(limit, received)
        st = self._stream(name)
        redactor: Redactor = st["redactor"]
        held = redactor.pending
        pieces = redactor.feed_pieces(data)
        st["fed_bytes"] += len(data)
        self._fork(st, redactor, held)
        if st["fed"] is not None:
            st["fed"].update(data)
        chunks: list[bytes] = []
        for piece in pieces:
            st["sha"].update(piece)
            _cut(st["buf"], piece, chunks)
        for chunk in chunks:
            await self._put(name, st, chunk)

    def _scan(self, name: str, data: bytes) -> None:
        """The piece that passed ``max_result``, scanned and not stored: where it echoes a
        secret, ``redacted_streams`` names its stream, and the attempt's record withholds the
        count it is in (``echoed.without_received_counts``: ``result_size_limit`` too) -- or a
        credential whose echo arrived in the piece that crossed the limit would be measured."""
        st = self._stream(name)
        redactor: Redactor = st["redactor"]
        held = redactor.pending
        redactor.feed_pieces(data)
        self._fork(st, redactor, held)

    @staticmethod
    def _fork(st: dict[str, Any], redactor: Redactor, held: bytes) -> None:
        """At the first replacement in a stream: start hashing its input on its own.  Until
        then the redacted bytes hashed so far are the input so far, short of what the redactor
        ``held`` back, so the input's hash is a copy of theirs plus those bytes."""
        if st["fed"] is None and redactor.changed:
            fed = st["fed"] = st["sha"].copy()
            fed.update(held)

    def fed(self, name: str) -> tuple[int, str]:
        """(bytes, hex SHA-256) of everything passed to stream ``name`` before redaction
        (``AttemptContext.fed``).  While redaction has changed nothing, that is the redacted
        stream's own hash plus the bytes the redactor holds back: the response's bytes are
        hashed once, not once by the adapter and again here (issue 15)."""
        st = self._streams.get(name)
        if st is None:
            return 0, _EMPTY_SHA256
        if st["fed"] is not None:
            return st["fed_bytes"], st["fed"].hexdigest()
        whole = st["sha"].copy()
        whole.update(st["redactor"].pending)
        return st["fed_bytes"], whole.hexdigest()

    def redacted_streams(self) -> list[str]:
        """The streams in which redaction replaced something, or would replace something in
        the bytes it still holds back (an answer cut right after an echo: never flushed), or
        would withhold those bytes: an answer that ends without a result was cut short, so
        every stream holding bytes back withholds them (``Redactor.ending``) -- whatever
        they are, so its counts go whatever the bytes were."""
        return [name for name, st in self._streams.items() if any(st["redactor"].ending())]

    @property
    def head_echoed(self) -> bool:
        """Whether ``scrub`` replaced a whole form (or a whole text: ``Redactor.scrub_text``)
        in what the remote wrote besides the streams -- a header that echoed the credential.
        An echo proven there is an echo of the answer: the record's word for it is
        ``redacted`` whatever the streams only end with (``_why``, ``delivery._commit``)."""
        return self._scrubber.echoed

    def head_word(self, texts: Iterable[str]) -> str:
        """``AttemptContext.head_word``: ``short_redacted`` if scrubbing ``texts`` (a head that
        ``holds`` a form) replaces only whole forms of a value under 8 bytes, else ``redacted``
        -- also when the scrub replaced nothing: never a weaker word than the proof allows.
        A fresh scrubber: this head's flags are not the summary's (``head_echoed``)."""
        r = self._scrubber.fresh()
        for text in texts:
            r.scrub_text(text)
        return "short_redacted" if r.short_echoed and not r.echoed else "redacted"

    @property
    def head_short(self) -> bool:
        """Whether ``scrub`` replaced, besides the streams, only whole forms of a value under
        8 bytes (``Redactor.short_echoed``): ordinary text may be one -- a password ``2026``
        in every answer's ``Date`` -- so the record's word for it is ``short_redacted``, never
        ``redacted`` (``_why``, ``delivery._commit``)."""
        return self._scrubber.short_echoed

    @property
    def head_why(self) -> str | None:
        """The record's word for what ``scrub`` replaced besides the streams: ``redacted``
        (``head_echoed``), ``short_redacted`` (``head_short``), or None (nothing)."""
        if self.head_echoed:
            return "redacted"
        return "short_redacted" if self.head_short else None

    def _why(self) -> str:
        """``redacted`` if a stream echoed a secret (or would in its held-back bytes) or the
        head did (``head_echoed``), else ``short_redacted`` if a stream or the head had only a
        short value's forms replaced (``head_short``), else ``tail_redacted``: a stream cut
        short had its last bytes withheld, whatever they were (``Redactor.flush``)."""
        endings = [st["redactor"].ending() for st in self._streams.values()]
        echoed, cut, short = (any(e[i] for e in endings) for i in (0, 1, 2))
        head = self.head_why
        if echoed or head == "redacted":
            return "redacted"
        if short or head is not None:
            return "short_redacted"
        return "tail_redacted" if cut else "redacted"

    def withhold(self, name: str) -> None:
        """``AttemptContext.withhold``: stream ``name`` was not scanned whole -- it may echo a
        secret that no redactor saw (HTTP's decoding: a ``br`` body, a corrupt one, a bomb)."""
        if name not in self.unscanned:
            self.unscanned.append(name)

    def withheld(self) -> tuple[list[str], str]:
        """The streams whose received sizes and hashes an attempt ending without a result
        withholds (``echoed.without_received_counts``), and why: those redaction replaced
        something in (``redacted_streams``) and, ``unscanned`` then, those not scanned whole."""
        if self.unscanned:
            return self.redacted_streams() + self.unscanned, "unscanned"
        return self.redacted_streams(), self._why()

    def redacted(self, name: str) -> bool:
        """After ``finish``: whether redaction replaced anything in stream ``name`` (a stream
        never fed was not)."""
        st = self._streams.get(name)
        return st is not None and st["fed"] is not None

    def why(self, name: str) -> str:
        """After ``finish``, of a ``redacted`` stream: ``redacted`` if it echoed a secret,
        ``tail_redacted`` if it was cut short and only its last bytes were withheld, whatever
        they were (``Redactor.flush``), ``short_redacted`` if what was replaced besides were
        only forms of a value under 8 bytes (``Redactor.short_echoed``: ordinary text may be
        one)."""
        r = self._streams[name]["redactor"]
        return "redacted" if r.echoed else "short_redacted" if r.short_echoed else "tail_redacted"

    async def _put(
        self, name: str, st: dict[str, Any], chunk: bytes, *, last: bool = False
    ) -> None:
        st["bytes"] += len(chunk)
        if self._keep:
            self._kept += len(chunk)
            if self._kept <= self._keep_limit:
                st["kept"].append(chunk)
            else:
                self._keep = False
                for other in self._streams.values():
                    other["kept"].clear()
        if self.store_failed:
            return
        index = st["index"]
        st["index"] += 1
        try:
            # A stream's last (short) chunk shares the commit's transaction; the commit checks
            # ``expected()`` against what the writer stored, so a chunk lost is never a gap in
            # a committed result.
            await self.writer.put(name, index, chunk, last=last)
        except ResultStoreFailed:
            # Not raised into the adapter: it would abort the exchange, and a complete answer
            # not stored is still a known outcome where an aborted one is unknown.
            self.store_failed = True

    async def drain(self) -> None:
        """Wait until every chunk handed over so far is stored (or storing failed) -- also
        after a failure: nothing of this result may stay queued to share a transaction with
        what is written next."""
        try:
            await self.writer.drain()
        except ResultStoreFailed:
            self.store_failed = True

    def expected(self) -> dict[str, str]:
        """{stream: hex SHA-256 of the redacted bytes written}, for ``commit_result(expect=)``."""
        return {name: st["sha"].hexdigest() for name, st in self._streams.items()}

    async def finish(self, cut: Callable[[str], bool] | None = None) -> dict[str, dict[str, Any]]:
        """Flush every stream and the writer; return per-stream {sha256, bytes, chunks}
        (redacted bytes).  ``cut``: whether a stream was stored cut short (a body truncated
        or withheld: ``readable.stream_cut``) -- its last bytes are withheld whatever they
        were; every other stream of a result ended complete, and has no end cut
        (``Redactor.flush``).  ``store_failed`` afterwards: the result cannot be committed."""
        out: dict[str, dict[str, Any]] = {}
        await self.drain()
        for name, st in sorted(self._streams.items()):
            held = st["redactor"].pending
            tail = st["redactor"].flush(complete=cut is None or not cut(name))
            self._fork(st, st["redactor"], held)
            st["sha"].update(tail)
            # What the redactor held back can be more than what fills the chunk being cut
            # (it keeps every byte a match might still start at): cut it as every read is, so
            # no stored chunk but the last is shorter and none is longer than RESULT_CHUNK --
            # ``--from-chunk N`` resumes at byte N * RESULT_CHUNK.
            chunks: list[bytes] = []
            _cut(st["buf"], tail, chunks)
            if chunks:
                for chunk in chunks:
                    await self._put(name, st, chunk)
                await self.drain()  # a refused chunk is seen before the commit, as above
            if st["buf"]:
                await self._put(name, st, bytes(st["buf"]), last=True)
                st["buf"].clear()
            out[name] = {
                "sha256": "sha256:" + st["sha"].hexdigest(),
                "bytes": st["bytes"],
                "chunks": st["index"],
            }
        if not self.store_failed:
            try:
                await self.writer.flush()  # a failed sync is a store failure, seen here
            except ResultStoreFailed:
                self.store_failed = True
        return out

    def kept(self) -> dict[str, bytes] | None:
        """After ``finish``: every stored stream's redacted bytes, as the journal holds them
        (streams that stored no chunk are not part of a stored result), or None if the result
        was too large to keep."""
        if not self._keep:
            return None
        return {n: b"".join(st["kept"]) for n, st in self._streams.items() if st["index"]}

    def release(self) -> None:
        """Drop the copies ``kept`` for the envelope once it is rendered: its text carries the
        result now, and its delivery may wait up to the daemon's ``WRITE_WAIT`` for a client
        that does not read -- 100 such answers of 0.9 MB each held these beside their
        encoding, uncounted (audit 50).  ``kept`` is None afterwards."""
        self._keep = False
        for st in self._streams.values():
            st["kept"] = []

    def digest(self) -> str:
        whole = hashlib.sha256()
        for name, st in sorted(self._streams.items()):
            whole.update(name.encode() + b"\0" + st["sha"].digest())
        return "sha256:" + whole.hexdigest()


def _cut(buf: bytearray, piece: bytes | memoryview, chunks: list[bytes]) -> None:
    """Append ``piece``'s whole ``RESULT_CHUNK``-sized chunks (after what ``buf`` holds) to
    ``chunks``, keeping the rest in ``buf``.  A chunk inside one piece is copied out of it once;
    only a chunk that straddles pieces goes through ``buf``, which never holds a whole chunk
    (issue 15: every byte of a 50 MiB body went through ~6 copies, and a buffer grown and
    shrunk by 256 KiB per read, between the redactor and the journal)."""
    view = memoryview(piece)
    pos, size = 0, len(view)
    if buf:
        pos = min(RESULT_CHUNK - len(buf), size)
        buf += view[:pos]
        if len(buf) < RESULT_CHUNK:
            return
        chunks.append(bytes(buf))
        buf.clear()
    while size - pos >= RESULT_CHUNK:
        chunks.append(bytes(view[pos : pos + RESULT_CHUNK]))
        pos += RESULT_CHUNK
    buf += view[pos:]


@dataclass(frozen=True, slots=True)
class Stored:
    """A just-committed result in the shape of ``StoredResult``, for ``result_payload``."""

    summary: Mapping[str, Any]
    streams: dict[str, bytes]
    sha256: str
