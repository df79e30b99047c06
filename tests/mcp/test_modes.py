"""Embedded and through the daemon alike: the canary credential is in no MCP message and no log
line; 32 concurrent tool calls from one session are all answered and the journal verifies; past
``max_calls`` a call is refused at once; the proxy (``--socket``) loads neither the engine, the
journal, the config nor the credential code.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.daemon.kit import run, running_daemon
from tests.journal.helpers import flip_stored_byte
from tests.mcp.kit import PYTHON, WAIT, Connected, connected, env_without_secrets, structured

from .conftest import Remotes, wait_for
from .test_delivery import HELD

MODES = ["embedded", "daemon"]


@contextlib.asynccontextmanager
async def session(
    mode: str, tmp: Path, remotes: Remotes, token: str, *python: str
) -> AsyncIterator[tuple[Connected, Path]]:
    """An MCP connection in ``mode``; also the config whose journal it writes."""
    log = tmp / "mcp.log"
    if mode == "embedded":
        cfg = remotes.config(tmp)
        async with connected(["--config", str(cfg)], remotes.env(token), log, python) as mcp:
            yield mcp, cfg
        return
    async with running_daemon(tmp, remotes.targets(), token=token) as daemon:
        args = ["--socket", str(daemon.socket)]
        async with connected(args, env_without_secrets(), log, python) as mcp:
            yield mcp, daemon.config


@pytest.mark.parametrize("mode", MODES)
async def test_a_stored_chunk_that_fails_verification_is_result_unverified(
    tmp_path: Path, remotes: Remotes, token: str, mode: str
) -> None:
    # A corrupt stored chunk is never handed over as the result, whole or resumed: the tool
    # answers RESULT_UNVERIFIED naming the chunk.
    async with session(mode, tmp_path, remotes, token) as (mcp, _):
        called = structured(
            await mcp.call("http_request", {"target": "ok", "method": "GET", "path": "/"})
        )
        iid = called["invocation_id"]
        flip_stored_byte(tmp_path / "journal.db", iid, "body", 0, at=0)
        for extra in ({}, {"from_chunk": 0}):
            result = await mcp.call("fetch_result", {"invocation_id": iid, **extra})
            answer = structured(result)
            assert result.is_error is True, answer
            assert answer["api_error"]["code"] == "RESULT_UNVERIFIED", answer
            assert "chunk 0" in answer["api_error"]["message"]
            assert "result" not in answer


@pytest.mark.parametrize("mode", MODES)
async def test_a_same_key_call_replaying_a_corrupted_chunk_is_result_unverified(
    tmp_path: Path, remotes: Remotes, token: str, mode: str
) -> None:
    # A same-key call answers with the stored result: one that fails verification is
    # RESULT_UNVERIFIED (``call_failure``), as its fetch is -- never JOURNAL_UNAVAILABLE ("the
    # journal could not record the call"), which nothing in the journal backs.
    keyed = {"target": "pay", "method": "POST", "path": "/p", "body": "1", "idempotency_key": "k1"}
    async with session(mode, tmp_path, remotes, token) as (mcp, _):
        iid = structured(await mcp.call("http_request", keyed))["invocation_id"]
        flip_stored_byte(tmp_path / "journal.db", iid, "body", 0, at=0)
        result = await mcp.call("http_request", keyed)
        answer = structured(result)
    assert result.is_error is True, answer
    assert answer["api_error"]["code"] == "RESULT_UNVERIFIED", answer
    assert "chunk 0" in answer["api_error"]["message"] and "result" not in answer


@pytest.mark.parametrize("mode", MODES)
async def test_the_canary_is_in_no_mcp_message_and_no_log_line(
    tmp_path: Path, remotes: Remotes, token: str, mode: str
) -> None:
    async with session(mode, tmp_path, remotes, token) as (mcp, _):
        echoed = structured(
            await mcp.call("http_request", {"target": "ok", "method": "GET", "path": "/"})
        )
        # The remote saw the credential and sent it back; the envelope carries it redacted.
        body = echoed["result"]["body"]
        assert body.startswith("saw ") and len(body) > len("saw ") and token not in body
        iid = echoed["invocation_id"]
        await mcp.call("fetch_result", {"invocation_id": iid})
        await mcp.call("get_record", {"invocation_id": iid})
        await mcp.call("list_actions")
        await mcp.call("list_targets")
        await mcp.call("http_request", {"target": "rejects", "method": "GET", "path": "/"})
        await mcp.session.list_tools()
        wire = list(mcp.wire)
    assert [r.header("authorization") for r in remotes.ok.requests] == [f"Bearer {token}"]
    assert wire and all(token not in message for message in wire)
    log = (tmp_path / "mcp.log").read_text()
    assert "session mcp-" in log
    assert token not in log


@pytest.mark.parametrize("mode", MODES)
async def test_32_concurrent_tool_calls_from_one_session_are_all_answered(
    tmp_path: Path, remotes: Remotes, token: str, mode: str
) -> None:
    answers: dict[int, dict[str, object]] = {}
    async with session(mode, tmp_path, remotes, token) as (mcp, cfg):

        async def one(n: int) -> None:
            args = {"target": "ok", "method": "GET", "path": f"/n/{n}"}
            result = await mcp.call("http_request", args)
            assert result.is_error is False
            answers[n] = structured(result)

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for n in range(32):
                    nursery.start_soon(one, n)
        mine = structured(await mcp.call("list_actions", {"limit": 100}))["actions"]
    assert sorted(answers) == list(range(32))
    assert len({a["invocation_id"] for a in answers.values()}) == 32
    assert sorted(a["invocation_id"] for a in mine) == sorted(
        str(a["invocation_id"]) for a in answers.values()
    )
    assert sorted(r.target for r in remotes.ok.requests) == sorted(f"/n/{n}" for n in range(32))
    verified = await run([PYTHON, "-m", "affidavit", "journal", "verify", "--config", str(cfg)])
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert b"journal intact" in verified.stdout


# Loaded by an embedded broker; none of them may be in the proxy.  (``cryptography`` is: the
# MCP SDK imports it for its OAuth support -- none of the broker's sealing or credential code.)
BROKER_ONLY = (
    "affidavit.engine",
    "affidavit.journal",
    "affidavit.secrets",
    "affidavit.config",
    "affidavit.protocols",
    "affidavit.adapters",
    "affidavit.statemachine",
    "affidavit.api.broker",
    "ssh",
)


async def test_the_proxy_imports_no_engine_journal_config_or_credential_code(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    async with session("daemon", tmp_path, remotes, token, "-X", "importtime") as (mcp, _):
        assert (await mcp.session.list_tools()).tools
        done = structured(
            await mcp.call("http_request", {"target": "ok", "method": "GET", "path": "/"})
        )
        await mcp.call("fetch_result", {"invocation_id": done["invocation_id"]})
        await mcp.call("get_record", {"invocation_id": done["invocation_id"]})
        await mcp.call("list_actions")
    imported = re.findall(r"import time:.*\|\s+(\S+)$", (tmp_path / "mcp.log").read_text(), re.M)
    assert "affidavit.mcp.server" in imported and "affidavit.api.client" in imported
    loaded = sorted(
        m for m in imported if any(m == b or m.startswith(b + ".") for b in BROKER_ONLY)
    )
    assert loaded == []


async def test_embedded_a_call_past_max_calls_is_refused_at_once_and_nothing_runs(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    """Calls run on past their handlers, so the server bounds them itself: the config's
    ``[service] max_calls``, as the daemon does; one more is OVERLOADED, never journaled."""
    cfg = remotes.config(tmp_path)
    cfg.write_text(cfg.read_text(encoding="utf-8") + "\n[service]\nmax_calls = 1\n")
    held: list[Any] = []
    async with connected(["--config", str(cfg)], remotes.env(token), tmp_path / "mcp.log") as mcp:

        async def hold() -> None:
            held.append(await mcp.call("http_request", HELD))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold)
            await wait_for(remotes.holds.event("received"))
            over = await mcp.call("http_request", {"target": "ok", "method": "GET", "path": "/"})
            assert over.is_error is True
            refused = structured(over)["api_error"]
            assert refused["code"] == "OVERLOADED" and "nothing was run" in refused["message"]
            # Told as the contract tells it: nothing ran, call again later.
            assert (refused["outcome"], refused["retry"]) == ("not_attempted", "backoff")
            remotes.holds.event("release").set()
        assert held[0].is_error is False
        # The held call counts until its delivery is recorded, a moment after its answer.
        with trio.fail_after(WAIT):
            while True:
                after = await mcp.call(
                    "http_request", {"target": "ok", "method": "GET", "path": "/b"}
                )
                if "api_error" not in structured(after):
                    break
                await trio.sleep(0.05)
        assert after.is_error is False
        rows = structured(await mcp.call("list_actions"))["actions"]
    assert len(rows) == 2, rows
    assert [r.target for r in remotes.ok.requests] == ["/b"]


@pytest.mark.parametrize("mode", MODES)
async def test_list_actions_answers_the_newest_limit_and_says_what_it_left_out(
    tmp_path: Path, remotes: Remotes, token: str, mode: str
) -> None:
    """A hostile agent fills its session cheaply (every refused call is a record): the tool
    answers the newest ``limit`` only, with ``total`` and ``truncated`` -- a cut list is never
    mistaken for the whole (the backend streams the view: memory O(limit), not O(journal))."""
    async with session(mode, tmp_path, remotes, token) as (mcp, _):
        ids = []
        for n in range(5):
            args = {"target": "ok", "method": "GET", "path": f"/n/{n}"}
            ids.append(structured(await mcp.call("http_request", args))["invocation_id"])
        cut = structured(await mcp.call("list_actions", {"limit": 2}))
        whole = structured(await mcp.call("list_actions"))
        none = structured(await mcp.call("list_actions", {"limit": 0}))
        too_many = await mcp.call("list_actions", {"limit": 1001})
    assert [a["invocation_id"] for a in cut["actions"]] == ids[-2:]
    assert (cut["total"], cut["truncated"]) == (5, True)
    assert [a["invocation_id"] for a in whole["actions"]] == ids
    assert (whole["total"], whole["truncated"]) == (5, False)
    assert (none["actions"], none["total"], none["truncated"]) == ([], 5, True)
    assert too_many.is_error is True
    refused = structured(too_many)
    assert "limit" in str(refused), refused


@pytest.mark.parametrize("mode", MODES)
async def test_fetch_result_pages_a_resumed_read_and_bounds_its_numbers(
    tmp_path: Path, remotes: Remotes, token: str, mode: str
) -> None:
    """``from_chunk`` reads a page (``chunks``, by default ``RESULT_PAGE_CHUNKS``) whose
    ``resume.next_chunk`` names the next; a ``from_chunk`` past the journal's numbers or a
    ``chunks`` outside 1..``MAX_RESULT_PAGE_CHUNKS`` is the tool's own INVALID_FIELD naming it,
    both ways (through the daemon it was the daemon's 400, an ``api_error``)."""
    from affidavit.api.wire import MAX_COUNT, MAX_RESULT_PAGE_CHUNKS

    async with session(mode, tmp_path, remotes, token) as (mcp, _):
        called = structured(
            await mcp.call("http_request", {"target": "ok", "method": "GET", "path": "/"})
        )
        iid = called["invocation_id"]
        pages = [
            structured(await mcp.call("fetch_result", {"invocation_id": iid, **extra}))
            for extra in ({"from_chunk": 0}, {"from_chunk": 0, "chunks": 1}, {"chunks": 1})
        ]
        refused = [
            (field, structured(await mcp.call("fetch_result", {"invocation_id": iid, **extra})))
            for field, extra in (
                ("from_chunk", {"from_chunk": MAX_COUNT + 1}),
                ("chunks", {"from_chunk": 0, "chunks": 0}),
                ("chunks", {"from_chunk": 0, "chunks": MAX_RESULT_PAGE_CHUNKS + 1}),
            )
        ]
    for page in pages:
        assert page["result"]["body"] == called["result"]["body"], page
        assert page["result"]["resume"]["from_chunk"] == 0
        assert page["result"]["resume"]["next_chunk"] is None  # one chunk: the only page
    for field, answer in refused:
        assert (answer["error"]["code"], answer["error"]["field"]) == ("INVALID_FIELD", field)
