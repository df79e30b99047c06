"""Crash safety (issue 3), on every backend: a real child process appends an invocation's events
and is killed with SIGKILL at each durable boundary in turn, and mid-transaction (on PostgreSQL
the server then ends its session, rolling the transaction back and releasing the chain head);
recovery from the journal must
project what was durable and never ``not_attempted`` once DISPATCH_STARTED was committed -- and
(issue 9) verify with the signing public key, every committed row signed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from affidavit.journal import JournalReader, SigningKey, VerifyReport
from affidavit.statemachine import Event, EventKind, Outcome, Projector

from ..helpers import happy
from .conftest import Place

CHILD = Path(__file__).parent.parent / "child.py"
TIMEOUT = 60.0

# What the crash child appends, in order (the chunks are not events).
SEQUENCE: list[EventKind] = [
    *[e.kind for e in happy("inv-1")],
    EventKind.RESULT_COMMITTED,
    EventKind.RESULT_DELIVERED,
]


def _spawn(place: Place, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), *args],
        env=place.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _read_until(proc: subprocess.Popen[str], predicate: object, limit: float) -> list[str]:
    assert proc.stdout is not None
    deadline = time.monotonic() + limit
    lines: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"child exited early: {proc.stderr.read() if proc.stderr else ''}")
        lines.append(line.strip())
        if callable(predicate) and predicate(lines):
            return lines
    raise AssertionError("child did not reach the boundary in time")


def _kill(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=TIMEOUT)
    assert proc.returncode == -signal.SIGKILL
    _kill_cleanup(proc)


def _kill_cleanup(proc: subprocess.Popen[str]) -> None:
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _verified(r: JournalReader, place: Place) -> VerifyReport:
    """A killed journal verifies with the signing *public* key alone, and every committed row
    is covered by a signed checkpoint: a crash never leaves unsigned rows."""
    public = SigningKey.load(place.signing_key).public_raw
    report = r.verify(public_key=public)
    assert report.ok, report
    assert report.signed_seq == (report.count or None), report
    return report


def _recover(place: Place) -> tuple[list[Event], Projector]:
    with place.reader() as r:
        _verified(r, place)
        events = r.events("inv-1")
        return events, Projector("inv-1").extend(events)


@pytest.mark.parametrize("boundary", range(1, len(SEQUENCE) + 1))
def test_kill_after_each_durable_transition(place: Place, boundary: int) -> None:
    proc = _spawn(place, "crash", place.location)
    try:
        lines = _read_until(
            proc, lambda ls: sum(x.startswith("durable") for x in ls) == boundary, TIMEOUT
        )
    finally:
        _kill(proc)
    acked = [x for x in lines if x.startswith("durable")]
    events, proj = _recover(place)
    kinds = [e.kind for e in events]
    # Every acknowledged barrier survived; at most the events after it are missing.
    assert kinds == SEQUENCE[: len(kinds)]
    assert len(kinds) >= boundary
    assert acked[-1].split()[2] == SEQUENCE[boundary - 1].value
    rec = proj.record()
    if EventKind.DISPATCH_STARTED in kinds:
        assert rec.outcome is not Outcome.NOT_ATTEMPTED
        assert rec.evidence["dispatch_started"] is True
    else:
        assert rec.outcome is Outcome.NOT_ATTEMPTED
    with place.reader() as r:
        result = r.read_result("inv-1")
        if EventKind.RESULT_COMMITTED in kinds:
            assert result is not None
            assert result.streams == {"body": b"chunk-0 chunk-1 chunk-2"}
        else:
            assert result is None


@pytest.mark.parametrize("committed", [2, 3, 6])
def test_kill_inside_an_open_transaction(place: Place, committed: int) -> None:
    """The child writes the next event's row, then blocks before COMMIT; SIGKILL lands there.
    Recovery sees exactly the committed prefix, an intact chain and a consistent projection."""
    proc = _spawn(place, "midtxn", place.location, str(committed))
    try:
        _read_until(proc, lambda ls: ls[-1] == "in-txn", TIMEOUT)
    finally:
        _kill(proc)
    events, proj = _recover(place)
    kinds = [e.kind for e in events]
    assert kinds == SEQUENCE[:committed]
    rec = proj.record()
    dispatched = EventKind.DISPATCH_STARTED in kinds
    assert (rec.outcome is not Outcome.NOT_ATTEMPTED) == dispatched
    # The recovered journal accepts the interrupted write again (no half row blocks it).
    import trio

    async def resume() -> int:
        async with place.open() as j:
            ev = await j.append(happy("inv-1")[committed], barrier=True)
            assert ev.seq is not None
            return ev.seq

    assert trio.run(resume) == committed + 1


@pytest.mark.parametrize("delay", [0.05, 0.2, 0.45])
def test_kill_during_a_stream_of_large_group_commits(place: Place, delay: float) -> None:
    """64 tasks commit batches of large sealed payloads; the kill lands at an arbitrary point,
    usually while a batch is being written.  Every acknowledged barrier must survive."""
    proc = _spawn(place, "bulk", place.location)
    acked: list[int] = []

    def drain() -> None:
        # Keep reading so the child never blocks on a full pipe: it must be busy writing.
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("durable"):
                acked.append(int(line.split()[1]))

    reader = threading.Thread(target=drain, daemon=True)
    try:
        reader.start()
        deadline = time.monotonic() + TIMEOUT
        while not acked and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.01)
        assert acked, "child never committed"
        time.sleep(delay)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=TIMEOUT)
        reader.join(timeout=TIMEOUT)
        _kill_cleanup(proc)
    acked_seq = max(acked)
    with place.reader() as r:
        report = _verified(r, place)
        assert report.count >= acked_seq
        for rec in r.list_actions():
            if rec.evidence.get("dispatch_started"):
                assert rec.outcome is not Outcome.NOT_ATTEMPTED
