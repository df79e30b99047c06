"""The operator routes' JSON bodies (``POST /v1/approvals/{id}/approve|deny``,
``/v1/invocations/{id}/reconcile``): a field the route does not take is refused with the call
API's code for it (``INVALID_FIELD``) and its name -- never dropped, where a misspelt ``note``
would record a decision without the operator's words -- and every other body error names its
field.  Nothing is decided or recorded on a refusal."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import trio

from affidavit.api.wire import blocking_request
from affidavit.daemon import operators
from affidavit.daemon.app import QUERY_PARAMS, Api
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import api_target, cli, running_daemon

CHARGE = {"target": "api", "method": "POST", "path": "/v1/charges", "body": "{}"}
REQUESTS: dict[Any, tuple[str, str, bytes | None]] = {
    Api.call: ("POST", "/v1/calls", json.dumps(CHARGE).encode()),
    Api.poll: ("POST", "/v1/operations/x/poll", None),
    operators.reconcile: ("POST", "/v1/invocations/x/reconcile", b'{"query": true}'),
    Api.result: ("GET", "/v1/invocations/x/result", None),
    Api.record: ("GET", "/v1/invocations/x", None),
    Api.actions: ("GET", "/v1/actions", None),
    Api.sessions: ("GET", "/v1/sessions", None),
    Api.metrics: ("GET", "/v1/metrics", None),
}
"""A request (method, path, a body it takes) of each handler that reads query parameters."""
ROUTES = tuple((*REQUESTS[handler], names) for handler, names in QUERY_PARAMS.items())
"""Every route that reads query parameters and the parameters, as the daemon lists them
(``app.QUERY_PARAMS``): a handler or parameter added there is tried here too -- a handler with
no request above fails at import, a parameter with no values below in its test."""


async def _post(socket: Path, path: str, body: dict[str, Any]) -> tuple[int, str, str, Any]:
    data = json.dumps(body).encode()
    answer = await trio.to_thread.run_sync(blocking_request, str(socket), "POST", path, data)
    error = answer.error()
    return answer.status, error.code, error.message, error.field


async def test_an_operator_body_with_an_unknown_or_wrong_field_is_refused_naming_it(
    tmp_path: Path, token: str
) -> None:
    service = {"operator_uids": [os.geteuid()], "allow_self_approval": True}
    async with (
        HostileServer.running(scripts.serve(Reply(200))) as srv,
        running_daemon(
            tmp_path,
            api_target(srv.url, approval={"methods": ["POST"]}),
            token=token,
            service=service,
        ) as daemon,
    ):
        asked = await cli(daemon, "call", "-", stdin=json.dumps(CHARGE).encode())
        iid = asked.json()["invocation_id"]
        assert asked.json()["error"]["code"] == "APPROVAL_PENDING", asked.stdout
        approve, deny = f"/v1/approvals/{iid}/approve", f"/v1/approvals/{iid}/deny"
        reconcile = f"/v1/invocations/{iid}/reconcile"
        for path, body, code, said in (
            (approve, {"note": "ok", "notes": "typo"}, "INVALID_FIELD", "notes: unknown field"),
            (deny, {"Note": "x"}, "INVALID_FIELD", "Note: unknown field"),
            (approve, {"a\nb": 1}, "INVALID_FIELD", "body: unknown field"),
            (approve, {"x" * 65: 1}, "INVALID_FIELD", "body: unknown field"),
            (approve, {"note": 5}, "BAD_REQUEST", "note: expected a string"),
            (reconcile, {"query": True, "force": True}, "INVALID_FIELD", "force: unknown field"),
            (reconcile, {"query": "yes"}, "BAD_REQUEST", "query: expected true or false"),
            (reconcile, {"attest": 1, "note": "n"}, "BAD_REQUEST", "attest: expected a string"),
            (reconcile, {"attest": "rejected", "note": 1}, "BAD_REQUEST", "note: expected"),
        ):
            status, got, message, field = await _post(daemon.socket, path, body)
            assert (status, got) == (400, code), (body, message)
            assert message.startswith(said), (body, message)
            assert field == said.split(":")[0], (body, field)  # api_error.field: the part to fix
            assert "\n" not in message and "x" * 65 not in message, message
        listed = await cli(daemon, "approvals", "--json")
        assert [a["invocation_id"] for a in listed.json()] == [iid]  # nothing decided
        done = await trio.to_thread.run_sync(
            blocking_request, str(daemon.socket), "POST", approve, b'{"note": "ok"}'
        )
        assert done.status == 200, done


async def test_a_bad_query_parameter_or_body_is_refused_naming_it_in_field(
    tmp_path: Path, token: str
) -> None:
    """Every 400 that names what to fix says it in ``api_error.field`` too (as an envelope's
    error does), not only at the start of the message: a query parameter, a body that is not
    an object, an action body that is not JSON -- and a query parameter the route does not
    read is one of them (``INVALID_FIELD``), not silently dropped."""
    async with (
        HostileServer.running(scripts.serve(Reply(200))) as srv,
        running_daemon(tmp_path, api_target(srv.url), token=token) as daemon,
    ):
        socket = str(daemon.socket)
        for method, path, body, code, field in (
            ("GET", "/v1/actions?limit=many", None, "BAD_REQUEST", "limit"),
            ("GET", "/v1/actions?outcome=fine", None, "BAD_REQUEST", "outcome"),
            ("GET", "/v1/actions?since=yesterday", None, "BAD_REQUEST", "since"),
            ("GET", "/v1/metrics?format=xml", None, "BAD_REQUEST", "format"),
            (
                "POST",
                "/v1/calls?timeout=-1",
                json.dumps(CHARGE).encode(),
                "INVALID_FIELD",
                "timeout",
            ),
            ("POST", "/v1/approvals/x/approve", b"[1]", "BAD_REQUEST", "body"),
            ("POST", "/v1/calls", b'{"target": "api"', "BAD_JSON", "action"),
            # A parameter the route does not read is refused, never dropped: a misspelt
            # timeout would run the call under the target's own.
            ("POST", "/v1/calls?timout=5", json.dumps(CHARGE).encode(), "INVALID_FIELD", "timout"),
            ("GET", "/v1/actions?limt=5", None, "INVALID_FIELD", "limt"),
            ("GET", "/v1/health?verbose=1", None, "INVALID_FIELD", "verbose"),
            ("GET", "/v1/invocations/x/result?from=2", None, "INVALID_FIELD", "from"),
            ("GET", "/v1/sessions?a%0Ab=1", None, "INVALID_FIELD", "query"),
        ):
            answer = await trio.to_thread.run_sync(blocking_request, socket, method, path, body)
            error = answer.error()
            assert (answer.status, error.code, error.field) == (400, code, field), (path, error)
            raw = json.loads(answer.body)["api_error"]
            assert raw["field"] == field and field in raw["message"], raw
            assert "\n" not in raw["message"], raw
        assert srv.requests == []  # the refused calls were never run
        listed = await trio.to_thread.run_sync(
            blocking_request, socket, "GET", "/v1/actions?limit=5&outcome=unknown", None
        )
        assert listed.status == 200 and listed.json()["actions"] == [], listed


async def test_a_query_parameter_given_twice_is_refused_naming_it_on_every_route(
    tmp_path: Path, token: str
) -> None:
    """``?timeout=1&timeout=100`` is refused (400 ``INVALID_FIELD``, ``field`` naming it),
    as an unknown parameter is -- never one of the two values kept unseen (the last, which
    would run the call under 100 s).  Every parameter of every route that reads one is tried,
    spelt plainly and percent-encoded; nothing is run."""
    values = {
        "timeout": ("1", "100"),
        "from_chunk": ("0", "1"),
        "from_seq": ("0", "1"),
        "chunks": ("1", "2"),
        "session": ("a", "b"),
        "outcome": ("unknown", "committed"),
        "phase": ("validation", "result_delivery"),
        "since": ("0", "1"),
        "until": ("0", "1"),
        "limit": ("5", "50"),
        "format": ("json", "prometheus"),
    }
    async with (
        HostileServer.running(scripts.serve(Reply(200))) as srv,
        running_daemon(tmp_path, api_target(srv.url), token=token) as daemon,
    ):
        socket = str(daemon.socket)
        for method, path, body, names in ROUTES:
            for name in names:
                one, other = values[name]
                encoded = "".join(f"%{b:02X}" for b in name.encode())
                for query in (f"{name}={one}&{name}={other}", f"{name}={one}&{encoded}={other}"):
                    target = f"{path}?{query}"
                    answer = await trio.to_thread.run_sync(
                        blocking_request, socket, method, target, body
                    )
                    error = answer.error()
                    assert (answer.status, error.code, error.field) == (
                        400,
                        "INVALID_FIELD",
                        name,
                    ), (target, answer.status, error)
                    assert "given twice" in error.message, (target, error)
        # A route that reads none still calls a repeated name unknown, as it does a single one.
        answer = await trio.to_thread.run_sync(
            blocking_request, socket, "GET", "/v1/health?verbose=1&verbose=2", None
        )
        error = answer.error()
        assert (answer.status, error.code, error.field) == (400, "INVALID_FIELD", "verbose")
        assert "unknown query parameter" in error.message, error
        assert srv.requests == []  # the refused calls were never run
        once = await trio.to_thread.run_sync(
            blocking_request, socket, "GET", "/v1/actions?limit=5&outcome=unknown", None
        )
        assert once.status == 200 and once.json()["actions"] == [], once


async def test_a_query_parameter_given_empty_is_refused_naming_it_on_every_route(
    tmp_path: Path, token: str
) -> None:
    """``?timeout=`` (or ``?timeout``) is refused as ``--timeout ''`` is (400 ``INVALID_FIELD``
    at ``timeout``), never read as absent -- the call ran under the target's own timeout, and
    ``?session=`` listed every session's records.  Every other parameter likewise, with the
    code a bad value of it gets (``BAD_REQUEST``); nothing is run."""
    async with (
        HostileServer.running(scripts.serve(Reply(200))) as srv,
        running_daemon(tmp_path, api_target(srv.url), token=token) as daemon,
    ):
        socket = str(daemon.socket)
        for method, path, body, names in ROUTES:
            for name in names:
                code = "INVALID_FIELD" if name == "timeout" else "BAD_REQUEST"
                for target in (f"{path}?{name}=", f"{path}?{name}"):
                    answer = await trio.to_thread.run_sync(
                        blocking_request, socket, method, target, body
                    )
                    error = answer.error()
                    assert (answer.status, error.code, error.field) == (400, code, name), (
                        target,
                        answer.status,
                        error,
                    )
                    assert name in error.message, (target, error)
        timeout = await trio.to_thread.run_sync(
            blocking_request, socket, "POST", "/v1/calls?timeout=", json.dumps(CHARGE).encode()
        )
        words = await cli(daemon, "call", "-", "--timeout", "", stdin=json.dumps(CHARGE).encode())
        assert f"affidavit: {timeout.error().message}\n".encode() == words.stderr, words.stderr
        assert srv.requests == []
