"""The public envelope, rendered from the projected record — never from an exception.

Seed shape::

    {"invocation_id": "...",
     "error": {"code", "phase", "outcome", "retry", "message"},   # or "result": {...}
     "evidence": {"dispatch_started", "request_complete", "response_headers_received",
                  "response_complete", "attempts": [...], "idempotency": {...}, ...}}

``code``, ``phase``, ``outcome`` and ``retry`` are closed enumerations.  New evidence fields may be
added without changing the meaning of existing ones.  A committed or rejected remote result may
accompany an error (exit status 23, HTTP 401): the error says how to treat it, the result is what
the remote returned (redacted).

Two more top-level members say what a complete result established beyond its own outcome:
``operation`` (a job a 202 accepted, tracked on its own: id, job_id, status_url, state) and
``items`` (a batch's per-item outcomes: id, outcome, code, retry), beside the parent's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .contract import CODES, Code, EvidenceSource, Outcome, Phase, Retry
from .operation import STATES as OPERATION_STATES
from .record import Record
from .withheld import HolderTag, caller_evidence, caller_record, hashes_withheld

__all__ = [
    "CURRENT_CODE_STATES",
    "ENVELOPE_SCHEMA_ID",
    "NOTHING_SENT_YET",
    "attested",
    "current_code",
    "envelope_schema",
    "in_progress_error",
    "lease_lost_error",
    "operation_json",
    "operation_view",
    "render_envelope",
    "shown_evidence",
    "shown_items",
]

ENVELOPE_SCHEMA_ID = "https://affidavit.dev/schema/envelope-v1.json"


def render_envelope(
    record: Record, result: Mapping[str, Any] | None = None, *, holder: HolderTag | None = None
) -> dict[str, Any]:
    """The caller-facing envelope for ``record``; ``result`` is the stored (redacted) result.
    Its lease's holder is shown as ``holder`` tags it (the journal's ``holder_tag``; none: as
    ``HOLDER_WITHHELD``), never as recorded, and a hash recorded before hashes were keyed is
    withheld (``withheld.py``)."""
    if hashes_withheld(record):
        record = caller_record(record, holder)  # rare: its hashes masked, its holder tagged
        shown = shown_evidence(record)
    else:
        # Only its evidence names the holder: tag it there, not in a copy of the whole record.
        shown = caller_evidence(record.invocation_id, shown_evidence(record), holder)
    env: dict[str, Any] = {"invocation_id": record.invocation_id}
    if not record.final:
        # Not finished (running elsewhere, waiting for a human, or its broker stopped and its
        # lease has not expired yet): there is no result to present, and "no error" would read
        # as success.  The caller may fetch later; it must not send the action again.  A record
        # that says why it waits (APPROVAL_PENDING) says so; any other is IN_PROGRESS.
        code = record.code
        env["error"] = in_progress_error(
            record, code if code is not None and CODES[code].pending else Code.IN_PROGRESS
        )
    elif record.code is not None:
        error: dict[str, Any] = {
            "code": record.code.value,
            "phase": record.phase.value,
            "outcome": record.outcome.value,
            "retry": record.retry.value,
            "message": record.message,
        }
        if record.field is not None:
            error["field"] = record.field
        env["error"] = error
    if result is not None:
        env["result"] = dict(result)
    elif "error" not in env:
        env["result"] = None
    if record.operation is not None:
        env["operation"] = operation_view(record.operation)
    items = shown_items(record)
    if items is not None:
        env["items"] = [dict(i) for i in items]
    evidence = dict(shown)
    evidence["outcome"] = record.outcome.value
    evidence["phase"] = record.phase.value
    evidence["attempts"] = [dict(a) for a in record.attempts]
    evidence["generation"] = record.generation
    evidence["budget"] = {"total": record.budget.total, "used": record.budget.used}
    evidence["record_seq"] = record.last_seq
    if record.retry_after is not None:
        evidence["retry_after"] = record.retry_after  # seconds the remote asked us to wait
    evidence["state"] = record.state
    # Whether the target declares the operation idempotent (ACTION_ACCEPTED's
    # ``operation.idempotent``): what a retry hint rests on -- a ``backoff`` on a ``rejected``
    # non-idempotent request rests on its key, and a new call is not that request
    # (``affidavit.api.sdk.call_checked``).  Left out where the record does not say.
    if record.idempotent_recorded:
        evidence["idempotent"] = record.idempotent
    env["evidence"] = evidence
    return env


def attested(record: Record) -> bool:
    """The record's outcome rests on an operator's attestation (``reconcile --attest``:
    ``evidence.source`` operator_attested), not on what the remote answered: the views count
    and mark it apart (``affidavit.text.shown_outcome`` for their JSON rows)."""
    return record.evidence.get("source") == EvidenceSource.OPERATOR_ATTESTED.value


def shown_evidence(record: Record) -> Mapping[str, Any]:
    """``record.evidence`` as an envelope or a view shows it.  A record at rest in a final
    state holds no lease: its attempt is over, nothing can be written under it, and a same-key
    call is answered from the record, never IN_PROGRESS (``journal/leases.py``: such a lease
    keeps no one out).  So its ``evidence.lease`` keeps whose attempt it was (generation,
    holder, seq) without the deadline (``expires_at``), which would say the invocation is held
    until then -- the contract gives the deadline only while the record rests in no final
    state (docs/contract.md, "When the hint is computed")."""
    evidence = record.evidence
    lease = evidence.get("lease")
    if lease is None or "expires_at" not in lease or not record.final:
        return evidence
    kept = {k: v for k, v in lease.items() if k != "expires_at"}
    return {**evidence, "lease": kept}


def shown_items(record: Record) -> tuple[Mapping[str, Any], ...] | None:
    """``record.items`` as an envelope or a view shows them.  While the record rests in no final
    state an attempt runs (or holds its lease, or waits for an operator) and the record says
    ``fetch_result`` (``in_progress_error``, ``views.shown_retry``): so does each item -- an
    item's own hint (``same_idempotency_key`` of a keyed batch) would invite the resend the
    record does not allow while an attempt is active.  Nor does an item keep the code of the
    attempt before a running retry (``CURRENT_CODE_STATES``)."""
    items = record.items
    if items is None or record.final:
        return items
    fetch = Retry.FETCH_RESULT.value
    if record.state in CURRENT_CODE_STATES:
        return tuple(i if i.get("retry") == fetch else {**i, "retry": fetch} for i in items)
    # No result of the running attempt yet: an item's code is the one that ended the attempt
    # before it (the parent's, shared), shown by no view (``views.shown_error``).
    return tuple({**i, "retry": fetch, "code": None} for i in items)


CURRENT_CODE_STATES = frozenset({"awaiting_approval", "completed_rejected", "completed_committed"})
"""The states short of a final one whose code (and items' codes) are the current attempt's:
APPROVAL_PENDING while it waits, the running attempt's complete result before it is stored
(``views.shown_error``, ``shown_items``)."""


def current_code(record: Record) -> Code | None:
    """The code every view of ``record`` shows (``views.shown_error``, ``views.shown_code``,
    ``approvals.approval_view``): its own once it rests in a final state or in one of
    ``CURRENT_CODE_STATES``; None while it rests in any other non-final state -- a retry holds
    its lease and sets up, and the projection's code is the one that ended the attempt before
    it, which the running attempt has not produced (it stays in that attempt's entry)."""
    code = record.code
    if code is None or record.final or record.state in CURRENT_CODE_STATES:
        return code
    return None


NOTHING_SENT_YET = (
    "The invocation has not finished, and no dispatch of it is on record: nothing has been sent"
    " so far.  Its attempt may still send it while it holds its lease; fetch it later, and once"
    " it has ended with nothing sent (not_attempted), a new call is safe."
)
"""IN_PROGRESS's message for a record with no DISPATCH_STARTED in any attempt
(``evidence.dispatch_started`` false): DISPATCH_STARTED is the barrier before the first byte,
so the record proves nothing was sent yet -- not that nothing will be (a worker holding the
lease may be at its gate).  An embedded call whose closing SETUP_FAILED the journal refused was
answered not_attempted / backoff; until a read closes its record once the lease ran out, this
is what every read says (docs/journal.md, "A close the journal refused")."""


def in_progress_error(record: Record, code: Code = Code.IN_PROGRESS) -> dict[str, Any]:
    """The error of an invocation that has not finished: ``code`` (IN_PROGRESS, or a pending
    code the record says it waits with), its phase and outcome so far, fetch it later --
    ``NOTHING_SENT_YET`` when no attempt of it dispatched."""
    message = CODES[code].meaning
    if code is Code.IN_PROGRESS and not record.evidence.get("dispatch_started"):
        message = NOTHING_SENT_YET
    return {
        "code": code.value,
        "phase": record.phase.value,
        "outcome": record.outcome.value,
        "retry": Retry.FETCH_RESULT.value,
        "message": message,
    }


def lease_lost_error(record: Record, generation: int, *, dispatched: bool) -> dict[str, Any]:
    """The error of a worker whose lease is no longer the invocation's -- it was refused at a
    dispatch gate (``dispatched`` False: it sent nothing; True: a redirect's next hop), or what
    it wrote after its dispatch was refused -- answered from ``record``.  One rule whenever it
    was stopped: the record's phase and outcome; ``fetch_result`` while the record is not final
    (an attempt runs, or its holder's lease has not run out) or once it holds a stored result,
    else the record's own hint.  The message says only what the record shows: a newer lease's
    generation, or that this generation's attempt was closed (its state), or -- neither -- that
    this worker's lease is no longer valid.  (The caller drops the record's result, items and
    job: another attempt's, never this caller's.)"""
    if record.generation != generation:
        why = (
            f"A newer attempt (lease generation {record.generation}) took this invocation over "
            f"from this worker (generation {generation})"
        )
    elif record.final:
        why = f"This worker's attempt (lease generation {generation}) was closed ({record.state})"
    else:
        why = f"This worker's lease (generation {generation}) is no longer valid"
    if dispatched:
        why += "; it had dispatched, and the record, not what it received, is the answer."
    else:
        why += "; it sent nothing."
    if not record.final:
        retry, then = Retry.FETCH_RESULT, " The invocation has not finished: fetch it later."
    elif record.evidence.get("result") is not None:
        retry, then = Retry.FETCH_RESULT, " Its result is stored: fetch it."
    else:
        retry, then = record.retry, ""
    return {
        "code": Code.LEASE_LOST.value,
        "phase": record.phase.value,
        "outcome": record.outcome.value,
        "retry": retry.value,
        "message": why + then,
    }


def operation_view(op: Mapping[str, Any]) -> dict[str, Any]:
    """The caller-facing part of a record's operation (``status_path`` is the broker's own)."""
    last = op.get("last_poll")
    return {
        "id": op["id"],
        "job_id": op.get("job_id"),
        "status_url": op.get("status_url"),
        "state": op["state"],
        "polls": op.get("polls", 0),
        "last_poll": dict(last) if last is not None else None,
    }


def operation_json(record: Record) -> dict[str, Any]:
    """A record's operation as every interface lists it: ``operation_view`` plus the submitting
    invocation, its target and session, and where the job was accepted in the journal."""
    op = record.operation
    if op is None:
        raise ValueError(f"{record.invocation_id} accepted no job")
    return {
        **operation_view(op),
        "invocation_id": record.invocation_id,
        "target": record.target,
        "session": record.session,
        "accepted_seq": op.get("accepted_seq"),
    }


def _enum(values: type[Any]) -> dict[str, Any]:
    return {"type": "string", "enum": [v.value for v in values]}


def envelope_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of the envelope, generated from the closed enums."""
    attempt = {
        "type": "object",
        "required": ["n", "stage", "outcome"],
        "properties": {
            "n": {"type": "integer", "minimum": 1},
            "generation": {"type": "integer", "minimum": 0},
            "stage": {"type": ["string", "null"]},
            "outcome": _enum(Outcome),
            "code": {"type": ["string", "null"]},
            "seq": {"type": ["integer", "null"]},
            # Consecutive stops before the gate (withdrawn, broker stopped), one entry.
            "repeated": {"type": "integer", "minimum": 1},
            # Their count per stage and code (bounded: rules_intake._MAX_STOP_KINDS rows).
            "stops": {
                "type": "array",
                "maxItems": 16,
                "items": {
                    "type": "object",
                    "required": ["stage", "code", "repeated"],
                    "properties": {
                        "stage": {"type": ["string", "null"]},
                        "code": {"type": ["string", "null"]},
                        "repeated": {"type": "integer", "minimum": 1},
                    },
                },
            },
        },
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": ENVELOPE_SCHEMA_ID,
        "title": "Affidavit envelope",
        "type": "object",
        "required": ["invocation_id", "evidence"],
        "anyOf": [{"required": ["error"]}, {"required": ["result"]}],
        "properties": {
            "invocation_id": {"type": "string", "minLength": 1},
            "error": {
                "type": "object",
                "required": ["code", "phase", "outcome", "retry", "message"],
                "additionalProperties": False,
                "properties": {
                    "code": _enum(Code),
                    "phase": _enum(Phase),
                    "outcome": _enum(Outcome),
                    "retry": _enum(Retry),
                    "message": {"type": "string"},
                    "field": {
                        "type": "string",
                        "description": "The path to fix: an action field (path, headers.X,"
                        " body) or a configuration key (targets.<name>.credential,"
                        " targets.<name>.ca_file, service.max_pending_approvals) -- the key,"
                        " never its value.  Absent where no input is shown wrong (a refused"
                        " connection, a rejected certificate, a remote result).",
                    },
                },
            },
            "result": {"type": ["object", "null"]},
            "operation": {
                "type": "object",
                "description": "A job the complete 202 accepted, tracked as its own operation; "
                "the submission's outcome is only its acceptance.",
                "required": ["id", "state"],
                "properties": {
                    "id": {"type": "string"},
                    "job_id": {"type": ["string", "null"]},
                    "status_url": {"type": ["string", "null"]},
                    "state": {"type": "string", "enum": sorted(OPERATION_STATES)},
                    "polls": {"type": "integer", "minimum": 0},
                    "last_poll": {"type": ["object", "null"]},
                },
            },
            "items": {
                "type": "array",
                "description": "A batch's items, one per item sent, each with its own outcome "
                "and retry hint beside the parent's transport outcome.",
                "items": {
                    "type": "object",
                    "required": ["id", "outcome", "code", "retry"],
                    "properties": {
                        "id": {"type": ["string", "integer"]},
                        "outcome": _enum(Outcome),
                        "code": {"anyOf": [_enum(Code), {"type": "null"}]},
                        "retry": _enum(Retry),
                        "status": {"type": ["string", "integer", "null"]},
                        "source": _enum(EvidenceSource),
                    },
                },
            },
            "evidence": {
                "type": "object",
                "required": ["dispatch_started", "outcome", "phase", "attempts"],
                "properties": {
                    "dispatch_started": {"type": "boolean"},
                    "idempotent": {
                        "type": "boolean",
                        "description": "Whether the target declares the operation idempotent, "
                        "as accepted (ACTION_ACCEPTED `operation.idempotent`; absent where that "
                        "record does not say): a backoff on a rejected request that is not rests "
                        "on its idempotency key, and a new call is not that request.",
                    },
                    "request_complete": {"type": "boolean"},
                    "response_headers_received": {"type": "boolean"},
                    "response_complete": {"type": "boolean"},
                    "outcome": _enum(Outcome),
                    "phase": _enum(Phase),
                    "source": _enum(EvidenceSource),
                    "attempts": {"type": "array", "items": attempt},
                    "generation": {"type": "integer"},
                    "budget": {
                        "type": "object",
                        "properties": {"total": {"type": "integer"}, "used": {"type": "integer"}},
                    },
                    "idempotency": {
                        "type": "object",
                        "properties": {
                            "key": {"type": ["string", "null"]},
                            "scope": {"type": ["string", "null"]},
                            "fingerprint": {
                                "type": ["string", "null"],
                                "description": "The request fingerprint, or 'withheld: "
                                "recorded before keyed hashes' (statemachine/withheld.py).",
                            },
                            "remote_contract": {"type": ["string", "null"]},
                            "bound_to": {
                                "type": "string",
                                "description": "A call refused CONFIG_CHANGED for its "
                                "idempotency key: the invocation the key is bound to (fetch or "
                                "reconcile that one).",
                            },
                        },
                    },
                    "record_seq": {"type": ["integer", "null"]},
                    "retry_after": {"type": "number", "minimum": 0},
                    "dispatch_seq": {"type": ["integer", "null"]},
                    "state": {"type": "string"},
                    "evidence_from": {
                        "type": "object",
                        "description": "Which hop produced this attempt's evidence: the origin, "
                        "or a proxy's socket with nothing attributing the answer to the origin "
                        "(a proxy that may be answering for itself -- through a forward proxy "
                        "any 4xx or 5xx: then the outcome stays unknown).  attribution: on whose "
                        "word a forward proxy's answer is the origin's (the proxy's "
                        "received-status, or the operator's trust_forward_proxy).",
                        "required": ["hop"],
                        "properties": {
                            "hop": {"type": "string", "enum": ["origin", "proxy"]},
                            "proxy": {"type": "string"},
                            "status": {"type": "integer"},
                            "proxy_status": {"type": "array", "items": {"type": "object"}},
                            "attribution": {
                                "type": "string",
                                "enum": ["received_status", "trusted_forward_proxy"],
                            },
                        },
                    },
                    "remote_request_id": {
                        "type": ["string", "null"],
                        "description": "The request id the remote's complete answer named "
                        "(X-Request-Id).",
                    },
                    "redirect_not_followed": {
                        "type": "object",
                        "description": "Why this attempt's complete 3xx is its result and was "
                        "not followed: reason (an approved request follows no redirect, an "
                        "origin the target does not list, a Location carrying the credential or "
                        "not visible ASCII, a redirect that would change the request -- a 303, "
                        "or a POST's 301/302: method names the GET it asks for --, a 301/302 "
                        "that would send a method the target does not declare idempotent "
                        "again: method names it) and origin; or the reason alone for a 304 "
                        "answering a request that was not a conditional GET or HEAD; or "
                        "the hop, code and stage at which the next hop's connection failed "
                        "before a byte of it was written; or the hop, method, origin and status "
                        "of a next hop sent without the credential that refused it (4xx, 429, "
                        "503: it decides nothing of the request sent with the credential).  "
                        "The code is REMOTE_REDIRECTED: the 3xx is the server's complete answer; "
                        "whether the server acted on the request is not recorded.",
                        "properties": {
                            "reason": {"type": "string"},
                            "origin": {"type": "string"},
                            "method": {"type": "string"},
                            "status": {"type": "integer"},
                            "hop": {"type": "integer"},
                            "code": {"type": "string"},
                            "stage": {"type": "string"},
                        },
                    },
                    "result_size_limit": {
                        "type": "object",
                        "description": "Why the attempt ended RESULT_SIZE_LIMIT: the target's "
                        "max_result and the bytes of the result received when the broker stopped "
                        "reading (decoded_bytes: what a compressed body had decoded to); for a "
                        "result that echoed a secret, was not scanned whole, or (a target with "
                        "a secret) was cut short, its end withheld, received_withheld "
                        "(redacted | short_redacted | tail_redacted | unscanned) instead of the "
                        "counts (docs/redaction.md).",
                        "required": ["limit"],
                        "oneOf": [
                            {
                                "required": ["received_bytes"],
                                "not": {"required": ["received_withheld"]},
                            },
                            {
                                "required": ["received_withheld"],
                                "not": {
                                    "anyOf": [
                                        {"required": ["received_bytes"]},
                                        {"required": ["decoded_bytes"]},
                                    ]
                                },
                            },
                        ],
                        "properties": {
                            "limit": {"type": "integer", "minimum": 0},
                            "received_bytes": {"type": "integer", "minimum": 0},
                            "decoded_bytes": {"type": "integer", "minimum": 0},
                            "received_withheld": {
                                "enum": ["redacted", "short_redacted", "tail_redacted", "unscanned"]
                            },
                        },
                    },
                },
            },
        },
    }
