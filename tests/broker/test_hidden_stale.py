"""A reconciliation query of an invocation a caller may not read (on a target this broker's
configuration does not name) is refused as an unknown id before anything is written for it --
even when its attempt was left open and its lease ran out, which any read that reaches it
closes (``recover_stale``, reconcile/service.py ``_unknown_at_rest``): a caller's probe closes
nothing, so the journal tells no asker that it found a record there.  An operator's query
(``as_operator``) reaches it and closes it, which is what makes the first half able to fail.
On a SQLite file and on a shared PostgreSQL database (where such a record is typically another
broker's, its holder stopped)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from affidavit.approvals import OperatorError
from affidavit.engine.ids import new_invocation_id
from affidavit.statemachine import Event, EventKind

from .helpers import http_target, open_broker, pg_journal, write_config
from .http_rows import LIMIT

E = EventKind


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_a_hidden_record_left_open_is_refused_as_an_unknown_id_and_left_as_it_was(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    journal = None  # a SQLite file; else a shared database, as another broker's record is
    if backend == "postgresql":
        db = request.getfixturevalue("pg_url")
        journal = pg_journal(tmp_path, db)
    targets = {"api": http_target("http://127.0.0.1:9")}
    cfg = write_config(tmp_path, targets, journal=journal)
    hidden, made_up = new_invocation_id(), new_invocation_id()
    async with open_broker(cfg) as broker:
        accepted = {
            "operation": {"target": "old", "protocol": "http", "idempotent": False},
            "holder": "dead-broker",
            "lease_expires_at": time.time() - 1.0,  # its holder gone, its lease run out
        }
        for kind, attrs in (
            (E.ACTION_ACCEPTED, accepted),
            (E.PREFLIGHT_VALIDATED, {}),
            (E.CREDENTIAL_AUTHORIZED, {}),
            (E.DISPATCH_STARTED, {"generation": 0}),
        ):
            await broker.journal.append(Event(kind, hidden, attrs), barrier=True)
        before = len(broker.events(hidden))
        refused = {}
        with trio.fail_after(LIMIT):
            for iid in (hidden, made_up):
                with pytest.raises(OperatorError) as caught:
                    await broker.reconcile(iid, query=True)
                err = caught.value
                refused[iid] = (err.code, err.status, err.field, str(err).replace(iid, "ID"))
            assert refused[hidden] == refused[made_up], refused
            assert refused[made_up][:3] == ("NO_SUCH_INVOCATION", 404, "invocation_id"), refused
            assert len(broker.events(hidden)) == before  # nothing written: the lease left open
            # An operator's channel reaches it: its stale attempt is closed by what it proves.
            with pytest.raises(OperatorError) as caught:
                await broker.reconcile(hidden, query=True, as_operator=True)
            assert caught.value.code != "NO_SUCH_INVOCATION", caught.value
        assert len(broker.events(hidden)) > before


def test_the_operator_s_channel_is_asked_for_by_one_keyword() -> None:
    # The reads a hidden id is refused at take one flag, named alike, never by position --
    # ``reconcile`` already had ``operator: Operator`` (who attests) beside it.
    import inspect

    from affidavit.api.broker import Broker

    for method in (Broker.reconcile, Broker.poll_operation, Broker.fetch_result):
        params = inspect.signature(method).parameters
        flag = params["as_operator"]
        assert (flag.kind, flag.default) == (inspect.Parameter.KEYWORD_ONLY, False), method
        assert method is Broker.reconcile or "operator" not in params, method
