"""Affidavit's pure core: the contract, the lifecycle machine, protocol tables, projection and
retry decisions.  No I/O happens in this package."""

from .contract import CODES, Code, CodeInfo, EvidenceSource, Outcome, Phase, Retry
from .envelope import (
    envelope_schema,
    in_progress_error,
    lease_lost_error,
    operation_json,
    operation_view,
    render_envelope,
    shown_evidence,
)
from .events import ATTEMPT_KINDS, BARRIER_KINDS, Event, EventKind, stored_event
from .lifecycle import DISPATCHED_STATES, INITIAL, STATES, TRANSITIONS, StateSpec, build_machine
from .operation import invocation_of, operation_id
from .projection import (
    Budget,
    ImpossibleEvent,
    Projector,
    Record,
    fold_runs,
    project,
    project_all,
)
from .protocol import (
    ProtocolMachine,
    ProtocolTable,
    ProtocolViolation,
    Step,
    register,
    registered,
    unregister,
)
from .retry import (
    Decision,
    Operation,
    compute_retry,
    decide,
    send_window,
    within_send_window,
)
from .withheld import KEYED_PREFIX, WITHHELD, caller_event, caller_record, hashes_withheld

__all__ = [
    "ATTEMPT_KINDS",
    "BARRIER_KINDS",
    "CODES",
    "DISPATCHED_STATES",
    "INITIAL",
    "KEYED_PREFIX",
    "STATES",
    "TRANSITIONS",
    "WITHHELD",
    "Budget",
    "Code",
    "CodeInfo",
    "Decision",
    "Event",
    "EventKind",
    "EvidenceSource",
    "ImpossibleEvent",
    "Operation",
    "Outcome",
    "Phase",
    "Projector",
    "ProtocolMachine",
    "ProtocolTable",
    "ProtocolViolation",
    "Record",
    "Retry",
    "StateSpec",
    "Step",
    "build_machine",
    "caller_event",
    "caller_record",
    "compute_retry",
    "decide",
    "envelope_schema",
    "fold_runs",
    "hashes_withheld",
    "in_progress_error",
    "invocation_of",
    "lease_lost_error",
    "operation_id",
    "operation_json",
    "operation_view",
    "project",
    "project_all",
    "register",
    "registered",
    "render_envelope",
    "send_window",
    "shown_evidence",
    "stored_event",
    "unregister",
    "within_send_window",
]
