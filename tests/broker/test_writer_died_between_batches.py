"""The journal's writer thread stopped between two batches (by a ``KeyboardInterrupt`` or a
``SystemExit`` delivered to it: not an ``Exception``, so ``journal/writer.py``'s ``_die``) while a
call runs: the broker answers from what is durable, never more.  Stopped before DISPATCH_STARTED
was durable, nothing is sent and the call is not attempted; stopped once it was, the call is
``unknown``; a call after that is refused before anything is recorded or sent (the documented
``JournalWriteError``: the daemon's 503 JOURNAL_UNAVAILABLE, "nothing was sent").  Bounded:
nothing waits for the dead thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api import Broker
from affidavit.journal import JournalWriteError
from tests.http.hostile import HostileServer, Peer, Reply
from tests.journal.helpers import unstick, unstick_handed

from .helpers import http_target, open_broker, write_config

LIMIT = 20
POST = {"target": "api", "method": "POST", "path": "/charge", "body": "{}"}


class Stop(BaseException):
    """Stands for a KeyboardInterrupt/SystemExit delivered to the writer thread."""


def _stop_between_batches(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, when: Callable[[Any], bool]
) -> None:
    """Stop the writer thread in its upkeep between two batches -- outside any transaction,
    the batch before answered -- the first time ``when(conn)`` holds there."""
    backend = broker.journal._writer.backend
    upkeep = backend.between

    def between(conn: Any) -> None:
        if when(conn):
            raise Stop()
        upkeep(conn)

    monkeypatch.setattr(backend, "between", between)


def _dispatch_durable(conn: Any) -> bool:
    sql = "SELECT 1 FROM events WHERE kind = 'DISPATCH_STARTED'"
    return conn.execute(sql).fetchone() is not None


async def _run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: Callable[[Any], bool]
) -> tuple[dict[str, Any], BaseException, HostileServer, Path]:
    died: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    dead = trio.Event()

    async def script(peer: Peer) -> None:
        # Answers only once the writer is dead: the call's next write meets it.
        if await peer.read_request() is None:
            return
        with trio.move_on_after(LIMIT):
            await dead.wait()
        await peer.respond(Reply(201, body=b"charged"))

    answers: dict[str, Any] = {}
    async with HostileServer.running(script) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        with pytest.raises(BaseExceptionGroup) as closed, trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                writer = broker.journal._writer

                async def watch() -> None:
                    stopped_at = None
                    while writer._dead is None:
                        await trio.sleep(0.005)
                        thread = writer._thread
                        if stopped_at is None and not (thread and thread.is_alive()):
                            stopped_at = trio.current_time()
                        if stopped_at is not None and trio.current_time() - stopped_at > 1:
                            # The bug: the thread stopped and the writes waiting for it were
                            # never told.  Answer them, so that the test fails, not hangs.
                            writer._closed = True
                            unstick(writer)
                            unstick_handed(writer)
                            break
                    dead.set()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(watch)
                    _stop_between_batches(broker, monkeypatch, when)
                    answers["env"] = await broker.call(POST)
                    # The writer task re-raising it cancels the journal's owner (this task); a
                    # call that still gets this far -- shielded here -- is refused, sends nothing.
                    with trio.CancelScope(shield=True), pytest.raises(JournalWriteError) as later:
                        await broker.call(POST)
                    answers["later"] = later.value
        assert closed.value.subgroup(Stop) is not None  # the journal's close raises it again
    assert len(died) == 1 and isinstance(died[0], Stop)
    return answers["env"], answers["later"], srv, cfg


async def test_a_writer_stopped_before_dispatch_sends_nothing(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, later, srv, cfg = await _run(tmp_path, monkeypatch, lambda conn: True)
    err = env["error"]
    assert (err["phase"], err["outcome"]) == ("connection_setup", "not_attempted"), env
    assert env["evidence"]["dispatch_started"] is False
    assert "the writer stopped (Stop): write not taken" in str(later)
    assert srv.requests == []  # neither call sent anything
    async with open_broker(cfg) as broker:  # what is durable says the same
        rec = broker.record(env["invocation_id"])
        assert rec is not None and rec.outcome.value == "not_attempted"


async def test_a_writer_stopped_after_dispatch_is_unknown(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, later, srv, cfg = await _run(tmp_path, monkeypatch, _dispatch_durable)
    err = env["error"]
    assert (err["phase"], err["outcome"], err["retry"], err["code"]) == (
        "remote_execution",
        "unknown",
        "reconcile",
        "REMOTE_OUTCOME_UNKNOWN",
    ), env
    assert env["evidence"]["dispatch_started"] is True
    assert "the writer stopped (Stop): write not taken" in str(later)
    # At most once (the write after DISPATCH_STARTED failing may end the call before the
    # request is whole: that is why it is unknown); the later call did not even connect.
    assert len(srv.requests) <= 1 and srv.connections == 1
    async with open_broker(cfg) as broker:  # what is durable: dispatched, so unknown
        rec = broker.record(env["invocation_id"])
        assert rec is not None and rec.outcome.value == "unknown", rec
        assert rec.state == "dispatched"  # (recovery closes it once its lease runs out)
