"""The text block of a tool result: what an agent that reads only text sees.

What decides the agent's next step comes first and is never cut: an envelope's ``error`` {code,
phase, outcome, retry, field} (and a fetched page's ``result.resume``), an ``api_error``'s code,
outcome, retry, field and ``retry_after``, a ``refused`` {code, message} beside a query's or a
poll's answer (a ``reconcile_query`` or ``poll_operation`` refused after it ran:
QUERY_SUPERSEDED, POLL_SUPERSEDED, RETRIED_MEANWHILE ...), and the status of every envelope an
answer holds. Only the bulk behind them -- a result's body, the rest of an answer as compact
JSON -- is cut at ``PREVIEW`` characters; the structured content keeps the whole answer. Before,
a 4190-character reconcile answer was rendered as compact JSON with sorted keys, cut at 2000:
``refused`` sorted last and was cut away, and the agent read the query's APPROVAL_PENDING as
still waiting.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["PREVIEW", "render"]

PREVIEW = 2000
"""Characters of a result's body (or stdout), or of an answer's compact JSON, the text shows;
the whole of it is in the structured content."""

_INNER = ("envelope", "query", "poll")
"""The envelopes a reconcile_query ({reconciled, envelope, query}) or poll_operation
({operation, poll}) answer holds, each summarised by ``_status`` ahead of the cut."""


def render(answer: Mapping[str, Any]) -> str:
    """A short text rendering for clients that show only text: first what decides the next
    step (never cut), then an envelope's result or any other answer's compact JSON, cut."""
    api = answer.get("api_error")
    if isinstance(api, Mapping):
        return "\n".join(_api_error(api))
    if isinstance(answer.get("error"), Mapping) or (
        "result" in answer and answer.get("invocation_id") is not None
    ):
        return "\n".join(_envelope(answer))
    lines = _deciding(answer)
    rest = {k: v for k, v in answer.items() if k != "refused"}  # shown whole above
    lines.append(_cut(json.dumps(rest, sort_keys=True, separators=(",", ":"))))
    return "\n".join(lines)


def _api_error(api: Mapping[str, Any]) -> list[str]:
    extra = [f"{k} {api[k]}" for k in ("outcome", "retry", "field", "retry_after") if k in api]
    return [
        f"daemon error {api.get('code')}" + (": " + ", ".join(extra) if extra else ""),
        str(api.get("message", "")),
    ]


def _status(envelope: Mapping[str, Any]) -> str:
    """An envelope's contract fields on one line."""
    error = envelope.get("error")
    if isinstance(error, Mapping):
        return (
            f"error {error.get('code')}: phase {error.get('phase')}, outcome "
            f"{error.get('outcome')}, retry {error.get('retry')}"
            + (f", field {error['field']}" if error.get("field") else "")
        )
    return "ok: outcome committed" + _result_line(envelope.get("result"))


def _envelope(answer: Mapping[str, Any]) -> list[str]:
    lines = [_status(answer)]
    error = answer.get("error")
    if isinstance(error, Mapping):
        lines.append(str(error.get("message", "")))
    if answer.get("invocation_id") is not None:
        lines.append(f"invocation_id {answer['invocation_id']}")
    if isinstance(answer.get("operation"), Mapping):
        op = answer["operation"]
        lines.append(f"operation {op.get('id')} state {op.get('state')} (poll_operation)")
    result = answer.get("result")
    if isinstance(result, Mapping) and isinstance(result.get("resume"), Mapping):
        page = result["resume"]  # a fetch_result page: where the next one starts (null: none)
        lines.append(
            f"page from_chunk {page.get('from_chunk')}, next_chunk "
            f"{json.dumps(page.get('next_chunk'))} (fetch_result from_chunk)"
        )
    if isinstance(result, Mapping):
        for stream in ("body", "stdout", "stderr"):
            text = result.get(stream)
            if isinstance(text, str) and text:
                lines.append(f"{stream}: {_cut(text)}")
    return lines


def _deciding(answer: Mapping[str, Any]) -> list[str]:
    """A non-envelope answer's deciding fields, one line each: ``refused`` first, then whether
    it reconciled, each envelope it holds, its operation's state, a listing's truncation."""
    lines: list[str] = []
    refused = answer.get("refused")
    if isinstance(refused, Mapping):
        lines.append(f"refused {refused.get('code')}: {refused.get('message')}")
    if "reconciled" in answer:
        lines.append(f"reconciled {json.dumps(answer['reconciled'])}")
    for key in _INNER:
        inner = answer.get(key)
        if isinstance(inner, Mapping):
            lines.append(f"{key} {inner.get('invocation_id')}: {_status(inner)}")
    op = answer.get("operation")
    if isinstance(op, Mapping):
        lines.append(f"operation {op.get('id')} state {op.get('state')}")
    if "truncated" in answer:
        lines.append(f"total {answer.get('total')}, truncated {json.dumps(answer['truncated'])}")
    return lines


def _result_line(result: Any) -> str:
    if not isinstance(result, Mapping):
        return ""
    parts: Sequence[str] = [
        f"{k} {result[k]}" for k in ("status", "exit_status", "exit_signal") if k in result
    ]
    return (", " + ", ".join(parts)) if parts else ""


def _cut(text: str) -> str:
    if len(text) <= PREVIEW:
        return text
    return text[:PREVIEW] + f"… ({len(text)} characters; the whole is in the structured content)"
