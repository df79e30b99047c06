"""The wait of a different request for a key's binder ends at the caller's deadline.

A call whose fingerprint differs from a binding with nothing recorded under it waits for the
binder's record, or for the binder to be gone (``binder.record_or_gone``) -- at most the
binder's window, 30 s here.  It ignored the caller's own timeout: a 0.3 s call held its call
slot for the whole window.  It now ends at the earlier of the two, with the caller's stop
(CALLER_CANCELLED, connection_setup, not_attempted, retry backoff) as its own invocation: nothing
sent, nothing written into the bound invocation, which is not named.
"""

from __future__ import annotations

import json
from pathlib import Path

import trio

from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import assert_error, http_target, open_broker, write_config
from .http_rows import IDEM

CHARGE = {
    "target": "api",
    "method": "POST",
    "path": "/v1/charges",
    "body": '{"amount": 5}',
    "idempotency_key": "charge-1",
}
HANG = 5  # seconds: far below the 30 s window, far above the 0.3 s timeout


async def test_a_short_timeout_ends_the_wait_for_a_binder_with_a_long_window(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(201))) as srv:
        timeout = {"connect": 1, "total": 30}
        target = http_target(srv.url, idempotency=IDEM, timeout=timeout)
        async with open_broker(write_config(tmp_path, {"api": target})) as b:
            other = "sha256:" + "0" * 64  # not this call's fingerprint
            await b.journal.bind_idempotency(IDEM["scope"], "charge-1", other, "act_bound", None)
            with trio.fail_after(HANG):
                env = await b.call(CHARGE, timeout=0.3)
            assert_error(
                b,
                env,
                phase="connection_setup",
                outcome="not_attempted",
                retry="backoff",
                code="CALLER_CANCELLED",
            )
            assert "act_bound" not in json.dumps(env)
            assert b.events("act_bound") == []
        assert srv.requests == []
