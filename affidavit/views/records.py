"""Views over the journal as plain data, shared by every interface (CLI, Python API, daemon,
MCP, console): a projected record and its events as JSON, and the metrics counts.

Enums become their string values; nothing here reads a sealed payload, so no view can show a
secret the journal's plaintext columns do not hold (and they hold none)."""

from __future__ import annotations

import json
import json.encoder
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, cast

from affidavit.statemachine import (
    NOTHING_SENT_YET,
    STATES,
    Event,
    HolderTag,
    Outcome,
    Phase,
    Record,
    Retry,
    caller_event,
    caller_evidence,
    caller_record,
    current_code,
    hashes_withheld,
    shown_evidence,
    shown_items,
)

if TYPE_CHECKING:
    from affidavit.journal import JournalReader, SessionSummary

__all__ = [
    "Newest",
    "actions_page",
    "event_to_json",
    "metrics",
    "metrics_key",
    "metrics_of",
    "newest_sessions",
    "plain",
    "prometheus_text",
    "record_json_encoder",
    "record_to_json",
    "record_view",
    "shown_code",
    "shown_error",
    "shown_retry",
]


_SCALARS = frozenset({str, int, float, bool, type(None)})


def plain(value: Any) -> Any:
    # Exact types first: a record holds mostly these, and the Mapping check below is an ABC
    # check (issue 15: a third of `actions --json`'s time over 1M events went here).
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:
        return {str(k): plain(v) for k, v in value.items()}
    if kind is list:
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if hasattr(value, "value") and isinstance(value.value, str):  # StrEnum
        return value.value
    return value


def shown_retry(rec: Record) -> str:
    """The retry hint a view shows for ``rec``: its own once it rests in a final state;
    ``fetch_result`` while it does not -- an attempt runs, waits for an operator, or its broker
    stopped and its lease has not run out.  Then a same-key call answers IN_PROGRESS and a new
    call would be a second active attempt (seed: "allow only one active attempt"), so the view
    says what the envelope says, not the hint of an attempt that is no longer the current one
    (docs/contract.md, "When the hint is computed")."""
    return rec.retry.value if rec.final else _FETCH


_FETCH = Retry.FETCH_RESULT.value


def shown_error(rec: Record) -> tuple[str | None, str, str | None]:
    """The ``code``, ``message`` and ``field`` a view shows for ``rec``: its own, unless it
    rests in no final state and they are a previous attempt's (``statemachine.current_code``,
    which the approvals' view shows by too) -- a retry holds its lease and
    sets up (``retry_pending``; ``validated`` after a refusal that asked to back off), and the
    projection still holds the code that ended the attempt before it.  Shown as the current
    one beside ``fetch_result``, that code claimed what the running attempt has not done; the
    view shows none (the earlier attempt's code stays in its ``attempts`` entry and its
    events).  A non-final record's own code is shown: APPROVAL_PENDING while it waits, and the
    complete result of the running attempt (``completed_*``) before it is stored."""
    code = current_code(rec)
    if code is not None:
        return code.value, rec.message, rec.field
    if not rec.final and not rec.evidence.get("dispatch_started"):
        # Running, no attempt dispatched: what its envelope's IN_PROGRESS says -- nothing sent
        # so far, a new call safe once it ends not_attempted (``NOTHING_SENT_YET``).
        return None, NOTHING_SENT_YET, None
    if rec.code is None:  # none of its own: its message and field, as they are
        return None, rec.message, rec.field
    return None, "", None


def shown_code(rec: Record) -> str:
    """The code ``rec`` is counted and filtered under (``metrics``, the console's and the
    daemon's code filter): the one its views show (``shown_error``), ``OK`` when they show
    none -- a running retry is not counted under the code of the attempt before it, which no
    view of it shows."""
    code = current_code(rec)
    return "OK" if code is None else code.value


def record_to_json(
    rec: Record, *, operator: bool = False, holder: HolderTag | None = None
) -> dict[str, Any]:
    """A projected record as plain JSON (enums as their values).  A caller's (``operator``
    False, the default) shows its lease's holder as ``holder`` tags it (the journal's
    ``holder_tag``; none: withheld) and withholds a hash recorded before hashes were keyed
    (``caller_record``: it would confirm a guessed credential reference); an operator's view
    shows both as recorded."""
    return _record_fields(rec if operator else caller_record(rec, holder), plain)


def record_view(
    rec: Record,
    events: Iterable[Event],
    *,
    operator: bool = False,
    holder: HolderTag | None = None,
) -> dict[str, Any]:
    """One invocation's record and its events, as ``record`` answers: for a caller, the
    holder and the hashes its record withholds are withheld from the events' attrs too
    (``caller_event``)."""
    if operator:
        events_json = list(map(event_to_json, events))
        return {"record": record_to_json(rec, operator=True), "events": events_json}
    withheld = hashes_withheld(rec)
    return {
        "record": record_to_json(rec, holder=holder),
        "events": [event_to_json(caller_event(e, withheld, holder)) for e in events],
    }


def _record_fields(rec: Record, conv: Callable[[Any], Any]) -> dict[str, Any]:
    """The record's JSON object, its nested values passed through ``conv``."""
    code, message, field = shown_error(rec)
    return {
        "invocation_id": rec.invocation_id,
        "state": rec.state,
        "phase": rec.phase.value,
        "outcome": rec.outcome.value,
        "retry": shown_retry(rec),
        "code": code,
        "message": message,
        "field": field,
        "session": rec.session,
        "target": rec.target,
        "protocol": rec.protocol,
        "idempotent": rec.idempotent,
        "fingerprint": rec.fingerprint,
        "idempotency": conv(rec.idempotency) if rec.idempotency is not None else None,
        "generation": rec.generation,
        "budget": {"total": rec.budget.total, "used": rec.budget.used, "left": rec.budget.left},
        "attempts": conv(rec.attempts),
        "evidence": conv(shown_evidence(rec)),
        "retry_after": rec.retry_after,
        "last_seq": rec.last_seq,
        "events": rec.events,
        "final": rec.final,
        "operation": conv(rec.operation) if rec.operation is not None else None,
        "items": conv(items) if (items := shown_items(rec)) is not None else None,
    }


def _view_as_dict(value: Any) -> Any:
    """The C encoder's fallback for what it cannot take as is: a record's read-only views (a
    record's own are ``MappingProxyType``: tested first, since ``isinstance`` against the
    ``Mapping`` ABC costs more than the copy)."""
    if type(value) is MappingProxyType:
        return value.copy()
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def record_json_encoder(
    *, operator: bool = False, holder: HolderTag | None = None
) -> Callable[[Record], str]:
    """``json.dumps(record_to_json(rec, operator=operator, holder=holder), sort_keys=True)`` as
    one call per record (a caller's withholds what ``record_to_json`` does), the same
    text (tests/test_views_json.py compares the two) at about half the cost (issue 15:
    ``affidavit actions --json`` over 1M events; 41 -> 17-25 us a record there).

    The record's own object is written here, its keys in sorted order: building
    ``record_to_json``'s dict of 24 fields (four enum ``.value`` properties among them) and
    having the encoder sort and walk it cost about as much as encoding the values.  A value
    of an exact type written the same way everywhere (``str``, ``None``, ``int``, ``bool``) is
    written directly; any other (a float, a nested tree, a read-only view, something JSON
    cannot hold) goes to one C encoder made once (``JSONEncoder.encode`` makes a new one per
    call, ~2 us), which is handed ``dict(view)`` for a read-only view instead of ``plain``
    copying the whole tree first.  String enums are strings to it.  A record's keys are
    strings, so ``plain``'s ``str(k)`` changes none.  A record is a tree (its values come from
    decoded JSON and the fold's own dicts), so the encoder's check for cycles, a dict
    operation per container, is left out."""
    make = json.encoder.c_make_encoder  # type: ignore[attr-defined]
    if make is None:  # an interpreter without the C accelerator
        encoder = json.JSONEncoder(sort_keys=True, check_circular=False, default=_view_as_dict)
        chunks: Callable[[Any, Any], Iterable[str]] = encoder.iterencode
    else:
        chunks = make(
            None, _view_as_dict, json.encoder.encode_basestring_ascii, None, ": ", ", ", True,
            False, True,
        )  # fmt: skip

    string, int_text, finals, join = (
        json.encoder.encode_basestring_ascii,
        int.__repr__,
        _FINAL,
        "".join,
    )
    fetch = string(_FETCH)  # ``shown_retry`` of a record not final
    proxy = MappingProxyType
    attempt_keys = _ATTEMPT_KEYS

    def text(v: Any) -> str:
        t = type(v)
        if t is str:
            return string(v)
        if v is None:
            return "null"
        if t is int:
            return int_text(v)
        if t is bool:
            return "true" if v else "false"
        return join(chunks(v, 0))

    def attempt_json(a: Any) -> str:
        # An attempt the fold made (``rules_attempt``: these six keys) written here, its keys
        # in sorted order, each value as ``text`` writes it: the C encoder's sort of the
        # items and encoding of each key cost ~18k instructions an attempt, this ~10k
        # (issue 15, callgrind).  Any other mapping goes to the encoder.
        if type(a) is not proxy or a.keys() != attempt_keys:
            return join(chunks(a, 0))
        v: Any
        return (
            f'{{"code": {"null" if (v := a["code"]) is None else text(v)}, '
            f'"generation": {int_text(v) if type(v := a["generation"]) is int else text(v)}, '
            f'"n": {int_text(v) if type(v := a["n"]) is int else text(v)}, '
            f'"outcome": {string(v) if type(v := a["outcome"]) is str else text(v)}, '
            f'"seq": {int_text(v) if type(v := a["seq"]) is int else text(v)}, '
            f'"stage": {string(v) if type(v := a["stage"]) is str else text(v)}}}'
        )

    def record_json(rec: Record) -> str:
        if operator:
            evidence = shown_evidence(rec)
        elif hashes_withheld(rec):  # rare: recorded before hashes were keyed
            rec = caller_record(rec, holder)  # its holder tagged, its plain hashes withheld
            evidence = shown_evidence(rec)
        else:
            # Its lease holder tagged without a copy of the record (``caller_record``'s
            # ``dataclasses.replace`` tripled the cost of a record's encoding).
            evidence = caller_evidence(rec.invocation_id, shown_evidence(rec), holder)
        b = rec.budget
        state = rec.state
        is_final = finals[state]  # ``rec.final``, without the property's call (two a record)
        # ``shown_error`` inlined for a final record (``current_code``: its own code), a call
        # fewer per record (~5% of a small record's encoding); the test in every state holds it.
        code, message, field = (rec.code, rec.message, rec.field) if is_final else shown_error(rec)
        # A record's attempts written here (``attempt_json``), not by the encoder (its
        # fallback for a read-only view is a Python call each): the usual record has one.
        attempts = rec.attempts
        if type(attempts) is not tuple:
            attempts_text = join(chunks(attempts, 0))
        elif len(attempts) == 1:
            attempts_text = f"[{attempt_json(attempts[0])}]"
        else:
            attempts_text = f"[{', '.join(map(attempt_json, attempts))}]"
        if type(evidence) is proxy:
            evidence = evidence.copy()
        v: Any  # each inline test below names its value
        # Keys in sorted order, as ``sort_keys`` writes them.  The state, its phase, outcome
        # and retry hint are strings (enums: str subclasses) by construction.  The values most
        # often None, False, an ``int`` or a ``str`` are written here, not by ``text``: a call
        # fewer each (issue 15: ~10 calls a record).
        return (
            f'{{"attempts": {attempts_text}, '
            f'"budget": {{"left": {int_text(v) if type(v := b.left) is int else text(v)}, '
            f'"total": {int_text(v) if type(v := b.total) is int else text(v)}, '
            f'"used": {int_text(v) if type(v := b.used) is int else text(v)}}}, '
            f'"code": {"null" if code is None else string(code)}, '
            f'"events": {int_text(v) if type(v := rec.events) is int else text(v)}, '
            f'"evidence": {join(chunks(evidence, 0))}, '
            f'"field": {"null" if field is None else text(field)}, '
            f'"final": {"true" if is_final else "false"}, '
            f'"fingerprint": {string(v) if type(v := rec.fingerprint) is str else text(v)}, '
            f'"generation": {int_text(v) if type(v := rec.generation) is int else text(v)}, '
            f'"idempotency": '
            f"{'null' if (v := rec.idempotency) is None else join(chunks(v, 0))}, "
            f'"idempotent": {"false" if (v := rec.idempotent) is False else text(v)}, '
            f'"invocation_id": '
            f"{string(v) if type(v := rec.invocation_id) is str else text(v)}, "
            f'"items": {"null" if (v := shown_items(rec)) is None else join(chunks(v, 0))}, '
            f'"last_seq": {int_text(v) if type(v := rec.last_seq) is int else text(v)}, '
            f'"message": {string(v) if type(v := message) is str else text(v)}, '
            f'"operation": {"null" if (v := rec.operation) is None else join(chunks(v, 0))}, '
            f'"outcome": {string(rec.outcome)}, '
            f'"phase": {string(rec.phase)}, '
            f'"protocol": {string(v) if type(v := rec.protocol) is str else text(v)}, '
            f'"retry": {string(rec.retry) if is_final else fetch}, '
            f'"retry_after": {"null" if (v := rec.retry_after) is None else text(v)}, '
            f'"session": {string(v) if type(v := rec.session) is str else text(v)}, '
            f'"state": {string(state)}, '
            f'"target": {string(v) if type(v := rec.target) is str else text(v)}}}'
        )

    return record_json


_FINAL = {state: spec.final for state, spec in STATES.items()}
"""``Record.final`` per state."""
_ATTEMPT_KEYS = frozenset(("code", "generation", "n", "outcome", "seq", "stage"))
"""The keys of an attempt the fold makes (``statemachine/rules_attempt.py``)."""


def event_to_json(ev: Event) -> dict[str, Any]:
    return {
        "seq": ev.seq,
        "at": ev.at,
        "kind": ev.kind.value,
        "source": ev.source.value,
        "observer": ev.observer,
        "observer_seq": ev.observer_seq,
        "attrs": plain(ev.attrs),
    }


class Newest:
    """The newest ``limit`` records of a stream (oldest first) and how many went by: a listing
    cut to a page in memory O(limit), not O(journal) -- ``feed`` passes the records on, so the
    same stream may be counted too (``metrics``).  ``truncated``: some were left out."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        self._kept: deque[Record] = deque(maxlen=limit)

    def feed(self, records: Iterable[Record]) -> Iterator[Record]:
        kept = self._kept
        for rec in records:
            self.total += 1
            kept.append(rec)
            yield rec

    def take(self, records: Iterable[Record]) -> Newest:
        for _ in self.feed(records):
            pass
        return self

    @classmethod
    def of(cls, limit: int, records: Iterable[Record], total: int) -> Newest:
        """A page already cut: ``records`` (at most ``limit``) of ``total``."""
        page = cls(limit)
        page._kept.extend(records)
        page.total = total
        return page

    @property
    def records(self) -> list[Record]:
        return list(self._kept)

    @property
    def truncated(self) -> bool:
        return self.total > len(self._kept)


def actions_page(
    reader: JournalReader,
    limit: int,
    session: str | None = None,
    outcome: Outcome | str | None = None,
    phase: Phase | str | None = None,
    since: float | None = None,
    until: float | None = None,
    now: float | None = None,
    summary: SessionSummary | None = None,
    readable: Callable[[str | None], bool] | None = None,
) -> Newest:
    """``Newest(limit).take(reader.iter_actions(...))``: the newest ``limit`` records that
    match, oldest first, and how many match.  Without a filter but the session, every record
    the view has matches: the page is read alone (``JournalReader.newest_actions``: the rows
    of the records shown and a count in the database, not O(journal)).  A filter on what a
    record's fold says (outcome, phase) or on when it was accepted (since, until) has no exact
    count short of folding every record: those pages are streamed from the whole view (of the
    session, given one) as before.  ``now``: as ``list_actions``; ``summary``: the daemon's
    (or MCP's) kept view, whose count (when it keeps one) stands for counting every invocation
    again (``JournalReader.newest_actions``).

    ``readable``: a caller's list (the daemon's, MCP's) holds only the records on a target it
    may read (``Broker.callable_target``: one the configuration names), page and count alike
    -- which the database cannot tell apart (it does not know the configuration).  With
    ``summary`` and no filter but the session, the page comes from the kept summary's count
    per target, and only its records are folded (``JournalReader.newest_readable``: O(page),
    however many invocations are on a target no longer named); it is streamed instead -- the
    whole view, filtered -- while the summary cannot answer: a session's page while nothing
    is kept yet (then the session alone is streamed, not the whole journal folded for it), or
    a record it keeps that its rows no longer say (a row altered: never shown from it)."""
    plain = outcome is None and phase is None and since is None and until is None
    if plain and readable is None:
        records, total = reader.newest_actions(limit, session, now, summary)
        return Newest.of(limit, records, total)
    if plain and summary is not None and readable is not None:
        found = reader.newest_readable(limit, summary, readable, now, session)
        if found is not None:
            return Newest.of(limit, *found)
    rows = reader.iter_actions(
        session=session, outcome=outcome, phase=phase, since=since, until=until, now=now
    )
    if readable is not None:
        rows = (r for r in rows if readable(r.target))
    return Newest(limit).take(rows)


def newest_sessions(sessions: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """A page of ``JournalReader.sessions``: the ``limit`` seen last (``last_seen``; the later
    one of a tie), in the reader's order -- ``{"sessions", "limit", "total", "truncated"}``.
    A caller names its sessions (an agent, as many as it likes): an answer holds a page.  The
    journal's cut (``summary_newest.newest_page``), which a kept summary's page
    (``JournalReader.summarized_session_page``) answers without building every entry."""
    from affidavit.journal.summary_newest import newest_page  # (the views load no journal)

    return newest_page(sessions, limit)


def metrics(records: Iterable[Record]) -> dict[str, Any]:
    """Counts of invocations by (phase, outcome) and by (code, outcome).

    Seed, "Retry code must be simple and testable": metrics must count phase and outcome
    separately — a rise in connection_setup/not_attempted points at routing, certificates or
    credentials; a rise in remote_execution/unknown needs reconciliation.  Lumping them together
    as "errors" hides both.  For the same reason a batch's items are counted apart from the
    invocations that carried them (``batch_items``, by outcome and code: a committed 207 may
    hold rejected and unknown items), and jobs accepted by a 202 by their own state
    (``operations``)."""
    tallies: dict[Hashable, int] = {}
    # A stream (``JournalReader.iter_actions``): every record counted, one held at a time.
    for rec in records:
        key = metrics_key(rec)
        tallies[key] = tallies.get(key, 0) + 1
    return metrics_of(tallies)


def metrics_key(rec: Record) -> Hashable:
    """What ``metrics`` counts of one record: its phase, outcome and code, its batch items'
    (outcome, code) and its job's state -- the ``tally`` of a ``SessionSummary`` the daemon
    keeps, so ``/v1/metrics`` without a filter need not fold every record again.  The code
    is the one the record's view shows (``shown_error``): a running retry's is not the code
    of the attempt before it."""
    items = tuple((str(i["outcome"]), str(i["code"] or "OK")) for i in shown_items(rec) or ())
    job = str(rec.operation["state"]) if rec.operation is not None else None
    return (rec.phase.value, rec.outcome.value, shown_code(rec), items, job)


def metrics_of(tallies: Mapping[Hashable, int]) -> dict[str, Any]:
    """``metrics()``' answer from how many records have each ``metrics_key``."""
    by_phase: dict[tuple[str, str], int] = {}
    by_code: dict[tuple[str, str], int] = {}
    by_item: dict[tuple[str, str], int] = {}
    by_job: dict[str, int] = {}
    count = 0
    for key, n in tallies.items():
        phase, outcome, code, items, job = cast("tuple[Any, ...]", key)
        count += n
        for ikey in items:
            by_item[ikey] = by_item.get(ikey, 0) + n
        if job is not None:
            by_job[job] = by_job.get(job, 0) + n
        by_phase[(phase, outcome)] = by_phase.get((phase, outcome), 0) + n
        by_code[(code, outcome)] = by_code.get((code, outcome), 0) + n
    return {
        "invocations": count,
        "by_phase_outcome": [
            {"phase": ph, "outcome": oc, "count": n} for (ph, oc), n in sorted(by_phase.items())
        ],
        "by_code_outcome": [
            {"code": c, "outcome": oc, "count": n} for (c, oc), n in sorted(by_code.items())
        ],
        "batch_items": [
            {"outcome": oc, "code": c, "count": n} for (oc, c), n in sorted(by_item.items())
        ],
        "operations": [{"state": st, "count": n} for st, n in sorted(by_job.items())],
    }


def prometheus_text(data: dict[str, Any]) -> str:
    """``metrics()`` in the Prometheus text exposition format (``affidavit metrics
    --prometheus`` and the daemon's ``GET /v1/metrics``): separate gauges, never merged."""
    lines = [
        "# HELP affidavit_invocations Invocations by phase and outcome.",
        "# TYPE affidavit_invocations gauge",
    ]
    for row in data["by_phase_outcome"]:
        lines.append(
            f'affidavit_invocations{{phase="{row["phase"]}",outcome="{row["outcome"]}"}} '
            f"{row['count']}"
        )
    lines += [
        "# HELP affidavit_invocations_by_code Invocations by error code and outcome.",
        "# TYPE affidavit_invocations_by_code gauge",
    ]
    for row in data["by_code_outcome"]:
        lines.append(
            f'affidavit_invocations_by_code{{code="{row["code"]}",outcome="{row["outcome"]}"}} '
            f"{row['count']}"
        )
    lines += [
        "# HELP affidavit_batch_items Batch items by outcome and code, apart from invocations.",
        "# TYPE affidavit_batch_items gauge",
    ]
    for row in data["batch_items"]:
        lines.append(
            f'affidavit_batch_items{{outcome="{row["outcome"]}",code="{row["code"]}"}} '
            f"{row['count']}"
        )
    lines += [
        "# HELP affidavit_operations Jobs accepted by a 202, by state.",
        "# TYPE affidavit_operations gauge",
    ]
    for row in data["operations"]:
        lines.append(f'affidavit_operations{{state="{row["state"]}"}} {row["count"]}')
    return "\n".join(lines) + "\n"
