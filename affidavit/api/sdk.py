"""A checked calling style for Python callers: errors raise, carrying the whole envelope.

    from affidavit.api.sdk import AffidavitError, call_checked

    try:
        envelope = await call_checked(broker, action, auto_retry=3)
    except AffidavitError as err:
        err.outcome, err.retry, err.envelope   # the evidence, never a bare exception text

Seed, "Retry code must be simple and testable": "If it must throw exceptions, attach the full
envelope and allow automatic retry only for backoff or same_idempotency_key.  To retry an
unknown/reconcile action, the caller should have to make an explicitly unsafe decision in code."
``call_checked`` therefore retries only those two hints, never sooner than Retry-After;
everything else raises.  What a retry is follows the record (docs/contract.md, "How the retry
hint is computed"; the lifecycle's rule 2: a ``rejected`` outcome is final):

* ``same_idempotency_key`` (``unknown``) and ``backoff`` on ``not_attempted`` (nothing was
  sent): the action again under the recorded key -- the broker resumes the same invocation,
  within its recorded budget (seed: ``RETRY_SAME_KEY``, ``RETRY_NEW_ATTEMPT``), and answers
  from the record once the budget is spent;
* ``backoff`` on ``rejected`` (a complete 429/503: seed ``RETRY_WHEN_ALLOWED``): that
  invocation is over, and a same-key call is answered from its record, so a retry is a *new*
  call, a new invocation with a budget of its own -- ``auto_retry`` bounds how many.  Only
  for an operation the target calls idempotent (``evidence.idempotent``, as accepted), and
  without the key, whose record is final; when the hint rested on the record's idempotency
  key (an operation not idempotent), a new call would be sent under a new key the remote
  cannot tie to the first, so ``call_checked`` raises instead and the caller decides.

There is deliberately no flag that retries ``reconcile``: a caller who has reconciled and still
wants to send again must build and send a new action itself.

Through the daemon (``affidavit.Client``) a call may also be refused before anything of it is
journaled or sent: ``ApiError`` 503 ``OVERLOADED`` (``[service] max_calls``), 429
``RATE_LIMITED`` (its uid's ``call_rate``), or unread (``NOT_SENT_CODES``).  No invocation
exists, so sending the same action again is a first attempt, not a retry: ``call_checked``
waits (``Retry-After``, at least its backoff) and calls again, at most ``refused_retries``
times and ``refused_wait`` seconds in all, then raises the last ``ApiError`` -- a batch script
is not broken by one busy second.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import trio

from .wire import ApiError, unsettled_items

__all__ = [
    "AUTO_RETRY_HINTS",
    "NOT_SENT_CODES",
    "AffidavitError",
    "BatchItemsError",
    "call_checked",
]

AUTO_RETRY_HINTS = frozenset({"backoff", "same_idempotency_key"})

NOT_SENT_CODES = frozenset(
    {"OVERLOADED", "RATE_LIMITED", "TOO_MANY_CONNECTIONS", "BODIES_IN_FLIGHT"}
)
"""The daemon's refusals of a call for being busy, before anything of it was journaled or sent
(an ``ApiError``'s ``code``; the last two: the request not even read): ``call_checked`` calls
again after them.  ``SHUTTING_DOWN`` is not among them: a daemon stopping is no busy second."""


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


class BatchItemsError(AffidavitError):
    """A batch whose parent has no error but whose items are not all ``committed``: the call
    did not do all it was asked.  ``items``: those items (each its ``id``, ``outcome``,
    ``code``, ``retry``); ``code``/``outcome``/``retry`` are the first ``unknown`` one's, else
    the first's -- an ``unknown`` item must be reconciled before anything of the batch is sent
    again; ``phase`` is ``remote_execution`` (the batch was dispatched).  Never retried
    automatically: a resend would repeat the items that were applied."""

    def __init__(self, envelope: Mapping[str, Any]) -> None:
        Exception.__init__(self)
        self.envelope = dict(envelope)
        self.items: list[Any] = unsettled_items(self.envelope)
        unknown = [i for i in self.items if isinstance(i, dict) and i.get("outcome") == "unknown"]
        first = (unknown or self.items)[0]
        first = first if isinstance(first, dict) else {}
        self.invocation_id = self.envelope["invocation_id"]
        self.code = str(first.get("code"))
        self.phase = "remote_execution"
        self.outcome = str(first.get("outcome"))
        self.retry = str(first.get("retry"))
        self.args = (
            f"{len(self.items)} batch item(s) not committed in {self.invocation_id} (first: "
            f"{self.code}, {self.outcome}, retry={self.retry}): see the envelope's items",
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
    refused_retries: int = 5,
    refused_wait: float = 60.0,
) -> dict[str, Any]:
    """Call; return the envelope when it has no error and every batch item (``items``) is
    ``committed``; else raise ``AffidavitError`` -- ``BatchItemsError`` for a batch whose
    items are not all committed, never retried.

    With ``auto_retry=N``, up to N further calls are made, and only when the hint is ``backoff``
    or ``same_idempotency_key`` (the module docstring says which are the same invocation, under
    its recorded key and budget, and which a new call -- and which ``backoff`` it raises for).

    A call the daemon refused unsent (``ApiError`` with a ``NOT_SENT_CODES`` code) is made again
    after its ``Retry-After`` (at least the backoff), up to ``refused_retries`` times and while
    the waits total at most ``refused_wait`` seconds; then, or for any other ``ApiError``, the
    ``ApiError`` is raised."""
    current = dict(action)
    refused = _Refused(refused_retries, refused_wait, backoff_base, backoff_cap)
    for attempt in range(auto_retry + 1):
        envelope = await refused.call(broker, current, timeout)
        err = envelope.get("error")
        if err is None:
            if unsettled_items(envelope):
                raise BatchItemsError(envelope)
            return envelope
        if attempt == auto_retry or err["retry"] not in AUTO_RETRY_HINTS:
            raise AffidavitError(envelope)
        evidence = envelope.get("evidence", {})
        key = (evidence.get("idempotency") or {}).get("key")
        if err["retry"] == "same_idempotency_key":
            if not key:  # the hint without a recorded key would be a lie; do not guess
                raise AffidavitError(envelope)
            current["idempotency_key"] = key
            continue
        if err["outcome"] == "rejected":
            idempotent = evidence.get("idempotent")
            if idempotent is not True and (key or idempotent is not None):
                # backoff on an operation not idempotent rests on its key: a new call is not
                # this one (an envelope that does not say: judged by the key, as before).
                raise AffidavitError(envelope)
            # An idempotent operation: a new call is safe (contract rule 7) -- and not under
            # its key, whose record is final and would answer the same again.
            current.pop("idempotency_key", None)
        if err["outcome"] == "not_attempted" and key:
            current["idempotency_key"] = key  # the same invocation, its recorded budget
        await trio.sleep(_delay(envelope, attempt, backoff_base, backoff_cap))
    raise AssertionError("unreachable")  # pragma: no cover


class _Refused:
    """``call_checked``'s bound on calling again after the daemon's unsent refusals."""

    def __init__(self, retries: int, wait: float, base: float, cap: float) -> None:
        self.left, self.wait, self.base, self.cap = retries, wait, base, cap
        self.waited = 0.0
        self.tries = 0

    async def call(
        self, broker: _Caller, action: Mapping[str, Any], timeout: float | None
    ) -> dict[str, Any]:
        while True:
            try:
                return await broker.call(action, timeout=timeout)
            except ApiError as exc:
                if exc.code not in NOT_SENT_CODES or self.left <= 0:
                    raise
                delay = max(min(self.cap, self.base * 2.0**self.tries), exc.retry_after or 0)
                if self.waited + delay > self.wait:
                    raise
                self.left -= 1
                self.tries += 1
                self.waited += delay
                await trio.sleep(delay)
