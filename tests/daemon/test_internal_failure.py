"""A call that ends without an envelope for a reason not the journal's (a bug) is answered 500
INTERNAL naming its invocation, so that its caller can find it -- the call may have been sent,
and ``fetch_result`` / ``affidavit result`` reads what its record proves.  The answer claims no
outcome of its own.  It used to name only the exception's type: a caller whose call may have
run had nothing to look it up by (an invocation has no idempotency key to find it by).

The daemon runs in this process (``Daemon.run``) so that rendering an envelope can fail on cue;
the caller is on its real socket."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.client import Client
from affidavit.api.wire import ApiError
from affidavit.engine.recorder import Recorder
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import WAIT, in_process


class Broken(RuntimeError):
    """Stands for a bug inside the broker, past the journal's writes."""


def _broken(token: str) -> Any:
    """``Recorder.render`` failing, its text quoting remote bytes (never to be shown)."""

    def render(self: Recorder, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise Broken("remote bytes " + token)

    return render


async def test_a_call_failing_inside_the_broker_names_its_invocation_and_claims_nothing(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"done"))) as (srv, socket):
        with trio.fail_after(WAIT):
            async with Client.open(socket) as client:
                with monkeypatch.context() as patched:
                    patched.setattr(Recorder, "render", _broken(token))
                    with pytest.raises(ApiError) as caught:
                        await client.call({"target": "api", "method": "GET", "path": "/r"})
                [row] = (await client.actions())["actions"]
                iid = row["invocation_id"]
                fetched = await client.fetch_result(iid)
    said = str(caught.value)
    assert (caught.value.status, caught.value.code) == (500, "INTERNAL"), said
    assert iid in said and "Broken" in said, said
    assert token not in said and "remote bytes" not in said
    assert not any(w in said for w in ("committed", "not_attempted", "rejected")), said
    assert len(srv.requests) == 1
    assert fetched is not None and fetched["invocation_id"] == iid  # what the record proves


async def test_the_embedded_mcp_server_names_the_invocation_as_the_daemon_does(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded MCP backend answers the same failure with the same words (one helper,
    ``engine.internal_failure``): it used to be 'the broker failed (Broken)', no invocation."""
    from affidavit.mcp.backends import Embedded, Exchange
    from tests.broker.helpers import http_target, open_broker, write_config

    monkeypatch.setenv(TOKEN_ENV, token)
    async with HostileServer.running(scripts.serve(Reply(200, body=b"done"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            with monkeypatch.context() as patched, trio.fail_after(WAIT):
                patched.setattr(Recorder, "render", _broken(token))
                action = {"target": "api", "method": "GET", "path": "/r"}
                answer = await Embedded(broker).call(action, Exchange())
            [record] = broker.journal.list_actions()
    error = answer["api_error"]
    assert error["code"] == "INTERNAL", answer
    assert record.invocation_id in error["message"] and "Broken" in error["message"], answer
    assert token not in str(answer)
    assert len(srv.requests) == 1
