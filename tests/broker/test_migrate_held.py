"""``affidavit journal migrate`` holds its source as a daemon does: under the exclusive writer
lock, from the source's verify until the copy has verified.  A daemon owning the file, or an
embedded broker with it open, went on appending after the copy was taken -- a call in flight
left open in the copy, which still reported "both verify"; now the migrate is refused
``JOURNAL_LOCKED`` (the daemon named), nothing copied, and no writer starts while it runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from affidavit.cli import main as cli_main
from affidavit.journal import Journal, JournalError, JournalLocked, JournalReader
from affidavit.journal import migrate as migrate_module
from affidavit.journal.lock import WriterLock
from tests.journal.helpers import happy
from tests.postgres import Cluster, argv_url

_DAEMON = "affidavit serve (pid 4242) on /run/affidavit/d.sock"
_CANARY = b"CANARY-migrate-held-5e1f"


@pytest.fixture
def cli_url(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    return argv_url(pg_url, monkeypatch)


async def _fill(db: Path) -> None:
    async with Journal.open(db) as j:
        for ev in happy("inv-h"):
            await j.append(ev)
        await j.put_result_chunk("inv-h", "body", 0, _CANARY)


def _refused_while(db: Path, pg: Cluster, pg_url: str, cli_url: str, owner: str | None,
                   capsys: pytest.CaptureFixture[str]) -> str:  # fmt: skip
    """Migrate ``db`` while a writer (an owner: the daemon; else embedded) holds it open: the
    refusal's one line, with the source and the target checked untouched."""
    with JournalReader.open(db) as r:
        head = r.head()
    before = db.read_bytes()

    async def held() -> None:
        async with Journal.open(db, owner=owner):
            argv = ["journal", "migrate", "--journal", str(db), "--to", cli_url, "--json"]
            assert cli_main(argv) == 2

    trio.run(held)
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("affidavit: JOURNAL_LOCKED: ") and "nothing was copied" in err, err
    assert json.loads(out)["api_error"]["code"] == "JOURNAL_LOCKED"  # (--json: the code there)
    assert pg.password not in out + err and _CANARY.decode() not in out + err
    with pytest.raises(JournalError, match="no journal"):
        JournalReader.open(pg_url)  # nothing copied: not even the schema
    with JournalReader.open(db) as r:
        assert r.head() == head
    assert db.read_bytes() == before
    return err


def test_migrate_is_refused_while_a_daemon_owns_the_journal(
    pg: Cluster, pg_url: str, cli_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j.db"
    trio.run(_fill, db)
    err = _refused_while(db, pg, pg_url, cli_url, _DAEMON, capsys)
    assert _DAEMON in err, err


def test_migrate_is_refused_while_an_embedded_broker_has_the_journal_open(
    pg: Cluster, pg_url: str, cli_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j.db"
    trio.run(_fill, db)
    err = _refused_while(db, pg, pg_url, cli_url, None, capsys)
    assert "another writer (an embedded broker, or an earlier affidavit)" in err, err
    # Once the writer is gone, the same journal migrates.
    assert cli_main(["journal", "migrate", "--journal", str(db), "--to", cli_url, "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["target_ok"] and done["source_ok"]
    with JournalReader.open(db) as r:
        assert (done["head_seq"], done["head_hash"]) == r.head()


def test_no_writer_opens_the_source_while_migrate_copies_it(
    pg_url: str, cli_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Held until the copy has verified: a writer starting mid-copy (embedded, or a daemon) is
    refused, told the journal is busy with the migrate -- never to ask a daemon, there is none
    -- and a second migrate likewise; after it, the lock is let go."""
    db = tmp_path / "j.db"
    trio.run(_fill, db)
    copy, tried = migrate_module._copy, []

    def copying(*args: object) -> object:
        for owner in (None, _DAEMON):
            with pytest.raises(JournalLocked, match="affidavit journal migrate") as exc:
                WriterLock.acquire(db, owner)
            tried.append(exc.value)
        with pytest.raises(JournalLocked, match="affidavit journal migrate") as exc:
            migrate_module._sole_writer(db)  # (a second migrate)
        tried.append(exc.value)
        return copy(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(migrate_module, "_copy", copying)
    assert cli_main(["journal", "migrate", "--journal", str(db), "--to", cli_url]) == 0
    assert len(tried) == 3 and "both verify" in capsys.readouterr().out
    for refused in tried:
        assert refused.job and "holds it for that one job; wait for it to finish" in str(refused)
        assert "daemon" not in str(refused) and "socket" not in str(refused), refused
    assert str(tried[2]).endswith("; nothing was copied"), tried[2]
    WriterLock.acquire(db, _DAEMON).release()  # let go once done
