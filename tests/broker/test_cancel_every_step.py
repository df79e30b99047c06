"""A stop, a withdrawal or the caller's own cancellation landing at every step of a call.

The dispatch gate and the preflight section hold no cancel scope of their own: their writes are
uncancellable by themselves (``append(..., shield=True)``, ``write_many(..., shield=True)``).
This walks a cancellation (CallControl.stop, CallControl.withdraw, or a scope of the caller's
cancelled) across each step the calling task takes -- from a trio instrument, while the task
waits at the checkpoint ending step ``k`` or as it resumes from it: between steps is the only
place another task's cancellation can land -- and checks the seed's invariant each time:

* no byte reaches the remote before its dispatch boundary is durable -- DISPATCH_STARTED, and
  for a redirect's next hop its hop_dispatch (read from the file by a separate connection when
  each request arrives);
* a record whose DISPATCH_STARTED is durable never answers not_attempted, and one without it
  never claims the request may have been sent (the engine and the journal agree);
* the record is closed, and the journal verifies.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.engine import CallControl
from affidavit.journal import writer
from tests.http.hostile import HostileServer, Peer, Reply

from .helpers import http_target, open_broker, raw_kinds, write_config

LIMIT = 20
ACTIONS = {
    "direct": {"target": "api", "method": "POST", "path": "/v1/pay", "body": "{}"},
    "redirect": {"target": "api", "method": "GET", "path": "/v1/moved"},  # then /v1/here
}
MAX_STEPS = 400  # a bound on the walk: a call takes far fewer steps


class _CancelAtStep(trio.abc.Instrument):
    """Runs ``cancel`` at the ``k``-th step of the caller's task (0: never): ``blocked``, just
    after the step, while the task waits at the checkpoint that ended it (a wait that can be
    aborted is then); else just before the step, as the task resumes from that wait (the
    cancellation is delivered at its next checkpoint)."""

    def __init__(self, k: int, cancel: Any, blocked: bool) -> None:
        self.k = k
        self.cancel = cancel
        self.blocked = blocked
        self.task: trio.lowlevel.Task | None = None
        self.steps = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        if self.task is None and task.name.endswith(".run"):
            self.task = task  # the caller's task, from its first step on

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps += 1
            if self.steps == self.k and not self.blocked:
                self.cancel()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task and self.steps == self.k and self.blocked:
            self.cancel()


def _boundaries(db: Path) -> int:
    """The dispatch boundaries durable in the file now: DISPATCH_STARTED and redirect hops."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        (n,) = conn.execute(
            "SELECT count(*) FROM events WHERE kind = 'DISPATCH_STARTED' OR "
            "(kind = 'PROTOCOL_OBSERVED' AND attrs LIKE '%\"hop_dispatch\"%')"
        ).fetchone()
    finally:
        conn.close()
    return int(n)


async def call_cancelled_at(
    broker: Broker, action: dict[str, Any], k: int, how: str, blocked: bool
) -> tuple[dict[str, Any] | None, str | None, int]:
    control = CallControl()
    caller = trio.CancelScope()
    cancel = {"stop": control.stop, "withdraw": control.withdraw, "caller": caller.cancel}[how]
    inst = _CancelAtStep(k, cancel, blocked)
    out: list[dict[str, Any]] = []

    async def run() -> None:
        assert inst.task is trio.lowlevel.current_task()
        with caller:
            out.append(await broker.call(action, control=control))

    trio.lowlevel.add_instrument(inst)
    try:
        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run)
    finally:
        trio.lowlevel.remove_instrument(inst)
    return (out[0] if out else None), control.invocation_id, inst.steps


# Checked to fail (the engine writes SETUP_FAILED after a DISPATCH_STARTED that landed) when
# Writer.submit's wait for a queued write's answer is made abortable.


@pytest.mark.parametrize("path", ["direct", "redirect"])
@pytest.mark.parametrize("when", ["blocked", "resuming"])
@pytest.mark.parametrize("queue", ["room", "full"])
@pytest.mark.parametrize("how", ["stop", "withdraw", "caller"])
async def test_a_cancellation_at_any_step_never_sends_before_the_barrier_nor_misreports_it(
    tmp_path: Path,
    token: str,
    monkeypatch: pytest.MonkeyPatch,
    how: str,
    queue: str,
    when: str,
    path: str,
) -> None:
    if queue == "full":  # a write queued behind another waits for room (the shielded path)
        monkeypatch.setattr(writer, "MAX_QUEUED", 1)
    db = tmp_path / "journal.db"
    seen: list[int] = []  # the durable dispatch boundaries when each request arrived
    action = ACTIONS[path]

    async def script(peer: Peer) -> None:
        while True:
            req = await peer.read_request()
            if req is None:
                return
            seen.append(_boundaries(db))
            if req.target == "/v1/moved":
                await peer.respond(Reply(307, headers=[("Location", "/v1/here")]))
            else:
                await peer.respond(Reply(201, body=b'{"id": 1}'))

    async with HostileServer.running(script) as srv:
        target = http_target(srv.url, follow_redirects=path == "redirect")
        config = write_config(tmp_path, {"api": target})
        async with open_broker(config) as broker:
            # The module patched above is the one the broker's writer runs in (imported as
            # ``journal.writer``, the package's other name, it was a copy: the patch did
            # nothing and "full" ran as "room").
            assert type(broker.journal._writer).__module__ == writer.__name__
            _, _, total = await call_cancelled_at(broker, action, 0, how, blocked=False)
            hops = 2 if path == "redirect" else 1
            assert len(seen) == hops and _boundaries(db) == hops  # uncancelled, it follows
            assert 5 < total < MAX_STEPS
            for k in range(1, total + 2):
                before, base = len(seen), _boundaries(db)
                env, iid, _ = await call_cancelled_at(
                    broker, action, k, how, blocked=when == "blocked"
                )
                sent = len(seen) > before
                for n, durable in enumerate(seen[before:], 1):
                    # the n-th request reached the remote: its boundary was durable first
                    assert durable >= base + n, (k, n, durable - base)
                if iid is None:  # cancelled before the invocation was created
                    assert not sent and env is None
                    continue
                rec = broker.record(iid)
                assert rec is not None and rec.final, (k, rec)
                started = "DISPATCH_STARTED" in raw_kinds(db, iid)
                assert started or not sent, k
                outcome = rec.outcome.value
                assert (outcome == "not_attempted") == (not started), (k, outcome, started)
                if env is not None and "error" in env:
                    assert (env["error"]["outcome"] == "not_attempted") == (not started), (k, env)
            assert broker.journal.verify().ok
