"""What a view shows of a record whose retry holds its lease: no earlier attempt's code.

An interrupted POST rests ``unknown`` / REMOTE_OUTCOME_UNKNOWN.  A retry takes the next lease
(``retry_pending``): the record rests in no final state, and every view shows it
``fetch_result`` (docs/contract.md, "When the hint is computed").  The projection still holds
the code that ended the attempt before, and the views showed it as the record's ``code`` --
with its message -- beside ``fetch_result``: a running attempt presented with an outcome code
it has not produced.  The view now shows no code for it; the earlier attempt's code stays in
its ``attempts`` entry.  ``record_to_json`` and the encoder ``affidavit actions --json`` uses
(caller's and operator's) agree.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from affidavit.journal import Journal
from affidavit.statemachine import Event, render_envelope
from affidavit.statemachine import EventKind as E
from affidavit.views import record_json_encoder, record_to_json

from .helpers import interrupted

IID = "act_retry"


def _views(j: Journal) -> list[dict]:
    rec = j.record(IID, now=time.time())
    assert rec is not None
    return [
        record_to_json(rec, holder=j.holder_tag),
        record_to_json(rec, operator=True),
        json.loads(record_json_encoder(holder=j.holder_tag)(rec)),
        json.loads(record_json_encoder(operator=True)(rec)),
    ]


async def test_a_retry_holding_its_lease_is_shown_without_the_earlier_attempts_code(
    tmp_path: Path,
) -> None:
    async with Journal.open(tmp_path / "j.db") as j:
        for ev in interrupted(IID):
            await j.append(ev)
        for shown in _views(j):  # at rest: its own code
            assert (shown["state"], shown["code"]) == ("interrupted", "REMOTE_OUTCOME_UNKNOWN")
            assert shown["message"]
        lease = await j.acquire_lease(IID, "broker-2", ttl=60.0)
        for shown in _views(j):
            assert (shown["state"], shown["retry"]) == ("retry_pending", "fetch_result"), shown
            assert shown["evidence"]["lease"]["expires_at"] == lease.expires_at
            assert (shown["code"], shown["message"], shown["field"]) == (None, "", None), shown
            (earlier,) = shown["attempts"]
            assert (earlier["generation"], earlier["code"]) == (0, "REMOTE_OUTCOME_UNKNOWN")
        # The retry dispatches and is interrupted in turn: its own code is shown again.
        await j.append(Event(E.DISPATCH_STARTED, IID, {"generation": 1}))
        await j.append(Event(E.ATTEMPT_INTERRUPTED, IID, {"code": "REMOTE_RESULT_INCOMPLETE"}))
        for shown in _views(j):
            assert (shown["state"], shown["code"]) == ("interrupted", "REMOTE_RESULT_INCOMPLETE")


async def test_a_record_at_rest_is_shown_no_lease_deadline(tmp_path: Path) -> None:
    """A final record holds no lease (``leases.acquire_op``: an attempt that is over keeps no
    one out; a same-key call is answered from the record): its ``evidence.lease`` names whose
    attempt it was, not a deadline until which the invocation would be held -- in the views
    and in the envelope (``fetch_result``).  While the attempt runs, the deadline is shown."""
    async with Journal.open(tmp_path / "j.db") as j:
        for ev in interrupted(IID):
            await j.append(ev)
        lease = await j.acquire_lease(IID, "broker-2", ttl=600.0)
        running = j.record(IID, now=time.time())
        assert running is not None
        assert render_envelope(running)["evidence"]["lease"]["expires_at"] == lease.expires_at
        await j.append(Event(E.DISPATCH_STARTED, IID, {"generation": 1}))
        await j.append(Event(E.ATTEMPT_INTERRUPTED, IID, {"code": "REMOTE_RESULT_INCOMPLETE"}))
        rec = j.record(IID, now=time.time())
        assert rec is not None and rec.final and lease.expires_at > time.time()
        shown = [*_views(j), render_envelope(rec, holder=j.holder_tag)["evidence"]]
        tag = j.holder_tag(IID, "broker-2")  # a caller's; an operator's view: as recorded
        for view, holder in zip(shown, [tag, "broker-2", tag, "broker-2", tag], strict=True):
            evidence = view.get("evidence", view)
            want = {"generation": 1, "holder": holder, "seq": lease.seq}
            assert evidence["lease"] == want, view


async def test_the_counts_and_the_code_filter_of_a_running_retry_agree_with_its_view(
    tmp_path: Path,
) -> None:
    """The metrics (``views.metrics_key``: ``/v1/metrics``, the kept counts, the console's
    counts) and the console's code filter read the projection's code: a retry holding its lease
    was counted -- and listed under ``?code=`` -- as REMOTE_OUTCOME_UNKNOWN, an outcome code the
    running attempt has not produced and its view does not show.  Counted as the view shows it
    (no code: ``OK``, as a first attempt in flight), and listed under that."""
    from affidavit.console.pages import ActionFilters, actions_page
    from affidavit.journal import SessionSummary
    from affidavit.views import metrics, metrics_key, metrics_of

    async with Journal.open(tmp_path / "j.db") as j:
        for ev in interrupted(IID):
            await j.append(ev)
        await j.acquire_lease(IID, "broker-2", ttl=60.0)
        (shown,) = _views(j)[:1]
        assert shown["code"] is None
        counted = metrics(j.iter_actions())
        kept = metrics_of(j.summarized_tallies(SessionSummary(metrics_key))[0])
        for counts in (counted, kept):
            assert counts["by_code_outcome"] == [
                {"code": "OK", "outcome": "unknown", "count": 1}
            ], counts
        listed = actions_page(j, ActionFilters(code="REMOTE_OUTCOME_UNKNOWN"))
        assert listed["rows"] == [], listed
        listed = actions_page(j, ActionFilters(code="OK"))
        assert [r["invocation_id"] for r in listed["rows"]] == [IID], listed


def test_the_items_of_a_record_in_flight_say_fetch_result_as_the_record_does() -> None:
    """A batch sent with an idempotency key: while its attempt runs (``dispatched``) or a
    retry holds its lease, the record is shown -- and answered -- ``fetch_result`` (a same-key
    call answers IN_PROGRESS; a new one would be a second active attempt), but each of its
    items said ``same_idempotency_key``: a resend the record itself does not allow.  The items
    of a record in no final state say ``fetch_result`` in every view and in the envelope; at
    rest, their own hint."""
    from affidavit.statemachine import Projector

    now = time.time()
    op = {
        "target": "payments",
        "protocol": "http",
        "fingerprint": "sha256:" + "0" * 64,
        "budget": 3,
        "idempotent": False,
        "idempotency": {"scope": "s", "key": "k1", "expires_at": now + 86400},
        "batch": {"items": ["a", "b"], "atomic": False},
    }
    p = Projector(IID)
    for ev in (
        Event(E.ACTION_ACCEPTED, IID, {"operation": op, "session": "s"}),
        Event(E.PREFLIGHT_VALIDATED, IID, {"config_hash": "sha256:c0ff"}),
        Event(E.CREDENTIAL_AUTHORIZED, IID, {"credential": "pay-token", "version": "7"}),
        Event(E.DISPATCH_STARTED, IID, {"attempt": 1}),
    ):
        p.apply(ev)

    def shown_hints() -> list[set[str]]:
        rec = p.record(now)
        return [
            {i["retry"] for i in view["items"]}
            for view in (
                record_to_json(rec),
                json.loads(record_json_encoder()(rec)),
                json.loads(record_json_encoder(operator=True)(rec)),
                render_envelope(rec),
            )
        ]

    assert shown_hints() == [{"fetch_result"}] * 4  # in flight
    p.apply(Event(E.ATTEMPT_INTERRUPTED, IID, {"code": "REMOTE_OUTCOME_UNKNOWN"}))
    assert shown_hints() == [{"same_idempotency_key"}] * 4  # at rest: its own
    p.apply(
        Event(E.RETRY_LEASE_ACQUIRED, IID, {"generation": 1, "holder": "b", "expires_at": now + 60})
    )
    assert shown_hints() == [{"fetch_result"}] * 4  # a retry holds its lease


def test_the_items_of_a_running_retry_are_shown_and_counted_without_the_earlier_code() -> None:
    """The items of a batch share the parent's code until its response gives them their own:
    a retry holding its lease showed -- and the metrics counted -- each item with the code that
    ended the attempt before it (REMOTE_OUTCOME_UNKNOWN), which the record itself no longer
    shows (``views.shown_error``).  Shown and counted without it; at rest, with it."""
    from affidavit.statemachine import Projector
    from affidavit.views import metrics

    now = time.time()
    op = {
        "target": "payments",
        "protocol": "http",
        "fingerprint": "sha256:" + "0" * 64,
        "budget": 3,
        "batch": {"items": ["a", "b"], "atomic": False},
    }
    p = Projector(IID)
    for ev in (
        Event(E.ACTION_ACCEPTED, IID, {"operation": op, "session": "s"}),
        Event(E.PREFLIGHT_VALIDATED, IID, {"config_hash": "sha256:c0ff"}),
        Event(E.CREDENTIAL_AUTHORIZED, IID, {"credential": "pay-token", "version": "7"}),
        Event(E.DISPATCH_STARTED, IID, {"attempt": 1}),
        Event(E.ATTEMPT_INTERRUPTED, IID, {"code": "REMOTE_OUTCOME_UNKNOWN"}),
    ):
        p.apply(ev)

    def shown_codes() -> list[set[str | None]]:
        rec = p.record(now)
        return [
            {i["code"] for i in view["items"]}
            for view in (
                record_to_json(rec),
                json.loads(record_json_encoder()(rec)),
                render_envelope(rec),
            )
        ]

    def counted() -> list[dict]:
        return metrics([p.record(now)])["batch_items"]

    assert shown_codes() == [{"REMOTE_OUTCOME_UNKNOWN"}] * 3  # at rest: the attempt's own
    assert {c["code"] for c in counted()} == {"REMOTE_OUTCOME_UNKNOWN"}
    lease = {"generation": 1, "holder": "b", "expires_at": now + 60}
    p.apply(Event(E.RETRY_LEASE_ACQUIRED, IID, lease))
    assert shown_codes() == [{None}] * 3
    assert {c["code"] for c in counted()} == {"OK"}, counted()
