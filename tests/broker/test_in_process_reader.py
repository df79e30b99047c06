"""An in-process reader -- the operator's ``affidavit result``, an embedded ``affidavit mcp`` --
delivers a stored result only if its own uid asked for it (``requested_by``): on a journal
shared with the daemon, a call another uid made through the daemon is read, nothing recorded.
Before, an in-process read passed no reader and every such read counted as the requester's:
the operator's ``affidavit result`` recorded RESULT_DELIVERED for an agent that never got it.
A record naming this process's uid is delivered as before (with its uid).  The daemon's
socket: tests/daemon/test_fetch_by_another.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import trio

from tests.http.hostile import HostileServer, Reply, scripts
from tests.mcp.kit import WAIT
from tests.mcp.test_linked_delivery import mcp, tool

from .helpers import TOKEN_ENV, http_target, open_broker, write_config
from .test_cli import _cli, _one_envelope

ACTION = {"target": "api", "method": "GET", "path": "/thing"}
OTHER = os.getuid() + 1


async def _gone(envelope: dict[str, Any]) -> None:
    raise ConnectionError("the caller hung up")


async def _undelivered(cfg: Path, requester: int) -> str:
    """A call made for ``requester`` (as the daemon records its peer) whose answer was lost."""
    async with open_broker(cfg) as broker:
        with trio.fail_after(10):
            envelope = await broker.call(ACTION, deliver=_gone, requester=requester)
        iid: str = envelope["invocation_id"]
        await broker.settled()
    return iid


async def _delivery(cfg: Path, iid: str) -> list[tuple[str, Any]]:
    async with open_broker(cfg) as broker:
        return [
            (e.kind.value, e.attrs.get("reader"))
            for e in broker.events(iid)
            if e.kind.value.startswith("RESULT_DELIVER")
        ]


async def test_the_operator_s_result_reads_another_uid_s_call_recording_nothing(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"done"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        theirs = await _undelivered(cfg, OTHER)
        ours = await _undelivered(cfg, os.getuid())
    shown = await _cli("result", theirs, "--config", str(cfg), env={TOKEN_ENV: token})
    assert shown.returncode == 0, shown.stderr
    read = _one_envelope(shown.stdout)
    assert read["result"]["body"] == "done" and read["delivery"]["recorded"] is False
    assert await _delivery(cfg, theirs) == [("RESULT_DELIVERY_FAILED", None)]

    own = await _cli("result", ours, "--config", str(cfg), env={TOKEN_ENV: token})
    assert own.returncode == 0, own.stderr
    assert await _delivery(cfg, ours) == [
        ("RESULT_DELIVERY_FAILED", None),
        ("RESULT_DELIVERED", {"uid": os.getuid()}),
    ]


async def test_an_embedded_mcp_reads_another_uid_s_call_recording_nothing(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"done"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        theirs = await _undelivered(cfg, OTHER)
        ours = await _undelivered(cfg, os.getuid())
        async with mcp(tmp_path, cfg, token) as raw:
            read = await tool(raw, 1, "fetch_result", {"invocation_id": theirs})
            assert read["result"]["body"] == "done" and read["delivery"]["recorded"] is False
            own = await tool(raw, 2, "fetch_result", {"invocation_id": ours})
            assert own["result"]["body"] == "done" and "delivery" not in own
            assert raw.proc.stdin is not None
            await raw.proc.stdin.aclose()  # end of input: it exits once its writes are done
            with trio.fail_after(WAIT):
                await raw.proc.wait()
    assert await _delivery(cfg, theirs) == [("RESULT_DELIVERY_FAILED", None)]
    assert [k for k, _ in await _delivery(cfg, ours)] == [
        "RESULT_DELIVERY_FAILED",
        "RESULT_DELIVERED",
    ]
