"""A journal whose signing records were removed is not one from before signing (docs/journal.md,
"Journals from before signing"): rows a signing broker wrote -- a schema, or a
RESULT_COMMITTED carrying ``marker_sha256``, which only signing brokers write -- are neither
accepted by ``verify --accept-unsigned`` nor adopted by a broker that would sign over them.

The forgery: a signed journal with a stored result, its triggers dropped, every checkpoint and
the recorded signing key deleted, a REMOTE_RESPONSE_COMPLETE changed to a rejection, the rows
re-chained from genesis."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
import trio

from affidavit.cli import journal_refusal
from affidavit.cli import main as cli_main
from affidavit.journal import Journal, JournalReader, SigningKey, SigningRecordsRemoved
from affidavit.journal.sqlite import SCHEMA_VERSION

from . import test_tamper
from .test_tamper import Built, _rechain_from, _sql

built, j = test_tamper.built, test_tamper.j  # the fixtures: a signed journal with a result

CODE = "SIGNING_RECORDS_REMOVED"


def _strip_and_forge(b: Built, schema: str | None = None) -> None:
    """The forgery above; ``schema``: also set the recorded schema back to it."""
    conn = sqlite3.connect(b.db)
    (seq,) = conn.execute(
        "SELECT seq FROM events WHERE invocation_id = 'inv-r' AND kind = 'REMOTE_RESPONSE_COMPLETE'"
    ).fetchone()
    conn.close()
    edits: list[tuple[str, tuple[object, ...]]] = [
        ("UPDATE events SET attrs = ? WHERE seq = ?", ('{"outcome":"rejected","status":409}', seq)),
        ("DELETE FROM checkpoints", ()),
        ("DELETE FROM meta WHERE name IN ('signing_key_id', 'signing_public_key')", ()),
    ]
    if schema is not None:
        edits.append(("UPDATE meta SET value = ? WHERE name = 'schema'", (schema,)))
    _sql(b.db, *edits)
    _rechain_from(b.db, 1)


def _open_writer(db: Path) -> None:
    async def run() -> None:
        async with Journal.open(db):
            pass

    trio.run(run)


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        (None, f"records schema {SCHEMA_VERSION}, which only signing brokers write"),
        ("1", "(RESULT_COMMITTED) carries marker_sha256"),  # the schema passed off as old too
    ],
)
def test_rows_a_signing_broker_wrote_are_not_accepted_as_from_before_signing(
    j: Built, schema: str | None, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _strip_and_forge(j, schema)
    with JournalReader.open(j.db) as r:
        report = r.verify(accept_unsigned=True)
    assert (report.ok, report.first_bad_seq, report.code) == (False, 1, CODE)
    assert why in report.reason and "signing records" in report.reason
    assert cli_main(["journal", "verify", "--journal", str(j.db), "--accept-unsigned"]) == 1
    out = capsys.readouterr().out
    assert f"journal BROKEN at seq 1 ({CODE}):" in out and "journal intact" not in out


@pytest.mark.parametrize("schema", [None, "1"])
def test_a_broker_does_not_adopt_rows_a_signing_broker_wrote(j: Built, schema: str | None) -> None:
    """With the signing key file removed too, nothing else betrays the removal: the broker
    used to adopt the forged rows and sign over them."""
    _strip_and_forge(j, schema)
    os.unlink(f"{j.db}.signing.key")
    with pytest.raises(SigningRecordsRemoved, match="its signing records were removed") as info:
        _open_writer(j.db)
    assert journal_refusal(info.value).code == CODE  # the command line's stable code
    assert not Path(f"{j.db}.signing.key").exists()
    conn = sqlite3.connect(j.db)
    assert conn.execute("SELECT count(*) FROM checkpoints").fetchone() == (0,)
    conn.close()


def test_a_journal_from_before_signing_is_checked_on_the_chain_alone_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Key source ``none``: the note that the check is not independent of the file."""
    from .test_signing import _unsigned

    db = _unsigned(tmp_path)
    with JournalReader.open(db) as r:
        report = r.verify(accept_unsigned=True)
    assert report.ok and report.code is None and report.key_source == "none"
    assert cli_main(["journal", "verify", "--journal", str(db), "--accept-unsigned"]) == 0
    out = capsys.readouterr().out
    assert "checked on the hash chain alone" in out and "independent of it" in out
    assert cli_main(["journal", "verify", "--journal", str(db), "--accept-unsigned", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["code"] is None


def test_an_adopted_prefix_a_signing_broker_wrote_is_not_accepted(j: Built) -> None:
    """A journal adopted with such rows in its adopted prefix -- by a broker from before this
    check, which signed over them -- is reported, not accepted as from before signing."""
    _strip_and_forge(j, "1")
    os.unlink(f"{j.db}.signing.key")
    key = SigningKey.create(f"{j.db}.signing.key")
    conn = sqlite3.connect(j.db, isolation_level=None)
    seq, head = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    cp = key.sign(seq, head, 0, 1767225600.0, adopted=True)
    conn.execute(
        "INSERT INTO checkpoints (seq, hash, prev, at, adopted, key_id, signature) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (cp.seq, cp.hash, cp.prev, cp.at, 1, cp.key_id, cp.signature),
    )
    conn.close()
    with JournalReader.open(j.db) as r:
        report = r.verify(public_key=key.public_raw, accept_unsigned=True)
    assert (report.ok, report.first_bad_seq, report.code) == (False, 1, CODE)
    assert "carries marker_sha256" in report.reason
