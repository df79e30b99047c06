"""Between a fence's two writes (``binder.fence``: ACTION_ACCEPTED with ``fenced``, then
PREFLIGHT_FAILED), the record is fenced already -- its first event says so (``Record.fenced``)
-- and every caller that meets it gets the answer it gets once the fence has closed it.

The set-up is test_binder_fence's first story: two brokers of one journal file, X (total 30 s)
binds ``charge-1`` and stalls before recording anything, Y (total 1 s) judges X gone by its own
window and fences X's invocation.  Here Y is held right after the fence's first write (bounded
by ``LIMIT``), and in that window come: X itself resuming (its ACTION_ACCEPTED refused), a
second call with a different request (Z, configured as Y), the same request again (X2,
configured as X), and recovery.  Once, X's preamble rows after its refused ACTION_ACCEPTED
landed in the fenced record and X went on to send the charge, while Y told its caller nothing
was sent under the key (X asking an operator first had the refusal escape its call); Z was told
"bound to a different request" where Y was told nothing was sent; X2 had recovery close the
record SETUP_FAILED, took a retry lease in it and sent the charge; recovery closed it
SETUP_FAILED, which reads as a setup failure that a retry may follow.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.engine import EngineSettings
from affidavit.statemachine import FENCE_RULES, Event
from affidavit.statemachine import EventKind as E
from tests.http.hostile import HostileServer, Peer, Reply

from .approvalkit import approval_config, verify_ok
from .helpers import closed_port, http_target, write_config
from .http_rows import IDEM, LIMIT

CHARGE = {
    "target": "api",
    "method": "POST",
    "path": "/v1/charges",
    "body": '{"amount": 5}',
    "idempotency_key": "charge-1",
}
UNSENT = "nothing was sent under the key"


def _error(envelope: dict[str, Any]) -> dict[str, Any]:
    """What a caller acts on: code, phase, outcome, retry and message."""
    return {k: envelope["error"][k] for k in ("code", "phase", "outcome", "retry", "message")}


@dataclass
class Window:
    """X's call, stalled after its binding; Y's, held between its fence's two writes."""

    bx: Broker
    by: Broker
    cx: Path
    cy: Path
    received: list[bytes]
    out: dict[str, dict[str, Any]] = field(default_factory=dict)
    go: trio.Event = field(default_factory=trio.Event)
    """Lets X's binder go on."""
    release: trio.Event = field(default_factory=trio.Event)
    """Lets Y's fence write its second event."""
    xid: str = ""
    """X's invocation, the one its binding names."""


async def _serve(peer: Peer, received: list[bytes]) -> None:
    while True:
        req = await peer.read_request()
        if req is None:
            return
        received.append(req.body or b"")
        await peer.respond(Reply(201, body=b'{"id": "ch_1"}'))


def _stall_binder(broker: Broker, go: trio.Event) -> tuple[trio.Event, list[str]]:
    """X binds as a broker from before the binding held its send deadline and target (so Y
    judges it by Y's own 1 s window), then waits for ``go``; the id it bound is kept."""
    bound, ids = trio.Event(), []
    bind = broker.journal.bind_idempotency

    async def stalled(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("send_by", None)
        kwargs.pop("target", None)
        done = await bind(*args, **kwargs)
        ids.append(done.invocation_id)
        bound.set()
        with trio.fail_after(LIMIT):
            await go.wait()
        return done

    broker.journal.bind_idempotency = stalled  # type: ignore[method-assign]
    return bound, ids


def _hold_first(broker: Broker, release: trio.Event, mark: str = "fenced") -> trio.Event:
    """Y's recorder holds after it wrote a first event carrying ``mark`` (a fence's ACTION_
    ACCEPTED; ``took_over``: a take-over's) until ``release``."""
    held = trio.Event()
    recorder = broker._engine.recorder
    write = recorder.write

    async def holding(event: Event, **kwargs: Any) -> None:
        await write(event, **kwargs)
        if event.kind is E.ACTION_ACCEPTED and mark in event.attrs and not held.is_set():
            held.set()
            with trio.fail_after(LIMIT):  # inside the fence's shield: bounded all the same
                await release.wait()

    recorder.write = holding  # type: ignore[method-assign]
    return held


@contextlib.asynccontextmanager
async def _window(
    tmp_path: Path,
    meanwhile: Callable[[Window], Awaitable[None]],
    *,
    approval: bool = False,
    refusing: bool = False,
) -> AsyncIterator[Window]:
    """Run X and Y into the window, then ``meanwhile``, then release Y and let X go on; yield
    once both calls have answered (the brokers still open).  ``approval``: X's target asks an
    operator first (its preamble is written with APPROVAL_REQUESTED); ``refusing``: X's target
    is a loopback port nobody listens on (its connection is refused)."""
    received: list[bytes] = []

    async def script(peer: Peer) -> None:
        await _serve(peer, received)

    async with HostileServer.running(script) as srv:

        def config(total: int, name: str, url: str = srv.url) -> Path:
            timeout = {"connect": 1, "total": total}
            return write_config(
                tmp_path,
                {"api": http_target(url, idempotency=IDEM, timeout=timeout)},
                name=name,
            )

        x_url = f"http://127.0.0.1:{closed_port()}" if refusing else srv.url
        cx, cy = config(30, "x.toml", x_url), config(1, "y.toml")
        if approval:
            timeout = {"connect": 1, "total": 30}
            cx = approval_config(
                tmp_path, srv.url, name="x.toml", idempotency=IDEM, timeout=timeout
            )
        quick = EngineSettings(lease_margin=0.1)
        async with (
            Broker.open(config=load_config(cx)) as bx,
            Broker.open(config=load_config(cy), settings=quick) as by,
        ):
            w = Window(bx, by, cx, cy, received)
            bound, ids = _stall_binder(bx, w.go)
            held = _hold_first(by, w.release)

            async def call(name: str, b: Broker) -> None:
                w.out[name] = await b.call(CHARGE)

            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(call, "x", bx)
                    await bound.wait()
                    w.xid = ids[0]
                    nursery.start_soon(call, "y", by)
                    await held.wait()
                    # The window: the record is fenced, not closed.
                    record = bx.record(w.xid)
                    assert record is not None and record.fenced is not None, record
                    assert not record.final, record
                    await meanwhile(w)
                    w.release.set()
                    w.go.set()
            yield w


def _fenced_fact(accepted: Event) -> dict[str, Any]:
    """The fence's facts, as its close and ``Record.fenced`` carry them: written under these
    rules (``FENCE_RULES``), which only its first event names."""
    fenced = dict(accepted.attrs["fenced"])
    assert fenced.pop("rules") == FENCE_RULES, accepted
    return fenced


def _assert_fenced_once(w: Window) -> None:
    """X's record holds the fence's two events -- the close built from the fenced fact,
    whoever wrote it -- then at most X's LEASE_LOST; nothing was received; the chain holds."""
    events = w.bx.events(w.xid)
    kinds = [e.kind for e in events]
    assert kinds[:2] == [E.ACTION_ACCEPTED, E.PREFLIGHT_FAILED], kinds
    assert kinds[2:] in ([], [E.LEASE_LOST]), kinds
    fenced = _fenced_fact(events[0])
    assert events[1].attrs["binder_gone"] == fenced
    assert events[1].attrs["code"] == "IDEMPOTENCY_MISMATCH"
    assert UNSENT in events[1].attrs["message"]
    record = w.bx.record(w.xid)
    assert record is not None and record.final
    assert dict(record.fenced or {}) == fenced
    assert record.evidence["dispatch_started"] is False
    assert w.received == []
    verify_ok(w.bx)


async def _closed_answers(w: Window) -> None:
    """Y is IDEMPOTENCY_MISMATCH, nothing sent; X is answered from its closed record."""
    y, x = w.out["y"], w.out["x"]
    assert {**_error(y), "message": None} == {
        "code": "IDEMPOTENCY_MISMATCH",
        "phase": "validation",
        "outcome": "not_attempted",
        "retry": "after_correction",
        "message": None,
    }, y
    assert UNSENT in y["error"]["message"], y
    fetched = await w.bx.fetch_result(w.xid, as_operator=True)
    assert fetched is not None
    assert _error(x) == _error(fetched), (x, fetched)
    assert x["error"]["code"] == "IDEMPOTENCY_MISMATCH", x
    assert x["error"]["outcome"] == "not_attempted", x
    assert UNSENT in x["error"]["message"], x
    assert x["evidence"]["dispatch_started"] is False, x


async def test_a_binder_resuming_between_the_fence_s_writes_is_answered_nothing_sent(
    tmp_path: Path, token: str
) -> None:
    """X resumes in the window: its ACTION_ACCEPTED is refused, and it closes the record as
    the fence would and answers from it (never re-raises the refusal as an INTERNAL error);
    Y's own close is then refused, and Y answers as ever."""

    async def binder_resumes(w: Window) -> None:
        w.go.set()
        with trio.fail_after(LIMIT):
            while "x" not in w.out:
                await trio.sleep(0.01)
        assert "y" not in w.out  # Y is still held between its writes

    async with _window(tmp_path, binder_resumes) as w:
        await _closed_answers(w)
        _assert_fenced_once(w)
        assert [e.kind for e in w.bx.events(w.xid)][2:] == [E.LEASE_LOST]


async def test_a_binder_whose_connection_is_refused_in_the_window_closes_it_as_the_fence(
    tmp_path: Path, token: str
) -> None:
    """X resumes in the window, its preamble refused without X being told (posted, not
    awaited), and connects to a port nobody listens on: its SETUP_FAILED CONNECTION_REFUSED is
    refused too -- a fenced record's close is the fence's, whoever writes it.  X closes it so
    and is answered from it, IDEMPOTENCY_MISMATCH after_correction (a new key), never
    CONNECTION_REFUSED backoff -- which every same-key retry was then answered, for good."""

    async def binder_resumes(w: Window) -> None:
        w.go.set()
        with trio.fail_after(LIMIT):
            while "x" not in w.out:
                await trio.sleep(0.01)

    async with _window(tmp_path, binder_resumes, refusing=True) as w:
        await _closed_answers(w)
        _assert_fenced_once(w)
        assert [e.kind for e in w.bx.events(w.xid)][2:] == [E.LEASE_LOST]
        assert w.out["x"]["error"]["retry"] == "after_correction", w.out["x"]
        with trio.fail_after(LIMIT):  # the same request again, same key: the same answer
            again = await w.bx.call(CHARGE)
        assert again["invocation_id"] == w.xid and _error(again) == _error(w.out["x"]), again


async def test_a_binder_asking_an_operator_between_the_fence_s_writes_is_answered_nothing_sent(
    tmp_path: Path, token: str
) -> None:
    """X's target needs approval: X resumes in the window, its preamble and APPROVAL_REQUESTED
    are refused -- answered from the record, closed as the fence closes it, not an INTERNAL
    error; nothing is asked of an operator, nothing sent."""

    async def binder_resumes(w: Window) -> None:
        w.go.set()
        with trio.fail_after(LIMIT):
            while "x" not in w.out:
                await trio.sleep(0.01)

    async with _window(tmp_path, binder_resumes, approval=True) as w:
        await _closed_answers(w)
        _assert_fenced_once(w)
        assert [e.kind for e in w.bx.events(w.xid)][2:] == [E.LEASE_LOST]


async def test_a_second_different_request_in_the_window_is_answered_as_the_fencing_one(
    tmp_path: Path, token: str
) -> None:
    """Z (configured as Y) calls under the key in the window, and again once it closed: the
    record is recognised as fenced by its first event, so both answers are Y's --
    IDEMPOTENCY_MISMATCH, nothing sent under the key -- with the fence's evidence recorded,
    and nothing of Z is written into X's record."""
    answers: list[dict[str, Any]] = []

    async def another_request(w: Window) -> None:
        async with Broker.open(config=load_config(w.cy)) as bz:
            answers.append(await bz.call(CHARGE))

    async with _window(tmp_path, another_request) as w:
        async with Broker.open(config=load_config(w.cy)) as bz:
            answers.append(await bz.call(CHARGE))
            fenced = _fenced_fact(w.bx.events(w.xid)[0])
            for z in answers:
                assert _error(z) == _error(w.out["y"]), (z, w.out["y"])
                refused = bz.events(z["invocation_id"])[-1]
                assert refused.kind is E.PREFLIGHT_FAILED
                assert refused.attrs["binder_gone"] == fenced
        await _closed_answers(w)
        _assert_fenced_once(w)


async def test_the_same_request_in_the_window_never_takes_the_fenced_invocation_over(
    tmp_path: Path, token: str
) -> None:
    """X2 (configured as X: the same fingerprint) calls in the window: it is answered from
    the record, closed as the fence closes it -- it takes no retry lease and sends nothing."""
    answers: list[dict[str, Any]] = []

    async def same_request(w: Window) -> None:
        async with Broker.open(config=load_config(w.cx)) as bx2:
            answers.append(await bx2.call(CHARGE))

    async with _window(tmp_path, same_request) as w:
        (x2,) = answers
        assert x2["invocation_id"] == w.xid, x2
        assert x2["error"]["code"] == "IDEMPOTENCY_MISMATCH", x2
        assert x2["error"]["outcome"] == "not_attempted", x2
        assert x2["error"]["retry"] == "after_correction", x2
        assert UNSENT in x2["error"]["message"], x2
        assert x2["evidence"]["dispatch_started"] is False, x2
        await _closed_answers(w)
        _assert_fenced_once(w)
        kinds = [e.kind for e in w.bx.events(w.xid)]
        assert E.RETRY_LEASE_ACQUIRED not in kinds and E.SETUP_FAILED not in kinds, kinds


async def test_recovery_in_the_window_closes_the_record_as_the_fence_does(
    tmp_path: Path, token: str
) -> None:
    """Recovery (a broker of the shared journal closing what ran out) meets the open fenced
    record -- no lease, no holder: it closes it with the fence's own close, so it still reads
    fenced, nothing sent, IDEMPOTENCY_MISMATCH -- never SETUP_FAILED, whose hint invites a
    retry; a reader in the window is told exactly that."""
    seen: list[Any] = []

    async def recovery(w: Window) -> None:
        async with Broker.open(config=load_config(w.cy)) as bz:
            closed = await bz.recover()
            seen.append(closed)
            seen.append(await w.bx.fetch_result(w.xid, as_operator=True))

    async with _window(tmp_path, recovery) as w:
        closed, fetched = seen
        assert [r.invocation_id for r in closed] == [w.xid], closed
        (record,) = closed
        assert record.fenced is not None and record.final, record
        assert record.code is not None and record.code.value == "IDEMPOTENCY_MISMATCH", record
        assert fetched is not None
        assert fetched["error"]["code"] == "IDEMPOTENCY_MISMATCH", fetched
        assert fetched["error"]["outcome"] == "not_attempted", fetched
        assert UNSENT in fetched["error"]["message"], fetched
        assert fetched["evidence"]["dispatch_started"] is False, fetched
        await _closed_answers(w)
        _assert_fenced_once(w)
