"""The text block of a tool result: what an agent that reads only text sees.

What decides the agent's next step comes first, one line each, never cut but for a caller's ids
(``render``): a ``refused`` {code, message} beside a query's or a poll's answer
(QUERY_SUPERSEDED, POLL_SUPERSEDED, RETRIED_MEANWHILE ...), whether it ``reconciled``, the
status of the envelope and of every envelope an answer holds (``_status``: its error, or
``evidence.outcome``, and the result's status; an envelope's invocation_id, operation and page
right after), what else of each decides what its result is worth (``_marks``: batch items
counted, the unclean listed, ``by_reference``, ``delivery``, base64 and truncated or withheld
streams), an ``api_error``'s code, outcome, retry, field and ``retry_after``, a fetched page's
``result.resume``, and a read tool's own (``_deciding``: get_record's record, each listed action
-- its operation and items as an envelope's -- and target). Only the bulk behind them -- a
stream as one JSON string, the rest of an answer as compact JSON with its strings cut first
(``_shown``) -- is cut at ``PREVIEW`` characters; the structured content keeps the whole answer.
No value makes a line of its own (``_flat``). Before, a 4190-character reconcile answer was
rendered as compact JSON with sorted keys, cut at 2000: ``refused`` sorted last and was cut
away, and the agent read the query's APPROVAL_PENDING as still waiting.
"""

from __future__ import annotations

import functools
import heapq
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from affidavit.text import json_escape, pieces, shown_as_is, shown_outcome

from .tools import WHOLE_FETCH_MOST

__all__ = ["ID", "ITEMS", "PREVIEW", "render"]

ID = 200
"""Characters of a caller's id (a batch item's) the text shows; longer ones are cut, marked."""

ITEMS = 50
"""Batch items that did not commit cleanly listed one line each; the rest are counted."""

LISTED_ITEMS = 3
"""Unclean batch items listed, and kinds counted, per action in ``list_actions`` (``ITEMS`` for
one record): a page of 1000 batch actions listing 50 each was ~54k lines; the record itself has
them all."""

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
        return _lines(_api_error(api))
    if isinstance(answer.get("error"), Mapping) or (
        "result" in answer and answer.get("invocation_id") is not None
    ):
        return _lines(_envelope(answer))
    lines = _deciding(answer)
    # ``refused`` is shown whole above; a record opens the rest: get_record's {events, record}
    # sorted ``events`` first, and an earlier attempt's outcome filled the cut.
    rest = {k: answer[k] for k in sorted(answer, key=lambda k: (k != "record", k))}
    rest.pop("refused", None)
    shown = _shown(rest, [PREVIEW - _ROOM], top=True)
    lines.append(_cut(_flat(json.dumps(shown, ensure_ascii=False, separators=(",", ":")))))
    return _lines(lines)


_ROOM = 100
"""Characters of the JSON line the strings' budget leaves for its syntax and the mark of the
string it cuts: with a budget of all ``PREVIEW`` the line's own cut always fell before that
mark, and a cut string read as whole."""


def _lines(lines: list[str]) -> str:
    return "\n".join(map(_flat, lines))


def _shown(value: Any, budget: list[int], top: bool = False) -> Any:
    """``value`` as the JSON line shows it: every mapping's keys sorted (the top level's order
    kept), every string cut so it is written, escapes included (``_prefix``), in what is left
    of ``budget``, and marked cut; once it is spent, the siblings left are one ``… N more``
    mark, counted, not walked.  ``budget`` is characters of the line, its syntax included,
    shared in the order the line is written (``PREVIEW - _ROOM`` in all).  Dumping the answer
    whole before the cut cost many times its bytes: a reconcile answer whose query body was
    64 Mi "é" peaked at 768 MB and 0.67 s to keep 2000 characters; walking it whole after the
    budget was spent, 200k one-char strings peaked at 44 MB.  This costs what it shows, one
    ``len`` per list on the way and one pass over each mapping's keys (``_first_keys``)."""
    if isinstance(value, str):
        kept, width = _prefix(value, max(budget[0], 0))
        budget[0] -= width + 3  # its quotes and a comma
        if len(kept) == len(value):
            return value
        budget[0] = min(budget[0], 0)  # spent: the line's walk ends here
        return kept + f"… ({len(value)} characters, cut)"
    if isinstance(value, Mapping):
        budget[0] -= 2
        mark = _mark_key(value)
        if budget[0] <= 0:
            return {mark: f"{len(value)} more"} if value else {}
        shown: dict[Any, Any] = {}
        for n, key in enumerate(value if top else _first_keys(value, budget[0])):
            if budget[0] <= 0:
                shown[mark] = f"{len(value) - n} more"
                break
            budget[0] -= _width(str(key)) + 3
            shown[key] = _shown(value[key], budget)
        return shown
    if isinstance(value, list | tuple):
        budget[0] -= 2
        listed = []
        for n, each in enumerate(value):
            if budget[0] <= 0:
                listed.append(f"… {len(value) - n} more")
                break
            listed.append(_shown(each, budget))
        return listed
    budget[0] -= len(str(value)) + 1
    return value


def _mark_key(value: Mapping[Any, Any]) -> str:
    """The key of a mapping's "N more" mark: "…", lengthened until the mapping has no such
    key -- a real "…" key (a remote's) was overwritten by the mark, or read as one."""
    mark = "…"
    while mark in value:
        mark += "…"
    return mark


def _first_keys(value: Mapping[Any, Any], budget: int) -> list[Any]:
    """A mapping's keys in sorted order, only as many as ``budget`` can show: a key and its
    value are written in 5 characters at least (``"":0,``), so at most ``budget // 5 + 2`` are
    walked (the last to find the budget spent and mark the rest).  Sorting them all cost the
    whole mapping: 1M keys 0.14 s and 15 MB to show ~380."""
    return heapq.nsmallest(budget // 5 + 2, value, key=str)


def _prefix(text: str, room: int) -> tuple[str, int]:
    """The longest prefix of ``text`` whose ``_width`` is at most ``room``, and that width:
    only its first ``room`` characters are looked at.  A character is written as 1 to 12
    (``"`` as ``\\"``, a control as ``\\u0001``, U+202E by ``_flat`` as ``\\u202e``, beyond
    the BMP a pair of those): charged one, 1900 U+202E made an 11,394-character line, and a
    quote-heavy body cut the JSON line inside a string, its own "cut" mark lost."""
    kept = text[:room]
    width = _width(kept)
    if width <= room:
        return kept, width
    fits, over = 0, len(kept)  # _width(kept[:fits]) <= room < _width(kept[:over])
    while over - fits > 1:
        mid = (fits + over) // 2
        fits, over = (mid, over) if _width(kept[:mid]) <= room else (fits, mid)
    return kept[:fits], _width(kept[:fits])


def _width(text: str) -> int:
    """Characters ``text`` takes inside a JSON string on a line, escapes included (json.dumps',
    then ``_flat``'s)."""
    return len(_flat(json.dumps(text, ensure_ascii=False))) - 2


def _api_error(api: Mapping[str, Any]) -> list[str]:
    extra = [
        f"{k} {_ident(api[k]) if k == 'field' else api[k]}"
        for k in ("outcome", "retry", "field", "retry_after")
        if k in api
    ]
    return [
        f"api_error {api.get('code')}" + (": " + ", ".join(extra) if extra else ""),
        f"message: {api.get('message', '')}",
    ]


def _status(envelope: Mapping[str, Any]) -> str:
    """An envelope's contract fields on one line: its error's (code, phase, outcome, retry,
    field) or, with none, ``evidence.outcome`` as recorded, first -- never assumed committed,
    ``ok`` only when committed, ``committed (attested)`` when an operator attested it
    (``text.shown_outcome``) -- and the result's HTTP or exit status beside either (a
    REMOTE_REJECTED carries both), then ``evidence.retry_after``: a REMOTE_THROTTLED is
    ``backoff`` only with a Retry-After, whose seconds are the wait (``sdk._delay``)."""
    error = envelope.get("error")
    evidence = envelope.get("evidence")
    evidence = evidence if isinstance(evidence, Mapping) else {}
    result = _result_line(envelope.get("result")) if "result" in envelope else ""
    if evidence.get("retry_after") is not None:
        result += f", retry_after {evidence['retry_after']}"
    if isinstance(error, Mapping):
        return (
            f"error {error.get('code')}: phase {error.get('phase')}, outcome "
            f"{error.get('outcome')}, retry {error.get('retry')}"
            + (f", field {_ident(error['field'])}" if error.get("field") else "")
            + result
        )
    outcome = evidence.get("outcome")
    if outcome == "committed":  # an operator's attestation marked: not the remote's answer
        return f"ok: outcome {shown_outcome(outcome, evidence)}" + result
    # Not "no error: ...": statemachine/envelope.py -- "no error" would read as success.
    return f"outcome {outcome or 'not stated'} (no error object)" + result


def _envelope(answer: Mapping[str, Any]) -> list[str]:
    lines = [_status(answer)]
    if answer.get("invocation_id") is not None:
        lines.append(f"invocation_id {answer['invocation_id']}")
    lines.extend(_operation(answer.get("operation")))
    result = answer.get("result")
    if isinstance(result, Mapping) and isinstance(result.get("resume"), Mapping):
        page = result["resume"]  # a fetch_result page: where the next one starts (null: none)
        lines.append(
            f"page from_chunk {page.get('from_chunk')}, next_chunk "
            f"{json.dumps(page.get('next_chunk'))} (fetch_result from_chunk)"
        )
    error = answer.get("error")
    if isinstance(error, Mapping):
        lines.append(f"message: {error.get('message', '')}")
    lines.extend(_marks(answer))
    if isinstance(result, Mapping):
        for stream in _STREAMS:
            text = result.get(stream)
            if isinstance(text, str) and text:
                lines.append(f"{stream}: {_quoted(text)}")
    return lines


_STREAMS = ("body", "stdout", "stderr")


def _marks(envelope: Mapping[str, Any]) -> list[str]:
    """What else of an envelope decides what its result is worth, one line each: its batch
    items (docs/contract.md: per item; ``_items``), a result kept by reference (not shown: fetch
    it), a delivery this read did not record, a stream given as base64 (not shown), a stream
    not received whole (it decides nothing).  Without them a by-reference or base64 result read
    as a 200 with an empty body, and a kept prefix as the whole body."""
    items = envelope.get("items")
    lines = _items(items) if isinstance(items, list | tuple) else []
    result = envelope.get("result")
    result = result if isinstance(result, Mapping) else {}
    ref = result.get("by_reference")
    if isinstance(ref, Mapping):
        streams = ref.get("streams")
        sizes = ", ".join(
            f"{name} {info.get('bytes')} bytes in {info.get('chunks')} chunks"
            for name, info in (streams.items() if isinstance(streams, Mapping) else ())
            if isinstance(info, Mapping)
        )
        fetch = ref.get("fetch")
        fetch = fetch if isinstance(fetch, Mapping) else {}
        lines.append(
            f"by_reference: {ref.get('bytes')} bytes ({sizes}), sha256 {result.get('sha256')}, "
            f"{ref.get('reason')}: not shown -- fetch_result invocation_id "
            f"{fetch.get('invocation_id')} pages it with from_chunk "
            f"{fetch.get('from_chunk')} and chunks (a page records nothing); without "
            f"from_chunk it is fetched whole and recorded delivered (over "
            f"{WHOLE_FETCH_MOST} bytes refused WHOLE_FETCH_TOO_LARGE: page it)"
        )
    delivery = envelope.get("delivery")
    if isinstance(delivery, Mapping):
        extra = "".join(
            f", {k} {json.dumps(v)}" for k, v in sorted(delivery.items()) if k not in _DELIVERY
        )
        lines.append(
            f"delivery: recorded {json.dumps(delivery.get('recorded'))}{extra}: "
            f"{delivery.get('why')}"
        )
    for name in _STREAMS:
        b64 = result.get(f"{name}_base64")
        if isinstance(b64, str):
            lines.append(
                f"{name}_base64: {len(b64)} characters of base64 (not UTF-8): the bytes are in "
                f"the structured content's result.{name}_base64"
            )
        if result.get(f"{name}_truncated"):
            lines.append(
                f"{name}_truncated: the {name} shown is a prefix, not the whole -- it decides "
                "nothing"
            )
        withheld = result.get(f"{name}_withheld")
        if withheld is not None:
            lines.append(
                f"{name}_withheld: {json.dumps(withheld, sort_keys=True, separators=(',', ':'))}"
                f" -- the {name} was not received whole: it decides nothing"
            )
    return lines


_DELIVERY = ("recorded", "why")


def _operation(op: Any) -> list[str]:
    """The job a 202 accepted, tracked as its own operation: an envelope's or a record's."""
    if not isinstance(op, Mapping):
        return []
    return [f"operation {op.get('id')} state {op.get('state')} (poll_operation)"]


def _items(items: Sequence[Any], cap: int = ITEMS) -> list[str]:
    """A batch's items: one line counting them by (outcome, code, retry), then those that did
    not commit cleanly (another outcome, or a code), the first ``cap`` of them (and of the
    kinds counted); those that are
    not objects are counted apart, malformed.  One line per item made a 1 MiB batch (~110k
    items) 6.1 MB of text with the invocation_id after it."""
    kinds: Counter[tuple[str, str, str]] = Counter()
    unclean: list[str] = []
    for item in items:
        if not isinstance(item, Mapping):
            continue
        kind = (_word(item.get("outcome")), _word(item.get("code")), _word(item.get("retry")))
        kinds[kind] += 1
        if kind[:2] != ("committed", "null"):
            unclean.append(
                f"item {_ident(item.get('id'))}: outcome {kind[0]}, code {kind[1]}, retry {kind[2]}"
            )
    counted = ", ".join(
        f"{n} outcome {o} code {c} retry {r}" for (o, c, r), n in kinds.most_common(cap)
    )
    more = f", {len(kinds) - cap} more kinds" if len(kinds) > cap else ""
    listed = kinds.total()
    if listed < len(items):  # not counted as items: nothing says what they are
        more += f"; {len(items) - listed} more malformed (not objects)"
    head = f"items {listed}: {counted}{more}" if counted else f"items {listed}{more}"
    lines = [head, *unclean[:cap]]
    if len(unclean) > cap:
        lines.append(f"{len(unclean) - cap} more: structured content `items`")
    return lines


def _word(value: Any) -> str:
    """A contract word (an outcome, a code, a retry hint) as shown: null, or cut like an id."""
    if value is None:
        return "null"
    return _cut_id(value) if isinstance(value, str) else _ident(value)


def _ident(value: Any) -> str:
    """A caller's id (a string or an integer) as JSON, cut at ``ID`` characters, marked."""
    if isinstance(value, str):
        return json.dumps(value[:ID], ensure_ascii=False) + _cut_mark(value)
    if value is None or isinstance(value, bool | int | float):
        return _cut_id(json.dumps(value))
    return f"(a JSON {type(value).__name__})"


def _cut_id(text: str) -> str:
    return text[:ID] + _cut_mark(text)


def _cut_mark(text: str) -> str:
    return f"… ({len(text)} characters, cut)" if len(text) > ID else ""


def _deciding(answer: Mapping[str, Any]) -> list[str]:
    """A non-envelope answer's deciding fields, one line each: ``refused`` first, then whether
    it reconciled, the status of each envelope it holds, its operation's state, then each
    envelope's operation and marks (an envelope's items never push a status down), a listing's
    session and truncation, a record's state, outcome, retry, code, field, retry_after,
    operation and items (get_record's, and each of list_actions'), each target's name and
    kind."""
    lines: list[str] = []
    refused = answer.get("refused")
    if isinstance(refused, Mapping):
        lines.append(f"refused {refused.get('code')}: {refused.get('message')}")
    if "reconciled" in answer:
        lines.append(f"reconciled {json.dumps(answer['reconciled'])}")
    inners = [(key, answer[key]) for key in _INNER if isinstance(answer.get(key), Mapping)]
    lines.extend(f"{key} {inner.get('invocation_id')}: {_status(inner)}" for key, inner in inners)
    op = answer.get("operation")
    if isinstance(op, Mapping):
        lines.append(f"operation {op.get('id')} state {op.get('state')}")
    for key, inner in inners:  # below every status: an envelope's items never push one down
        marks = _operation(inner.get("operation")) + _marks(inner)
        lines.extend(f"{key} {line}" for line in marks)
    if isinstance(answer.get("session"), str):
        lines.append(f"session {answer['session']}")
    if "truncated" in answer:
        lines.append(f"total {answer.get('total')}, truncated {json.dumps(answer['truncated'])}")
    if isinstance(answer.get("record"), Mapping):  # get_record
        lines.extend(_record_lines("record", answer["record"]))
    listed_record = functools.partial(_record_lines, cap=LISTED_ITEMS)
    for key, each in (("actions", listed_record), ("targets", _target_lines)):
        listed = answer.get(key)
        if isinstance(listed, list):
            for r in listed:
                lines.extend(each(key[:-1], r) if isinstance(r, Mapping) else ())
    return lines


def _record_lines(label: str, record: Mapping[str, Any], cap: int = ITEMS) -> list[str]:
    """A record's deciding fields (``views.record_to_json``): one line, ``retry_after`` when
    it has one, then its operation and its batch items as an envelope's (``_operation``,
    ``_items``).  Before, these were left to the JSON line, where attempts, budget and evidence
    sort first: a record read committed/never with a pending job and an unknown item unseen.
    An outcome an operator attested reads ``committed (attested)`` (``text.shown_outcome``)."""
    got = {k: record.get(k) for k in ("state", "outcome", "retry", "code")}
    if isinstance(got["outcome"], str):  # attested: marked, as the tables mark it
        got["outcome"] = shown_outcome(got["outcome"], record.get("evidence"))
    name = f"{label} {record.get('invocation_id')}"
    after = record.get("retry_after")
    items = record.get("items")
    return [
        f"{name}: "
        + ", ".join(f"{k} {'null' if v is None else v}" for k, v in got.items())
        + f", field {_ident(record.get('field'))}"  # a caller's path: quoted, cut
        + ("" if after is None else f", retry_after {after}"),
        *(
            f"{name} {line}"
            for line in _operation(record.get("operation"))
            + (_items(items, cap) if isinstance(items, list | tuple) else [])
        ),
    ]


def _target_lines(label: str, target: Mapping[str, Any]) -> list[str]:
    return [f"{label} {target.get('name')}: kind {target.get('kind')}"]


def _result_line(result: Any) -> str:
    if result is None:
        return ", result null"
    if not isinstance(result, Mapping):
        return ""
    parts: Sequence[str] = [
        f"{k} {result[k]}" for k in ("status", "exit_status", "exit_signal") if k in result
    ]
    return (", " + ", ".join(parts)) if parts else ""


def _cut(text: str) -> str:
    """The JSON line, its strings already cut (``_shown``) and escaped (``_flat``), cut at
    ``PREVIEW``: what ``_shown`` does not charge (a long key, deep nesting's marks)."""
    if len(text) <= PREVIEW:
        return text
    return text[:PREVIEW] + "… (cut; the whole answer is in the structured content)"


def _quoted(text: str) -> str:
    """A stream's cut prefix as one JSON string: a remote's bytes never make a line."""
    kept = _prefix(text, PREVIEW)[0]
    shown = json.dumps(kept, ensure_ascii=False)
    if len(kept) == len(text):
        return shown
    return shown + f"… ({len(text)} characters; the whole is in the structured content)"


def _flat(line: str) -> str:
    """``line`` as one line: a message, an id or a path from a caller or a remote cannot print
    a line of its own nor act on what shows it.  What ``affidavit.text`` escapes everywhere (C0
    but the tab, DEL, C1, format characters -- bidi controls, zero-width ones --, the line and
    paragraph separators, lone surrogates, private use, unassigned, and ``INVISIBLE``: variation
    selectors, fillers, spaces but U+0020) is written ``\\uXXXX``, a
    surrogate pair beyond the BMP: inside a JSON string the same character, elsewhere a text no
    value can break into lines (``str.splitlines`` splits on more than newlines)."""
    if shown_as_is(line):
        return line  # the fast path, at C speed
    return "".join(json_escape(c) if esc else c for c, esc in pieces(line, keep="\t"))
