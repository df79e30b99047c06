"""A retry's result is exactly its own bytes, whatever streams an earlier attempt left behind.

An attempt that stored some chunks and never committed (its connection dropped, its caller's
timeout struck, its lease ran out) leaves them in the journal.  The attempt that commits may
write other streams than it did: an SSH command that wrote to stderr the first time and only
to stdout the second, or nothing at all.  Chunk 0 of a stream starts only that stream over, so
an earlier attempt's stream the retry never writes is still stored when the retry commits.  The
commit must neither take those bytes into the result (a result that is not the committing
attempt's) nor refuse the retry's complete response for them (RESULT_STORE_FAILED, an
operator's problem, for a response that was complete and storable).

Through ``result_writer``, as the engine's sink writes (on SQLite a long stream goes to segment
files; on PostgreSQL every chunk is a row as it arrives, ``PostingWriter``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from affidavit.cli import main as cli_main
from affidavit.journal import Journal, ResultWriter
from affidavit.statemachine import Event, EvidenceSource
from affidavit.statemachine import EventKind as E

from ..helpers import until_dispatch
from .conftest import Place

CHUNK = 64 * 1024

FIRST = {"stdout": b"o" * CHUNK, "stderr": b"e" * (3 * CHUNK)}
"""The first attempt's full chunks (every one is handed to the journal before the commit)."""

RETRIES = {
    "stdout-only": {"stdout": b"second\n"},
    "fewer-stderr-chunks": {"stdout": b"second\n", "stderr": b"warning\n"},
    "no-stream-at-all": {},
    "stderr-only": {"stderr": b"E" * CHUNK + b"tail"},
}


async def _put(j: Journal, iid: str, generation: int, streams: dict[str, bytes]) -> ResultWriter:
    writer = j.result_writer(iid, generation)
    for stream, data in streams.items():
        for idx, start in enumerate(range(0, len(data), CHUNK)):
            part = data[start : start + CHUNK]
            await writer.put(stream, idx, part, last=len(part) < CHUNK)
    return writer


def _stored_streams(place: Place, iid: str, audit: bool) -> set[str]:
    """The streams with a stored chunk (SQLite: a row, or a segment file's reference)."""
    table = "result_audit" if audit else "result_chunks"
    rows = place.rows(f"SELECT DISTINCT stream FROM {table} WHERE invocation_id = '{iid}'")
    if place.cluster is None:
        rows += place.rows(
            "SELECT DISTINCT stream FROM result_segments "
            f"WHERE invocation_id = '{iid}' AND audit = {int(audit)}"
        )
    return {r[0] for r in rows} - {""}  # "": the summary's auditor copy


@pytest.mark.parametrize("audited", [False, True], ids=["", "audited"])
@pytest.mark.parametrize("retry", list(RETRIES), ids=list(RETRIES))
async def test_a_retry_commits_exactly_its_own_streams(
    place: Place, retry: str, audited: bool, tmp_path: Path
) -> None:
    """The committed result, its auditor copy and the stored chunks are the retry's streams,
    each exactly its bytes; the first attempt's chunks are gone with the commit."""
    second = RETRIES[retry]
    opts = {}
    if audited:
        priv, pub = tmp_path / "auditor.pem", tmp_path / "auditor.pub"
        assert cli_main(["journal", "audit-keygen", str(priv), str(pub)]) == 0
        opts["auditor_public_key"] = pub
    async with place.open(**opts) as j:
        for ev in until_dispatch("inv-r"):
            await j.append(ev)
        first = await _put(j, "inv-r", 0, FIRST)
        await first.drain()
        await j.append(
            Event(
                E.ATTEMPT_INTERRUPTED,
                "inv-r",
                {"code": "REMOTE_OUTCOME_UNKNOWN", "generation": 0},
            )
        )
        lease = await j.acquire_lease("inv-r", "w2", ttl=60)
        assert lease.generation == 1
        await j.append(
            Event(E.DISPATCH_STARTED, "inv-r", {"generation": 1}), lease=("w2", 1), barrier=True
        )
        writer = await _put(j, "inv-r", 1, second)
        await writer.flush()
        await j.append(
            Event(
                E.REMOTE_RESPONSE_COMPLETE,
                "inv-r",
                {"outcome": "committed", "generation": 1},
                source=EvidenceSource.REMOTE_RESPONSE,
            )
        )
        expect = {s: hashlib.sha256(d).hexdigest() for s, d in second.items()}
        ev = await j.commit_result(
            Event(E.RESULT_COMMITTED, "inv-r", {"generation": 1}),
            summary={"exit_status": 0},
            expect=expect,
            writer=writer,
        )
        assert ev.attrs["chunks"] == {s: -(-len(d) // CHUNK) for s, d in second.items()}
        assert ev.attrs["bytes"] == sum(len(d) for d in second.values())
        res = j.read_result("inv-r")
        assert res is not None and res.streams == second
    with place.reader() as r:
        assert r.read_result("inv-r") == res
        if audited:
            copy = r.audit_result("inv-r", priv)
            assert copy is not None and copy.streams == second
        report = r.verify()
        assert report.ok and report.results == 1
    for audit in (False, True) if audited else (False,):
        assert _stored_streams(place, "inv-r", audit) == set(second)
