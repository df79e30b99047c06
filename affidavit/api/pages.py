"""The pages of a stored result put back together: what a client of the daemon does to read a
result from a chunk to its end (``affidavit result --from-chunk N``, ``Client.fetch_result``),
now that the daemon answers ``?from_chunk=`` a page at a time (``&chunks=``, at most
``MAX_RESULT_PAGE_CHUNKS``; ``result.resume.next_chunk`` names the next, null after the last).

``merge_pages`` gives the envelope the embedded ``Broker.fetch_result(from_chunk=N)`` renders:
each stream's bytes from chunk N on -- text when they decode as UTF-8, else ``_base64``, judged
on the whole, as ``result_payload`` judges it -- and the ``resume`` table of the first page with
``next_chunk`` null.

The daemon is not trusted to page honestly (a client designed as if its peer were hostile):
every page must be of the same stored result (its ``sha256`` and ``resume.streams`` table),
start where the one before said the next starts (its ``resume.from_chunk``), name a next chunk
past its own and within the largest stream's chunk count (so the pages are at most that many),
and hold every stream, each with exactly the bytes its chunks span (chunk K starts at byte K x
``RESULT_CHUNK_BYTES``); put together, each stream has the size the table gives it, and -- read
from chunk 0 -- its hash.  Else ``ValueError``, the words saying which page broke which rule.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from .wire import RESULT_CHUNK_BYTES, ApiError

__all__ = [
    "PAGE_RETRIES",
    "RETRY_WAIT_MOST",
    "merge_pages",
    "next_chunk",
    "read_pages",
    "read_record_pages",
]

PAGE_RETRIES = 3
"""Times a page answered 503 with ``Retry-After`` (answers in flight, a read declined this
once) is asked again, after the wait it names, before the refusal is the caller's."""
RETRY_WAIT_MOST = 30
"""The longest ``Retry-After`` waited out, in seconds (a daemon's word, not trusted further)."""


def next_chunk(page: dict[str, Any]) -> int | None:
    """Where the page after ``page`` starts; None after the last (or an envelope without a
    stored result: nothing to page)."""
    result = page.get("result")
    resume = result.get("resume") if isinstance(result, dict) else None
    value = resume.get("next_chunk") if isinstance(resume, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def _page(
    fetch: Callable[[int], Awaitable[dict[str, Any] | None]], at: int
) -> dict[str, Any] | None:
    """``fetch(at)``, asked again after a 503 with ``Retry-After`` (``PAGE_RETRIES`` times)."""
    for attempt in range(PAGE_RETRIES + 1):
        try:
            return await fetch(at)
        except ApiError as exc:
            if exc.status != 503 or exc.retry_after is None or attempt == PAGE_RETRIES:
                raise
            await trio.sleep(min(exc.retry_after, RETRY_WAIT_MOST))
    raise AssertionError("unreachable")  # pragma: no cover


async def _at(
    fetch: Callable[[int, int], Awaitable[dict[str, Any] | None]], limit: int, at: int
) -> dict[str, Any] | None:
    return await fetch(at, limit)


async def read_record_pages(
    fetch: Callable[[int, int], Awaitable[dict[str, Any] | None]], limit: int
) -> dict[str, Any] | None:
    """A record read a page of events at a time (``fetch(n, m)``: ``GET
    /v1/invocations/{id}?from_seq=n&limit=m``, None for an unknown invocation) -- what a record
    too large to be answered whole (413 ``ANSWER_TOO_LARGE``) is read by: ``{"record",
    "events"}`` as a whole read answers, the record of the last page.  A page itself too large
    is asked again with half the ``limit`` (down to one event: then the refusal is the
    caller's).  Each page must hold a list of events (objects) and name a ``next_seq`` past
    its own events (else ``ValueError``): a daemon that pages dishonestly cannot keep a
    client asking the same page for ever."""
    at = 0
    events: list[Any] = []
    while True:
        try:
            page = await _page(functools.partial(_at, fetch, limit), at)
        except ApiError as exc:
            if exc.code != "ANSWER_TOO_LARGE" or limit == 1:
                raise
            limit //= 2
            continue
        if page is None:
            if events:
                raise ValueError(f"the page from seq {at} names no invocation")
            return None
        got = page.get("events")
        nxt = page.get("next_seq")
        if not (isinstance(got, list) and all(isinstance(e, dict) for e in got)):
            # A string's characters, a mapping's keys would be taken for events.
            raise ValueError(f"the page from seq {at} holds no list of events")
        seqs = [e.get("seq") for e in got]
        if not all(isinstance(q, int) and q >= at for q in seqs):
            raise ValueError(f"the page from seq {at} holds an event before it")
        events.extend(got)
        if nxt is None:
            return {"record": page.get("record"), "events": events}
        if not (isinstance(nxt, int) and seqs and nxt > max(seqs)):
            raise ValueError(f"the page from seq {at} names no next seq past its events")
        at = nxt


async def read_pages(
    fetch: Callable[[int], Awaitable[dict[str, Any] | None]], from_chunk: int
) -> dict[str, Any] | None:
    """Every page from ``from_chunk`` on (``fetch(n)``: the page starting at chunk ``n``, None
    for an unknown invocation), merged as they arrive (``merge_pages``'s checks, each page as
    it comes: at most the largest stream's chunk count of them, whatever the daemon says)."""
    first = await _page(fetch, from_chunk)
    if first is None:
        return None
    merged = _Merged(first, from_chunk)
    while merged.at is not None:
        page = await _page(fetch, merged.at)
        if page is None:
            raise ValueError(f"the page at chunk {merged.at} names no invocation")
        merged.add(page)
    return merged.envelope()


def merge_pages(pages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The envelope of consecutive pages as one (see the module docstring)."""
    first = pages[0]
    result = first.get("result")
    if not isinstance(result, dict) or "resume" not in result:
        if len(pages) > 1:
            raise ValueError("pages of an envelope without a stored result's resume table")
        return first
    merged = _Merged(first, _whole(result["resume"].get("from_chunk"), "resume.from_chunk"))
    for page in pages[1:]:
        if merged.at is None:
            raise ValueError("a page after the last")
        merged.add(page)
    return merged.envelope()


def _whole(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what} is not a whole number")
    return value


class _Merged:
    """Pages put together so far, each checked as it is added (the module docstring)."""

    def __init__(self, first: dict[str, Any], from_chunk: int) -> None:
        self.first = first
        self.result = first.get("result")
        self.from_chunk = from_chunk
        self.at: int | None = from_chunk
        if not isinstance(self.result, dict) or "resume" not in self.result:
            self.at = None  # nothing to page: the envelope as it is
            return
        streams = self.result["resume"].get("streams")
        if not isinstance(streams, dict):
            raise ValueError("the first page has no resume.streams table")
        self.sizes: dict[str, int] = {}
        for name, info in sorted(streams.items()):
            size = _whole(info.get("bytes") if isinstance(info, dict) else None, f"{name} bytes")
            if _whole(info.get("chunks"), f"{name} chunks") != -(-size // RESULT_CHUNK_BYTES):
                raise ValueError(f"stream {name!r} has {size} bytes but not their chunk count")
            self.sizes[name] = size
        self.streams = streams
        self.chunks = max((-(-n // RESULT_CHUNK_BYTES) for n in self.sizes.values()), default=0)
        self.data = {name: bytearray() for name in self.sizes}
        self.add(first)

    def add(self, page: dict[str, Any]) -> None:
        """Take the page starting at chunk ``at``; ``at`` becomes where the next starts."""
        at, part = self.at, page.get("result")
        assert at is not None and isinstance(self.result, dict)
        if not isinstance(part, dict) or part.get("sha256") != self.result.get("sha256"):
            raise ValueError(f"the page at chunk {at} is of another stored result")
        resume = part.get("resume")
        if not isinstance(resume, dict) or resume.get("streams") != self.streams:
            raise ValueError(f"the page at chunk {at} has another resume.streams table")
        if resume.get("from_chunk") != at:
            raise ValueError(f"the page asked at chunk {at} starts at {resume.get('from_chunk')}")
        after = next_chunk(page)
        if after is not None and not at < after < self.chunks:
            raise ValueError(
                f"the page at chunk {at} names chunk {after} next (the streams have "
                f"{self.chunks} chunks)"
            )
        end = self.chunks if after is None else after
        for name, size in self.sizes.items():
            if isinstance(part.get(name), str):
                piece = part[name].encode("utf-8")
            elif isinstance(part.get(f"{name}_base64"), str):
                piece = base64.b64decode(part[f"{name}_base64"], validate=True)
            else:
                raise ValueError(f"the page at chunk {at} lacks stream {name!r}")
            span = min(size, end * RESULT_CHUNK_BYTES) - min(size, at * RESULT_CHUNK_BYTES)
            if len(piece) != span:
                raise ValueError(
                    f"stream {name!r}'s page at chunk {at} holds {len(piece)} bytes, not {span}"
                )
            self.data[name] += piece
        self.at = after

    def envelope(self) -> dict[str, Any]:
        """The pages as one envelope -- each stream's size is its pages' spans' sum, from
        ``from_chunk`` to its end: checked page by page -- read from chunk 0, each stream's
        hash checked against the resume table."""
        if not isinstance(self.result, dict) or "resume" not in self.result:
            return self.first
        for name in self.sizes:
            if self.from_chunk == 0:
                digest = "sha256:" + hashlib.sha256(self.data[name]).hexdigest()
                if digest != self.streams[name].get("sha256"):
                    raise ValueError(f"stream {name!r} put together has another sha256")
        merged: dict[str, Any] = {}
        for key, value in self.result.items():
            name = key.removesuffix("_base64")
            if name not in self.data:
                merged[key] = value
                continue
            try:
                merged[name] = self.data[name].decode("utf-8")
            except UnicodeDecodeError:
                merged[f"{name}_base64"] = base64.b64encode(self.data[name]).decode("ascii")
        merged["resume"] = {**self.result["resume"], "next_chunk": None}
        return {**self.first, "result": merged}
