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
