"""``affidavit journal reclaim [--dry-run]`` (``affidavit/cli/reclaim.py``), run as a real
process: the uncommitted chunks of closed records are listed, then dropped -- counts and bytes
reported, an open record's kept, nothing appended; a journal a daemon owns, a journal that is
not there and a key that is not there are refused with a stable code, exit 2, never a
traceback, and nothing is created."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import trio

from affidavit.journal import Journal, JournalReader
from affidavit.journal.lock import WriterLock
from affidavit.statemachine import Event, EventKind
from tests.journal import segkit as kit
from tests.journal.helpers import happy
from tests.postgres import Cluster

from .helpers import http_target, write_config

LIMIT = 30
CLOSING = {"code": "REMOTE_OUTCOME_UNKNOWN", "generation": 0}


async def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(LIMIT):
        return await trio.run_process(
            [sys.executable, "-m", "affidavit", *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env={**os.environ, "AFFIDAVIT_CONFIG": str(cwd / "none.toml")},
            cwd=str(cwd),
        )


async def _journal(db: Path | str, **keys: Path) -> None:
    """inv-closed: stopped mid-body, then closed (unknown); inv-open: mid-body, still open;
    inv-done: a committed result."""
    async with Journal.open(db, **keys) as j:
        for iid in ("inv-closed", "inv-open"):
            for ev in happy(iid)[:-1]:  # through REMOTE_RESPONSE_STARTED
                await j.append(ev, barrier=True)
            for idx in range(3):
                await j.put_result_chunk(iid, "body", idx, b"x" * 1000, generation=0)
        await j.append(Event(EventKind.ATTEMPT_INTERRUPTED, "inv-closed", CLOSING), barrier=True)
        for ev in happy("inv-done"):
            await j.append(ev, barrier=True)
        await j.put_result_chunk("inv-done", "body", 0, b"kept")
        await j.commit_result(Event(EventKind.RESULT_COMMITTED, "inv-done"), summary={})


def _state(db: Path | str, key_file: Path | None = None) -> tuple[int, dict[str, int]]:
    with JournalReader.open(db, key_file=key_file) as r:
        report = r.verify()
        assert report.ok, report
        assert report.count is not None
        counts = {}
        for iid in ("inv-closed", "inv-open", "inv-done"):
            counts[iid] = sum(1 for _ in r.tables.chunks(False, iid))
        return report.count, counts


def _clean(p: subprocess.CompletedProcess[bytes]) -> None:
    assert b"Traceback" not in p.stderr and b"Traceback" not in p.stdout


async def test_dry_run_lists_then_reclaim_drops_the_closed_records_chunks(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    await _journal(db)
    events, chunks = _state(db)
    assert chunks == {"inv-closed": 3, "inv-open": 3, "inv-done": 1}

    dry = await _cli("journal", "reclaim", "--journal", str(db), "--dry-run", cwd=tmp_path)
    _clean(dry)
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.decode().splitlines()
    assert lines[0].startswith("inv-closed  3 chunks, 0 auditor copies, ")
    assert lines[1].startswith("would reclaim the uncommitted chunks of 1 closed record(s): 3 ")
    assert lines[2].startswith("kept those of 1 open record(s)")
    # Its chunks are rows: no segment directory, nothing to compact -- not "0 file(s) looked at".
    assert not Path(f"{db}.results").exists()
    assert lines[3:] == [
        f"no result segment files ({db}.results does not exist): nothing to compact"
    ]
    assert _state(db) == (events, chunks)  # nothing changed

    done = await _cli("journal", "reclaim", "--journal", str(db), "--json", cwd=tmp_path)
    _clean(done)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    (record,) = report["records"]
    assert record["invocation_id"] == "inv-closed" and record["chunks"] == 3
    assert record["bytes"] > 3000 and report["bytes"] == record["bytes"]
    assert (report["dry_run"], report["chunks"], report["kept_open"]) == (False, 3, ["inv-open"])
    assert report["segments"] is None  # as on PostgreSQL: no segment files to compact
    # Only the closed record's chunks went; nothing was appended and the chain verifies.
    assert _state(db) == (events, {"inv-closed": 0, "inv-open": 3, "inv-done": 1})

    again = await _cli("journal", "reclaim", "--journal", str(db), cwd=tmp_path)
    assert again.returncode == 0
    assert b"reclaimed the uncommitted chunks of 0 closed record(s)" in again.stdout


async def test_reclaim_returns_the_segment_bytes_of_interrupted_results(tmp_path: Path) -> None:
    """SQLite: long results cut mid-body left bytes in segment files no row names.  The dry
    run reports them (``--json``: ``segments``) and changes nothing; the reclaim gives them back
    -- the files' allocated size drops by what it reports -- and the committed result still
    reads back byte-identical; ``affidavit journal verify`` passes."""
    db = tmp_path / "j.db"
    await kit.build(db)
    before = kit.allocated(db)

    dry = await _cli(
        "journal", "reclaim", "--journal", str(db), "--dry-run", "--json", cwd=tmp_path
    )
    _clean(dry)
    assert dry.returncode == 0, dry.stderr
    seg = json.loads(dry.stdout)["segments"]
    assert (seg["files"], seg["removed"], seg["busy"]) == (2, 1, 0)
    assert seg["bytes"] > 3 * 40 * kit.CHUNK * 0.9
    assert kit.allocated(db) == before and len(kit.segments(db)) == 2

    done = await _cli("journal", "reclaim", "--journal", str(db), cwd=tmp_path)
    _clean(done)
    assert done.returncode == 0, done.stderr
    last = done.stdout.decode().splitlines()[-1]
    freed = before - kit.allocated(db)
    mode = (
        "holes punched between committed chunks"
        if seg["holes"]
        else "this filesystem cannot punch holes: only whole files and tails count"
    )
    assert last == (
        f"reclaimed {freed} bytes of result segment files no committed result names: "
        f"2 file(s) looked at, 1 removed whole; {mode}"
    )
    assert freed >= seg["bytes"] * 0.95
    kit.check(db)
    verify = await _cli("journal", "verify", "--journal", str(db), cwd=tmp_path)
    _clean(verify)
    assert verify.returncode == 0, verify.stdout + verify.stderr


async def test_segments_an_earlier_broker_may_write_are_refused_with_a_code(
    tmp_path: Path,
) -> None:
    """A journal upgraded from schema 6 by an embedded writer: an earlier broker (its segments
    unlocked) may still write it, so the segments are not compacted -- the chunk report is
    printed, then exit 2 with the stable code and what to do; nothing is touched."""
    from tests.journal.test_segment_compact_older import OLDER

    db = tmp_path / "j.db"
    await kit.build(db)
    kit.tamper(db, *OLDER)
    before = kit.allocated(db)
    done = await _cli("journal", "reclaim", "--journal", str(db), "--json", cwd=tmp_path)
    assert b"Traceback" not in done.stderr
    assert done.returncode == 2, done.stderr
    seg = json.loads(done.stdout)["segments"]
    assert seg["refused"] == "SEGMENT_WRITERS_UNPROVEN" and "affidavit serve" in seg["message"]
    text = await _cli("journal", "reclaim", "--journal", str(db), cwd=tmp_path)
    assert text.returncode == 2 and b"Traceback" not in text.stderr
    assert b"reclaimed the uncommitted chunks of 0 closed record(s)" in text.stdout
    assert text.stderr.startswith(b"affidavit: SEGMENT_WRITERS_UNPROVEN: "), text.stderr
    assert kit.allocated(db) == before and len(kit.segments(db)) == 2
    kit.check(db)


async def test_a_segment_path_that_is_not_a_directory_is_named_so(tmp_path: Path) -> None:
    """``<path>.results`` a regular file: the reclaim says what is true -- not a directory, a
    stable code, exit 2 after the chunk report -- never "does not exist"; the file stays."""
    db = tmp_path / "j.db"
    await _journal(db)
    results = Path(f"{db}.results")
    results.write_bytes(b"someone's notes")
    text = await _cli("journal", "reclaim", "--journal", str(db), cwd=tmp_path)
    _clean(text)
    assert text.returncode == 2
    assert b"does not exist" not in text.stdout + text.stderr
    assert b"reclaimed the uncommitted chunks of 1 closed record(s)" in text.stdout
    err = text.stderr.decode()
    assert err.startswith("affidavit: SEGMENT_DIR_UNUSABLE: "), err
    assert f"{db}.results is not a directory" in err
    done = await _cli("journal", "reclaim", "--journal", str(db), "--json", cwd=tmp_path)
    _clean(done)
    assert done.returncode == 2
    seg = json.loads(done.stdout)["segments"]
    assert seg["refused"] == "SEGMENT_DIR_UNUSABLE" and "is not a directory" in seg["message"]
    assert results.read_bytes() == b"someone's notes"


async def test_a_journal_a_daemon_owns_is_refused(tmp_path: Path) -> None:
    """The daemon holds ``<journal>.lock`` exclusive (``lock.py``) and reclaims at its own
    start: a second writer is refused, naming it."""
    db = tmp_path / "j.db"
    await _journal(db)
    before = _state(db)
    lock = WriterLock.acquire(db, "affidavit serve on /run/affidavit.sock")
    try:
        p = await _cli("journal", "reclaim", "--journal", str(db), cwd=tmp_path)
    finally:
        lock.release()
    _clean(p)
    assert p.returncode == 2
    assert p.stderr.decode().startswith("affidavit: JOURNAL_LOCKED: ")
    assert "affidavit serve on /run/affidavit.sock" in p.stderr.decode()
    assert _state(db) == before


async def test_no_journal_or_no_key_is_refused_and_nothing_is_created(tmp_path: Path) -> None:
    missing = await _cli("journal", "reclaim", "--journal", "nope.db", cwd=tmp_path)
    _clean(missing)
    assert missing.returncode == 2
    assert missing.stderr.decode().startswith("affidavit: JOURNAL_UNUSABLE: no journal at nope.db")
    db = tmp_path / "j.db"
    await _journal(db)
    Path(f"{db}.key").unlink()
    keyless = await _cli("journal", "reclaim", "--journal", str(db), cwd=tmp_path)
    _clean(keyless)
    assert keyless.returncode == 2
    assert keyless.stderr.decode().startswith(f"affidavit: FILE_UNUSABLE: no sealing key at {db}")
    assert not (tmp_path / "nope.db").exists() and not Path(f"{db}.key").exists()


async def test_a_shared_journal_is_reclaimed_with_the_configs_keys(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """PostgreSQL, for real: the journal and its keys named by the config; no lock to refuse
    on (each batch is checked and dropped under the chain head, as a broker's start-up)."""
    keys = {"key_file": tmp_path / "shared.key", "signing_key": tmp_path / "a.signing.key"}
    await _journal(pg_url, **keys)
    events, _ = _state(pg_url, keys["key_file"])
    journal = {"url": pg_url, **{k: str(v) for k, v in keys.items()}}
    cfg = write_config(tmp_path, {"api": http_target("http://127.0.0.1:9")}, journal=journal)
    p = await _cli("journal", "reclaim", "--config", str(cfg), "--json", cwd=tmp_path)
    _clean(p)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert [r["invocation_id"] for r in report["records"]] == ["inv-closed"]
    assert (report["chunks"], report["kept_open"]) == (3, ["inv-open"])
    assert pg_url.split("@")[0] not in p.stdout.decode() + p.stderr.decode()
    after = _state(pg_url, keys["key_file"])
    assert after == (events, {"inv-closed": 0, "inv-open": 3, "inv-done": 1})
