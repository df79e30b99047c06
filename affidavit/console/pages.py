"""What each console page shows, as plain data for its template -- read from the journal with
the same functions every interface uses (``affidavit.approvals``, ``affidavit.views``,
``JournalReader``); nothing here decides anything.

Everything a remote or a caller controls (URLs, header values, bodies, session names, notes)
reaches the templates as data, and Jinja2's autoescaping renders it inert.  Bodies are shown
bounded; header values whose name says they carry a credential are masked even though a
caller's headers never hold the broker's (the credential is injected at dispatch).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from typing import Any

from affidavit.approvals import pending
from affidavit.journal import JournalReader
from affidavit.statemachine import Code, Outcome, Phase
from affidavit.views import event_to_json, metrics, record_to_json

from .diagram import lifecycle_svg, path_of

__all__ = [
    "PREVIEW",
    "ActionFilters",
    "actions_page",
    "approvals_page",
    "invocation_page",
    "journal_page",
]

PREVIEW = 2000
"""Characters of a body shown on a page (the download has all of the stored result)."""
SENSITIVE = ("authorization", "cookie", "token", "secret", "password", "api-key", "apikey")


def _masked(headers: Any) -> list[tuple[str, str]]:
    if not isinstance(headers, Mapping):
        return []
    out = []
    for name, value in sorted(headers.items()):
        hidden = any(word in str(name).lower() for word in SENSITIVE)
        out.append((str(name), "(hidden)" if hidden else str(value)))
    return out


def _preview(text: Any) -> tuple[str | None, bool]:
    if not isinstance(text, str):
        return None, False
    return text[:PREVIEW], len(text) > PREVIEW


def approvals_page(reader: JournalReader) -> list[dict[str, Any]]:
    """The pending requests (``affidavit.approvals.pending``), each with what the page
    renders: headers masked, the body bounded."""
    rows = []
    for view in pending(reader):
        request = view.get("request") or {}
        body, cut = _preview(request.get("body"))
        rows.append(
            {
                **view,
                "headers": _masked(request.get("headers")),
                "body_preview": body,
                "body_cut": cut,
                "left": max(0, int(float(view.get("expires_at") or 0) - time.time())),
            }
        )
    return rows


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


def actions_page(reader: JournalReader, f: ActionFilters) -> dict[str, Any]:
    """The invocation list (``list_actions``'s filters, then the code) and its counts by
    phase x outcome (``views.metrics``)."""
    records = reader.list_actions(
        session=f.session, outcome=f.outcome, phase=f.phase, since=f.since, until=f.until
    )
    if f.code is not None:
        records = [r for r in records if (r.code.value if r.code else "OK") == f.code]
    counts = {(c["phase"], c["outcome"]): c["count"] for c in metrics(records)["by_phase_outcome"]}
    return {
        "rows": [record_to_json(r) for r in reversed(records)],  # newest first
        "matrix": [(ph, [counts.get((ph, oc), 0) for oc in OUTCOMES]) for ph in PHASES],
        "total": len(records),
    }


def invocation_page(reader: JournalReader, invocation_id: str) -> dict[str, Any] | None:
    record = reader.record(invocation_id)
    if record is None:
        return None
    events = reader.events(invocation_id)
    timeline = []
    for ev in map(event_to_json, events):
        attrs = ev["attrs"]
        timeline.append({**ev, "attrs_text": json.dumps(attrs, sort_keys=True, indent=1)})
    rec = record_to_json(record)
    return {
        "record": rec,
        "timeline": timeline,
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


def journal_page(reader: JournalReader) -> dict[str, Any]:
    """``affidavit journal verify`` (the recorded key), the last signed checkpoint -- what
    ``affidavit journal anchor`` would export -- and the sessions."""
    report = reader.verify()
    checkpoint = reader.latest_checkpoint()
    head_seq, head_hash = reader.head()
    return {
        "report": dataclasses.asdict(report),
        "checkpoint": None
        if checkpoint is None
        else {
            "seq": checkpoint.seq,
            "hash": checkpoint.hash,
            "at": checkpoint.at,
            "key_id": checkpoint.key_id,
        },
        "head": {"seq": head_seq, "hash": head_hash},
        "sessions": reader.sessions(),
    }
