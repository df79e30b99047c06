"""Whole answers within the server's answer budget: views' pages, records, call envelopes.

A stored result's answer is written a piece at a time (``results.py``); every other answer is
written whole, and one may be megabytes: a ``/v1/sessions`` page at ``limit=10000`` (3.75 MB),
a record of many events, a call's envelope carrying its inline result (1 MiB by default, up to
six times that as JSON), a poll's or a reconciliation query's answer carrying one.  Such an
answer is held until its last byte is written, which a client that does not read makes
``WRITE_WAIT`` (30 s): 100 connections of one agent not reading a sessions page grew the
daemon by 1.1 GB (audit 48).  So a large one is counted in the answer budget
(``admission.ANSWER_BUDGET``) while it is written, as a result's pieces are:

* a view's page or a record (``respond_page``) is encoded in the view's thread, with the read,
  then held -- past the budget, 503 ``ANSWERS_IN_FLIGHT`` with ``Retry-After``: a read, safe
  to repeat, and nothing was written;
* an answer the broker delivers (``respond_delivered``: a call's envelope, a poll's or a
  query's answer) up to ``FREE_BODY`` (64 KiB) is not counted, as a request body that small is
  not: one per connection, 16 MiB at most -- so a few uids keeping large answers unread cannot
  cost another's small one.  Nor is one that says nothing was dispatched (``not_attempted``):
  it carries no result, and a client told nothing would have to think the call may have run;
* a larger one counts its encoding and, beside it, its decoded inline results (the text of
  each stream, as much memory as the string takes: ``sys.getsizeof``): the engine keeps the
  envelope until the answer is written, to render a failed delivery from it.  What else a call
  held of its result -- the sink's copies kept for the envelope, the segment writer's last
  chunks -- is dropped once the envelope is rendered (``StreamSink.release``), not counted:
  100 unread answers of 0.9 MB took the daemon from 58 to 392 MB before, 0.9 MB of each
  counted (audit 50; tests/benchmarks/slow_readers.py).  Such an
  answer is the record of something that ran: it is never refused for the budget as if it
  had not.  It waits for room (``Server.wait_answer``: ahead of new pages and fetches) at
  most ``WRITE_WAIT`` -- as long as a client that does not read may hold it -- and not past
  its client's hang-up nor the stop's grace; then it is not written: the link is ``broken``,
  so the delivery failed (``RESULT_DELIVERY_FAILED``: the result stays stored, fetched, never
  run again) and the connection closes unanswered (the client's ``AnswerLost``: it may have
  run).  One larger than its uid's share could ever hold fails at once, logged with the
  sizes -- the daemon's inline limit (1 MiB of result, at most about 6 MiB of JSON and the
  remote's headers) keeps an envelope well within an agent's 32 MiB.

An answer that may be large (``_bulk``) is encoded once, in one of the server's
``answer_threads`` (its own: never the request bodies' ``parse_threads``), and kept while it
waits.  A small one is encoded on the event loop -- a thread hop costs more than encoding it.

Not counted: the answers that are small by construction (health, metrics, the catalog, an
``api_error``) and the operators' routes (an operator is not the hostile caller here).
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

import trio

from .http import FREE_BODY, Request, json_body
from .results import PARTS, held

__all__ = ["encoded", "encoded_in_thread", "respond_delivered", "respond_page"]

log = logging.getLogger("affidavit.daemon")


ITEM_GUESS = 256
"""Bytes a batch's item is taken to encode to (``_bulk``): a bound of the few short values one
holds, so a long ``items`` list is encoded off the event loop too."""


def _bulk(value: Any, measure: Callable[[str], int] = len) -> int:
    """About the bytes of ``value``'s inline results -- the text of each ``result``'s streams
    (``measure``d: its length by default, ``sys.getsizeof`` for the memory it takes) and
    ``ITEM_GUESS`` per batch item, its own or those of an envelope it carries (a poll's
    ``poll``, a query's): an envelope's other values are a few dozen short ones (its headers
    bounded by the remote's head limit).  A look at a few keys, not a walk of the tree:
    walking a whole envelope cost more than encoding a small one."""
    if not isinstance(value, dict):
        return 0
    size = 0
    for holder in (value, *(v for v in value.values() if isinstance(v, dict))):
        result, items = holder.get("result"), holder.get("items")
        if isinstance(result, dict):
            size += sum(measure(v) for v in result.values() if isinstance(v, str))
        if isinstance(items, list):
            size += len(items) * ITEM_GUESS
    return size


def _ran(value: dict[str, Any]) -> bool:
    """Whether ``value`` may be the record of something dispatched: not an envelope, nor an
    answer carrying envelopes (a poll's ``poll``), whose ``evidence.outcome`` is each
    ``not_attempted`` -- durable evidence that nothing crossed the dispatch boundary.  One
    that says nothing of it counts as run."""
    told = [
        e["evidence"].get("outcome")
        for e in (value, *value.values())
        if isinstance(e, dict) and isinstance(e.get("evidence"), dict)
    ]
    return not told or any(outcome != "not_attempted" for outcome in told)


async def encoded(req: Request, value: Any) -> bytes:
    """``json_body(value)``: on the event loop when its inline results are small (``_bulk``),
    else in one of the server's ``answer_threads`` (encoding megabytes stalls every other
    connection meanwhile)."""
    if _bulk(value) <= FREE_BODY:
        return json_body(value)
    return await encoded_in_thread(req, value)


async def encoded_in_thread(req: Request, value: Any) -> bytes:
    """``json_body(value)`` in one of the server's ``answer_threads``, whatever its size (a
    view's page: ``Api.sessions``)."""
    encode = functools.partial(json_body, value)
    return await trio.to_thread.run_sync(encode, limiter=req.server.answer_threads)


async def respond_page(req: Request, data: bytes, parts: str = PARTS) -> None:
    """Answer 200 with ``data`` (a view's page, a record: encoded with its read), held in the
    answer budget until it is written -- or 503 ``ANSWERS_IN_FLIGHT``, or 413
    ``ANSWER_TOO_LARGE`` naming ``parts``, how to read it in parts (``results.held``)."""
    with held(req, len(data), parts):
        await req.respond(200, data)


async def respond_delivered(req: Request, value: dict[str, Any]) -> None:
    """Answer 200 with ``value`` (a call's envelope, a linked asker's answer): up to
    ``FREE_BODY``, or one of nothing dispatched, not counted; else held in the answer budget
    while it is written, waiting for room (``Server.wait_answer``) or else not written and the
    link ``broken`` (the module docstring says why)."""
    server, uid, other = req.server, req.peer.uid, req.other
    data = await encoded(req, value)
    if req.link.hung_up.is_set():  # while it was encoded: never delivered (link.py)
        req.link.broken = True
        return
    if len(data) <= FREE_BODY or not _ran(value):
        await req.respond(200, data)
        return
    # Its encoding, and the decoded result beside it: the engine keeps the envelope until
    # this answer is written (it renders a failed delivery from it).
    n = len(data) + _bulk(value, sys.getsizeof)
    if server.hold_answer(n, uid, other, first=True) is not None:
        why = await server.wait_answer(n, uid, other, server.write_wait, req.link)
        if why is not None:
            log.warning(
                "an answer holding %d bytes to %s was not written (%s; the answer budget holds "
                "%d bytes at once, %d for its uid, waiting at most %g s): the connection is "
                "closed",
                n,
                req.peer.describe(),
                why,
                server.answer_shares.budget,
                server.answer_share(other),
                server.write_wait,
            )
            req.link.broken = True  # never delivered: the caller fetches it
            return
    try:
        await req.respond(200, data)
    finally:
        server.drop_answer(n, uid, other)
