"""A stored result whose sealed summary does not open with the broker key (a result from before
per-chunk hashes, whose summary blob no chained hash covers: the key meets the altered byte
first) is RESULT_UNVERIFIED on every surface -- a fetch of it and a same-key call replaying it,
embedded and through the daemon -- as any other part of a stored result that fails its
verification (``results_read.open_result``).  Never JOURNAL_UNAVAILABLE ("the journal could not
record the call": nothing in the journal backs it), never JOURNAL_UNUSABLE, never the result,
and through the daemon never the key file's path.  Nothing is sent again."""

from __future__ import annotations

import json
from pathlib import Path

from tests.broker.http_rows import IDEM, POST
from tests.http.hostile import Reply, scripts

from .kit import cli, embedded, serving, start_daemon, stop
from .test_key_file_unplaced import _old_and_altered
from .test_result_unverified_cli import _refusal

BODY = b"secret-free stored body " * 8


async def test_a_summary_that_does_not_open_is_result_unverified_on_every_surface(
    tmp_path: Path, token: str
) -> None:
    keyed = json.dumps({**POST, "idempotency_key": "key-s"}).encode()
    async with serving(
        tmp_path, scripts.serve(Reply(201, body=BODY)), token=token, overrides={"idempotency": IDEM}
    ) as (srv, daemon):
        called = await cli(daemon, "call", "-", stdin=keyed)
        assert called.returncode == 0, called.stderr
        iid = called.json()["invocation_id"]
        stop(daemon)
        signing = Path(f"{daemon.journal}.signing.key")
        _old_and_altered(daemon.journal, iid, signing, part="summary")
        config = str(daemon.config)
        runs = [
            await embedded("call", "-", "--config", config, stdin=keyed, token=token),
            await embedded("result", iid, "--config", config, token=token),
        ]
        again = await start_daemon(daemon.config, daemon.socket, daemon.log, token)
        try:
            runs += [await cli(again, "call", "-", stdin=keyed), await cli(again, "result", iid)]
        finally:
            stop(again)
    for run in runs:
        assert _refusal(run) == (2, "RESULT_UNVERIFIED", None), run
        said = run.stderr.decode()
        assert f"invocation {iid}" in said and "summary does not open" in said, said
        assert "stored body" not in said, said
    for run in runs[2:]:  # a caller of the daemon is never told where the key file lives
        assert str(tmp_path) not in run.stderr.decode(), run
    assert len(srv.requests) == 1
