"""An id in a request path is one segment, whatever it holds: the thin client quotes it
(``wire.invocation_path``: ``/`` as ``%2F``), and the daemon routes on the path as sent, then
unquotes each id -- never the whole path first, where ``X%2Fresult`` became ``X/result`` and
``affidavit record 'X/result'`` was answered the *result* of X (a shape the command did not
expect: a traceback)."""

from __future__ import annotations

from pathlib import Path

import trio

from affidavit.api.wire import blocking_request

from .kit import action_bytes, api_target, cli, running_daemon


async def test_an_id_holding_a_slash_is_no_other_route(tmp_path: Path, token: str) -> None:
    async with running_daemon(tmp_path, api_target("http://127.0.0.1:9"), token=token) as d:
        made = await cli(d, "call", "-", stdin=action_bytes())
        iid = made.json()["invocation_id"]

        for path, method in (
            (f"/v1/invocations/{iid}%2Fresult", "GET"),
            (f"/v1/invocations/{iid}%2Freconcile", "GET"),
            (f"/v1/invocations/{iid}%2Fresult/result", "GET"),
        ):
            answer = await trio.to_thread.run_sync(blocking_request, str(d.socket), method, path)
            error = answer.error()
            assert (answer.status, error.code) == (404, "NO_SUCH_INVOCATION"), (path, answer)
            assert f"{iid}/" in error.message, error.message

        shown = await cli(d, "record", f"{iid}/result")
        assert shown.returncode != 0 and b"Traceback" not in shown.stderr, shown
        assert f"no invocation {iid}/result".encode() in shown.stderr, shown.stderr
        # Quoted the other way round too: a percent sign in an id stays one.
        answer = await trio.to_thread.run_sync(
            blocking_request, str(d.socket), "GET", f"/v1/invocations/{iid}%252F"
        )
        assert f"{iid}%2F" in answer.error().message
        # The id itself, unquoted as ever.
        found = await cli(d, "record", iid)
        assert found.returncode == 0, found


async def test_an_id_or_path_is_echoed_at_most_64_printable_characters(
    tmp_path: Path, token: str
) -> None:
    """A refusal quotes the caller's id (``no operation X in the journal``) or path at most
    ``ECHO`` (64) characters, escaped: the 422 for an unknown operation echoed a 10 000-character
    id whole, and a line break (``%0A``) in one into the message.  Its code and ``field`` stay;
    a short printable id is quoted whole, as before."""
    long_id, split_id = "op_" + "A" * 10_000, "op_X%0AINJECTED"
    async with running_daemon(tmp_path, api_target("http://127.0.0.1:9"), token=token) as d:
        for method, path, status, code, field, shown in (
            (
                "POST",
                f"/v1/operations/{long_id}/poll",
                422,
                "OPERATION_ERROR",
                "operation_id",
                f"no operation {long_id[:61]}... in the journal",
            ),
            (
                "POST",
                f"/v1/operations/{split_id}/poll",
                422,
                "OPERATION_ERROR",
                "operation_id",
                "no operation op_X\\nINJECTED in the journal",
            ),
            (
                "POST",
                "/v1/operations/op_SHORT/poll",
                422,
                "OPERATION_ERROR",
                "operation_id",
                "no operation op_SHORT in the journal",
            ),
            (
                "GET",
                f"/v1/invocations/act_{'B' * 10_000}",
                404,
                "NO_SUCH_INVOCATION",
                "invocation_id",
                f"no invocation act_{'B' * 57}... in the journal",
            ),
            (
                "GET",
                f"/v1/{'c' * 10_000}",
                404,
                "NOT_FOUND",
                None,
                f"no such API path: /v1/{'c' * 57}...",
            ),
            ("PUT", f"/v1/calls%0A{'d' * 100}", 404, "NOT_FOUND", None, "/v1/calls\\ndddd"),
            ("PUT", "/v1/calls", 405, "METHOD_NOT_ALLOWED", None, "/v1/calls takes POST"),
        ):
            answer = await trio.to_thread.run_sync(blocking_request, str(d.socket), method, path)
            error = answer.error()
            assert (answer.status, error.code, error.field) == (status, code, field), error
            assert shown in error.message and "\n" not in error.message, error.message
            assert len(error.message) < 150, error.message


async def test_a_time_filter_is_echoed_at_most_64_printable_characters(
    tmp_path: Path, token: str
) -> None:
    """``since`` / ``until`` that is no time is refused quoting it as every echo is
    (``text.echoed``): a 15 KB ``since`` was echoed whole into a 15 KB answer (audit 53), by
    the daemon's ``GET /v1/actions`` and by ``affidavit actions --since`` alike.  The field is
    still named."""
    bad = "x" * 15_000
    async with running_daemon(tmp_path, api_target("http://127.0.0.1:9"), token=token) as d:
        for name in ("since", "until"):
            answer = await trio.to_thread.run_sync(
                blocking_request, str(d.socket), "GET", f"/v1/actions?{name}={bad}"
            )
            error = answer.error()
            assert (answer.status, error.code, error.field) == (400, "BAD_REQUEST", name), error
            assert f"{name}: expected ISO 8601" in error.message, error.message
            assert f"'{'x' * 61}...'" in error.message and len(error.message) < 150, error.message
        shown = await cli(d, "actions", "--since", bad + "\n")
        assert shown.returncode != 0 and b"Traceback" not in shown.stderr, shown
        assert b"--since" in shown.stderr and b"x" * 62 not in shown.stderr, shown.stderr
        assert len(shown.stderr) < 400, shown.stderr
