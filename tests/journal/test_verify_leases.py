"""``journal verify`` holds each lease row to its invocation's last chained lease event.

The writer decides "busy" (and the next generation) from the row alone (``leases.acquire_op``),
so a row edited -- its holder, generation or deadline -- or removed decides the next attempt.
Before, verify read the table not at all: ``UPDATE leases SET holder='evil', generation=7,
expires_at=9e18`` verified "intact".  Each edit here is one a user with write access and no
key can make (the triggers dropped, nothing re-signed)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.cli import main as cli_main
from affidavit.journal import (
    Journal,
    JournalReader,
    LeaseEventRefused,
    SigningKey,
    public_key_pem,
)
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E

from .helpers import interrupted

PUB = "journal.pub"


async def _fill(db: Path) -> None:
    async with Journal.open(db) as j:
        for iid in ("inv-1", "inv-2"):
            for ev in interrupted(iid):
                await j.append(ev)
        await j.acquire_lease("inv-1", "worker-1", 60.0)
        await j.acquire_lease("inv-2", "worker-2", 60.0)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("leases") / "j.db"
    trio.run(_fill, db)
    (db.parent / PUB).write_bytes(public_key_pem(SigningKey.load(f"{db}.signing.key").public_raw))
    return db


@pytest.fixture
def db(base: Path, tmp_path: Path) -> Path:
    out = tmp_path / "j.db"
    with sqlite3.connect(base) as a, sqlite3.connect(out) as b:
        a.backup(b)
    a.close()
    b.close()
    shutil.copy2(base.parent / PUB, tmp_path / PUB)
    return out


def _edit(db: Path, sql: str) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {name}")
    conn.execute(sql)
    conn.close()


def _lease_seq(db: Path, iid: str) -> int:
    conn = sqlite3.connect(db)
    (seq,) = conn.execute("SELECT seq FROM leases WHERE invocation_id = ?", (iid,)).fetchone()
    conn.close()
    return int(seq)


def _verify(db: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any], str]:
    argv = ["journal", "verify", "--journal", str(db), "--public-key", str(db.parent / PUB)]
    code = cli_main([*argv, "--json"])
    data = json.loads(capsys.readouterr().out)
    assert cli_main(argv) == code
    return code, data, capsys.readouterr().out


def test_untouched_lease_rows_are_proven_by_their_events(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, data, text = _verify(db, capsys)
    assert code == 0 and data["leases"] == 2
    assert "2 lease rows match their chained lease events" in text


@pytest.mark.parametrize(
    ("column", "to"),
    [("holder", "'evil'"), ("generation", "7"), ("expires_at", "9e18")],
)
def test_an_edited_lease_row_is_caught_at_its_event(
    db: Path, column: str, to: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seq = _lease_seq(db, "inv-2")
    _edit(db, f"UPDATE leases SET {column} = {to} WHERE invocation_id = 'inv-2'")
    with JournalReader.open(db) as r:
        assert r.lease("inv-2") is not None  # what acquire_op would decide from
    code, data, text = _verify(db, capsys)
    assert code == 1 and data["first_bad_seq"] == seq
    assert f"the lease row of invocation inv-2 differs from its lease event at seq {seq} " in text
    assert f"({column})" in text and "evil" not in text  # the column, never its value


def test_every_column_edited_is_named(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _edit(db, "UPDATE leases SET holder = 'evil', generation = 7, expires_at = 9e18")
    code, data, _ = _verify(db, capsys)
    assert code == 1 and "(holder, generation, expires_at)" in str(data["reason"])
    assert len(data["also"]) == 1  # inv-2's row too


def test_a_removed_lease_row_is_caught(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seq = _lease_seq(db, "inv-1")
    _edit(db, "DELETE FROM leases WHERE invocation_id = 'inv-1'")
    code, data, _ = _verify(db, capsys)
    assert code == 1 and data["first_bad_seq"] == seq
    assert "has a lease event at seq" in str(data["reason"]) and "removed" in str(data["reason"])


def test_a_lease_row_pointed_elsewhere_or_invented_is_caught(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seq = _lease_seq(db, "inv-1")
    _edit(db, f"UPDATE leases SET seq = {seq - 1} WHERE invocation_id = 'inv-1'")
    code, data, _ = _verify(db, capsys)
    assert (
        code == 1
        and data["first_bad_seq"] == seq
        and "not its last lease event" in str(data["reason"])
    )
    _edit(db, f"UPDATE leases SET seq = {seq} WHERE invocation_id = 'inv-1'")
    _edit(db, "INSERT INTO leases VALUES ('inv-none', 'w', 1, 1.0, 2)")
    code, data, _ = _verify(db, capsys)
    assert code == 1 and data["first_bad_seq"] == 2 and "has no lease event" in str(data["reason"])
    _edit(db, "UPDATE leases SET generation = 'x' WHERE invocation_id = 'inv-none'")
    code, data, _ = _verify(db, capsys)
    assert code == 1 and "not of its type" in str(data["reason"])


def test_an_invented_lease_row_past_the_head_is_caught(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A row naming a seq past the journal's head, for an invocation with no lease event: it
    would keep every acquire of inv-3 out (LeaseBusy) while verify said "intact"."""
    conn = sqlite3.connect(db)
    (head,) = conn.execute("SELECT MAX(seq) FROM events").fetchone()
    conn.close()
    _edit(db, "INSERT INTO leases VALUES ('inv-3', 'evil', 7, 9e18, 100000)")
    code, data, text = _verify(db, capsys)
    assert code == 1 and data["first_bad_seq"] == head + 1
    assert "inv-3 names seq 100000, but the invocation has no lease event" in str(data["reason"])
    assert f"the journal ends at seq {head}" in str(data["reason"]) and "evil" not in text


async def test_a_lease_event_is_refused_outside_acquire_lease(tmp_path: Path) -> None:
    """Appended (or posted) by a caller, a lease event had no lease row -- only acquire_lease
    writes one -- so the journal verified BROKEN ("the row was removed").  Refused with a
    stable code, nothing written; acquire_lease still writes both."""
    db = tmp_path / "j.db"
    attrs = {"generation": 1, "holder": "evil", "expires_at": 9e18}
    async with Journal.open(db) as j:
        for ev in interrupted("inv-1"):
            await j.append(ev)
        before = len(j.events("inv-1"))
        seen = Event(E.PROTOCOL_OBSERVED, "inv-1", {})
        for kind in (E.RETRY_LEASE_ACQUIRED, E.DISPATCH_LEASE_ACQUIRED):
            ev = Event(kind, "inv-1", attrs)
            for how in ("append", "post", "post_many"):
                with pytest.raises(LeaseEventRefused) as caught:
                    if how == "post_many":
                        await j.post_many([(seen, None), (ev, None)])
                    else:
                        await getattr(j, how)(ev)
                assert caught.value.code == "LEASE_EVENT_REFUSED"
                assert "evil" not in str(caught.value)
        assert len(j.events("inv-1")) == before
        await j.acquire_lease("inv-1", "worker-1", 60.0)
    with JournalReader.open(db) as r:
        report = r.verify()
    assert report.ok and report.leases == 1


def test_verify_names_the_lease_kinds_leases_writes() -> None:
    """verify writes ``leases.LEASE_KINDS`` out (a reader must not import trio): kept equal."""
    from journal import leases, verify

    assert {kind.value for kind in leases.LEASE_KINDS} == verify._LEASE_KINDS
