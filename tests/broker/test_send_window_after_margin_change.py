"""A hint invites a same-key retry only while the lease check of today's settings allows it.

ACTION_ACCEPTED records the key's ``send_window`` -- the lease a retry takes with the target's
default timeout and ``[service] lease_margin`` as they were then.  Raise ``lease_margin`` and
restart (the daemon reads it at start: ``EngineSettings(lease_margin=...)``): a same-key retry's
lease is now longer, and ``journal/leases.py`` refuses one the key could not outlast.  Judged
by the recorded window alone, every read of the record accepted before went on saying
``same_idempotency_key`` -- and the retry it invited was answered ``reconcile``, nothing sent.
Every read now judges the key by the longer of the two windows: ``reconcile`` when the
current lease would outlast the key, and a retry inside the window still shown is sent.

Timeout 100 s, key retention 300 s: accepted under lease_margin 30 (a 130 s window, the key
usable while a retry's lease ends before 300 - 60 = 240 s).  Then lease_margin 150 (250 s: past
it) or 35 (135 s: still inside it, with 105 s to spare -- the real seconds the scenario takes,
two CLI processes on a loaded machine included, must not be what decides; with retention 200
and the same windows, 5 s did on a busy CI-like run).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.engine.delivery import STORE_ONLY
from affidavit.engine.settings import EngineSettings
from affidavit.journal import JournalWriteError
from affidavit.mcp.backends import Embedded
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E
from tests.http.hostile import HostileServer, Peer, Reply

from .helpers import affidavit_cli, event_kinds, http_target, write_config
from .http_rows import IDEM

LIMIT = 60  # seconds: the bound on each scenario
CHARGE = {"target": "api", "method": "POST", "path": "/v1/x", "idempotency_key": "charge"}


def _with_margin(cfg: Path, margin: int) -> Path:
    """The config, as an operator edits it: ``[service] lease_margin`` set."""
    text = cfg.read_text(encoding="utf-8")
    cfg.write_text(f"{text}\n[service]\nlease_margin = {margin}\n", encoding="utf-8")
    return cfg


def _open(cfg: Path) -> Broker:
    """The broker as ``affidavit serve`` opens it: its lease margin from the config."""
    config = load_config(cfg)
    return Broker.open(config=config, settings=EngineSettings(config.service.lease_margin))


@pytest.mark.parametrize(
    ("margin", "hint", "resent"),
    [(150, "reconcile", False), (35, "same_idempotency_key", True)],
    ids=["raised_past_the_key", "raised_within_the_key"],
)
async def test_a_raised_lease_margin_is_in_every_hint_of_a_record_accepted_before(
    tmp_path: Path, token: str, margin: int, hint: str, resent: bool
) -> None:
    received: list[str] = []

    async def script(peer: Peer) -> None:
        # The first request closed unanswered (unknown outcome), any later one answered 201.
        while (req := await peer.read_request()) is not None:
            received.append(req.target)
            if peer.index == 0:
                await peer.close()
                return
            await peer.respond(Reply(201, body=b'{"ok": true}'))

    async with HostileServer.running(script) as srv:
        target = http_target(
            srv.url,
            timeout={"connect": 2, "total": 100},
            idempotency={**IDEM, "retention": "300s"},
        )
        cfg = write_config(tmp_path, {"api": target})
        with trio.fail_after(LIMIT):
            async with _open(cfg) as broker:
                first = await broker.call(CHARGE)
                iid = first["invocation_id"]
                accepted = broker.record(iid)
            assert first["error"]["outcome"] == "unknown", first
            assert first["error"]["retry"] == "same_idempotency_key", first
            assert accepted is not None and accepted.idempotency is not None
            assert accepted.idempotency["send_window"] == 130

            _with_margin(cfg, margin)
            async with _open(cfg) as broker:
                fetched = await broker.fetch_result(iid)
                assert fetched is not None and fetched["error"]["retry"] == hint, fetched
                record = broker.record(iid)
                assert record is not None and record.retry == hint
                (listed,) = broker.journal.list_actions()
                assert listed.retry == hint
                (streamed,) = broker.journal.iter_actions()
                assert streamed.retry == hint
                page, _ = broker.journal.newest_actions(10)
                assert [r.retry for r in page] == [hint]
                shown = (await Embedded(broker).record(iid))["record"]
                assert shown["retry"] == hint, shown
                # The CLI reads in its own process, with the same config.
                got = await affidavit_cli("record", iid, "--json", "--config", str(cfg))
                assert got.returncode == 0, got.stderr
                assert json.loads(got.stdout)["record"]["retry"] == hint
                listing = await affidavit_cli("actions", "--json", "--config", str(cfg))
                assert [r["retry"] for r in json.loads(listing.stdout)] == [hint]

                again = await broker.call(CHARGE)
                kinds = event_kinds(broker, iid)
    assert again["invocation_id"] == iid
    if resent:  # the retry inside the window still shown is taken and sent
        assert "error" not in again, again
        assert received == ["/v1/x", "/v1/x"]
        assert E.RETRY_LEASE_ACQUIRED in kinds, kinds
        return
    # What every read said is what the same-key call is answered: nothing sent or written.
    assert received == ["/v1/x"]
    err = again["error"]
    assert (err["outcome"], err["retry"]) == ("unknown", "reconcile"), again
    assert E.RETRY_LEASE_ACQUIRED not in kinds, kinds


async def test_a_stored_result_fetched_by_a_deliverer_is_judged_by_todays_lease(
    tmp_path: Path, token: str
) -> None:
    """A stored result no caller has received, fetched with a deliverer (the daemon's answer):
    its envelope is rendered as the record will stand once delivered (``delivery._deliver``),
    a projection of its own -- judged by today's lease as every read is.  Throttled (429 with
    Retry-After, a POST: only the key makes a backoff safe), accepted under lease_margin 30,
    fetched under 150: the key would not outlast a retry's lease, so ``reconcile``, as the
    record and every view say -- never the ``backoff`` the recorded window alone gives."""

    async def script(peer: Peer) -> None:
        while await peer.read_request() is not None:
            await peer.respond(Reply(429, headers=[("retry-after", "1")]))

    async with HostileServer.running(script) as srv:
        target = http_target(
            srv.url,
            timeout={"connect": 2, "total": 100},
            idempotency={**IDEM, "retention": "300s"},
        )
        cfg = write_config(tmp_path, {"api": target})
        with trio.fail_after(LIMIT):
            async with _open(cfg) as broker:
                first = await broker.call(CHARGE, deliver=STORE_ONLY)
                iid = first["invocation_id"]
            assert first["error"]["code"] == "REMOTE_THROTTLED", first
            assert first["error"]["retry"] == "backoff", first

            _with_margin(cfg, 150)
            async with _open(cfg) as broker:
                handed: list[dict[str, object]] = []

                async def deliver(envelope: dict[str, object]) -> None:
                    handed.append(envelope)

                fetched = await broker.fetch_result(iid, deliver=deliver)
                record = broker.record(iid)
    assert record is not None and record.state.startswith("delivered"), record
    assert record.retry == "reconcile"
    assert fetched is not None and fetched["error"]["retry"] == "reconcile", fetched
    assert [e["error"]["retry"] for e in handed] == ["reconcile"]  # type: ignore[index]


async def test_a_call_the_journal_stopped_is_judged_by_todays_lease(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry's answer built from the durable events because the journal refused its closing
    event (``recovery.journal_refused``) is judged by today's lease too.  Accepted under
    lease_margin 30 (window 130), retried under 80 (180: inside the key, which is usable until
    240 s, the lease is taken); the retry is dropped and its ATTEMPT_INTERRUPTED refused while
    85 s have passed: by the recorded window the key still outlasts a retry (85 + 130 < 240),
    by today's it does not (85 + 180 > 240) -- ``reconcile``, as the record read back says.
    Either side holds for up to 25 real seconds of the scenario's own."""

    async def script(peer: Peer) -> None:  # every request closed unanswered: unknown
        if await peer.read_request() is not None:
            await peer.close()

    async with HostileServer.running(script) as srv:
        target = http_target(
            srv.url,
            timeout={"connect": 2, "total": 100},
            idempotency={**IDEM, "retention": "300s"},
        )
        cfg = write_config(tmp_path, {"api": target})
        with trio.fail_after(LIMIT):
            async with _open(cfg) as broker:
                first = await broker.call(CHARGE)
            assert first["error"]["retry"] == "same_idempotency_key", first

            _with_margin(cfg, 80)
            async with _open(cfg) as broker:
                journal = broker.journal
                real_append = journal.append

                async def append(event: Event, **kw: Any) -> None:
                    if event.kind is E.ATTEMPT_INTERRUPTED:
                        later = time.time() + 85
                        monkeypatch.setattr(journal, "_clock", lambda: later)
                        raise JournalWriteError("journal: write not committed (injected)")
                    await real_append(event, **kw)

                monkeypatch.setattr(journal, "append", append)
                again = await broker.call(CHARGE)
                record = broker.record(again["invocation_id"])
    assert record is not None and record.retry == "reconcile", record
    assert again["error"]["outcome"] == "unknown", again
    assert again["error"]["retry"] == "reconcile", again
