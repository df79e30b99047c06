"""A reconciliation query's path is held to the action path's rule: a bound value that makes a
segment some server reads as "." or ".." gets the query refused, and nothing is sent.

docs/approvals.md ("A value never changes the template's syntax"): a value is percent-encoded as
one segment (every character but ``A-Z a-z 0-9 - . _ ~``), so a key ``%2e%2e`` is sent as
``%252e%252e`` -- ``..`` to a server that decodes twice -- and a key ``..`` as itself.  The
query is an ordinary action on the target (``reconcile/service.py``), parsed by the same
``parse_action``: the rule of ``affidavit/protocols/http/segments.py`` refuses it at ``path``
before the host name is resolved or the credential read.  The scripted payments API records
every request it gets; a plain key's query reaching it is the row that shows it would.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from tests.http.hostile import HostileServer

from .approvalkit import PaymentsApi, reconcile_target, verify_ok
from .helpers import open_broker, write_config
from .http_rows import LIMIT

# The key as a path segment, and in the query the payments API reads it from.
TEMPLATE = "/v1/charges/{idempotency_key}/state?idempotency_key={idempotency_key}"


def _targets(url: str) -> dict[str, object]:
    targets = reconcile_target(url)
    targets["api"]["reconcile"] = {**targets["api"]["reconcile"], "path": TEMPLATE}
    return targets


@pytest.mark.parametrize(
    ("key", "sent"),
    [
        ("pay-1", ["POST", "GET"]),  # a name: the query runs and settles the charge committed
        ("..", ["POST"]),
        ("%2e%2e", ["POST"]),  # sent as %252e%252e: ".." decoded twice
        ("%2e%2e%3F", ["POST"]),  # %252e%252e%253F: "..?" -- a decoded "?" ends the name
        ("%EF%BC%8E%EF%BC%8E", ["POST"]),  # full-width "．．" once decoded twice, NFKC
    ],
)
async def test_a_key_that_makes_the_query_path_climb_gets_it_refused_unsent(
    tmp_path: Path, token: str, key: str, sent: list[str]
) -> None:
    api = PaymentsApi()
    charge = {
        "target": "api",
        "method": "POST",
        "path": "/v1/charges",
        "body": json.dumps({"drop": True}),  # applied, then closed unanswered: unknown
        "idempotency_key": key,
    }
    async with (
        HostileServer.running(api.script) as srv,
        open_broker(write_config(tmp_path, _targets(srv.url))) as broker,
    ):
        with trio.fail_after(LIMIT):
            env = await broker.call(charge)
            assert env["error"]["outcome"] == "unknown", env
            answer = await broker.reconcile(env["invocation_id"], query=True)
        rec = broker.record(env["invocation_id"])
        assert rec is not None
        verify_ok(broker)
    assert api.applied == [key]
    assert [r.method for r in srv.requests] == sent  # the refused query reached nothing
    if sent[-1] == "GET":
        assert answer["reconciled"] is True and rec.outcome.value == "committed", answer
        return
    query = answer["query"]
    assert query["error"]["code"] == "INVALID_FIELD" and query["error"]["field"] == "path"
    assert query["error"]["outcome"] == "not_attempted"
    assert query["evidence"]["dispatch_started"] is False
    assert answer["reconciled"] is False and rec.outcome.value == "unknown"
