"""The daemon's socket reads only invocations on a target the caller may call: one the daemon's
configuration names (every peer it allows may call each of them).  A target removed from the
configuration -- its access withdrawn -- took its invocations with it for callers: their ids
answer exactly as an unknown id does (404 NO_SUCH_INVOCATION, the same words) at the result
(``fetch_result``) and at the record (``GET /v1/invocations/{id}``), and ``/v1/actions`` lists
them not, nor counts them -- so through these routes a caller can neither read them nor tell
that they exist (``/v1/sessions`` and ``/v1/metrics`` do not count them either:
tests/daemon/test_readable_page.py).  An operator still reads them (``affidavit result``
embedded, the console)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.broker.helpers import TOKEN_ENV, http_target, open_broker
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import HUNG, api_target, ask, embedded, start_daemon, stop, write_daemon_config

BODY = b"the old target's stored answer"


SESSION = "two-targets"


async def made_on_two_targets(cfg: Path) -> tuple[str, str]:
    """One call on ``api`` and one on ``old``, embedded, in ``SESSION``: their invocation ids."""
    ids = []
    async with open_broker(cfg) as broker:
        for name in ("api", "old"):
            action = {"target": name, "method": "GET", "path": "/thing", "session": SESSION}
            with trio.fail_after(HUNG):
                env = await broker.call(action)
            assert env.get("error") is None, env
            ids.append(str(env["invocation_id"]))
    return ids[0], ids[1]


def unknown_like(iid: str) -> str:
    """An id of the same form that names nothing."""
    return iid[:-4] + ("ZZZZ" if not iid.endswith("ZZZZ") else "YYYY")


async def test_a_result_on_a_target_no_longer_configured_is_answered_as_an_unknown_id(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)  # the embedded calls' credential
    async with HostileServer.running(scripts.serve(Reply(200, body=BODY))) as srv:
        socket = tmp_path / "affidavit.sock"
        both = {**api_target(srv.url), "old": http_target(srv.url)}
        kept, old = await made_on_two_targets(write_daemon_config(tmp_path, both, socket=socket))
        cfg = write_daemon_config(tmp_path, api_target(srv.url), socket=socket)  # "old" removed
        daemon = await start_daemon(cfg, socket, tmp_path / "daemon.log", token)
        try:
            answers: dict[str, tuple[int, Any]] = {}
            with trio.fail_after(HUNG):
                for view in ("/result", ""):
                    for iid in (kept, old, unknown_like(old)):
                        path = f"/v1/invocations/{iid}{view}"
                        status, _h, body = await ask(socket, "GET", path)
                        answers[iid + view] = (status, json.loads(body))
                listed = {}
                for query in ("", f"?session={SESSION}", "?outcome=committed"):
                    status, _h, body = await ask(socket, "GET", f"/v1/actions{query}")
                    assert status == 200, body
                    listed[query] = json.loads(body)
        finally:
            stop(daemon)
        status, envelope = answers[kept + "/result"]
        assert status == 200 and envelope["result"]["status"] == 200, envelope
        status, shown = answers[kept]
        assert status == 200 and shown["record"]["invocation_id"] == kept, shown
        for view in ("/result", ""):
            status, refused = answers[old + view]
            assert (status, refused["api_error"]["code"]) == (404, "NO_SUCH_INVOCATION"), refused
            assert BODY.decode() not in json.dumps(refused)
            # The same answer as an id that names nothing, word for word (but the id echoed).
            unknown = answers[unknown_like(old) + view]
            assert (status, refused) == (
                unknown[0],
                json.loads(json.dumps(unknown[1]).replace(unknown_like(old), old)),
            )
        # Listed (and counted) is only what the caller may read: every page, filtered or not.
        for page in listed.values():
            assert [a["invocation_id"] for a in page["actions"]] == [kept], page
            assert (page["total"], page["truncated"]) == (1, False), page
            assert old not in json.dumps(page)
        # The operator reads it still: ``affidavit result`` embedded, the journal's owner.
        shown = await embedded("result", old, "--config", str(cfg), token=token)
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["result"]["status"] == 200
