"""The lease holder a caller is shown: a tag, never the recorded ``hostname:pid:hex``.

A call that is still in flight holds its lease; a same-key call meanwhile answers IN_PROGRESS
with ``evidence.lease`` naming whose attempt runs.  Through MCP (embedded, or through the
daemon's socket) and the daemon's socket API, every answer that names the holder -- that
envelope, the record and its events, the actions view -- shows the journal's keyed tag of it
(``JournalReader.holder_tag``): the same in each, with no host name or pid of the broker in any
of them.  The operator maps the tag back to the recorded holder (``affidavit journal holder``),
which names the broker's own pid.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.client import Client
from affidavit.journal import JournalReader
from tests.daemon.kit import DaemonProc, embedded, running_daemon
from tests.mcp.kit import Connected, connected, env_without_secrets, structured

from .conftest import Remotes, wait_for
from .test_delivery import HELD, config, targets

KEYED = {**HELD, "idempotency_key": "holder-1"}


@contextlib.asynccontextmanager
async def session(
    mode: str, tmp: Path, remotes: Remotes, token: str
) -> AsyncIterator[tuple[Connected, Path, DaemonProc | None]]:
    log = tmp / "mcp.log"
    if mode == "embedded":
        cfg = config(remotes, tmp)
        async with connected(["--config", str(cfg)], remotes.env(token), log) as mcp:
            yield mcp, cfg, None
        return
    async with running_daemon(tmp, targets(remotes), token=token) as daemon:
        args = ["--socket", str(daemon.socket)]
        async with connected(args, env_without_secrets(), log) as mcp:
            yield mcp, daemon.config, daemon


def _recorded_holder(journal: Path, iid: str) -> str:
    with JournalReader.open(journal) as r:
        holder = r.events(iid)[0].attrs["holder"]
    assert isinstance(holder, str)
    return holder


@pytest.mark.parametrize("mode", ["embedded", "daemon"])
async def test_a_caller_is_shown_a_tag_of_the_holder_and_the_operator_maps_it_back(
    tmp_path: Path, remotes: Remotes, token: str, mode: str
) -> None:
    answers: list[Any] = []
    async with session(mode, tmp_path, remotes, token) as (mcp, cfg, daemon):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(mcp.call, "http_request", KEYED)
            await wait_for(remotes.holds.event("received"))
            busy = structured(await mcp.call("http_request", KEYED))
            assert busy["error"]["code"] == "IN_PROGRESS", busy
            iid = busy["invocation_id"]
            answers += [
                busy,
                structured(await mcp.call("get_record", {"invocation_id": iid})),
                structured(await mcp.call("list_actions")),
            ]
            if daemon is not None:  # the daemon's socket API, as a caller reaches it
                async with Client.open(daemon.socket) as client:
                    answers += [
                        await client.call(KEYED),
                        await client.record(iid),
                        await client.events(iid),
                        await client.actions(),
                    ]
            remotes.holds.event("release").set()
        done = structured(await mcp.call("fetch_result", {"invocation_id": iid}))
        assert done["result"]["body"] == "late and done", done
        answers.append(done)
        recorded = _recorded_holder(tmp_path / "journal.db", iid)
        host, pid, _ = recorded.split(":")
        assert host == socket.gethostname()
        if daemon is not None:
            assert int(pid) == daemon.proc.pid

        shown = busy["evidence"]["lease"]["holder"]
        assert shown.startswith("hmac-sha256:") and len(shown) == len("hmac-sha256:") + 64
        assert done["evidence"]["lease"]["holder"] == shown  # the same lease: the same tag
        for answer in answers:
            text = json.dumps(answer)
            assert recorded not in text and f"{host}:{pid}" not in text, text
            assert shown in text, text  # each names the holder, by its tag
        assert len(answers) == (8 if daemon is not None else 4)

        # The operator's path: the recorded holder, from the tag a caller was shown.
        mapped = await embedded("journal", "holder", iid, shown, "--config", str(cfg))
        assert mapped.returncode == 0, mapped.stderr
        assert mapped.stdout.decode().strip() == recorded
        listed = await embedded("journal", "holder", iid, "--config", str(cfg), "--json")
        assert listed.returncode == 0, listed.stderr
        (row,) = listed.json()["holders"]
        assert (row["recorded"], row["shown"]) == (recorded, shown)
        unknown = await embedded("journal", "holder", iid, "hmac-sha256:00", "--config", str(cfg))
        assert unknown.returncode == 2 and b"NO_SUCH_HOLDER" in unknown.stderr, unknown
        assert b"Traceback" not in unknown.stderr
    assert len(remotes.holds.requests) == 1
