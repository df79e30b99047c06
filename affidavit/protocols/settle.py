"""``settle``: how long after an attempt ended a reconciliation query's "absent" is believed.

Seed: "do not turn an absence of evidence into permission".  The broker stops its own attempt
within its lease, so nothing of an invocation leaves the broker once it is at rest ``unknown``;
but a request it gave up waiting for may still sit in the remote's queues, a proxy or a retry
of its own, and be applied after a query looked and found nothing.  A query that finds the
effect *present* settles the outcome whenever it runs (an effect observed present stays
present).  One that finds it *absent* settles it only when it was sent at least ``settle``
after the attempt ended -- the remote's own processing window, which only its operator knows;
on a shared journal, plus ``[service] lease_margin`` for the clocks of the brokers that wrote
the two times; sooner, it is ``RECONCILE_INCONCLUSIVE`` with the time to query again
(``affidavit.reconcile``).

The default, 60 s, is a conservative guess for an API that answers in seconds; a remote whose
idempotency key also refuses a late arrival of the same request may say ``settle = "0s"``.
Every protocol's ``reconcile`` table has this field (``SETTLE``), declared once here.
"""

from __future__ import annotations

from typing import Any

from affidavit.schema import Field, Read, duration_setting

__all__ = ["DEFAULT_SETTLE", "SETTLE", "settle_of"]

DEFAULT_SETTLE = 60.0


def _settle(r: Read) -> float:
    return duration_setting(r, zero=True)


SETTLE = Field(
    "settle",
    _settle,
    default=DEFAULT_SETTLE,
    shown='`"60s"`',
    doc="how long after the attempt ended an absent finding is believed",
    binding=False,
    reason="read when a reconciliation runs; the call it reconciles never uses it",
)


def settle_of(target: Any) -> float:
    """The ``settle`` of a target's ``reconcile`` table (``ReconcileContract.settle``)."""
    return float(target.reconcile.settle)
