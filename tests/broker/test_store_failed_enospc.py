"""A real full disk right after dispatch (audit 53b F1): the journal on a small tmpfs, filled
by the remote the moment it receives the request -- DISPATCH_STARTED is durable, and nothing
after it fits: neither the result, nor the complete response, nor RESULT_STORE_FAILED.  The
envelope is the event recovery later closes the record with, and it does: the same code, phase,
outcome and retry (test_journal_faults.py injects the same refusal without privilege).

Mounting needs root (CAP_SYS_ADMIN): skipped otherwise, with the reason."""

from __future__ import annotations

import contextlib
import errno
from pathlib import Path

import trio

from affidavit.statemachine import EventKind
from tests.external import tmpfs
from tests.http.hostile import HostileServer, Received, Reply, scripts

from .helpers import (
    assert_recovered_as_rendered,
    assert_unknown_after_dispatch,
    http_target,
    open_broker,
    write_config,
)

LIMIT = 30
POST = {"target": "api", "method": "POST", "path": "/charge", "body": "{}"}


def _fill(path: Path) -> None:
    """Write ``path`` until the file system has no byte left (ENOSPC)."""
    block = b"\0" * 4096
    with path.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(block)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    with contextlib.suppress(OSError), path.open("ab", buffering=0) as f:
        while True:
            f.write(b"\0")


async def test_a_disk_full_after_dispatch_answers_what_recovery_writes(
    tmp_path: Path, token: str
) -> None:
    with tmpfs(tmp_path / "mnt", "4m") as mnt:
        fill = mnt / "fill"

        def reply(_: Received) -> Reply:
            _fill(fill)  # DISPATCH_STARTED is on record: the request is here
            return Reply(201, body=b"x" * (300 * 1024))

        async with HostileServer.running(scripts.serve(reply)) as srv:
            cfg = write_config(tmp_path, {"api": http_target(srv.url)})
            cfg.write_text(cfg.read_text().replace(str(tmp_path / "journal.db"), str(mnt / "j.db")))
            with trio.fail_after(LIMIT):
                async with open_broker(cfg) as broker:
                    env = await broker.call(POST)
                    iid = env["invocation_id"]
                    kinds = [e.kind for e in broker.events(iid)]
                fill.unlink()
                assert_unknown_after_dispatch(env)
                assert EventKind.REMOTE_RESPONSE_COMPLETE not in kinds, kinds
                await assert_recovered_as_rendered(cfg, env)
            assert len(srv.requests) == 1
