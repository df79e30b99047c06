"""A checked calling style for Python callers: errors raise, carrying the whole envelope.

    from affidavit.api.sdk import AffidavitError, call_checked

    try:
        envelope = await call_checked(broker, action, auto_retry=3)
    except AffidavitError as err:
        err.outcome, err.retry, err.envelope   # the evidence, never a bare exception text

Seed, "Retry code must be simple and testable": "If it must throw exceptions, attach the full
envelope and allow automatic retry only for backoff or same_idempotency_key.  To retry an
unknown/reconcile action, the caller should have to make an explicitly unsafe decision in code."
``call_checked`` therefore retries only those two hints, within the invocation's recorded budget
and never sooner than Retry-After; everything else raises.  There is deliberately no flag that
retries ``reconcile``: a caller who has reconciled and still wants to send again must build and
send a new action itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import trio

__all__ = ["AUTO_RETRY_HINTS", "AffidavitError", "call_checked"]

AUTO_RETRY_HINTS = frozenset({"backoff", "same_idempotency_key"})


class _Caller(Protocol):
    async def call(
        self, action: Mapping[str, Any], *, timeout: float | None = None
    ) -> dict[str, Any]: ...


class AffidavitError(Exception):
    """An error envelope, raised.  Branch on ``code``/``phase``/``outcome``/``retry``; the
    message is for humans only."""

    def __init__(self, envelope: Mapping[str, Any]) -> None:
        self.envelope = dict(envelope)
        err = self.envelope["error"]
        self.invocation_id: str = self.envelope["invocation_id"]
        self.code: str = err["code"]
        self.phase: str = err["phase"]
        self.outcome: str = err["outcome"]
        self.retry: str = err["retry"]
        super().__init__(
            f"{self.code} ({self.phase}/{self.outcome}, retry={self.retry}) "
            f"in {self.invocation_id}: {err['message']}"
        )


def _delay(envelope: Mapping[str, Any], attempt: int, base: float, cap: float) -> float:
    raw = envelope.get("evidence", {}).get("retry_after")
    backoff = min(cap, base * 2.0**attempt)
    retry_after = float(raw) if isinstance(raw, int | float) else 0.0
    return max(backoff, retry_after)  # the remote's own word beats our schedule


async def call_checked(
    broker: _Caller,
    action: Mapping[str, Any],
    *,
    timeout: float | None = None,
    auto_retry: int = 0,
    backoff_base: float = 0.2,
    backoff_cap: float = 30.0,
) -> dict[str, Any]:
    """Call; return the envelope when it has no error, else raise ``AffidavitError``.

    With ``auto_retry=N``, up to N further calls are made, and only when the hint is ``backoff``
    or ``same_idempotency_key``: the latter re-sends with the recorded key, so the broker resumes
    the same invocation (and its budget) instead of creating a new one."""
    current = dict(action)
    for attempt in range(auto_retry + 1):
        envelope = await broker.call(current, timeout=timeout)
        err = envelope.get("error")
        if err is None:
            return envelope
        if attempt == auto_retry or err["retry"] not in AUTO_RETRY_HINTS:
            raise AffidavitError(envelope)
        if err["retry"] == "same_idempotency_key":
            key = (envelope.get("evidence", {}).get("idempotency") or {}).get("key")
            if not key:  # the hint without a recorded key would be a lie; do not guess
                raise AffidavitError(envelope)
            current["idempotency_key"] = key
        else:
            await trio.sleep(_delay(envelope, attempt, backoff_base, backoff_cap))
    raise AssertionError("unreachable")  # pragma: no cover
