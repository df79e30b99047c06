"""An operation poll and a reconciliation query whose own stored answer fails its verification
(a byte of its chunk flipped in the journal's segment file while the answer was still arriving:
the chained hash is the bytes the broker wrote) answer RESULT_UNVERIFIED with the journal's
words, as a fetch of that result and a same-key call replaying one do
(``engine.recovery.act_failure``) -- never JOURNAL_UNREADABLE, which says the journal could not
be read.  Through the daemon (its route, ``affidavit mcp --socket``) and embedded (the
command, ``affidavit mcp``); nothing of the answer is taken into the operation or
the record (no OPERATION_POLLED, no RECONCILED), never a byte of the answer, and through the
daemon never where the journal lives."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
import trio

from affidavit.api.client import Client
from affidavit.api.wire import ApiError
from affidavit.daemon.operators import RECORD_CHECK
from tests.broker.approvalkit import reconcile_target
from tests.broker.test_operations import ACCEPTED, JOBS
from tests.external import require_module
from tests.http.hostile import Peer, Reply, Script

from .kit import TOKEN_ENV, WAIT, Run, cli, client_env, embedded, serving, stop
from .test_result_unverified_cli import _refusal

CHUNK = 64 * 1024
FIRST = b"v" * (24 * CHUNK)  # past the segment store's held chunks and its first batch
REST = b"v" * CHUNK
PAYMENTS = reconcile_target("unused")["api"]  # its key contract and reconciliation query


def _segments(tmp: Path) -> dict[Path, int]:
    return {p: p.stat().st_size for p in tmp.rglob("*.seg")}


async def _flip_what_arrives(tmp: Path, before: dict[Path, int]) -> None:
    """Once a segment file has grown past ``before``, flip a byte of what was written."""
    with trio.fail_after(WAIT):
        while True:
            grown = [(p, n) for p, n in _segments(tmp).items() if n > before.get(p, 0) + 100]
            if grown:
                break
            await trio.sleep(0.05)
    path, _ = grown[0]
    at = before.get(path, 0) + 50
    with path.open("r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
        os.fsync(f.fileno())


def _remote(tmp: Path, first: Reply | None) -> Script:
    """The first request is answered ``first`` (None: read, then closed unanswered -- the
    outcome unknown); every later one 200 with a long body whose first part, once the broker
    has written it to its segment file, is altered there before the rest is sent."""
    seen = 0

    async def script(peer: Peer) -> None:
        nonlocal seen
        while await peer.read_request() is not None:
            seen += 1
            if seen == 1:
                if first is None:
                    await peer.close()
                    return
                await peer.respond(first)
                continue
            before = _segments(tmp)
            length = len(FIRST) + len(REST)
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
            await peer.send_raw(head.encode() + FIRST)
            await _flip_what_arrives(tmp, before)
            await peer.send_raw(REST)
            await peer.close()  # written past h11: the next request comes on a new connection
            return

    return script


def _kinds(journal: Path, *kinds: str) -> int:
    conn = sqlite3.connect(journal)
    marks = ",".join("?" * len(kinds))
    (n,) = conn.execute(f"SELECT count(*) FROM events WHERE kind IN ({marks})", kinds).fetchone()
    conn.close()
    return int(n)


def _words(said: str, tmp: Path | None = None) -> str:
    """The journal's verdict on the answer, never a byte of it; with ``tmp``: through the
    daemon, where nothing under it (the journal, its keys) is named."""
    assert "fails verification" in said and "differs from its chained hash" in said, said
    assert "vvvv" not in said, said
    assert tmp is None or str(tmp) not in said, said
    return said


async def _mcp(args: list[str], tool: str, arguments: dict[str, str], tmp: Path, **env: str) -> str:
    """``affidavit mcp ARGS``'s answer to one ``tool`` call: an ``api_error`` coded
    RESULT_UNVERIFIED (its log in ``tmp``); its message."""
    require_module("mcp", "dev")
    from tests.mcp.kit import connected, structured

    async with connected(args, {**client_env(), **env}, tmp / "mcp.log") as mcp:
        result = await mcp.call(tool, arguments)
    answer = structured(result)
    assert (
        result.is_error is True and answer.get("api_error", {}).get("code") == "RESULT_UNVERIFIED"
    ), answer
    return str(answer["api_error"]["message"])


def _unverified(run: Run, tmp: Path | None = None) -> str:
    """A command's one-line refusal: exit 2, RESULT_UNVERIFIED, the journal's words."""
    assert _refusal(run) == (2, "RESULT_UNVERIFIED", None), run
    return _words(run.stderr.decode(), tmp)


async def test_a_poll_whose_answer_fails_verification_is_result_unverified(
    tmp_path: Path, token: str
) -> None:
    submit = {"target": "api", "method": "POST", "path": "/jobs", "body": "{}"}
    script = _remote(tmp_path, ACCEPTED)
    overrides = {"operations": JOBS["operations"]}
    async with serving(tmp_path, script, token=token, overrides=overrides) as (
        srv,
        daemon,
    ):
        called = await cli(daemon, "call", "-", stdin=json.dumps(submit).encode())
        assert called.returncode == 0, called.stderr
        op_id = called.json()["operation"]["id"]
        async with Client.open(daemon.socket) as client:
            with pytest.raises(ApiError) as info:
                await client.poll_operation(op_id)
        polled = {"operation_id": op_id}
        said = [await _mcp(["--socket", str(daemon.socket)], "poll_operation", polled, tmp_path)]
        stop(daemon)
        config = str(daemon.config)
        run = await embedded("operation", "poll", op_id, "--config", config, token=token)
        mcp = ["--config", config]
        embedded_mcp = await _mcp(mcp, "poll_operation", polled, tmp_path, **{TOKEN_ENV: token})
        journal = daemon.journal
    exc = info.value
    assert (exc.status, exc.code) == (500, "RESULT_UNVERIFIED"), exc
    said = [_words(m, tmp_path) for m in (exc.message, *said)]  # a caller of the daemon's
    for words in (*said, _unverified(run), _words(embedded_mcp)):
        assert f"the poll of {op_id}" in words, words
    # The daemon's words name the submission's record (it holds the polls) as the socket reads
    # it, for whichever interface asked -- an agent behind the proxy has no command line; the
    # command line run embedded names its own command; MCP embedded its own tool.
    submission = "act_" + op_id.removeprefix("op_")
    for words in said:
        assert RECORD_CHECK.format(submission) in words and "affidavit op" not in words, words
    assert "`affidavit operations`" in _unverified(run), run
    assert f"the get_record tool (invocation_id {submission})" in _words(embedded_mcp)
    assert len(srv.requests) == 5  # the submission, then one query per poll: none sent again
    assert _kinds(journal, "OPERATION_POLLED", "OPERATION_POLL_FAILED") == 0


async def test_a_reconciliation_query_whose_answer_fails_verification_is_result_unverified(
    tmp_path: Path, token: str
) -> None:
    charge = {"target": "api", "method": "POST", "path": "/v1/charges", "body": "{}"}
    keyed = json.dumps({**charge, "idempotency_key": "k-1"}).encode()
    overrides = {k: PAYMENTS[k] for k in ("idempotency", "reconcile")}
    operators = {"operator_uids": [os.geteuid()]}
    script = _remote(tmp_path, None)
    async with serving(tmp_path, script, token=token, overrides=overrides, service=operators) as (
        srv,
        daemon,
    ):
        called = await cli(daemon, "call", "-", stdin=keyed)
        envelope = called.json()
        assert envelope["error"]["outcome"] == "unknown", envelope
        iid = envelope["invocation_id"]
        queried = {"invocation_id": iid}
        run = await cli(daemon, "reconcile", iid, "--query")
        said = [await _mcp(["--socket", str(daemon.socket)], "reconcile_query", queried, tmp_path)]
        stop(daemon)
        config = str(daemon.config)
        runs = [await embedded("reconcile", iid, "--query", "--config", config, token=token)]
        mcp = ["--config", config]
        embedded_mcp = await _mcp(mcp, "reconcile_query", queried, tmp_path, **{TOKEN_ENV: token})
        journal = daemon.journal
    said = [_unverified(run, tmp_path), *(_words(m, tmp_path) for m in said)]
    for words in (*said, _unverified(runs[0]), _words(embedded_mcp)):
        assert f"the reconciliation of {iid}" in words, words
    for words in said:  # the daemon's, whichever interface asked it (as a poll's)
        assert RECORD_CHECK.format(iid) in words and "affidavit record" not in words, words
    assert f"`affidavit record {iid}`" in _unverified(runs[0]), runs[0]
    assert f"the get_record tool (invocation_id {iid})" in _words(embedded_mcp)  # (as a poll's)
    assert [r.method for r in srv.requests] == ["POST", "GET", "GET", "GET", "GET"]
    assert _kinds(journal, "RECONCILED", "RECONCILE_INCONCLUSIVE") == 0
