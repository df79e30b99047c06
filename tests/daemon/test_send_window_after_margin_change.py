"""``affidavit serve`` restarted with a raised ``[service] lease_margin``: its views -- read on
their own connections (``Api.read``), not through the broker's journal -- judge a record
accepted before by the lease a same-key retry takes now, as the broker's own reads do.

Accepted under lease_margin 30 (timeout 100 s: a 130 s window; the key retained 200 s, usable
while a retry's lease ends before 140 s), then served under 50 (a 150 s lease, past it): the
actions view and ``record`` over the socket say ``reconcile``, the answer a same-key call gets.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.config import load_config
from tests.broker.helpers import TOKEN_ENV
from tests.broker.http_rows import IDEM
from tests.http.hostile import HostileServer, Peer

from .kit import WAIT, api_target, cli, start_daemon, stop, write_daemon_config

CHARGE = {"target": "api", "method": "POST", "path": "/v1/x", "idempotency_key": "charge"}


async def _unanswered(peer: Peer) -> None:
    await peer.read_request()
    await peer.close()  # applied, never answered: unknown


async def test_the_daemons_views_judge_the_key_by_todays_lease(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)  # the in-process broker's credential
    async with HostileServer.running(_unanswered) as srv:
        targets = api_target(
            srv.url, timeout={"connect": 2, "total": 100}, idempotency={**IDEM, "retention": "200s"}
        )
        socket = tmp_path / "affidavit.sock"
        cfg = write_daemon_config(tmp_path, targets, socket=socket, service={"lease_margin": 50})
        # Accepted before the change: a broker with the margin it had (the default, 30 s).
        with trio.fail_after(WAIT):
            async with Broker.open(config=load_config(cfg)) as broker:
                first = await broker.call(CHARGE)
        assert first["error"]["retry"] == "same_idempotency_key", first
        iid = first["invocation_id"]

        daemon = await start_daemon(cfg, socket, tmp_path / "daemon.log", token)
        try:
            listed = await cli(daemon, "actions", "--json")
            assert listed.returncode == 0, listed.stderr
            assert [r["retry"] for r in listed.json()] == ["reconcile"], listed.stdout
            shown = await cli(daemon, "record", iid, "--json")
            assert shown.returncode == 0, shown.stderr
            assert json.loads(shown.stdout)["record"]["retry"] == "reconcile"
            again = await cli(daemon, "call", "-", stdin=json.dumps(CHARGE).encode())
            assert again.json()["error"]["retry"] == "reconcile", again.stdout
        finally:
            stop(daemon)
    assert len(srv.requests) == 1  # nothing resent
