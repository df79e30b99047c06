"""A late binder that reaches its dispatch gate after a take-over sends nothing.

Two brokers of one journal file: X binds ``charge-1`` and stalls before recording anything (as
a broker from before the binding held its send deadline, so Y judges it by Y's own window: total
1 s); X sizes its own lease 4 s longer, so it still runs when X resumes.  Past Y's window, Y
(the same request) takes the invocation over by winning its first event -- generation 0, as X's
attempt -- and X resumes: its posted preamble is refused, it connects, and its DISPATCH_STARTED
append is held until Y has recorded its CREDENTIAL_AUTHORIZED and holds at its own gate.  X's
gate, generation 0 in a record whose preamble is all Y's, is refused: by its refused first event
among its unread posts (``Journal.append(after=...)``), and by the record's lease being Y's
(``leases.check_first_deadline``).  Once, it passed under Y's deadline and X sent.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import trio

from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.engine import EngineSettings
from affidavit.engine.attempt import superseded
from affidavit.engine.recovery import journal_refused
from affidavit.journal import JournalWriteError
from affidavit.statemachine import Event, ImpossibleEvent
from affidavit.statemachine import EventKind as E
from tests.http.hostile import HostileServer, Peer
from tests.journal.helpers import accepted, interrupted, until_dispatch

from .approvalkit import verify_ok
from .helpers import http_target, write_config
from .http_rows import IDEM, LIMIT
from .test_takeover_window import CHARGE, _serve, _stall_binder


def _hold_gate(
    broker: Broker, wait_for: trio.Event, raised: list[BaseException] | None = None
) -> trio.Event:
    """``broker``'s DISPATCH_STARTED append waits for ``wait_for`` (what it then raises is
    kept in ``raised``); the event returned is set once it is held there."""
    held = trio.Event()
    journal = broker.journal
    append = journal.append

    async def holding(event: Event, **kwargs: Any) -> Event:
        if event.kind is not E.DISPATCH_STARTED or held.is_set():
            return await append(event, **kwargs)
        held.set()
        with trio.fail_after(LIMIT):
            await wait_for.wait()
        try:
            return await append(event, **kwargs)
        except BaseException as exc:
            if raised is not None:
                raised.append(exc)
            raise

    journal.append = holding  # type: ignore[method-assign]
    return held


async def _until_authorized(broker: Broker, iid: str) -> None:
    """Until ``iid``'s record holds CREDENTIAL_AUTHORIZED (polled, bounded by the caller)."""
    while E.CREDENTIAL_AUTHORIZED not in [e.kind for e in broker.events(iid)]:
        await trio.sleep(0.01)


async def test_a_binder_s_gate_after_a_take_over_is_refused_and_sends_nothing(
    tmp_path: Path, token: str
) -> None:
    received: list[bytes] = []

    async def script(peer: Peer) -> None:
        await _serve(peer, received)

    out: dict[str, dict[str, Any]] = {}
    async with HostileServer.running(script) as srv:
        timeout = {"connect": 1, "total": 1}
        target = http_target(srv.url, idempotency=IDEM, timeout=timeout)
        cfg = load_config(write_config(tmp_path, {"api": target}))
        quick = EngineSettings(lease_margin=0.1)
        async with (
            Broker.open(config=cfg, settings=quick) as bx,
            Broker.open(config=cfg, settings=quick) as by,
        ):
            ttl = bx._engine.lease_ttl  # X holds its lease 4 s longer than Y judges it by
            bx._engine.lease_ttl = lambda t, timeout: ttl(t, timeout) + 4  # type: ignore[method-assign]
            go, y_at_gate = trio.Event(), trio.Event()
            bound, ids = _stall_binder(bx, go)
            gate: list[BaseException] = []
            x_at_gate = _hold_gate(bx, y_at_gate, gate)
            release_y = trio.Event()
            y_held = _hold_gate(by, release_y)

            async def call(name: str, b: Broker) -> None:
                out[name] = await b.call(CHARGE)

            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(call, "x", bx)
                    await bound.wait()
                    await trio.sleep(1.3)  # past Y's window for X (total 1 s + margin 0.1)
                    nursery.start_soon(call, "y", by)
                    (xid,) = ids
                    while not any("took_over" in e.attrs for e in bx.events(xid)):
                        await trio.sleep(0.01)
                    go.set()  # X resumes after Y's first event
                    await x_at_gate.wait()
                    await y_held.wait()
                    await _until_authorized(bx, xid)
                    y_at_gate.set()  # X's gate goes on, in Y's record, Y's preamble in it
                    while "x" not in out:
                        await trio.sleep(0.01)
                    assert "y" not in out and received == []
                    release_y.set()
            # X's gate was refused with its first event's refusal: the call's unsettled posts
            # went with it (``Recorder.unsettled``), its preamble among them.
            (refused,) = gate
            assert isinstance(refused, ImpossibleEvent), refused
            assert refused.event.kind is E.ACTION_ACCEPTED, refused.event
            assert refused.event.attrs["holder"] == bx._engine.holder
            events = bx.events(xid)
            kinds = [e.kind for e in events]
            assert kinds.count(E.ACTION_ACCEPTED) == kinds.count(E.DISPATCH_STARTED) == 1
            assert "took_over" in events[0].attrs
            assert kinds.count(E.PREFLIGHT_VALIDATED) == kinds.count(E.CREDENTIAL_AUTHORIZED) == 1
            lost = [e for e in events if e.kind is E.LEASE_LOST]
            assert [e.attrs for e in lost] == [{"generation": 0, "holder": bx._engine.holder}]
            assert kinds.index(E.LEASE_LOST) < kinds.index(E.DISPATCH_STARTED), kinds
            # The record tells the stopped generation-0 worker (X) from the one that ran (Y).
            (stale,) = bx.journal.record(xid).evidence["stale_workers"]  # type: ignore[union-attr]
            assert (stale["generation"], stale["holder"]) == (0, bx._engine.holder), stale
            # Exactly one request at the server: Y's.
            assert received == [b'{"amount": 5}']
            x, y = out["x"], out["y"]
            assert y["invocation_id"] == xid and "error" not in y, y
            assert y["evidence"]["outcome"] == "committed", y
            assert x["invocation_id"] == xid, x
            assert x["error"]["code"] == "LEASE_LOST", x
            assert x["error"]["outcome"] == "not_attempted", x
            assert "it sent nothing" in x["error"]["message"], x
            assert x["evidence"]["dispatch_started"] is False, x
            verify_ok(bx)


async def test_a_failed_call_in_a_taker_s_record_is_answered_lease_lost(
    tmp_path: Path, token: str
) -> None:
    """A call stopped by the journal (``journal_refused``) whose attempt -- generation 0 --
    is not the record's: the record's generation 0 is another holder's, which won the first
    event and ran the invocation.  The call is answered LEASE_LOST, sent nothing -- never the
    taker's committed result as its own (the generation alone matches)."""
    received: list[bytes] = []

    async def script(peer: Peer) -> None:
        await _serve(peer, received)

    async with HostileServer.running(script) as srv:
        target = http_target(srv.url, idempotency=IDEM)
        cfg = load_config(write_config(tmp_path, {"api": target}))
        async with Broker.open(config=cfg, holder="taker") as b:
            taker = await b.call(CHARGE)
            iid = taker["invocation_id"]
            assert taker["evidence"]["outcome"] == "committed", taker
            recorder = b._engine.recorder
            recorder.attempting(iid, 0)
            try:
                failed = JournalWriteError("journal: disk I/O error (injected)")
                env = await journal_refused(recorder, iid, failed, "binder")
            finally:
                recorder.done()
            # The record's phase and outcome (``lease_lost_error``), none of its result.
            assert env["error"]["code"] == "LEASE_LOST", env
            assert env["error"]["message"].endswith(
                "it sent nothing. Its result is stored: fetch it."
            )
            assert "result" not in env, env
            assert received == [b'{"amount": 5}']


async def test_a_refused_first_event_is_a_lost_record_only_when_another_call_s_is_first(
    tmp_path: Path,
) -> None:
    """``superseded`` after this call's own ACTION_ACCEPTED was refused: the record is lost to
    another call only when it exists and its first event is another's (a taker's); with no
    record, or this call's own first event first, the refusal is something else and the caller
    raises it -- never an assertion on a missing record."""
    cfg = load_config(write_config(tmp_path, {"api": http_target("http://127.0.0.1:9")}))
    async with Broker.open(config=cfg, holder="binder") as b:
        engine = b._engine
        deadline = {"lease_expires_at": time.time() + 60}
        mine = {**accepted("inv-1").attrs, "holder": "binder", **deadline}
        for iid, first in (("inv-mine", mine), ("inv-taken", {**mine, "holder": "taker"})):
            for ev in until_dispatch(iid)[:2]:
                await b.journal.append(
                    ev if ev.kind is not E.ACTION_ACCEPTED else Event(ev.kind, iid, first)
                )

        def refusal(iid: str) -> ImpossibleEvent:
            return ImpossibleEvent(Event(E.ACTION_ACCEPTED, iid, mine), "accepted", "refused")

        assert await superseded(engine, "inv-none", 0, refusal("inv-none")) is None
        assert await superseded(engine, "inv-mine", 0, refusal("inv-mine")) is None
        taken = await superseded(engine, "inv-taken", 0, refusal("inv-taken"))
        assert taken is not None and taken.invocation_id == "inv-taken"


async def test_a_binder_whose_generation_the_taker_dispatched_is_told_it_sent_nothing(
    tmp_path: Path, token: str
) -> None:
    """The taker won generation 0, dispatched and was interrupted; a retry took generation 1.
    A binder stopped by the journal (``journal_refused``) at its generation 0 is answered
    LEASE_LOST -- and generation 0's dispatch is the taker's, so the binder is told it sent
    nothing, never "it had dispatched" (the record's generation alone matched)."""
    cfg = load_config(write_config(tmp_path, {"api": http_target("http://127.0.0.1:9/")}))
    async with Broker.open(config=cfg, holder="taker") as b:
        journal, iid = b.journal, "act_0TAKENOVERDISPATCHED000000"
        first, *rest = interrupted(iid)
        taken = Event(first.kind, iid, {**first.attrs, "holder": "taker"})
        for event in (taken, *rest):
            await journal.append(event)
        await journal.acquire_lease(iid, "taker", 30.0)
        recorder = b._engine.recorder
        with trio.fail_after(LIMIT):
            recorder.attempting(iid, 0)
            try:
                failed = JournalWriteError("journal: disk I/O error (injected)")
                env = await journal_refused(recorder, iid, failed, "binder")
            finally:
                recorder.done()
        message = env["error"]["message"]
        assert env["error"]["code"] == "LEASE_LOST", env
        assert "it sent nothing" in message and "had dispatched" not in message, message
