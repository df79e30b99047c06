"""``chunk_owners`` (SQLite schema 6, PostgreSQL schema 2): the reclaim's candidates are read
from a small table naming each invocation with chunks stored and no marker, not from a scan of
every chunk row (``journal/reclaim.py``).  An invocation is named with its first chunk and
taken out by the transaction that stores its marker, or by the reclaim that drops its chunks; a
journal from before the table gains it, filled from its unmarked chunks, when a writer opens it.
Both backends, for real."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.journal import generate_auditor_keypair, reclaim
from affidavit.journal.postgres import SCHEMA_VERSION as PG_SCHEMA
from affidavit.journal.sqlite import SCHEMA_VERSION as SQLITE_SCHEMA
from affidavit.statemachine import Event, EventKind

from ..helpers import happy
from .conftest import Place

CLOSING = {"code": "REMOTE_OUTCOME_UNKNOWN", "generation": 0}


def _owners(place: Place) -> list[str]:
    return [str(r[0]) for r in place.rows("SELECT invocation_id FROM chunk_owners ORDER BY 1")]


async def _interrupted(j: Any, iid: str, data: bytes = b"part") -> None:
    """An attempt stopped mid-body: chunks stored, the record closed with no marker."""
    for ev in happy(iid)[:-1]:  # through REMOTE_RESPONSE_STARTED
        await j.append(ev, barrier=True)
    await j.put_result_chunk(iid, "body", 0, data, generation=0)
    await j.put_result_chunk(iid, "body", 1, data, generation=0)
    await j.append(Event(EventKind.ATTEMPT_INTERRUPTED, iid, CLOSING), barrier=True)


async def _committed(j: Any, iid: str) -> None:
    for ev in happy(iid):
        await j.append(ev, barrier=True)
    await j.put_result_chunk(iid, "body", 0, b"kept")
    await j.commit_result(Event(EventKind.RESULT_COMMITTED, iid), summary={})


def test_only_unmarked_chunks_are_named_and_reclaim_reads_only_them(
    place: Place, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With an auditor key: the marker's transaction writes the summary's auditor copy (chunk 0
    of its stream) after the marker, which must not name the committed result again."""
    generate_auditor_keypair(tmp_path / "auditor", tmp_path / "auditor.pub")
    seen: list[list[str]] = []
    real_op = reclaim.reclaim_op

    def spied(candidates: Sequence[str], **kw: Any) -> Any:
        seen.append(list(candidates))
        return real_op(candidates, **kw)

    monkeypatch.setattr(reclaim, "reclaim_op", spied)

    async def main() -> tuple[list[str], list[str], list[reclaim.Reclamation]]:
        async with place.open(auditor_public_key=tmp_path / "auditor.pub") as j:
            await _committed(j, "inv-c")
            await _interrupted(j, "inv-i")
            before = _owners(place)
            dry = await j.reclaim(dry_run=True, measure=True)
            after_dry = _owners(place)
            return before, after_dry, [dry, await j.reclaim(measure=True)]

    before, after_dry, (dry, done) = trio.run(main)
    # The committed result's marker took it out in its own transaction; the interrupted one
    # stays named until reclaimed -- a dry run keeps it, the reclaim drops it.
    assert before == ["inv-i"] and after_dry == ["inv-i"]
    assert seen == [["inv-i"], ["inv-i"]]
    assert dry == done and done.kept == [] and len(done.dropped) == 1
    assert done.dropped == ["inv-i"]
    (gone,) = done.measured
    assert (gone.invocation_id, gone.chunks, gone.audit) == ("inv-i", 2, 2)
    assert gone.bytes > 2 * len(b"part")  # sealed: the plaintext and a nonce and tag each
    assert _owners(place) == []
    assert place.rows("SELECT count(*) FROM result_chunks WHERE invocation_id = 'inv-i'") == [(0,)]
    assert place.rows("SELECT count(*) FROM result_chunks WHERE invocation_id = 'inv-c'") == [(1,)]


def test_a_journal_from_before_the_table_gains_it_filled_once(place: Place) -> None:
    """As the previous schema left it: no ``chunk_owners``.  A writer's opening transaction
    creates the table and names the invocations whose chunks no marker names (the committed
    one is not named); the reclaim then finds and drops them."""

    async def fill() -> None:
        async with place.open() as j:
            await _committed(j, "inv-c")
            await _interrupted(j, "inv-a")
            await _interrupted(j, "inv-b")

    trio.run(fill)
    old = "5" if place.kind == "sqlite" else "1"
    place.write("DROP TABLE chunk_owners")
    place.write(f"UPDATE meta SET value = '{old}' WHERE name = 'schema'")

    async def reopen() -> tuple[list[str], list[str]]:
        async with place.open() as j:
            named = _owners(place)
            return named, await j.reclaim_chunks()

    named, dropped = trio.run(reopen)
    assert named == ["inv-a", "inv-b"]
    assert dropped == ["inv-a", "inv-b"]
    assert _owners(place) == []
    assert place.rows("SELECT count(*) FROM result_chunks") == [(1,)]
    assert place.rows("SELECT value FROM meta WHERE name = 'schema'") == [
        (str(SQLITE_SCHEMA if place.kind == "sqlite" else PG_SCHEMA),)  # (both moved on)
    ]


def test_a_name_whose_marker_is_stored_is_only_taken_out(place: Place) -> None:
    """A name left beside a stored marker (an older broker's commit, which did not take it
    out): the reclaim drops none of that result's chunks, only the name."""

    async def fill() -> None:
        async with place.open() as j:
            await _committed(j, "inv-c")

    trio.run(fill)
    place.write("INSERT INTO chunk_owners (invocation_id) VALUES ('inv-c')")

    async def again() -> list[str]:
        async with place.open() as j:
            return await j.reclaim_chunks()

    assert trio.run(again) == []
    assert _owners(place) == []
    with place.reader() as r:
        stored = r.read_result("inv-c")
        assert stored is not None and stored.streams == {"body": b"kept"}
