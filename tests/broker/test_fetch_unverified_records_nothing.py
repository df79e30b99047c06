"""A whole fetch of a result awaiting delivery records RESULT_DELIVERED only once the result
was read and verified: a read that fails -- a chunk that differs, the segment directory not
restored yet, the completeness marker (``results`` row) removed -- answers RESULT_UNVERIFIED and
records nothing, the result still stored and undelivered (audit 54a: ``Broker.fetch_result``
appended the event first, then failed the read; a removed marker read as ``result: null``)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api import Broker
from affidavit.config import load_config
from affidavit.engine import RESULT_CHUNK, EngineSettings, result_failure
from affidavit.journal import ResultUnverified
from affidavit.statemachine import EventKind as E
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import affidavit_cli, assert_ok, http_target, write_config

LIMIT = 30
GET = {"target": "api", "method": "GET", "path": "/thing"}
BODY = b"z" * (RESULT_CHUNK * 6 + 5)
"""Seven chunks: past the four a stream holds in memory, so its first ones go to a segment."""
REMOVED = "has no completeness marker (its results row was removed)"


def _delivered(broker: Broker, iid: str) -> list[str]:
    return [e.attrs["channel"] for e in broker.events(iid) if e.kind is E.RESULT_DELIVERED]


def _flip_a_segment_byte(db: Path, iid: str) -> None:
    """As someone with write access to the segment files: one bit of chunk 1 flipped."""
    conn = sqlite3.connect(db)
    try:
        row = conn.execute(
            "SELECT segment, pos FROM result_segments WHERE invocation_id = ? AND audit = 0 "
            "AND idx = 1",
            (iid,),
        ).fetchone()
    finally:
        conn.close()
    assert row is not None, "chunk 1 is not in a segment"
    with open(Path(f"{db}.results") / row[0], "r+b") as f:
        f.seek(row[1] + 40)
        byte = f.read(1)
        f.seek(row[1] + 40)
        f.write(bytes([byte[0] ^ 1]))


def _remove_marker(db: Path, iid: str) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        assert conn.execute("DELETE FROM results WHERE invocation_id = ?", (iid,)).rowcount == 1
    finally:
        conn.close()


async def _stored_undelivered(tmp_path: Path) -> tuple[Path, str]:
    """A config and the id of a call answered by reference: stored, awaiting delivery."""
    settings = EngineSettings(inline_result_limit=RESULT_CHUNK)
    async with HostileServer.running(scripts.serve(Reply(200, body=BODY))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with Broker.open(config=load_config(cfg), settings=settings) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(GET)
            assert_ok(broker, env)
            assert "by_reference" in env["result"]
            await broker.settled()
            iid = env["invocation_id"]
            assert _delivered(broker, iid) == []
    return cfg, iid


async def _fetch_fails(cfg: Path, iid: str, token: str) -> ResultUnverified:
    """The SDK's whole fetch raises ``ResultUnverified`` and leaves the record as it was."""
    async with Broker.open(config=load_config(cfg)) as broker:
        with pytest.raises(ResultUnverified) as caught:
            await broker.fetch_result(iid)
        await broker.settled()
        assert _delivered(broker, iid) == []
        record = broker.record(iid)
        assert record is not None and record.state == "stored_committed"
    _status, code, message = result_failure(caught.value, iid)
    assert code == "RESULT_UNVERIFIED"
    assert token not in message and token not in str(caught.value)
    return caught.value


async def _fetch_delivers(cfg: Path, iid: str) -> None:
    async with Broker.open(config=load_config(cfg)) as broker:
        fetched: Any = await broker.fetch_result(iid)
        await broker.settled()
        assert fetched["result"]["body"].encode() == BODY
        assert fetched["evidence"]["state"] == "delivered_committed"
        assert _delivered(broker, iid) == ["fetch"]


async def test_a_chunk_that_differs_fails_the_fetch_and_records_no_delivery(
    tmp_path: Path, token: str
) -> None:
    cfg, iid = await _stored_undelivered(tmp_path)
    _flip_a_segment_byte(tmp_path / "journal.db", iid)
    exc = await _fetch_fails(cfg, iid, token)
    assert "chunk 1" in str(exc)


async def test_the_segment_directory_missing_then_restored(tmp_path: Path, token: str) -> None:
    """Restored without ``.results/`` (not copied back yet): the fetch fails, recording nothing;
    once the directory is back, a fetch answers the result and records one delivery."""
    cfg, iid = await _stored_undelivered(tmp_path)
    results, aside = tmp_path / "journal.db.results", tmp_path / "aside"
    shutil.move(results, aside)
    await _fetch_fails(cfg, iid, token)
    shutil.move(aside, results)
    await _fetch_delivers(cfg, iid)


async def test_a_removed_marker_is_unverified_never_no_result(tmp_path: Path, token: str) -> None:
    """Its RESULT_COMMITTED chained, its ``results`` row deleted: the SDK's fetch and
    ``affidavit result`` both answer RESULT_UNVERIFIED in ``verify``'s words -- never
    ``result: null`` -- and nothing is recorded."""
    cfg, iid = await _stored_undelivered(tmp_path)
    _remove_marker(tmp_path / "journal.db", iid)
    exc = await _fetch_fails(cfg, iid, token)
    assert REMOVED in str(exc) and iid in str(exc)
    for args in ((), ("--raw",)):
        done = await affidavit_cli("result", iid, *args, "--config", str(cfg))
        said = done.stderr.decode()
        assert done.returncode == 2, (args, said)
        assert done.stdout == b"", args
        assert "RESULT_UNVERIFIED" in said and REMOVED in said, said
        assert token not in said
    async with Broker.open(config=load_config(cfg)) as broker:
        assert _delivered(broker, iid) == []
