"""The daemon's broker names every asker (``EngineSettings.peer_askers``): a route that forgot
its socket peer's uid is a bug answered 500 INTERNAL, never run as the daemon's own uid -- which
this test's caller also has, so without the setting a call or a whole fetch passing no uid
succeeds unnoticed (and a fetch would record the delivery to whoever the daemon's user is).

The daemon runs in this process (``kit.in_process``) so that a route can drop its uid on cue:
``Broker.call`` / ``Broker.fetch_result`` are wrapped to pass none, as a route forgetting
``requester=req.peer.uid`` / ``reader=req.peer.uid`` would.  The rule itself, per entry point:
tests/broker/test_peer_askers.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api import Broker
from affidavit.api.client import Client
from affidavit.api.wire import ApiError
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import Reply, scripts

from .kit import WAIT, action, in_process


def _forgetting(method: Any, name: str) -> Any:
    """``method`` called as a route that forgot its peer's uid (``name``) calls it."""

    async def forgot(self: Broker, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop(name, None)
        return await method(self, *args, **kwargs)

    return forgot


async def test_a_route_naming_no_peer_is_refused_not_run_as_the_daemon_s_uid(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    script = scripts.serve(Reply(200, body=b"done"))
    async with in_process(tmp_path, script) as (srv, socket):
        with trio.fail_after(WAIT):
            async with Client.open(socket) as client:
                with monkeypatch.context() as patched:
                    patched.setattr(Broker, "call", _forgetting(Broker.call, "requester"))
                    with pytest.raises(ApiError) as call_refused:
                        await client.call(action("/r"))
                assert (await client.actions())["actions"] == []  # refused before any row
                envelope = await client.call(action("/r"))  # the route as it is: its peer
                iid = envelope["invocation_id"]
                before = [e["kind"] for e in await client.events(iid)]
                with monkeypatch.context() as patched:
                    patched.setattr(
                        Broker, "fetch_result", _forgetting(Broker.fetch_result, "reader")
                    )
                    with pytest.raises(ApiError) as fetch_refused:
                        await client.fetch_result(iid)
                after = [e["kind"] for e in await client.events(iid)]
    for caught in (call_refused, fetch_refused):
        assert (caught.value.status, caught.value.code) == (500, "INTERNAL"), str(caught.value)
    assert after == before  # the refused fetch recorded nothing
    assert len(srv.requests) == 1  # only the call naming its peer was sent
