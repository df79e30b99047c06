"""The rules of who holds an invocation and who may settle it: the dispatch and retry leases
(each a new generation; a retry's spends budget), the budget running out, a stale worker's lost
lease, and the second observers -- a reconciliation query or an operator -- whose findings are
added beside the original attempt, never over it (seed: "Reconciliation is an observation").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .contract import CODES, Code, EvidenceSource, Retry
from .events import Event
from .rules_common import (
    _COMMITTED,
    _FENCED,
    _REMOTE_REJECTED,
    _SOURCE,
    _asked_by,
    _is_int,
    _lease_evidence,
    _refuse,
    _resolved_outcome,
    _stale_row,
    open_query,
)

if TYPE_CHECKING:
    from .projection import Projector

_APPROVAL_PENDING = Code.APPROVAL_PENDING.value
_SECOND_OBSERVER = frozenset({EvidenceSource.REMOTE_QUERY, EvidenceSource.OPERATOR_ATTESTED})


def _on_lease(p: Projector, event: Event) -> None:
    if p._fenced is not None:
        _refuse(p, event, _FENCED)
    gen = event.attrs.get("generation")
    if not _is_int(gen) or gen <= p._generation:
        _refuse(p, event, f"lease generation must exceed {p._generation}")
    if p._budget_used >= p._budget_total:
        _refuse(p, event, "retry budget exhausted")
    if p._state == "credential_failed":
        code = p._code
        if code is None or CODES[code].retry is not Retry.BACKOFF:
            # Only a refusal that asks to back off (APPROVAL_LIMIT) is retried under the same
            # invocation; a missing or unusable credential must be corrected first.
            _refuse(p, event, "a credential refusal is retried only when its code says backoff")
    p._generation = gen
    p._budget_used += 1
    p._evidence["lease"] = _lease_evidence(event, gen, event.attrs.get("expires_at"))
    _asked_by(p, event)


def _on_dispatch_lease(p: Projector, event: Event) -> None:
    gen = event.attrs.get("generation")
    if not _is_int(gen) or gen <= p._generation:
        _refuse(p, event, f"lease generation must exceed {p._generation}")
    # No budget is spent: the approved invocation has not been attempted yet.
    p._generation = gen
    p._evidence["lease"] = _lease_evidence(event, gen, event.attrs.get("expires_at"))
    _asked_by(p, event)


def _on_budget(p: Projector, event: Event) -> None:
    p._budget_used = p._budget_total
    p._evidence["budget_exhausted"] = True


def _observed(p: Projector, event: Event) -> None:
    """Refuse a second observer's event that names a generation other than the record's current
    one.  A reconciliation reads the record, observes the remote (a query is a whole remote
    call; an operator inspects it), then appends what it found, naming the generation it read
    (``attrs.generation``; absent in journals written before it did, and then unchecked).  A
    retry that took a lease in between -- and may have dispatched, and applied the effect -- is
    not what was observed: the observation must not close it, nor speak for it."""
    gen = event.attrs.get("generation")
    if gen is not None and (type(gen) is not int or gen != p._generation):
        _refuse(
            p,
            event,
            f"observed generation {gen}; the current lease generation is {p._generation} "
            "(the invocation was retried since)",
        )


def _on_reconciled(p: Projector, event: Event) -> str:
    _observed(p, event)
    outcome = _resolved_outcome(event)
    if outcome is None:
        _refuse(p, event, "attrs.outcome must be rejected or committed (never not_attempted)")
    if event.source not in _SECOND_OBSERVER:
        _refuse(
            p, event, "reconciliation must name remote_query or operator_attested as its source"
        )
    # The original attempt stays as recorded; the reconciliation is added beside it.
    raw: str = event.attrs["outcome"]
    ev = p._evidence
    ev["reconciliation"] = {
        "outcome": raw,
        "source": _SOURCE[event.source],
        "observer": event.observer,
        "observer_seq": event.observer_seq,
        "seq": event.seq,
        "note": event.attrs.get("note"),
    }
    for key in ("query_invocation", "operator", "matched"):
        if key in event.attrs:
            ev["reconciliation"][key] = event.attrs[key]
    ev["source"] = _SOURCE[event.source]
    p._code = None if outcome is _COMMITTED else _REMOTE_REJECTED
    p._message = event.attrs.get("message")
    return raw


def _on_reconcile_inconclusive(p: Projector, event: Event) -> None:
    _observed(p, event)
    ev = p._evidence
    query = event.attrs.get("query_invocation")
    if type(query) is not str or not query:
        _refuse(p, event, "attrs.query_invocation must name the query's invocation")
    item = {
        "query_invocation": query,
        "code": event.attrs.get("code"),
        "reason": event.attrs.get("reason"),
        "seq": event.seq,
    }
    opened = event.attrs.get("open")
    if opened is not None and type(opened) is not bool:
        _refuse(p, event, "attrs.open must be true or false")
    if opened:
        # One query at a time (affidavit/reconcile/approved.py): a query asked, or still
        # waiting for an operator, is open until a row naming it without ``open`` reads it or
        # gives it up.  Checked here, in the writing transaction: one asker wins, in any process.
        current = open_query(ev.get("reconcile_queries", ()), p._generation)
        if current is not None and current != query:
            _refuse(p, event, f"the reconciliation query {current} is still open")
    if opened and _stale_row(p, event):
        # A stale row a broker from before the writer refused it stored (``_reopened``): the
        # query stays closed; the row is listed, marked stale.  Refused when written.
        item["stale"] = True
    elif opened or (opened is None and item["code"] == _APPROVAL_PENDING):
        # A row written before rows named ``open`` left a query awaiting an operator with
        # APPROVAL_PENDING and no ``open``: it was taken up then, so it is open now too (not
        # a second card after an upgrade).  Never refused: a journal folds as it was written.
        item["open"] = True
        item["generation"] = p._generation
    not_before = event.attrs.get("not_before")
    if not_before is not None:  # an absent finding too soon after the attempt (settle.py)
        if type(not_before) not in (int, float):
            _refuse(p, event, "attrs.not_before must be a time in seconds since the epoch")
        item["not_before"] = not_before
    ev["reconcile_queries"] = [*ev.get("reconcile_queries", ()), item]


def _on_lease_lost(p: Projector, event: Event) -> None:
    gen = event.attrs.get("generation")
    if not _is_int(gen) or gen > p._generation:
        _refuse(p, event, "LEASE_LOST must name a generation not newer than the current one")
    ev = p._evidence
    # Its holder too: after a take-over two workers ran generation 0 (the binder's and the
    # taker's), and only the holder tells an auditor which one was stopped.
    worker: dict[str, Any] = {"generation": gen, "seq": event.seq}
    holder = event.attrs.get("holder")
    if isinstance(holder, str):
        worker["holder"] = holder
    ev["stale_workers"] = [*ev.get("stale_workers", ()), worker]
