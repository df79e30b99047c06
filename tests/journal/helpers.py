"""Shared builders for journal tests (a module, not a conftest, so child scripts import it too)."""

from __future__ import annotations

from typing import Any

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


async def append_interleaved(j: Any, runs: list[list[Event]]) -> None:
    """The runs' events interleaved, as concurrent calls write them."""
    for i in range(max(map(len, runs))):
        for run in runs:
            if i < len(run):
                await j.append(run[i])


class Ticking:
    """A journal clock that moves one second per reading (distinct, ordered labels)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


async def fill_views(j: Any) -> None:
    """Four invocations in three sessions for the view tests: committed, unknown, refused in
    validation, and one without a session."""
    for ev in happy("ok-1", "alice"):
        await j.append(ev)
    for ev in interrupted("lost-1", "alice"):
        await j.append(ev)
    await j.append(accepted("bad-1", "bob"))
    await j.append(
        Event(E.PREFLIGHT_FAILED, "bad-1", {"code": "INVALID_TARGET", "field": "target"})
    )
    for ev in happy("ok-2", None):
        await j.append(ev)


async def fill_results(j: Any, body: bytes) -> int:
    """A committed invocation with ``body`` stored in 64 KiB chunks, an unknown one and a
    committed one without a result; returns the RESULT_COMMITTED seq."""
    chunk = 64 * 1024
    for ev in happy("inv-r"):
        await j.append(ev)
    for i in range(0, len(body), chunk):
        await j.put_result_chunk("inv-r", "body", i // chunk, body[i : i + chunk])
    stored = await j.commit_result(Event(E.RESULT_COMMITTED, "inv-r"), summary={"status": 201})
    for ev in interrupted("inv-u"):
        await j.append(ev)
    for ev in happy("inv-z"):
        await j.append(ev)
    assert stored.seq is not None
    return int(stored.seq)
