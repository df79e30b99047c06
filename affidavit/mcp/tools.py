"""The MCP tools as data: names, descriptions that teach the contract, input schemas, the read
tools' argument checks, and how an answer becomes a tool result.

Pure: no engine, journal or SDK here.  The action tools (``http_request``, ``ssh_exec``, any
registered protocol's) come from the catalog (``affidavit.protocols.catalog``) -- the broker's
own, or the daemon's ``GET /v1/catalog`` -- so their schemas are the parser's declarations.  The
read tools' parameters are declared once below (``Param``): their schema and their check are
both derived from the declaration.

A tool's answer is a JSON object, handed over as the result's structured content beside a short
text rendering (``render.py``); ``is_error`` is true exactly when it carries an ``error`` (an
envelope's, or one this layer found before anything was invoked) or an ``api_error`` (the
daemon could not answer).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from affidavit.api.wire import MAX_COUNT, MAX_RESULT_PAGE_CHUNKS, RESULT_PAGE_CHUNKS
from affidavit.session import MAX_SESSION, SESSION_CHARS, SESSION_WORDS

__all__ = [
    "CONTRACT",
    "NOT_SENT",
    "READ_TOOLS",
    "ArgumentError",
    "Param",
    "ReadTool",
    "act_refused",
    "action_tool_doc",
    "api_error",
    "is_error",
    "non_finite",
    "refusal",
    "visible_name",
]

CONTRACT = (
    "The answer is an envelope: `result`, or `error` {code, phase, outcome, retry, message, "
    "field}, and `evidence`. Branch on `outcome` and `retry`, never on the message. outcome: "
    "`not_attempted` nothing was sent; `rejected` or `committed` the remote answered (committed "
    "is not success: read the result); `unknown` it may have run. retry: `after_correction` fix "
    "`field`; `backoff` or `same_idempotency_key` call again (with the same idempotency_key); "
    "`fetch_result` call fetch_result with the invocation_id -- a read, nothing is sent again; "
    "`reconcile` check the remote state yourself and never repeat the call; `never` do not. "
    "An `operation` (a job a 202 accepted) is followed with poll_operation, never resubmitted. "
    "No envelope: `api_error` {code, message, outcome, retry, field, retry_after} -- the "
    "broker could not answer; the same `outcome` and `retry` decide (`unknown`: the action may "
    "have run, never resend it blindly; `retry_after`: seconds to wait), never its code: one "
    "code may come before a call was sent or after (SHUTTING_DOWN, JOURNAL_READ_DECLINED), so "
    "read `outcome` and `retry`. Codes: OVERLOADED, SHUTTING_DOWN, DAEMON_UNAVAILABLE, "
    "JOURNAL_READ_DECLINED, ANSWERS_IN_FLIGHT, BODIES_IN_FLIGHT, VIEWS_IN_FLIGHT, RATE_LIMITED, "
    "ANSWER_LOST, "
    "CALLER_GONE (an answer lost on its "
    "way: list_actions for the action's session, then fetch_result), INTERNAL, "
    "JOURNAL_UNAVAILABLE, JOURNAL_UNREADABLE, RESULT_UNVERIFIED, CLIENT_ERROR and the daemon's "
    "refusals."
)


def action_tool_doc(doc: str) -> str:
    return f"{doc} {CONTRACT}".strip()


class ArgumentError(Exception):
    """A read tool's argument is wrong: nothing was invoked, so nothing is journaled."""

    def __init__(self, field: str, message: str, code: str = "INVALID_FIELD") -> None:
        self.field = field
        self.message = message
        self.code = code
        super().__init__(f"{field}: {message}")


def refusal(code: str, field: str, message: str) -> dict[str, Any]:
    """An error found before anything was invoked: the envelope's ``error`` object with the
    validation phase's facts, and no invocation id (there is none)."""
    return {
        "error": {
            "code": code,
            "phase": "validation",
            "outcome": "not_attempted",
            "retry": "after_correction",
            "message": message,
            "field": field,
        }
    }


NOT_SENT: dict[str, str] = {
    "OVERLOADED": "backoff",
    "SHUTTING_DOWN": "backoff",
    "TOO_MANY_CONNECTIONS": "backoff",
    "RATE_LIMITED": "backoff",  # this uid's [service] call_rate: nothing journaled (shares.py)
    "DAEMON_UNAVAILABLE": "backoff",
    "REQUEST_TIMEOUT": "backoff",
    "BAD_JSON": "after_correction",
    "BAD_REQUEST": "after_correction",
    "INVALID_FIELD": "after_correction",
    "BODY_TOO_LARGE": "after_correction",
    "BODIES_IN_FLIGHT": "backoff",  # the daemon did not read the body (http.py)
    "CHUNKS_TOO_SMALL": "after_correction",  # a body of tiny chunks (h11server.py)
    "ANSWER_TOO_LARGE": "never",  # never held whole: read it in parts (results.held)
    "DAEMON_SOCKET_UNSAFE": "never",
    # a poll's or a reconciliation query's refusals (``act_refused``)
    "STILL_RUNNING": "backoff",
    "QUERY_PENDING": "backoff",
    "POLL_PENDING": "backoff",
    "POLL_TOO_SOON": "backoff",  # polled within operations.min_poll_interval: retry_after
    "NOT_UNKNOWN": "never",
    "NO_QUERY": "never",
    "BATCH_NOT_ATOMIC": "never",
    "CONFIG_CHANGED": "never",
    "OPERATION_ERROR": "never",
}
"""Codes with which the daemon (or this process) refuses a request before its action is sent
-- what ``api_error`` says of them with ``sent=False`` -- and the retry hint each gets.  Any
other code refusing a read (nothing is sent for one) is ``backoff``, but ``STANDING``'s."""

STANDING = frozenset({"JOURNAL_UNREADABLE", "RESULT_UNVERIFIED"})
"""A journal's failure that no outage explains, met again until an operator restores the journal
(``engine.call_failure``): a read failing so is ``never``, not ``backoff``."""


def api_error(
    code: str,
    message: str,
    field: str | None = None,
    *,
    sent: bool,
    retry: str | None = None,
    retry_after: int | None = None,
) -> dict[str, Any]:
    """The daemon could not answer (unreachable, the connection lost, an API-level refusal):
    its ``{"api_error": ...}`` shape, never dressed up as an envelope -- with the ``field`` to
    fix when the daemon's refusal named one (a 400 at ``body.timeout``), and the contract's
    own words for what an agent branches on: ``outcome`` ``not_attempted`` when nothing was
    sent (``sent=False``), else ``unknown`` -- the action may have run, and its ``retry``
    (``reconcile`` unless told) never invites a blind resend.  ``retry_after``: the seconds
    the daemon asked for (``Retry-After``)."""
    error: dict[str, Any] = {"code": code, "message": message}
    if field is not None:
        error["field"] = field
    if sent:
        error["outcome"], error["retry"] = "unknown", retry or "reconcile"
    else:
        standing = "never" if code in STANDING else "backoff"
        error["outcome"], error["retry"] = "not_attempted", retry or NOT_SENT.get(code, standing)
    if retry_after is not None:
        error["retry_after"] = retry_after
    return {"api_error": error}


def act_refused(
    code: str, message: str, field: str | None, argument: str, retry_after: int | None = None
) -> dict[str, Any]:
    """A poll or a reconciliation query the broker refused before anything was sent, answered
    as the daemon's socket API answers it -- one mapping for both backends (embedded: the
    ``OperatorError`` or ``OperationError``; through the daemon: its 4xx).  A refusal's
    ``field`` is the part of the request to change, so a refusal where the id is right (wait,
    check by hand: QUERY_PENDING, BATCH_NOT_ATOMIC, STILL_RUNNING) names none.  A refusal naming
    the tool's ``argument`` as the part to fix (the id names nothing: NO_SUCH_INVOCATION, an
    unknown operation) is ``INVALID_FIELD`` there, retry after_correction, as fetch_result
    answers an unknown id; any other keeps the daemon's code as an ``api_error`` --
    STILL_RUNNING (query again once the call ends), NOT_UNKNOWN, NO_QUERY, CONFIG_CHANGED (the
    target now reaches another account than the dispatch did), BATCH_NOT_ATOMIC, QUERY_PENDING,
    OPERATION_ERROR
    (a job with nothing to query) -- never dressed as a validation refusal whose
    after_correction would have the agent change an argument that is right."""
    if field == argument:
        return refusal("INVALID_FIELD", argument, message)
    return api_error(code, message, field, sent=False, retry_after=retry_after)


def non_finite(args: Mapping[str, Any]) -> str | None:
    """Where a tool's arguments hold a number JSON cannot: a literal like ``1e400``, which the
    parser reads as infinity (the transport refuses ``NaN``/``Infinity`` themselves) -- the
    field's path (``body``, ``headers.X-A``; a list's own path), ``action`` when that path is
    not plain enough to quote; None when every number is finite.  Checked for both backends
    alike, before either runs: embedded, the parser would see a float where it wants a string
    (or a field it does not know), and the proxy would send ``Infinity``, never sent to it."""
    stack: list[tuple[Any, str]] = [(v, str(k)) for k, v in args.items()]
    while stack:  # bounded by the transport's prescan: 11,000 values, 200 levels
        value, path = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return path if visible_name(path) and len(path) <= 200 else "action"
        if isinstance(value, dict):
            stack.extend((v, f"{path}.{k}") for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, path) for v in value)
    return None


_VISIBLE_CHARS = r"[\x21-\x7e]+"
_VISIBLE = re.compile(r"[\x21-\x7e]{1,255}")


def visible_name(text: str) -> bool:
    """Whether a caller's name may be quoted back: 1-255 visible ASCII characters."""
    return _VISIBLE.fullmatch(text) is not None


@dataclass(frozen=True)
class Param:
    """One read tool parameter: its schema and its check both come from here."""

    name: str
    doc: str
    type: str = "string"
    required: bool = False
    values: tuple[str, ...] = ()
    minimum: int = 0
    maximum: int | None = None
    chars: str = _VISIBLE_CHARS
    """A string's pattern (matched whole; Python's and ECMA-262's alike)."""
    max_length: int = 255
    words: str = "1-255 visible ASCII characters"
    """How a refusal of a string that breaks ``chars`` or ``max_length`` says it."""

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "description": self.doc}
        if self.type == "string":
            if self.values:
                out["enum"] = list(self.values)
            else:
                out.update(maxLength=self.max_length, pattern=f"^(?:{self.chars})$")
        else:
            out["minimum"] = self.minimum
            if self.maximum is not None:
                out["maximum"] = self.maximum
        return out

    def read(self, args: Mapping[str, Any]) -> Any:
        value = args.get(self.name)
        if value is None:
            if self.required:
                raise ArgumentError(self.name, "is required", "MISSING_FIELD")
            return None
        if self.type == "integer":
            # JSON Schema's integer is a number with no fraction: 5.0 and 1e2 are integers
            # (audit 53c), read as the int they are, once within the bounds.
            whole = isinstance(value, float) and math.isfinite(value) and value.is_integer()
            if not (whole or isinstance(value, int)) or isinstance(value, bool):
                raise ArgumentError(self.name, f"must be a whole number >= {self.minimum}")
            if value < self.minimum:
                raise ArgumentError(self.name, f"must be a whole number >= {self.minimum}")
            if self.maximum is not None and value > self.maximum:
                raise ArgumentError(self.name, f"must be at most {self.maximum}")
            return int(value)
        if not isinstance(value, str):
            raise ArgumentError(self.name, "must be a string")
        if self.values and value not in self.values:
            raise ArgumentError(self.name, "must be one of " + ", ".join(self.values))
        if not self.values and (
            len(value) > self.max_length or re.fullmatch(self.chars, value) is None
        ):
            raise ArgumentError(self.name, f"must be {self.words}")
        return value


@dataclass(frozen=True)
class ReadTool:
    name: str
    doc: str
    params: tuple[Param, ...]
    read_only: bool = True

    def input_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {p.name: p.schema() for p in self.params},
            "required": [p.name for p in self.params if p.required],
            "additionalProperties": False,
        }

    def read(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """The arguments, checked; ``ArgumentError`` for the first wrong or unknown one."""
        known = {p.name for p in self.params}
        for key in sorted(args):
            if key not in known:
                raise ArgumentError(key if visible_name(key) else "arguments", "unknown")
        return {p.name: p.read(args) for p in self.params}


_ID = Param("invocation_id", "the envelope's invocation_id", required=True)
OUTCOMES = ("not_attempted", "rejected", "committed", "unknown")

LINE_MOST = 64 * 1024 * 1024
"""The transport's own bound on a JSON-RPC line (``transport.MAX_LINE``, on input): the one a
whole fetch's answer line is kept under (tests/mcp/test_fetch_pointer.py checks they agree)."""

WHOLE_FETCH_MOST = (LINE_MOST - 1024 * 1024) // 6
"""The most stored result bytes a whole ``fetch_result`` answers (10.5 MiB): a stored byte
costs at most 6 bytes of the JSON-RPC line (a control character is escaped ``\\u0001``), and
1 MiB is left for the rest of the answer (the envelope's other fields, the text's 2000-character
preview), so the line stays under ``LINE_MOST`` whatever the body holds.  Past it the fetch is
refused ``WHOLE_FETCH_TOO_LARGE`` at ``from_chunk`` (page it; nothing recorded, the line never
built).  Review 53c: a 24 MiB body made a 25 MB line in 9 s, ``max_result`` allows 1 GiB, and
16 MiB - 1 of ``\\x01`` counted by stored bytes made a 100,663,484-byte line."""

READ_TOOLS: dict[str, ReadTool] = {
    t.name: t
    for t in (
        ReadTool(
            "fetch_result",
            "The stored envelope of an invocation: a read -- nothing is sent to the remote "
            "again, whatever retry said. Use it after retry `fetch_result`, or to find out what "
            "became of a call whose answer you lost. `from_chunk` resumes a long result a "
            f"page at a time: `chunks` (default {RESULT_PAGE_CHUNKS}, at most "
            f"{MAX_RESULT_PAGE_CHUNKS}) of each stream from that chunk on, with "
            "`result.resume` -- its `next_chunk` is where the next page starts (null: none). "
            "Only a whole fetch (no `from_chunk`) records the result delivered; a page never "
            f"does. A whole fetch of a result over {WHOLE_FETCH_MOST} bytes is refused "
            "(WHOLE_FETCH_TOO_LARGE at from_chunk): page it.",
            (
                _ID,
                Param("from_chunk", "resume from this chunk", type="integer", maximum=MAX_COUNT),
                Param(
                    "chunks",
                    "the page's chunks of each stream (with from_chunk)",
                    type="integer",
                    minimum=1,
                    maximum=MAX_RESULT_PAGE_CHUNKS,
                ),
            ),
        ),
        ReadTool(
            "get_record",
            "The journal's record of an invocation and its events: the evidence behind every "
            "field of its envelope. A read.",
            (_ID,),
        ),
        ReadTool(
            "list_targets",
            "The configured targets: kind, what each allows, which methods or commands it "
            "treats as idempotent, its idempotency contract, its description. Also names this "
            "connection's `session`. A read.",
            (),
        ),
        ReadTool(
            "list_actions",
            "Invocations, newest last: by default this connection's own session (an explicit "
            "`session` names another, e.g. an earlier connection's). Only the newest `limit`: "
            "`total` says how many there are, `truncated` true that older ones were left out. "
            "A read.",
            (
                Param(
                    "session",
                    "the session to list (default: this connection's)",
                    chars=SESSION_CHARS,
                    max_length=MAX_SESSION,
                    words=SESSION_WORDS,
                ),
                Param("outcome", "only this outcome", values=OUTCOMES),
                Param("limit", "at most this many, newest (default 50)", "integer", maximum=1000),
            ),
        ),
        ReadTool(
            "poll_operation",
            "Query the status resource of a job a 202 accepted (`operation.id` of an envelope) "
            "once, as an invocation of its own; the submission is never sent again. The answer is "
            "{operation, poll, refused?}: `poll` is that query's envelope (null when the job had "
            "already ended and nothing was sent). Under the target's approval a poll answers "
            "APPROVAL_PENDING in `poll`; until it is decided and read, polling again is refused "
            "POLL_PENDING (an `api_error`: wait, nothing was sent) -- once approved the next poll "
            "sends it or reads its answer. POLL_TOO_SOON (an `api_error`, `retry_after`): polled "
            "within the target's min_poll_interval, by anyone -- nothing sent, the job still "
            "pending; poll again after it. OPERATION_ERROR: check the job by hand. A poll that ran "
            "and came back still open (APPROVAL_PENDING, or being sent) while another asker "
            "closed that poll (and perhaps opened another), or the job ended meanwhile, answers "
            "`refused` "
            "{code POLL_SUPERSEDED, message} beside `poll`: this answer was not recorded (the "
            "message names the row that closed it, which stands, or the one that ended the job) "
            "-- the poll is not waiting on you: poll again.",
            (Param("operation_id", "the envelope's operation.id", required=True),),
            read_only=False,
        ),
        ReadTool(
            "reconcile_query",
            "After an `unknown` outcome (retry `reconcile`): run the target's configured "
            "reconciliation query once, as an invocation of its own -- the original call is never "
            "sent again. The answer is {reconciled, envelope, query, refused?}: `envelope` is the "
            "original's, settled (`evidence.source` remote_query) only when the query's own "
            "complete answer proves the effect present or absent; else it stays unknown. Only an "
            "operator can attest an outcome; no tool does. Refused before anything is sent (an "
            "`api_error`, the id is right): STILL_RUNNING (query once the call ends), NOT_UNKNOWN "
            "(already settled: fetch_result), NO_QUERY and CONFIG_CHANGED (check by hand), "
            "BATCH_NOT_ATOMIC (a batch applied item by item: check each item by hand), "
            "QUERY_PENDING (an earlier query awaits an operator: query again once it is decided). "
            "Under the target's approval a query answers APPROVAL_PENDING in `query`. A query that "
            "ran but whose finding the record no longer takes answers `reconciled` false and "
            "`refused` {code, message} -- what the record shows now: RETRIED_MEANWHILE (a same-key "
            "retry took it over and ended unknown again: query again), STILL_RUNNING, NOT_UNKNOWN, "
            "QUERY_SUPERSEDED (it came back still open -- APPROVAL_PENDING, or being sent -- while "
            "another asker closed that query (and perhaps opened another): this answer was not "
            "recorded, "
            "the query is not waiting on you -- query again), ROW_REFUSED (its row was refused "
            "for a reason no race explains: a bug to report; the answer in `query` is kept, not "
            "recorded).",
            (_ID,),
            read_only=False,
        ),
    )
}


def is_error(answer: Mapping[str, Any]) -> bool:
    """The tool result's ``isError``: the answer carries an error of the envelope's kind or of
    the API's -- for ``poll_operation``, the poll's own envelope; for ``reconcile_query``,
    whether the outcome is still unknown."""
    if "error" in answer or "api_error" in answer or answer.get("reconciled") is False:
        return True
    poll = answer.get("poll")
    return isinstance(poll, Mapping) and "error" in poll
