"""What each console page shows, as plain data for its template -- read from the journal with
the same functions every interface uses (``affidavit.approvals``, ``affidavit.views``,
``JournalReader``); nothing here decides anything.

Everything a remote or a caller controls (URLs, header values, bodies, session names, notes)
reaches the templates as data; Jinja2's autoescaping renders it inert and the ``v`` filter
(``text.visible``) shows its control, bidi and zero-width characters as escapes.

What an approval binds is shown whole: the protocol's operator view (``operator_view`` of the
protocol's module, stored with APPROVAL_REQUESTED) is rendered field by field whatever the
protocol, headers unmasked -- a caller may never set the header carrying the injected
credential (``FORBIDDEN_HEADER``), so a mask could only hide what the agent chose -- and a
content (``X`` with ``X_bytes`` and ``X_sha256``: an HTTP body, SSH stdin) with its size and hash,
its text when the view holds it, and "not shown" saying why when it does not.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from affidavit.approvals import pending_page
from affidavit.journal import AlteredRow, AsOf, JournalReader, SessionSummary
from affidavit.statemachine import Code, Outcome, Phase
from affidavit.views import (
    Newest,
    event_to_json,
    metrics,
    metrics_of,
    newest_sessions,
    record_to_json,
    shown_code,
)

from .diagram import lifecycle_svg, path_of
from .verified import KeptVerify

__all__ = [
    "MAX_APPROVALS",
    "MAX_ROWS",
    "PREVIEW",
    "ActionFilters",
    "actions_page",
    "approvals_page",
    "invocation_page",
    "journal_page",
    "journal_sessions",
    "request_fields",
]

PREVIEW = 2000
"""Characters of a stored result's stream shown on the invocation page (the download has all
of it).  Not used for approvals: an operator sees all the approval view holds."""
_FIRST = ("method", "url", "destination", "command")
MAX_ROWS = 500
MAX_APPROVALS = 50
"""Pending requests the approvals page shows (the oldest); it says how many wait in all."""
"""Rows a list page shows at most (the newest; its counts are still of all): every refused
action is journaled, so an agent can make as many rows as it likes, and a page of them all --
reloaded every 5 seconds -- would grow without bound for the operator's browser and the
daemon alike.  The filters narrow the list; ``affidavit actions`` lists everything."""


def _preview(text: Any) -> tuple[str | None, bool]:
    if not isinstance(text, str):
        return None, False
    return text[:PREVIEW], len(text) > PREVIEW


def request_fields(request: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A protocol's operator view as rows to render: ``{"name", "kind", ...}`` with kind
    ``text`` (``value``), ``pairs`` (``pairs``: a mapping such as headers, sorted) or
    ``content`` (``bytes``, ``sha256``, ``text`` or None, ``withheld``: why the text is not
    shown)."""
    contents = sorted(
        k.removesuffix("_sha256")
        for k in request
        if k.endswith("_sha256") and f"{k.removesuffix('_sha256')}_bytes" in request
    )
    used = {f"{c}{s}" for c in contents for s in ("", "_bytes", "_sha256", "_base64")}
    names = [k for k in _FIRST if k in request]
    names += sorted(k for k in request if k not in used and k not in _FIRST)
    rows: list[dict[str, Any]] = []
    for name in names:
        value = request[name]
        if isinstance(value, Mapping):
            pairs = sorted((str(k), _plain(v)) for k, v in value.items())
            rows.append({"name": name, "kind": "pairs", "pairs": pairs})
        else:
            rows.append({"name": name, "kind": "text", "value": _plain(value)})
    for name in contents:
        text = request.get(name)
        size = request[f"{name}_bytes"]
        if isinstance(text, str):
            withheld = None
        elif f"{name}_base64" in request:
            withheld = "binary: not shown"
        else:
            withheld = "larger than the approval view keeps: not shown"
        rows.append(
            {
                "name": name,
                "kind": "content",
                "bytes": size,
                "sha256": request[f"{name}_sha256"],
                "text": text if isinstance(text, str) else None,
                "withheld": withheld,
            }
        )
    return rows


def _plain(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def approvals_page(reader: JournalReader) -> dict[str, Any]:
    """The ``MAX_APPROVALS`` oldest pending requests (``affidavit.approvals.pending_page``: the
    closest to expiring unseen first), each with its request's rows (``request_fields``) and the
    seconds left, and how many wait in all (``total``)."""
    rows = []
    views, total = pending_page(reader, MAX_APPROVALS)
    for view in views:
        request = view.get("request")
        rows.append(
            {
                **view,
                "fields": request_fields(request) if isinstance(request, Mapping) else None,
                # By the view's clock (``expires_in``: the database's on a shared journal).
                "left": int(view.get("expires_in") or 0),
            }
        )
    return {"rows": rows, "total": total}


@dataclasses.dataclass(frozen=True)
class ActionFilters:
    session: str | None = None
    outcome: str | None = None
    phase: str | None = None
    code: str | None = None
    since: float | None = None
    until: float | None = None


OUTCOMES = [o.value for o in Outcome]
PHASES = [p.value for p in Phase]
CODES = sorted(c.value for c in Code)


def actions_page(
    reader: JournalReader, f: ActionFilters, summary: SessionSummary | None = None
) -> dict[str, Any]:
    """The invocation list (``list_actions``'s filters, then the code) and its counts by
    phase x outcome (``views.metrics``): every match counted, the newest ``MAX_ROWS`` shown --
    streamed, so memory is O(MAX_ROWS), not O(journal).  Without a filter, given ``summary``
    (one with ``views.metrics_key`` as its tally), the counts are its kept tallies and the
    rows the page alone (``JournalReader.newest_actions``): O(what changed since the last
    request + the page), not O(journal) -- issue 15; the counts, the total and the rows are
    read in one snapshot (``JournalReader.summarized_page``)."""
    if f == ActionFilters() and summary is not None:
        return _unfiltered_page(reader, summary)
    records = reader.iter_actions(
        session=f.session, outcome=f.outcome, phase=f.phase, since=f.since, until=f.until
    )
    if f.code is not None:
        code = f.code
        records = (r for r in records if shown_code(r) == code)  # the code each row shows
    newest = Newest(MAX_ROWS)
    found = metrics(newest.feed(records))
    return {**_page(found, newest.records, newest.total), "as_of": None}  # (folded now)


def _unfiltered_page(reader: JournalReader, summary: SessionSummary) -> dict[str, Any]:
    tallies, records, total, as_of = reader.summarized_page(summary, MAX_ROWS)
    return {**_page(metrics_of(tallies), records, total), "as_of": as_of.to_json()}


def _page(found: Mapping[str, Any], records: list[Any], total: int) -> dict[str, Any]:
    counts = {(c["phase"], c["outcome"]): c["count"] for c in found["by_phase_outcome"]}
    return {
        "rows": [record_to_json(r, operator=True) for r in reversed(records)],  # newest first
        "matrix": [(ph, [counts.get((ph, oc), 0) for oc in OUTCOMES]) for ph in PHASES],
        "total": total,
    }


EDGE = 50
"""Timeline rows an invocation's page shows at each end: a caller adds a row with every poll of
its operation, and 4,000 rows made a 1.75 MB page rendered in 0.25-0.35 s on the daemon's event
loop (other callers waited: 31 -> 96 ms).  The rows between are "M more", paged through."""

PAGE = 100
"""Timeline rows one page of the rows between shows (``?from=N``)."""


def timeline_rows(count: int, start: int | None) -> list[tuple[int, int] | int]:
    """Which of ``count`` timeline rows a page shows: row numbers, and ``(hidden, link)`` for a
    gap of ``hidden`` rows whose link starts the page that shows them (``?from=link``).  No
    ``start``: the first and last ``EDGE``; else ``PAGE`` rows from ``start``."""
    if start is None:
        if count <= 2 * EDGE + PAGE // 2:
            return list(range(count))
        return [*range(EDGE), (count - 2 * EDGE, EDGE), *range(count - EDGE, count)]
    start = min(start, max(count - PAGE, 0))
    end = min(start + PAGE, count)
    before: list[tuple[int, int] | int] = [(start, max(start - PAGE, 0))] if start else []
    after: list[tuple[int, int] | int] = [(count - end, end)] if end < count else []
    return [*before, *range(start, end), *after]


def invocation_page(
    reader: JournalReader, invocation_id: str, start: int | None = None
) -> dict[str, Any] | None:
    """An invocation's page: its record, attempts, lifecycle, and the timeline rows
    ``timeline_rows`` picks (``start``: the page of them from that row); every row is still
    read (the lifecycle path is the whole timeline's), only those shown are rendered."""
    record = reader.record(invocation_id)
    if record is None:
        return None
    events = reader.events(invocation_id)
    timeline: list[dict[str, Any]] = []
    for row in timeline_rows(len(events), start):
        if isinstance(row, tuple):
            timeline.append({"gap": row[0], "link": row[1]})
            continue
        ev = event_to_json(events[row])
        timeline.append({**ev, "attrs_text": json.dumps(ev["attrs"], sort_keys=True, indent=1)})
    rec = record_to_json(record, operator=True)
    return {
        "record": rec,
        "timeline": timeline,
        "events": len(events),
        "paged": start is not None,
        "attempts": rec["attempts"],
        "evidence_text": json.dumps(rec["evidence"], sort_keys=True, indent=1),
        "svg": lifecycle_svg(path_of(events)),
        "path": path_of(events),
    }


def result_view(envelope: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The stored result of an envelope, bounded for the page."""
    result = (envelope or {}).get("result")
    if not isinstance(result, Mapping):
        return None
    streams = []
    for name in ("body", "stdout", "stderr", "body_base64", "stdout_base64", "stderr_base64"):
        text, cut = _preview(result.get(name))
        if text is not None:
            streams.append({"name": name, "text": text, "cut": cut, "size": len(result[name])})
    meta = {k: v for k, v in result.items() if k not in {s["name"] for s in streams}}
    return {"streams": streams, "meta_text": json.dumps(meta, sort_keys=True, indent=1)}


def journal_page(reader: JournalReader, kept: KeptVerify, whole: bool = False) -> dict[str, Any]:
    """The journal page but its sessions (``journal_sessions`` reads them on their own: a whole
    verify that runs does not hold them, nor they it): ``affidavit journal verify`` (the
    recorded key) as ``kept`` keeps it -- the last whole verify extended to the head
    (``KeptVerify``; ``whole``: run a whole verify now) -- and the last signed checkpoint --
    what ``affidavit journal anchor`` would export."""
    checkpoint = reader.latest_checkpoint()
    head_seq, head_hash = reader.head()
    return {
        **kept.page(reader, whole),
        "checkpoint": None
        if checkpoint is None
        else {
            "seq": checkpoint.seq,
            "hash": checkpoint.hash,
            "at": checkpoint.at,
            "key_id": checkpoint.key_id,
        },
        "head": {"seq": head_seq, "hash": head_hash},
    }


def journal_sessions(reader: JournalReader, summary: SessionSummary | None) -> dict[str, Any]:
    """The sessions, or why they cannot be read: a row the fold meets altered does not hide
    the verify above it (the journal's own words, as every surface shows them)."""
    as_of: AsOf | None = None  # (folded now)
    try:
        if summary is None:
            page = newest_sessions(reader.sessions(), MAX_ROWS)
        else:  # (the page from the order the summary keeps: not every session's entry)
            page, as_of = reader.summarized_session_page(summary, MAX_ROWS)
    except AlteredRow as exc:
        return {
            "sessions": [],
            "sessions_total": 0,
            "sessions_error": str(exc),
            "sessions_as_of": None,
        }
    marker = None if as_of is None else as_of.to_json()
    # The ``MAX_ROWS`` sessions seen last (any agent can name as many as it likes), in the
    # reader's order, and how many there are.
    return {
        "sessions": page["sessions"],
        "sessions_total": page["total"],
        "sessions_error": None,
        "sessions_as_of": marker,
    }
