"""A stale worker whose call then fails -- the journal refuses its next write, or a failure
inside the broker -- closes its OWN attempt or nothing: never the attempt of the worker that took
the invocation over.

Seed, "Idempotency is defined by the remote contract": "the broker still needs to take a lease
on the invocation, record the retry generation, and allow only one active attempt."  Seed,
"Retry code must be simple and testable": "When the first one resumes, the generation check must
stop it".  A call the journal stopped is closed as a stopped broker's would be
(``journal_refused``), and one a bug ended at once (``internal_close``): both used to build the
closing event from the record's CURRENT generation -- so a worker resuming after its lease ran
out (cut off from its database past it, then ``CommitUnknown``) wrote ATTEMPT_INTERRUPTED into
the newer attempt while that attempt's request was in flight: the record read ``interrupted``,
inviting a third same-key send, and the newer attempt's response was refused.

Worker A (generation 0) is stopped with its response in hand until its lease has run out;
worker B -- a second broker on the same journal -- calls with the same key: recovery closes A's
attempt (unknown) and B retries under generation 1, its request held at the remote.  Then A
resumes and its first write fails, nothing written (the journal takes the next): ``journal``
-- refused (``JournalWriteError``); ``internal`` -- a failure inside the broker (a bug:
``RuntimeError``), the two brokers sharing one holder name (the holder check alone passed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.engine import EngineSettings
from affidavit.journal import JournalWriteError
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Peer, Reply

from .helpers import http_target, until_lease_lapsed, write_config
from .http_rows import IDEM, POST

E = EventKind
LIMIT = 20  # seconds: the bound on each scenario
ACTION = {**POST, "idempotency_key": "stale-failure"}


class Stalled:
    """A's binding: stops, shielded, once the real ``perform`` returned (a paused process), until
    ``resume``."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.kind, self.table = real.kind, real.table
        self.stopped, self.resume = trio.Event(), trio.Event()

    def prepare(self, *args: Any) -> Any:
        return self.real.prepare(*args)

    def connect_timeout(self, target: Any) -> float:
        return float(self.real.connect_timeout(target))

    async def aclose(self) -> None:
        await self.real.aclose()

    async def perform(self, prepared: Any, ctx: Any) -> Any:
        result = await self.real.perform(prepared, ctx)
        self.stopped.set()
        with trio.CancelScope(shield=True):
            await self.resume.wait()
        return result


async def _remote(peer: Peer) -> None:
    """A's request is answered at once; B's held until the test sets ``release_b``."""
    if await peer.read_request() is None:
        return
    if peer.index > 0:
        peer.server.event("b_received").set()
        await peer.server.event("release_b").wait()
    await peer.respond(Reply(201, body=b'{"n":%d}' % peer.index))


def _fail_once(broker: Broker, error: Exception) -> None:
    """``broker``'s next append fails with ``error``, nothing written; later ones land."""
    journal = broker.journal
    real = journal.append

    async def append(*args: Any, **kw: Any) -> Any:
        journal.append = real  # type: ignore[method-assign]
        raise error

    journal.append = append  # type: ignore[method-assign]


@pytest.mark.parametrize("failure", ["journal", "internal"])
async def test_a_stale_worker_s_failure_never_closes_the_attempt_that_took_over(
    tmp_path: Path, token: str, failure: str
) -> None:
    async with HostileServer.running(_remote) as srv:
        cfg = load_config(write_config(tmp_path, {"api": http_target(srv.url, idempotency=IDEM)}))
        settings = EngineSettings(lease_margin=0.0)
        holders = ("worker", "worker") if failure == "internal" else ("worker-A", "worker-B")
        async with (
            Broker.open(config=cfg, settings=settings, holder=holders[0]) as a,
            Broker.open(config=cfg, settings=settings, holder=holders[1]) as b,
        ):
            stalled = Stalled(a._engine.bindings["http"])
            a._engine.bindings["http"] = stalled
            envs: dict[str, Any] = {}
            a_done = trio.Event()

            async def call_a() -> None:
                try:
                    envs["a"] = await a.call(ACTION, timeout=0.5)
                except RuntimeError as exc:
                    envs["a"] = exc
                a_done.set()

            async def call_b() -> None:
                envs["b"] = await b.call(ACTION)

            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(call_a)
                    await stalled.stopped.wait()
                    (action,) = a.journal.list_actions()
                    iid = action.invocation_id
                    (accepted,) = [e for e in b.events(iid) if e.kind is E.ACTION_ACCEPTED]
                    await until_lease_lapsed(accepted)  # A's lease runs out while A is stopped
                    nursery.start_soon(call_b)
                    await srv.event("b_received").wait()  # B's retry is in flight
                    if failure == "journal":
                        _fail_once(a, JournalWriteError("journal: disk I/O error (injected)"))
                    else:
                        _fail_once(a, RuntimeError("a bug (injected)"))
                    stalled.resume.set()
                    await a_done.wait()
                    # A answered while B's request is still held: B's attempt stays open.
                    during = b.record(iid)
                    assert during is not None
                    assert (during.state, during.generation) == ("dispatched", 1), during.state
                    srv.event("release_b").set()
            events = b.events(iid)
            closings = {E.ATTEMPT_INTERRUPTED, E.SETUP_FAILED, E.RESULT_STORE_FAILED}
            assert [e.attrs.get("generation") for e in events if e.kind in closings] == [0]
            env_b = envs["b"]
            assert "error" not in env_b, env_b  # B's response is the invocation's result
            record = b.record(iid)
            assert record is not None
            assert [(x["generation"], x["outcome"]) for x in record.attempts] == [
                (0, "unknown"),
                (1, "committed"),
            ]
            env_a = envs["a"]
            if failure == "internal":
                assert isinstance(env_a, RuntimeError)  # the host names the invocation
                return
            # A's answer: LEASE_LOST from the record as it stood (B in flight), nothing of it
            # claimed as A's.
            err = env_a["error"]
            assert err["code"] == "LEASE_LOST", env_a
            assert (err["outcome"], err["retry"]) == ("unknown", "fetch_result"), err
            assert "generation 1" in err["message"], err["message"]
            assert "result" not in env_a
