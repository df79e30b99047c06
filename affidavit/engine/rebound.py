"""A same-key call whose fingerprint is not the one the key is bound to: another request, or the
same request under a changed target configuration.

Seed, "Idempotency is defined by the remote contract": "A retry must use the same key and an
identical fingerprint.  Reusing the key with a modified body must fail locally with
``IDEMPOTENCY_MISMATCH``."  The fingerprint covers the target's snapshot too (its keyed hash), so
any edit of the target -- a connect timeout 2 -> 3 -- changes it.  Answered IDEMPOTENCY_MISMATCH,
"bound to a request with a different fingerprint", the identical request invites the natural
reaction "new key, resend", which makes a duplicate.  So the request part is compared on its
own: the same request is refused ``CONFIG_CHANGED``, naming the invocation the key is bound to
and what its record says (fetch it, or reconcile it: that is where the request went), and only
a different request is ``IDEMPOTENCY_MISMATCH``.  So is the same request bound by *another* target
that declares the same scope (the remote's one key space, shared): its invocation is not named,
nor its outcome -- this target never sent it, and "fetch it" would hand over another target's
response.

The request part is ACTION_ACCEPTED's ``operation.request_fingerprint``; a record written before
it was recorded is recognized as ``legacy_fingerprint`` recognizes a v1 one, by recomputing:
its fingerprint with the config hash its own PREFLIGHT_VALIDATED recorded.  Either way only what
the chained record holds is compared; the binding row itself proves nothing (``bound_record``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from affidavit.journal import IdempotencyMismatch
from affidavit.protocols.actions import fingerprint, legacy_fingerprint, request_fingerprint
from affidavit.statemachine import Code, EventKind, Outcome, Record

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["Refusal", "refusal"]


class Refusal(NamedTuple):
    code: Code
    field: str
    message: str
    bound_to: str | None = None
    """The invocation the key is bound to, when the answer names it: PREFLIGHT_FAILED's
    ``bound_to``, the envelope's ``evidence.idempotency.bound_to`` -- a caller acts on it
    without parsing the message (seed: "The message text should not be parsed")."""


_MISMATCH = Refusal(
    Code.IDEMPOTENCY_MISMATCH,
    "idempotency_key",
    "this idempotency key is bound in its scope to a different request (another target, "
    "method, path, headers or body; another command or stdin)",
)


def refusal(
    engine: Engine, exc: IdempotencyMismatch, record: Record, action: Any, target: Any
) -> Refusal:
    """What a new invocation refused for ``exc`` answers.  ``record``: the bound invocation's
    (``bound_record``, which proves the binding row by the chained ACTION_ACCEPTED: a row given
    another fingerprint is altered, not a mismatch) -- a key bound with nothing recorded yet is
    not refused at all (the caller answers it IN_PROGRESS)."""
    if record.target != target.name:
        # Bound by another target that declares the same scope (one remote key space): not
        # this target's invocation -- its record, its result and its advice are not this
        # call's to read, and "fetch it" would answer with a request this target never sent.
        return _MISMATCH
    iid = exc.existing.invocation_id
    if exc.existing.fingerprint == legacy_fingerprint(action, target):
        # The same request, bound before the target hash was keyed: its binding cannot be
        # matched with this one, and is not another request either.
        why = "by an earlier broker version (its binding cannot be matched with this one)"
    elif _same_request(engine, record, exc, action, target):
        why = "under the target's configuration as it was then (it changed since)"
    else:
        return _MISMATCH
    message = (
        f"this idempotency key is bound to invocation {iid} for this same request, {why}; "
        f"{_advice(record)}"
    )
    return Refusal(Code.CONFIG_CHANGED, f"targets.{target.name}", message, iid)


def _same_request(
    engine: Engine, record: Record, exc: IdempotencyMismatch, action: Any, target: Any
) -> bool:
    accepted = validated = None
    for event in engine.journal.events(record.invocation_id):
        if event.kind is EventKind.ACTION_ACCEPTED and accepted is None:
            accepted = event.attrs
        elif event.kind is EventKind.PREFLIGHT_VALIDATED and validated is None:
            validated = event.attrs
    recorded = ((accepted or {}).get("operation") or {}).get("request_fingerprint")
    if recorded is not None:
        return bool(recorded == request_fingerprint(action, target, engine.journal.keyed_digest))
    # Recorded before the request part was: its fingerprint, recomputed with the config hash
    # it was built on (its own PREFLIGHT_VALIDATED), is the one bound only for this request.
    config_hash = (validated or {}).get("config_hash")
    return type(config_hash) is str and fingerprint(action, target, config_hash) == (
        exc.existing.fingerprint
    )


def _advice(record: Record) -> str:
    """What to do about the invocation the key is bound to, by what its record says now --
    never "a new key" while that would send again what took, or may have taken, effect."""
    state = f"outcome {record.outcome.value}, retry {record.retry.value}"
    if not record.final:
        return (
            f"it has not finished ({record.state}): fetch its result later; a new key would "
            "send the request again."
        )
    if record.outcome is Outcome.COMMITTED:
        return f"it completed ({state}): fetch its result; a new key would send the request again."
    if record.outcome is Outcome.UNKNOWN:
        return (
            f"its outcome is unknown ({state}): reconcile it first; a new key would send the "
            "request again, a duplicate if it took effect."
        )
    if record.outcome is Outcome.REJECTED:
        return (
            f"the remote rejected it ({state}): fetch it to see why; a corrected request goes "
            "under a new key."
        )
    return f"it was never sent ({state}): a new invocation with a new key sends the request."
