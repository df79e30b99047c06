"""Shared builders for journal tests (a module, not a conftest, so child scripts import it too)."""

from __future__ import annotations

from affidavit.statemachine import Event, EvidenceSource
from affidavit.statemachine import EventKind as E

CANARY = "canary-7f3a9c1e-SECRET-do-not-store"


def accepted(iid: str, session: str | None = "sess-1", budget: int = 3) -> Event:
    attrs: dict[str, object] = {
        "operation": {
            "target": "payments",
            "protocol": "http",
            "fingerprint": "sha256:8b1f",
            "budget": budget,
        }
    }
    if session is not None:
        attrs["session"] = session
    return Event(E.ACTION_ACCEPTED, iid, attrs)


def until_dispatch(iid: str, session: str | None = "sess-1") -> list[Event]:
    return [
        accepted(iid, session),
        Event(E.PREFLIGHT_VALIDATED, iid, {"config_hash": "sha256:c0ff"}),
        Event(E.CREDENTIAL_AUTHORIZED, iid, {"credential": "pay-token", "version": "7"}),
        Event(E.DISPATCH_STARTED, iid, {"attempt": 1}),
    ]


def happy(iid: str, session: str | None = "sess-1") -> list[Event]:
    """The seed's durable happy path up to (not including) RESULT_COMMITTED."""
    return [
        *until_dispatch(iid, session),
        Event(E.REQUEST_SENT, iid),
        Event(E.REMOTE_RESPONSE_STARTED, iid, {"status": 201}),
        Event(
            E.REMOTE_RESPONSE_COMPLETE,
            iid,
            {"outcome": "committed", "status": 201},
            source=EvidenceSource.REMOTE_RESPONSE,
        ),
    ]


def interrupted(iid: str, session: str | None = "sess-1") -> list[Event]:
    """Dispatched, then the connection dropped: unknown, at rest, retryable with a lease."""
    return [
        *until_dispatch(iid, session),
        Event(E.ATTEMPT_INTERRUPTED, iid, {"code": "REMOTE_OUTCOME_UNKNOWN"}),
    ]


def db_files(path: object) -> list[str]:
    p = str(path)
    return [p, p + "-wal", p + "-shm"]
