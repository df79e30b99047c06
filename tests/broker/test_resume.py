"""Resumable results (issue 14, item 3).  Seed, "A result delivery error must not repeat
execution": "Store chunks with sequence numbers and a final completeness marker.  The caller may
resume delivery from the last verified chunk, but the broker must not declare the result
complete until it receives the terminator".

A 20 MiB response from a scripted server is stored in 64 KiB chunks; ``fetch_result(from_chunk=N)``,
``Broker.result_stream`` and ``affidavit result ID --from-chunk N [--raw]`` resume from chunk N,
each chunk verified before it is handed out; a chunk corrupted in the file stops the stream at
that chunk -- nothing of it, nor after it, is delivered -- with a clear error, never a traceback.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from affidavit.engine import RESULT_CHUNK
from affidavit.journal import Journal, JournalError
from affidavit.statemachine import Event, EventKind
from tests.http.hostile import HostileServer, Reply, scripts
from tests.journal.helpers import copy_segments, flip_stored_byte, happy

from .helpers import TOKEN_ENV, assert_ok, http_target, open_broker, write_config

LIMIT = 120
MIB = 1024 * 1024
# 20 MiB of numbered lines: every chunk differs from every other, so a swapped or shifted chunk
# could never pass for the right one by accident.
BODY = b"".join(b"%09d\n" % i for i in range(20 * MIB // 10 + 1))[: 20 * MIB]
CHUNKS = -(-len(BODY) // RESULT_CHUNK)


@dataclass(frozen=True)
class Stored:
    config: Path
    db: Path
    iid: str
    token: str


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Stored:
    """One real call whose 20 MiB answer is stored (module-wide: the tests only read it, or
    corrupt their own copy)."""
    tmp = tmp_path_factory.mktemp("resume")
    token = "tok-resume-" + "r" * 16

    async def call() -> str:
        async with HostileServer.running(scripts.serve(Reply(200, body=BODY))) as srv:
            target = http_target(srv.url, timeout={"connect": 5, "total": LIMIT})
            cfg = write_config(tmp, {"api": target})
            async with open_broker(cfg) as broker:
                with trio.fail_after(LIMIT):
                    env = await broker.call({"target": "api", "method": "GET", "path": "/big"})
                assert_ok(broker, env)
                assert env["evidence"]["result"]["chunks"] == {"body": CHUNKS}
                return str(env["invocation_id"])

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(TOKEN_ENV, token)
        iid = trio.run(call)
    return Stored(tmp / "affidavit.toml", tmp / "journal.db", iid, token)


@pytest.fixture
def copy(stored: Stored, tmp_path: Path) -> Stored:
    """A private copy of the stored journal (config, keys and all) to corrupt."""
    copy_segments(stored.db, tmp_path / "journal.db")
    for name in os.listdir(stored.db.parent):
        src = stored.db.parent / name
        if src.is_file() and name.startswith("journal.db") and not name.endswith(("-wal", "-shm")):
            if name == "journal.db":
                with sqlite3.connect(src) as a, sqlite3.connect(tmp_path / name) as b:
                    a.backup(b)
                a.close()
                b.close()
                os.chmod(tmp_path / name, 0o600)  # the journal refuses one others may read
            else:
                (tmp_path / name).write_bytes(src.read_bytes())
                os.chmod(tmp_path / name, 0o600)
    cfg = tmp_path / "affidavit.toml"
    cfg.write_text(stored.config.read_text().replace(str(stored.db), str(tmp_path / "journal.db")))
    return Stored(cfg, tmp_path / "journal.db", stored.iid, stored.token)


def _cli(s: Stored, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "affidavit", *args, "--config", str(s.config)],
        capture_output=True,
        env={**os.environ, TOKEN_ENV: s.token},
        timeout=LIMIT,
        check=False,
    )


async def test_fetch_result_from_chunk_resumes_a_20_mib_result(stored: Stored) -> None:
    async with open_broker(stored.config) as broker:
        env = await broker.fetch_result(stored.iid, from_chunk=100)
        assert env is not None and "error" not in env
        result = env["result"]
        assert result["body"].encode() == BODY[100 * RESULT_CHUNK :]
        resume = result["resume"]
        assert resume["from_chunk"] == 100
        body = resume["streams"]["body"]
        assert body == {
            "chunks": CHUNKS,
            "bytes": len(BODY),
            "sha256": "sha256:" + hashlib.sha256(BODY).hexdigest(),
        }
        # What was delivered before plus what the resumed read returns is the whole result.
        first = await broker.fetch_result(stored.iid, from_chunk=0)
        assert first is not None
        whole = first["result"]["body"].encode()
        assert whole[: 100 * RESULT_CHUNK] + result["body"].encode() == BODY
        # Past the last chunk: nothing more, and still the same resume table.
        past = await broker.fetch_result(stored.iid, from_chunk=CHUNKS)
        assert past is not None and past["result"]["body"] == ""


async def test_fetch_result_reads_a_page_and_names_where_the_next_starts(stored: Stored) -> None:
    """``chunks=M``: chunks N to N+M-1 of each stream, ``resume.next_chunk`` N+M while chunks
    remain, null on the last page (a resumed read to the end has it null too)."""
    async with open_broker(stored.config) as broker:
        page = await broker.fetch_result(stored.iid, from_chunk=100, chunks=3)
        last = await broker.fetch_result(stored.iid, from_chunk=CHUNKS - 2, chunks=3)
        rest = await broker.fetch_result(stored.iid, from_chunk=CHUNKS - 2)
        with pytest.raises(ValueError, match="chunks"):
            await broker.fetch_result(stored.iid, chunks=3)  # a page names where it starts
    assert page is not None and last is not None and rest is not None
    assert page["result"]["body"].encode() == BODY[100 * RESULT_CHUNK : 103 * RESULT_CHUNK]
    assert page["result"]["resume"]["next_chunk"] == 103
    assert last["result"]["body"].encode() == BODY[(CHUNKS - 2) * RESULT_CHUNK :]
    assert last["result"]["resume"]["next_chunk"] is None
    assert rest["result"] == last["result"]


async def test_the_result_stream_seam_yields_verified_chunks(stored: Stored) -> None:
    async with open_broker(stored.config) as broker:
        stream = broker.result_stream(stored.iid)
        assert stream is not None and set(stream.streams) == {"body"}
        got = list(stream.chunks("body", CHUNKS - 3))
        assert b"".join(got) == BODY[(CHUNKS - 3) * RESULT_CHUNK :]
        assert len(got) == 3
        assert broker.result_stream("act_does_not_exist") is None
        with pytest.raises(ValueError):
            stream.chunks("body", -1)


def test_cli_raw_from_chunk_writes_the_stored_bytes(stored: Stored) -> None:
    p = _cli(stored, "result", stored.iid, "--from-chunk", "100", "--raw")
    assert p.returncode == 0, p.stderr
    assert p.stdout == BODY[100 * RESULT_CHUNK :]
    assert p.stderr == b""
    whole = _cli(stored, "result", stored.iid, "--raw")
    assert whole.returncode == 0 and whole.stdout == BODY


async def test_a_corrupted_chunk_in_the_middle_stops_the_stream_at_that_chunk(
    copy: Stored,
) -> None:
    flip_stored_byte(copy.db, copy.iid, "body", 150)
    p = _cli(copy, "result", copy.iid, "--from-chunk", "100", "--raw")
    assert p.returncode == 2
    # Every verified chunk before it was written; nothing of chunk 150 or after.
    assert p.stdout == BODY[100 * RESULT_CHUNK : 150 * RESULT_CHUNK]
    err = p.stderr.decode()
    assert "chunk 150" in err and "Traceback" not in err
    assert "output stopped before chunk 150" in err
    # With the code the daemon answers such a result with (it used to print none).
    assert err.startswith("affidavit: RESULT_UNVERIFIED: "), err
    # Resuming before the bad chunk still works up to it; after it, cleanly past it.
    after = _cli(copy, "result", copy.iid, "--from-chunk", "151", "--raw")
    assert after.returncode == 0 and after.stdout == BODY[151 * RESULT_CHUNK :]
    # The envelope read is a clean error too, never altered bytes presented as the result.
    env = _cli(copy, "result", copy.iid)
    assert env.returncode == 2 and env.stdout == b""
    assert b"fails verification" in env.stderr and b"Traceback" not in env.stderr
    async with open_broker(copy.config) as broker:
        with pytest.raises(JournalError, match="chunk 150"):
            await broker.fetch_result(copy.iid)
        with pytest.raises(JournalError, match="chunk 150"):
            await broker.fetch_result(copy.iid, from_chunk=120)


def test_usage_errors_of_result_resume(stored: Stored) -> None:
    for args, msg in [
        (["--from-chunk", "-1"], b"--from-chunk"),
        # Past the journal's integer columns, or digits int() refuses: a usage error, never
        # an OverflowError from the database.
        (["--from-chunk", "99999999999999999999"], b"--from-chunk: expected a whole number"),
        (["--from-chunk", "\u00b2"], b"--from-chunk: expected a whole number"),
        (["--from-chunk", "9" * 5000], b"--from-chunk: expected a whole number"),
        (["--stream", "body"], b"affidavit: INVALID_FIELD: --stream goes with --raw"),
        (
            ["--raw", "--stream", "stderr"],
            b"INVALID_FIELD: --stream: the result has no stream 'stderr'",
        ),
    ]:
        p = _cli(stored, "result", stored.iid, *args)
        assert p.returncode == 2 and msg in p.stderr and b"Traceback" not in p.stderr, args


async def test_streams_are_addressed_by_name(tmp_path: Path) -> None:
    """An SSH result has stdout and stderr: ``--raw`` needs ``--stream`` to pick one."""
    cfg = write_config(tmp_path, {})
    async with Journal.open(tmp_path / "journal.db") as j:
        for ev in happy("inv-2"):
            await j.append(ev)
        await j.put_result_chunk("inv-2", "stdout", 0, b"out-0 ")
        await j.put_result_chunk("inv-2", "stdout", 1, b"out-1")
        await j.put_result_chunk("inv-2", "stderr", 0, b"err")
        await j.commit_result(Event(EventKind.RESULT_COMMITTED, "inv-2"), summary={})
    s = Stored(cfg, tmp_path / "journal.db", "inv-2", "unused")
    both = _cli(s, "result", "inv-2", "--raw")
    assert both.returncode == 2 and b"pick one" in both.stderr
    assert both.stderr.startswith(b"affidavit: INVALID_FIELD: --stream: the result has streams "), (
        both
    )
    assert _cli(s, "result", "inv-2", "--raw", "--stream", "stdout").stdout == b"out-0 out-1"
    assert _cli(
        s, "result", "inv-2", "--raw", "--stream", "stdout", "--from-chunk", "1"
    ).stdout == (b"out-1")
    assert _cli(s, "result", "inv-2", "--raw", "--stream", "stderr").stdout == b"err"


async def test_raw_without_a_stored_result_says_so(tmp_path: Path) -> None:
    from tests.journal.helpers import interrupted

    cfg = write_config(tmp_path, {})
    async with Journal.open(tmp_path / "journal.db") as j:
        for ev in interrupted("inv-u"):
            await j.append(ev)
    s = Stored(cfg, tmp_path / "journal.db", "inv-u", "unused")
    p = _cli(s, "result", "inv-u", "--raw")
    assert p.returncode == 1 and p.stdout == b""
    assert b"has no stored result" in p.stderr and b"unknown" in p.stderr


async def test_raw_from_a_chunk_past_the_end_is_refused_naming_the_chunks_there_are(
    tmp_path: Path,
) -> None:
    """``--raw --from-chunk 5`` of a one-chunk result printed nothing and exited 0, as if that
    were all.  The end itself (chunk 1 of 1) is a resume with nothing left: exit 0, empty."""
    token = "tok-resume-" + "s" * 16
    async with HostileServer.running(scripts.serve(Reply(200, body=b"small"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(TOKEN_ENV, token)
            async with open_broker(cfg) as broker:
                env = await broker.call({"target": "api", "method": "GET", "path": "/s"})
                assert_ok(broker, env)
                assert env["evidence"]["result"]["chunks"] == {"body": 1}
    s = Stored(cfg, tmp_path / "journal.db", str(env["invocation_id"]), token)
    past = await trio.to_thread.run_sync(
        lambda: _cli(s, "result", s.iid, "--raw", "--from-chunk", "5")
    )
    assert (past.returncode, past.stdout) == (2, b""), past.stderr
    assert past.stderr == (
        b"affidavit: CHUNK_OUT_OF_RANGE at from_chunk: stream 'body' has chunks 0 to 0; "
        b"--from-chunk 5 is past its end (give 0 to 1; 1 is the end: nothing left)\n"
    )
    end = await trio.to_thread.run_sync(
        lambda: _cli(s, "result", s.iid, "--raw", "--from-chunk", "1")
    )
    assert (end.returncode, end.stdout, end.stderr) == (0, b"", b"")
    first = await trio.to_thread.run_sync(
        lambda: _cli(s, "result", s.iid, "--raw", "--from-chunk", "0")
    )
    assert (first.returncode, first.stdout) == (0, b"small")
