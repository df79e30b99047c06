"""The pages of a stored result put back together: what a client of the daemon does to read a
result from a chunk to its end (``affidavit result --from-chunk N``, ``Client.fetch_result``),
now that the daemon answers ``?from_chunk=`` a page at a time (``&chunks=``, at most
``MAX_RESULT_PAGE_CHUNKS``; ``result.resume.next_chunk`` names the next, null after the last).

``merge_pages`` gives the envelope the embedded ``Broker.fetch_result(from_chunk=N)`` renders:
each stream's bytes from chunk N on -- text when they decode as UTF-8, else ``_base64``, judged
on the whole, as ``result_payload`` judges it -- and the ``resume`` table of the first page with
``next_chunk`` null.  Each page must be of the same stored result (its ``sha256``), and each must
start where the one before said the next starts: else ``ValueError``.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

__all__ = ["merge_pages", "next_chunk", "read_pages"]


def next_chunk(page: dict[str, Any]) -> int | None:
    """Where the page after ``page`` starts; None after the last (or an envelope without a
    stored result: nothing to page)."""
    result = page.get("result")
    resume = result.get("resume") if isinstance(result, dict) else None
    value = resume.get("next_chunk") if isinstance(resume, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def read_pages(
    fetch: Callable[[int], Awaitable[dict[str, Any] | None]], from_chunk: int
) -> dict[str, Any] | None:
    """Every page from ``from_chunk`` on (``fetch(n)``: the page starting at chunk ``n``, None
    for an unknown invocation), merged.  A page whose ``next_chunk`` does not move forward is
    ``ValueError``: the loop ends with the result, whatever the pages say."""
    pages: list[dict[str, Any]] = []
    at: int | None = from_chunk
    while at is not None:
        page = await fetch(at)
        if page is None:
            return None
        pages.append(page)
        after = next_chunk(page)
        if after is not None and after <= at:
            raise ValueError(f"page at chunk {at} names chunk {after} next")
        at = after
    return merge_pages(pages)


def merge_pages(pages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The envelope of consecutive pages as one (see the module docstring)."""
    first = pages[0]
    result = first.get("result")
    if len(pages) == 1 or not isinstance(result, dict) or "resume" not in result:
        return first
    names = sorted(result["resume"]["streams"])
    data = {name: bytearray() for name in names}
    for page in pages:
        part = page.get("result") or {}
        if part.get("sha256") != result.get("sha256"):
            raise ValueError("the pages are of different stored results")
        for name in names:
            if name in part:
                data[name] += str(part[name]).encode("utf-8")
            else:
                data[name] += base64.b64decode(part.get(f"{name}_base64", ""), validate=True)
    merged: dict[str, Any] = {}
    for key, value in result.items():
        name = key.removesuffix("_base64")
        if name not in data:
            merged[key] = value
            continue
        try:
            merged[name] = data[name].decode("utf-8")
        except UnicodeDecodeError:
            merged[f"{name}_base64"] = base64.b64encode(data[name]).decode("ascii")
    merged["resume"] = {**result["resume"], "next_chunk": None}
    return {**first, "result": merged}
