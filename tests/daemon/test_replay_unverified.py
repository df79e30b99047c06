"""A same-key call whose stored result fails verification, embedded and through the daemon: the
code a fetch of it answers (RESULT_UNVERIFIED, ``result_failure``) -- never the result, never
JOURNAL_UNUSABLE (embedded: the file or key unusable) nor JOURNAL_UNAVAILABLE (through the
daemon: "the journal could not record the call"), which nothing in the journal backs.  Nothing
is sent again."""

from __future__ import annotations

import json
from pathlib import Path

from tests.broker.http_rows import IDEM, POST
from tests.http.hostile import Reply, scripts
from tests.journal.helpers import flip_stored_byte

from .kit import cli, embedded, serving, stop
from .test_result_unverified_cli import _refusal


async def test_a_same_key_call_replaying_a_corrupted_chunk_is_result_unverified(
    tmp_path: Path, token: str
) -> None:
    body = b"secret-free stored body " * 40
    overrides = {"idempotency": IDEM}
    keyed = json.dumps({**POST, "idempotency_key": "key-a"}).encode()
    async with serving(
        tmp_path, scripts.serve(Reply(201, body=body)), token=token, overrides=overrides
    ) as (srv, daemon):
        called = await cli(daemon, "call", "-", stdin=keyed)
        assert called.returncode == 0, called.stderr
        iid = called.json()["invocation_id"]
        flip_stored_byte(daemon.journal, iid, "body", 0)
        through = await cli(daemon, "call", "-", stdin=keyed)
    stop(daemon)  # the journal is the daemon's while it runs: embedded reads it after
    alone = await embedded("call", "-", "--config", str(daemon.config), stdin=keyed, token=token)
    for run in (through, alone):
        assert _refusal(run) == (2, "RESULT_UNVERIFIED", None), run
        assert b"chunk 0" in run.stderr and b"stored body" not in run.stderr
    assert len(srv.requests) == 1
