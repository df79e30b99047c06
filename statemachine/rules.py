"""What each lifecycle event does to a fold: one rule per event kind, in the lifecycle's order.

A rule first *checks* the event against the fold and the contract -- refusing with
``ImpossibleEvent`` before changing anything -- and only then *applies* its effect, so a refused
event leaves the fold exactly as it was (seed: "The projection must reject impossible state
reversals").  Which (state, kind) pairs are possible at all is the lifecycle table's business
(``lifecycle.TRANSITIONS``); ``projection.py`` looks the rule up together with the destination.

The rules are the ``Projector``'s own code: they write its (package-private) fields directly.
This module is their table; the rules live beside it by the part of the lifecycle they fold --
``rules_intake.py`` (acceptance, preflight, approval, credential, setup), ``rules_attempt.py``
(dispatch, request and response, result, storage and delivery, protocol steps),
``rules_lease.py`` (leases, budget, second observers) -- over the helpers of
``rules_common.py``.  The rules of the operation table and of batch items, which fold state of
their own, live in ``operation.py`` and ``batch.py`` and are merged into ``RULES`` below.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .batch import on_items_recorded
from .events import Event, EventKind
from .operation import OPERATION_RULES
from .rules_attempt import (
    _on_complete,
    _on_delivered,
    _on_delivery_failed,
    _on_dispatch,
    _on_interrupted,
    _on_observed,
    _on_request_sent,
    _on_response_started,
    _on_result_committed,
    _on_store_failed,
)
from .rules_common import DEFAULT_BUDGET, DEFAULT_MAX_RETRY_AFTER, Rule, _stale
from .rules_intake import (
    _on_accepted,
    _on_approval_denied,
    _on_approval_granted,
    _on_approval_requested,
    _on_approval_revoked,
    _on_credential,
    _on_credential_failed,
    _on_preflight_failed,
    _on_setup_attempt,
    _on_setup_failed,
    _on_validated,
)
from .rules_lease import (
    _on_budget,
    _on_dispatch_lease,
    _on_lease,
    _on_lease_lost,
    _on_reconcile_inconclusive,
    _on_reconciled,
)

if TYPE_CHECKING:
    from .projection import Projector

__all__ = ["DEFAULT_BUDGET", "DEFAULT_MAX_RETRY_AFTER", "RULES", "SPLITTING", "Rule"]

E = EventKind


def _generation_checked(rule: Rule) -> Rule:
    """``rule``, first refusing a stale generation (``_stale``): for the rarer kinds an attempt
    writes, whose rules live in ``batch.py`` and ``operation.py``."""

    def checked(p: Projector, event: Event) -> str | None:
        gen = event.attrs.get("generation")
        if gen is not None and (type(gen) is not int or gen != p._generation):
            _stale(p, event, gen)
        return rule(p, event)

    return checked


RULES: Mapping[EventKind, Rule] = {
    E.ACTION_ACCEPTED: _on_accepted,
    E.PREFLIGHT_VALIDATED: _on_validated,
    E.PREFLIGHT_FAILED: _on_preflight_failed,
    E.APPROVAL_REQUESTED: _on_approval_requested,
    E.APPROVAL_GRANTED: _on_approval_granted,
    E.APPROVAL_DENIED: _on_approval_denied,
    E.APPROVAL_REVOKED: _on_approval_revoked,
    E.DISPATCH_LEASE_ACQUIRED: _on_dispatch_lease,
    E.CREDENTIAL_AUTHORIZED: _on_credential,
    E.CREDENTIAL_FAILED: _on_credential_failed,
    E.SETUP_ATTEMPT_FAILED: _on_setup_attempt,
    E.SETUP_FAILED: _on_setup_failed,
    E.RETRY_LEASE_ACQUIRED: _on_lease,
    E.DISPATCH_STARTED: _on_dispatch,
    E.REQUEST_SENT: _on_request_sent,
    E.REMOTE_RESPONSE_STARTED: _on_response_started,
    E.REMOTE_RESPONSE_COMPLETE: _on_complete,
    E.ATTEMPT_INTERRUPTED: _on_interrupted,
    E.RESULT_COMMITTED: _on_result_committed,
    E.RESULT_STORE_FAILED: _on_store_failed,
    E.RESULT_DELIVERY_FAILED: _on_delivery_failed,
    E.RESULT_DELIVERED: _on_delivered,
    E.RETRY_BUDGET_EXHAUSTED: _on_budget,
    E.RECONCILED: _on_reconciled,
    E.RECONCILE_INCONCLUSIVE: _on_reconcile_inconclusive,
    E.PROTOCOL_OBSERVED: _on_observed,
    E.LEASE_LOST: _on_lease_lost,
    **OPERATION_RULES,
    E.BATCH_ITEMS_RECORDED: _generation_checked(on_items_recorded),
    E.OPERATION_ACCEPTED: _generation_checked(OPERATION_RULES[E.OPERATION_ACCEPTED]),
}
"""Each kind's rule: checks that refuse before any change, then the effect."""

SPLITTING = frozenset({E.REMOTE_RESPONSE_COMPLETE, E.RECONCILED})
"""Kinds whose rule returns the outcome that picks a split destination."""
