"""``linked_calls`` (SQLite schema 11, PostgreSQL schema 5): a claim's check (``Txn._attrs_naming``)
seeks the rows naming its call instead of scanning the record under the write lock.  Every
writer fills it with the rows it inserts; a writer opening a journal from before fills it once,
decoding each row as the check does -- so a row an old or foreign writer spelt otherwise (keys
in another order, an escaped key, a key given twice, an escaped value: the check before read
only rows holding the call's canonical spelling, and missed the last) is found all the same,
and a row that is not JSON fails nothing.  A broker of the schema before refuses the journal
(its rows would go unindexed).  Both backends."""

from __future__ import annotations

import hashlib
import logging
import re
import time

import pytest
import trio

from affidavit.journal import Journal, JournalError
from affidavit.journal.chain import GENESIS, row_digest
from affidavit.journal.postgres import SCHEMA_VERSION as PG_SCHEMA
from affidavit.journal.rows import LINKED_TAIL, index_keys
from affidavit.journal.signing import SigningKey
from affidavit.journal.sqlite import SCHEMA_VERSION as SQLITE_SCHEMA
from affidavit.journal.tables import Tables
from affidavit.statemachine import LINKED_ATTRS, Event, EvidenceSource, ImpossibleEvent
from affidavit.statemachine import EventKind as E

from ..helpers import happy, interrupted, query_claim, query_row
from ..segkit import LIMIT
from .conftest import Place

IID = "act_x1"
QUERY = "act_q1"
BEFORE = {"sqlite": 10, "postgresql": 4}
"""The last schema of each backend without ``linked_calls``."""
NAMED = re.escape(f"{QUERY} is named by an earlier row")
_CHAIN_4 = f"""RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  last_seq  BIGINT;
  last_hash TEXT;
BEGIN
  SELECT e.seq, e.hash INTO last_seq, last_hash FROM events e ORDER BY e.seq DESC LIMIT 1;
  IF NEW.seq IS DISTINCT FROM coalesce(last_seq, 0) + 1
     OR NEW.prev_hash IS DISTINCT FROM coalesce(last_hash, '{GENESIS}') THEN
    RAISE EXCEPTION 'journal rows must extend the hash chain by one'
      USING ERRCODE = 'integrity_constraint_violation';
  END IF;
  RETURN NEW;
END $$"""
"""PostgreSQL schema 4's chain function, as a journal from before ``linked_calls`` holds it."""


def _row(query: str, **attrs: object) -> Event:
    return query_row(IID, query, **attrs)


def _claim(query: str) -> Event:
    return query_claim(IID, query)


def _run(place: Place, body: object) -> None:
    async def run() -> None:
        with trio.fail_after(LIMIT):
            async with place.open() as j:
                await body(j)  # type: ignore[operator]

    trio.run(run)


def _interrupted(place: Place) -> None:
    async def body(j: Journal) -> None:
        for event in interrupted(IID):
            await j.append(event)

    _run(place, body)


def _before(place: Place) -> None:
    """The journal as the schema before left it: no ``linked_calls``, the number before."""
    if place.kind == "sqlite":
        place.write("DROP TRIGGER events_linked_indexed")
    else:  # the chain function as schema 4's (no linked_calls check)
        place.write(f"CREATE OR REPLACE FUNCTION affidavit_extend_chain() {_CHAIN_4}")
    place.write("DROP TABLE linked_calls")
    place.write(f"UPDATE meta SET value = '{BEFORE[place.kind]}' WHERE name = 'schema'")


def _write_raw(
    place: Place,
    iid: str,
    kind: str,
    source: str,
    attrs: str,
    *,
    index: bool = False,
    attrs_sql: str | None = None,
) -> None:
    """A row as another writer spelt it, chained as the schema's trigger requires and signed
    as a trusted broker of the schema before signs (the writer refuses an unsigned head);
    ``index``: with the ``linked_calls`` rows a writer of this schema inserts first;
    ``attrs_sql``: the column as this SQL stores it (bytes), chained as ``attrs``."""
    ((seq, prev),) = place.rows("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1")
    for key in index_keys(attrs) if index else ():
        place.write(
            "INSERT INTO linked_calls (invocation_id, call_sha256, seq) VALUES "
            f"('{iid}', {place.blob(key)}, {seq + 1})"
        )
    at = time.time()
    digest = row_digest(bytes.fromhex(prev), seq + 1, at, iid, None, kind, source, "obs", 1,
                        attrs, None, None)  # fmt: skip
    text = attrs_sql or "'{}'".format(attrs.replace("'", "''"))
    place.write(
        "INSERT INTO events (seq, at, invocation_id, session_id, kind, source, observer, "
        f"observer_seq, attrs, payload, audit, prev_hash, hash) VALUES ({seq + 1}, {at!r}, "
        f"'{iid}', NULL, '{kind}', '{source}', 'obs', 1, {text}, NULL, NULL, '{prev}', "
        f"'{digest.hex()}')"
    )
    ((last,),) = place.rows("SELECT max(seq) FROM checkpoints")
    cp = SigningKey.load(place.signing_key).sign(seq + 1, digest.hex(), last, at)
    place.write(
        "INSERT INTO checkpoints (seq, hash, prev, at, adopted, key_id, signature) VALUES "
        f"({cp.seq}, '{cp.hash}', {cp.prev}, {cp.at!r}, 0, '{cp.key_id}', "
        f"{place.blob(cp.signature)})"
    )


SPELLINGS = {
    # Each a claim (open, no code) then its close, as a foreign writer might spell them.
    "key-order-and-spaces": (
        '{"reason": "asking", "open": true, "code": null, "query_invocation": "act_q1"}',
        '{"reason": "read", "query_invocation": "act_q1", "code": "APPROVAL_DENIED"}',
    ),
    "escaped-key": (
        '{"code":null,"open":true,"query\\u005finvocation":"act_q1","reason":"asking"}',
        '{"code":"APPROVAL_DENIED","query\\u005finvocation":"act_q1","reason":"read"}',
    ),
    "key-given-twice": (
        '{"code":null,"open":true,"query_invocation":"act_q9","query_invocation":"act_q1"}',
        '{"code":"APPROVAL_DENIED","query_invocation":"act_q9","query_invocation":"act_q1"}',
    ),
    # Missed by the check before (its LIKE sought the canonical "act_q1"): found now.
    "escaped-value": (
        '{"code":null,"open":true,"query_invocation":"act\\u005fq1","reason":"asking"}',
        '{"code":"APPROVAL_DENIED","query_invocation":"\\u0061ct_q1","reason":"read"}',
    ),
}


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_call_an_old_writer_s_row_names_in_another_spelling_is_not_claimed_again(
    place: Place, spelling: str
) -> None:
    _interrupted(place)
    _before(place)
    for attrs in SPELLINGS[spelling]:
        _write_raw(place, IID, "RECONCILE_INCONCLUSIVE", "remote_query", attrs)

    async def body(j: Journal) -> None:  # the opening writer indexes the rows (upgrade)
        rec = j.record(IID)
        assert [q.get("query_invocation") for q in rec.evidence["reconcile_queries"]] == [
            QUERY,
            QUERY,
        ]
        with pytest.raises(ImpossibleEvent, match=NAMED):
            await j.append(_claim(QUERY))
        await j.append(_claim("act_q2"))  # a new call is claimed

    _run(place, body)
    assert place.rows("SELECT count(*) FROM linked_calls WHERE invocation_id = 'act_x1'") == [(3,)]


def test_rows_that_are_not_json_fail_neither_the_upgrade_nor_a_write_nor_the_check(
    place: Place,
) -> None:
    """Attrs that are not JSON (only someone writing the file makes them), in another record:
    no database JSON function reads them, so nothing fails; the record's own check is as
    before.  On SQLite also attrs whose bytes are not UTF-8: the fill reads them leniently
    (it read them as ``str`` and failed every open of the new version).  (In the claim's own
    record such a row fails its fold first: ``AlteredRow``.)"""
    _interrupted(place)
    _before(place)
    if place.kind == "sqlite":  # bytes that are not UTF-8 (PostgreSQL's text holds none)
        bad = b'{"query_invocation":"act_q\xff"}'
        raw = bad.decode("utf-8", "replace")  # (chained as no reader reads it: altered)
        sql = f"CAST({place.blob(bad)} AS TEXT)"
        _write_raw(place, "act_other", "ATTEMPT_INTERRUPTED", "transport_observed", raw,
                   attrs_sql=sql)  # fmt: skip
    for attrs in ('{"query_invocation": "act_q1"', "not json", '{"query_invocation":"\\ud8"}'):
        _write_raw(place, "act_other", "ATTEMPT_INTERRUPTED", "transport_observed", attrs)

    async def body(j: Journal) -> None:
        await j.append(_claim(QUERY))
        await j.append(_row(QUERY, code="APPROVAL_DENIED", reason="read"))
        with pytest.raises(ImpossibleEvent, match=NAMED):
            await j.append(_claim(QUERY))

    _run(place, body)
    _write_raw(
        place,
        "act_other",
        "ATTEMPT_INTERRUPTED",
        "transport_observed",
        '{"poll_invocation": [',
        index=True,
    )

    async def again(j: Journal) -> None:
        with pytest.raises(ImpossibleEvent, match=NAMED):
            await j.append(_claim(QUERY))
        await j.append(_claim("act_q3"))

    _run(place, again)


LONG = "act_" + "".join(hashlib.sha256(b"%d" % n).hexdigest() for n in range(400))
"""25.6 kB that compress poorly: past a B-tree entry's bound even compressed."""


@pytest.mark.parametrize(
    "call", ["act\x00nul", LONG, 'act_"\\\u2028'], ids=["nul", "long", "escapes"]
)
def test_a_call_of_any_content_or_length_is_indexed_and_not_claimed_twice(
    place: Place, call: str
) -> None:
    """A key of one size and no NUL (its SHA-256): PostgreSQL's text holds no NUL and its
    B-tree entries ~2.7 kB, so a call named by its text could fail the batch it rides in."""

    async def body(j: Journal) -> None:
        for event in interrupted(IID):
            await j.append(event)
        await j.append(_claim(call))
        await j.append(_row(call, code="APPROVAL_DENIED", reason="read"))
        with pytest.raises(ImpossibleEvent, match="is named by an earlier row"):
            await j.append(_claim(call))

    _run(place, body)


def test_a_broker_without_linked_calls_refuses_the_journal(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    from affidavit.journal import postgres, sqlite_schema

    _interrupted(place)
    now = SQLITE_SCHEMA if place.kind == "sqlite" else PG_SCHEMA
    assert place.rows("SELECT value FROM meta WHERE name = 'schema'") == [(str(now),)]
    module = sqlite_schema if place.kind == "sqlite" else postgres
    monkeypatch.setattr(module, "SCHEMA_VERSION", BEFORE[place.kind])
    with pytest.raises(JournalError, match=rf"newer affidavit \(schema {now}; this one knows"):
        _interrupted(place)
    with pytest.raises(JournalError, match=rf"newer affidavit \(schema {now};"):
        place.reader()
    assert place.rows("SELECT count(*) FROM events")[0][0] == len(interrupted(IID))


def test_a_journal_from_before_is_read_as_it_is_and_indexed_by_a_writer(
    place: Place, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fill = Tables.fill_linked_calls
    monkeypatch.setattr(Tables, "fill_linked_calls", lambda self: fill(self, page=2))  # 4 pages

    async def claimed(j: Journal) -> None:
        await j.append(_claim(QUERY))
        await j.append(_row(QUERY, code="APPROVAL_DENIED", reason="read"))

    _interrupted(place)
    _run(place, claimed)
    _before(place)
    with place.reader() as r:  # read-only: read as it is, not upgraded
        assert r.verify().ok
    old = str(BEFORE[place.kind])
    assert place.rows("SELECT value FROM meta WHERE name = 'schema'") == [(old,)]

    async def refused(j: Journal) -> None:
        with pytest.raises(ImpossibleEvent, match=NAMED):
            await j.append(_claim(QUERY))

    with caplog.at_level(logging.INFO, logger="affidavit.journal"):
        _run(place, refused)
    # The upgrade says, once, how many rows it read (``Tables.index_linked_calls``).
    indexed = f"indexed the linked calls of {len(interrupted(IID)) + 2} events in "
    assert sum(indexed in r.getMessage() for r in caplog.records) == 1
    now = SQLITE_SCHEMA if place.kind == "sqlite" else PG_SCHEMA
    assert place.rows("SELECT value FROM meta WHERE name = 'schema'") == [(str(now),)]
    assert place.rows("SELECT seq FROM linked_calls ORDER BY seq") == [
        (len(interrupted(IID)) + 1,),
        (len(interrupted(IID)) + 2,),
    ]
    with pytest.raises(Exception, match="append-only"):
        place.write("DELETE FROM linked_calls")


@pytest.mark.parametrize("change", ["removed", "added", "table-dropped"])
def test_verify_finds_linked_calls_altered(place: Place, change: str) -> None:
    """The table is not chained and the check reads it alone: a row of it removed lets a claim
    naming a call an earlier row names be written, so ``verify`` holds it to the events."""

    async def claimed(j: Journal) -> None:
        await j.append(_claim(QUERY))
        await j.append(_row(QUERY, code="APPROVAL_DENIED", reason="read"))

    _interrupted(place)
    _run(place, claimed)
    with place.reader() as r:
        assert r.verify().ok
    first = len(interrupted(IID)) + 1
    drop = () if place.kind == "postgresql" else ("DROP TRIGGER linked_calls_no_delete",)
    statement = {
        "removed": f"DELETE FROM linked_calls WHERE seq = {first}",
        "added": "INSERT INTO linked_calls (invocation_id, call_sha256, seq) VALUES "
        f"('{IID}', {place.blob(b'x' * 32)}, 2)",
        "table-dropped": "DROP TABLE linked_calls",
    }[change]
    place.tamper(*drop, statement)
    with place.reader() as r:
        report = r.verify()
    assert not report.ok
    assert report.first_bad_seq == (2 if change == "added" else first), report
    assert "linked_calls" in report.reason, report.reason


@pytest.mark.parametrize("past", [(1, 50), (50,)])
def test_verify_reports_linked_calls_rows_past_the_head(
    place: Place, past: tuple[int, ...]
) -> None:
    """Every row intact, ``linked_calls`` rows stored at seqs no event has reached (the broker's
    role may INSERT: one at head+1 would wait for the next row): verify says the table was
    altered, from the first of them -- it said 'intact' before."""
    _interrupted(place)
    ((head,),) = place.rows("SELECT max(seq) FROM events")
    for n in past:
        place.write(
            "INSERT INTO linked_calls (invocation_id, call_sha256, seq) VALUES "
            f"('act_zz', {place.blob(bytes([n]) * 32)}, {head + n})"
        )
    with place.reader() as r:
        report = r.verify()
    assert not report.ok
    assert report.first_bad_seq == head + past[0], report
    assert f"linked_calls holds a row for seq {head + past[0]}" in report.reason, report.reason
    assert report.count == head, report


def test_verify_reads_linked_calls_a_window_of_seqs_at_a_time(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``verify`` reads ``linked_calls`` a window of seqs a query, so what one query holds in
    memory (all of it, on PostgreSQL's client-side cursor) is bounded by the window, not the
    table -- and windows of 2 seqs find what one read finds: a whole table intact, then rows
    planted below 0 and far past the head reported from the first."""
    monkeypatch.setattr(Tables, "LINKED_WINDOW", 2)
    largest: list[int] = []
    rows = Tables.rows

    def counted(self: Tables, name: str, params: tuple[object, ...] = ()) -> object:
        found = list(rows(self, name, params))
        if name == "linked_calls_rows":
            largest.append(len(found))
        return iter(found)

    monkeypatch.setattr(Tables, "rows", counted)

    async def claims(j: Journal) -> None:
        for n in range(5):
            await j.append(_claim(f"act_q{n}"))
            await j.append(_row(f"act_q{n}", code="APPROVAL_DENIED", reason="read"))

    _interrupted(place)
    _run(place, claims)
    assert place.rows("SELECT count(*) FROM linked_calls") == [(10,)]
    with place.reader() as r:
        assert r.verify().ok
    assert sum(largest) == 10 and max(largest) <= 2, largest
    for seq in (-7, 2**62):
        place.write(
            "INSERT INTO linked_calls (invocation_id, call_sha256, seq) VALUES "
            f"('act_zz', {place.blob(bytes(32))}, {seq})"
        )
    with place.reader() as r:
        report = r.verify()
    assert not report.ok
    assert report.first_bad_seq == -7, report


def test_verify_claims_nothing_about_linked_calls_past_the_rows_it_proves(place: Place) -> None:
    """A claim and its close in one transaction (one checkpoint after both), that checkpoint's
    signature altered: the rows from the first unproven one on are not judged -- the table
    holds both rows' entries, and no line says one was removed."""

    async def claimed(j: Journal) -> None:
        both = [(_claim(QUERY), None), (_row(QUERY, code="APPROVAL_DENIED", reason="read"), None)]
        await (await j.post_many(both)).wait()

    _interrupted(place)
    _run(place, claimed)
    first = len(interrupted(IID)) + 1
    assert place.rows("SELECT max(seq) FROM checkpoints") == [(first + 1,)]
    place.tamper(
        f"UPDATE checkpoints SET signature = {place.blob(bytes(64))} WHERE seq = {first + 1}"
    )
    with place.reader() as r:
        report = r.verify()
    assert not report.ok
    assert report.first_bad_seq == first, report
    assert not [line for line in (report.reason, *report.also) if "linked_calls" in line], report


def test_an_index_row_already_there_as_the_writer_means_it_refuses_nothing(place: Place) -> None:
    """``linked_calls``' key is its whole row: one inserted ahead of its event (the broker's
    role may INSERT) exactly as the writer then inserts it is the row meant -- the claim is
    written, not refused 'duplicate key' (on PostgreSQL that refusal also broke the writer's
    connection: ``test_postgres``), and verify finds the table whole."""
    _interrupted(place)
    ((head,),) = place.rows("SELECT max(seq) FROM events")
    for key in index_keys(f'{{"query_invocation":"{QUERY}"}}'):
        place.write(
            "INSERT INTO linked_calls (invocation_id, call_sha256, seq) VALUES "
            f"('{IID}', {place.blob(key)}, {head + 1})"
        )

    async def claimed(j: Journal) -> None:
        assert (await j.append(_claim(QUERY))).seq == head + 1

    _run(place, claimed)
    assert place.rows(f"SELECT count(*) FROM linked_calls WHERE seq = {head + 1}") == [(1,)]
    with place.reader() as r:
        assert r.verify().ok


def test_a_broker_of_the_schema_before_still_writing_fails_its_claims_loudly(place: Place) -> None:
    """A broker of the schema before that opened the journal before a writer of this one
    upgraded it fills no ``linked_calls`` row: its rows naming a call (written here as it
    writes them, canonical JSON and no index row) are refused by the schema, not left
    unindexed for a later claim of the same call to be taken.  The journal starts as the schema
    before left it (PostgreSQL: schema 4's chain function): the writer's open that upgrades it
    is what must put the refusal in place."""

    async def claimed(j: Journal) -> None:
        await j.append(_claim(QUERY))

    _interrupted(place)
    _before(place)
    _run(place, claimed)
    old = '{"code":"APPROVAL_DENIED","query_invocation":"act_q1","reason":"read"}'
    for attrs in (old, '{"poll_invocation":"act_p1"}', '{"reason":"not_invocation"}'):
        with pytest.raises(Exception, match="a broker of the schema before the upgrade"):
            _write_raw(place, IID, "RECONCILE_INCONCLUSIVE", "remote_query", attrs)
    # A row holding no linked key's tail needs no index row: the old broker's other rows go on.
    _write_raw(place, "act_other", "ATTEMPT_INTERRUPTED", "transport_observed", '{"a":1}')
    # Its own close of the call, indexed, then a claim of it again: refused.
    _write_raw(place, IID, "RECONCILE_INCONCLUSIVE", "remote_query", old, index=True)

    async def again(j: Journal) -> None:
        with pytest.raises(ImpossibleEvent, match=NAMED):
            await j.append(_claim(QUERY))

    _run(place, again)
    with place.reader() as r:
        assert r.verify().ok


OP = "op_x1"
POLL = "act_p1"
POLL_SPELLINGS = {
    # A poll's claim (open, no code) then its close, as a broker writes them and as a foreign
    # writer might spell them: ``poll_invocation`` is indexed as ``query_invocation`` is.
    "canonical": (
        '{"code":null,"open":true,"operation_id":"op_x1","poll_invocation":"act_p1",'
        '"reason":"asking"}',
        '{"code":"APPROVAL_DENIED","operation_id":"op_x1","poll_invocation":"act_p1",'
        '"reason":"unsent","unsent":true}',
    ),
    "escaped-key": (
        '{"code":null,"open":true,"operation_id":"op_x1","poll\\u005finvocation":"act_p1",'
        '"reason":"asking"}',
        '{"code":"APPROVAL_DENIED","operation_id":"op_x1","poll\\u005finvocation":"act_p1",'
        '"reason":"unsent","unsent":true}',
    ),
}


def _poll(poll: str, **attrs: object) -> Event:
    return Event(
        E.OPERATION_POLL_FAILED,
        IID,
        {"operation_id": OP, "poll_invocation": poll, **attrs},
        source=EvidenceSource.REMOTE_RESPONSE,
    )


def _poll_claim(poll: str) -> Event:
    return _poll(poll, code=None, reason="asking", open=True)


def _accepted_job(place: Place) -> None:
    async def body(j: Journal) -> None:
        for event in happy(IID):
            await j.append(Event(event.kind, IID, {**event.attrs, "status": 202}, event.source))
        job = {"operation_id": OP, "job_id": "j1", "status_url": "http://x/j1"}
        await j.append(Event(E.OPERATION_ACCEPTED, IID, job, EvidenceSource.REMOTE_RESPONSE))
        await j.commit_result(Event(E.RESULT_COMMITTED, IID), summary={"status": 202})

    _run(place, body)


@pytest.mark.parametrize("together", [False, True], ids=["stored", "same-transaction"])
def test_a_poll_claimed_and_closed_is_not_claimed_again(place: Place, together: bool) -> None:
    """A poll's claim is checked as a query's is, stored or queued in the same transaction."""
    _accepted_job(place)
    close = _poll(POLL, code="APPROVAL_DENIED", reason="unsent", unsent=True)

    async def body(j: Journal) -> None:
        if together:
            posted = await j.post_many([(_poll_claim(POLL), None), (close, None)])
            await posted.wait()
        else:
            await j.append(_poll_claim(POLL))
            await j.append(close)
        with pytest.raises(ImpossibleEvent, match=re.escape(f"{POLL} is named by an earlier")):
            await j.append(_poll_claim(POLL))
        await j.append(_poll_claim("act_p2"))

    _run(place, body)
    assert place.rows("SELECT count(*) FROM linked_calls WHERE invocation_id = 'act_x1'") == [(3,)]


@pytest.mark.parametrize("spelling", POLL_SPELLINGS)
def test_a_poll_an_old_writer_s_row_names_is_indexed_by_the_upgrade(
    place: Place, spelling: str
) -> None:
    _accepted_job(place)
    _before(place)
    for attrs in POLL_SPELLINGS[spelling]:
        _write_raw(place, IID, "OPERATION_POLL_FAILED", "remote_response", attrs)

    async def body(j: Journal) -> None:
        with pytest.raises(ImpossibleEvent, match=re.escape(f"{POLL} is named by an earlier")):
            await j.append(_poll_claim(POLL))
        await j.append(_poll_claim("act_p2"))

    _run(place, body)
    with place.reader() as r:
        assert r.verify().ok


def test_the_linked_attributes_are_the_schema_s() -> None:
    """``linked_calls`` indexes the attributes of ``LINKED_ATTRS`` as the schema that filled it
    knew them: a new one read by the check without a new schema number (whose upgrade fills the
    table again) would leave every stored row naming a call under it unindexed, and a claim of
    such a call taken.  Change the three together."""
    assert (LINKED_ATTRS, SQLITE_SCHEMA, PG_SCHEMA) == (
        ("poll_invocation", "query_invocation"),
        12,  # 12 / 6: APPROVAL_REVOKED's rules, no new linked attribute (the table as filled)
        7,  # 7: the triggers' pinned search_path, no new linked attribute
    )
    assert all(name.endswith(LINKED_TAIL[:-1]) for name in LINKED_ATTRS)  # the trigger's test


def test_a_fill_failing_partway_leaves_the_schema_before_and_no_table(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fill runs in the opening transaction: a failure on its third page rolls all of it
    back -- the number before, no table, no trigger needing one -- and the next open fills it."""
    from affidavit.journal import tables

    async def claimed(j: Journal) -> None:
        for n in range(5):
            await j.append(_claim(f"act_q{n}"))
            await j.append(_row(f"act_q{n}", code="APPROVAL_DENIED", reason="read"))

    _interrupted(place)
    _run(place, claimed)
    _before(place)
    pages = []
    real = tables.linked_call_rows

    def failing(rows: object) -> object:
        pages.append(rows)
        if len(pages) == 3:
            raise OSError("disk I/O error")
        return real(rows)  # type: ignore[arg-type]

    fill = Tables.fill_linked_calls
    with monkeypatch.context() as m:
        m.setattr(Tables, "fill_linked_calls", lambda self: fill(self, page=3))
        m.setattr(tables, "linked_call_rows", failing)
        with pytest.raises(OSError, match="disk I/O error"):
            _run(place, claimed)
    assert len(pages) == 3
    old = str(BEFORE[place.kind])
    assert place.rows("SELECT value FROM meta WHERE name = 'schema'") == [(old,)]
    table = (
        "SELECT count(*) FROM sqlite_master WHERE name IN ('linked_calls', 'events_linked_indexed')"
        if place.kind == "sqlite"
        else "SELECT count(*) FROM pg_class WHERE oid = to_regclass('linked_calls')"
    )
    assert place.rows(table) == [(0,)]

    async def refused(j: Journal) -> None:
        with pytest.raises(ImpossibleEvent, match=NAMED):
            await j.append(_claim(QUERY))

    _run(place, refused)
    assert place.rows("SELECT count(*) FROM linked_calls") == [(10,)]


def test_the_rows_naming_a_call_are_read_through_linked_calls_alone(place: Place) -> None:
    """``JournalReader.events_naming`` (an operation's open poll found without reading the
    polls before it): the record's rows naming the call, by seq, as ``events`` reads them --
    not the rows naming another call, nor another record's naming the same call; a call no row
    names reads none.  Found through the table alone: a row someone removed from it is not
    found, and ``verify`` reports that removal."""
    other = "act_x2"
    stored: list[Event] = []

    async def body(j: Journal) -> None:
        for event in [*interrupted(IID), *interrupted(other)]:
            await j.append(event)
        stored.append(await j.append(_claim(QUERY)))
        stored.append(await j.append(_row(QUERY, code=None, reason="read")))
        await j.append(_claim("act_q2"))
        await j.append(query_claim(other, QUERY))
        stored.append(await j.append(_row("act_q2", code=None, reason="read")))
        stored.append(await j.append(_row(QUERY, code="APPROVAL_DENIED", reason="read")))
        del stored[2]  # (names act_q2)
        assert j.events_naming(IID, QUERY) == [e for e in j.events(IID) if e.seq in
                                                {s.seq for s in stored}]  # fmt: skip

    _run(place, body)
    with place.reader() as r:
        found = r.events_naming(IID, QUERY)
        assert [e.seq for e in found] == [e.seq for e in stored]
        assert all(e.attrs["query_invocation"] == QUERY for e in found)
        assert [e.seq for e in r.events_naming(IID, "act_q2")] == [
            e.seq for e in r.events(IID) if e.attrs.get("query_invocation") == "act_q2"
        ]
        assert r.events_naming(IID, "act_none") == []
        assert [e.invocation_id for e in r.events_naming(other, QUERY)] == [other]
    drop = () if place.kind == "postgresql" else ("DROP TRIGGER linked_calls_no_delete",)
    place.tamper(*drop, f"DELETE FROM linked_calls WHERE seq = {stored[0].seq}")
    with place.reader() as r:
        # Not found through the table: the caller falls back to the record
        # (``operations._earlier``, test_poll_approval), and ``verify`` reports the removal.
        assert [e.seq for e in r.events_naming(IID, QUERY)] == [e.seq for e in stored[1:]]
        report = r.verify()
    assert not report.ok
    assert report.first_bad_seq == stored[0].seq, report
    assert "linked_calls" in report.reason, report.reason
