"""A shared journal from the operator's side: ``[journal] url`` in the config (never echoing its
password), ``affidavit init --journal-url``, the views and ``journal verify`` on a URL with one
public key per broker, and ``affidavit journal migrate --to postgresql://...`` copying a SQLite
journal with its chain verified end to end on both sides."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import trio

from affidavit.cli import main as cli_main
from affidavit.config import ConfigError, config_from_dict, load_config
from affidavit.config.service import MIN_SHARED_LEASE_MARGIN
from affidavit.journal import Journal, JournalError, JournalReader, SigningKey, public_key_pem
from affidavit.statemachine import Event, EvidenceSource, ImpossibleEvent, Outcome
from affidavit.statemachine import EventKind as E
from tests.journal.helpers import FINGERPRINT, accepted, happy, interrupted
from tests.postgres import Cluster, argv_url


@pytest.fixture
def cli_url(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """``pg_url`` as a command line names it: its password in ``PGPASSWORD``."""
    return argv_url(pg_url, monkeypatch)


def _config(tmp: Path, journal: dict[str, object]) -> object:
    return config_from_dict({"journal": journal}, base_dir=tmp)


def test_a_shared_journal_is_a_url_with_named_key_files(tmp_path: Path) -> None:
    secret = "pw-canary-1f2e3d"
    url = f"postgresql://broker:{secret}@db.example:5432/affidavit"
    config = _config(tmp_path, {"url": url, "key_file": "k", "signing_key": "s"})
    journal = config.journal  # type: ignore[attr-defined]
    assert journal.location == url
    assert secret not in repr(journal) and secret not in repr(config)
    from affidavit.journal.backend import where

    assert where(journal.location) == "postgresql://broker:***@db.example:5432/affidavit"
    # libpq's parameters that carry a password, whatever their case: the client key's
    # passphrase too (sslpassword), never shown; the others are.
    query = f"?password={secret}&SSLPassword={secret}x&sslmode=verify-full&sslkey=/k/c.key"
    shown = where(f"postgresql://broker@db.example/affidavit{query}")
    assert secret not in shown and shown.count("***") == 2, shown
    assert "sslmode=verify-full" in shown and "sslkey=/k/c.key" in shown, shown
    assert journal.key_file == tmp_path / "k"
    bad = [
        ({"url": url}, "journal.key_file", "required with url"),
        ({"url": url, "key_file": "k"}, "journal.signing_key", "required with url"),
        ({"url": url, "path": "j.db", "key_file": "k", "signing_key": "s"}, "journal.url",
         "not both"),
        ({"url": f"mysql://root:{secret}@h/db"}, "journal.url", "postgresql:// URL"),
        ({"url": f"postgresql://u:{secret}@h/db x"}, "journal.url", "without spaces"),
    ]  # fmt: skip
    for table, field, message in bad:
        with pytest.raises(ConfigError) as info:
            _config(tmp_path, table)
        assert info.value.field == field and message in info.value.message
        assert secret not in str(info.value)


def test_init_writes_a_shared_config_and_creates_the_schema(
    pg: Cluster,
    pg_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = tmp_path / "affidavit.toml"
    # The password on the command line is refused (every local user reads /proc/<pid>/cmdline)
    # before anything is written; libpq takes it from PGPASSWORD instead.
    assert cli_main(["init", "--config", str(config), "--journal-url", pg_url]) == 2
    err = capsys.readouterr().err
    assert "INVALID_FIELD" in err and "--journal-url" in err and pg.password not in err
    assert not config.exists()
    bare = argv_url(pg_url, monkeypatch)
    assert cli_main(["init", "--config", str(config), "--journal-url", bare]) == 0
    out = capsys.readouterr().out
    assert pg.password not in out
    loaded = load_config(config)
    assert loaded.journal.url == bare
    with JournalReader.open(bare) as r:
        assert r.head() == (0, "0" * 64) and r.verify().ok
    # Idempotent: a second broker's first open finds the schema and registers its own key.
    assert cli_main(["journal", "verify", "--config", str(config)]) == 0
    assert (
        cli_main(["init", "--config", str(tmp_path / "x.toml"), "--journal-url", "http://x"]) == 2
    )
    assert "expected a postgresql:// URL" in capsys.readouterr().err


async def _two_brokers(url: str, tmp: Path) -> None:
    keys = {"key_file": tmp / "shared.key"}
    async with (
        Journal.open(url, signing_key=tmp / "a.signing.key", **keys) as a,
        Journal.open(url, signing_key=tmp / "b.signing.key", **keys) as b,
    ):
        for ev in happy("inv-a", "alice"):
            await a.append(ev)
        for ev in interrupted("inv-b", "bob"):
            await b.append(ev)


def test_views_and_verify_take_a_url_and_one_public_key_per_broker(
    pg: Cluster, pg_url: str, cli_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trio.run(_two_brokers, pg_url, tmp_path)
    pubs = []
    for name in "ab":
        pub = tmp_path / f"{name}.pub"
        pub.write_bytes(
            public_key_pem(SigningKey.load(tmp_path / f"{name}.signing.key").public_raw)
        )
        pubs += ["--public-key", str(pub)]
    assert cli_main(["actions", "--journal", cli_url, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["invocation_id"], r["outcome"]) for r in rows] == [
        ("inv-a", "committed"),
        ("inv-b", "unknown"),
    ]
    assert cli_main(["journal", "verify", "--journal", cli_url, *pubs]) == 0
    out = capsys.readouterr().out
    assert "journal intact: 12 events" in out and "keys " in out and pg.password not in out
    assert cli_main(["journal", "verify", "--journal", cli_url, *pubs[:2]]) == 1
    assert "not signed by key" in capsys.readouterr().out
    assert cli_main(["journal", "public-key", "--journal", cli_url]) == 2
    assert "--signing-key" in capsys.readouterr().err


def test_a_url_that_reaches_no_server_is_one_line_without_the_password(
    pg: Cluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = argv_url(pg.url("postgres").replace(f":{pg.port}/", ":1/"), monkeypatch)
    assert cli_main(["actions", "--journal", url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot connect" in err and pg.password not in err


# -- migrate ----------------------------------------------------------------------------------


async def _sqlite_journal(db: Path) -> None:
    async with Journal.open(db) as j:
        for ev in happy("inv-r"):
            await j.append(ev)
        await j.put_result_chunk("inv-r", "body", 0, b"x" * 70_000)
        await j.put_result_chunk("inv-r", "body", 1, b"tail")
        await j.commit_result(Event(E.RESULT_COMMITTED, "inv-r"), summary={"status": 201})
        # bound first, then accepted naming its key (as the engine does: journal/bindings.py)
        await j.bind_idempotency("api.create", "key-1", FINGERPRINT, "inv-u", 2e9)
        for ev in [accepted("inv-u", idem=("api.create", "key-1")), *interrupted("inv-u")[1:]]:
            await j.append(ev)
        for attrs in (_CLAIM, {"query_invocation": "act_q1", "code": "APPROVAL_DENIED"}):
            await j.append(_query(attrs))
        await j.acquire_lease("inv-u", "old-broker", ttl=1)


_CLAIM = {"query_invocation": "act_q1", "code": None, "open": True}


def _query(attrs: dict[str, object]) -> Event:
    return Event(E.RECONCILE_INCONCLUSIVE, "inv-u", attrs, EvidenceSource.REMOTE_QUERY,
                 observer="o", observer_seq=1)  # fmt: skip


def test_migrate_copies_a_sqlite_journal_verified_on_both_sides(
    pg: Cluster, pg_url: str, cli_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j.db"
    trio.run(_sqlite_journal, db)
    with JournalReader.open(db) as r:
        head = r.head()
        result = r.read_result("inv-r")
    assert cli_main(["journal", "migrate", "--journal", str(db), "--to", cli_url, "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["copied"] == {
        "events": head[0], "checkpoints": done["copied"]["checkpoints"], "results": 1,
        "chunks": 2, "auditor_copies": 0, "leases": 1, "idempotency": 1,
    }  # fmt: skip
    assert (done["head_seq"], done["head_hash"]) == head and done["target_ok"]
    assert pg.password not in json.dumps(done)
    # The same evidence: rows, records, results (read with the shared sealing key), leases.
    with JournalReader.open(pg_url, key_file=f"{db}.key") as r:
        assert r.head() == head and r.verify().ok
        assert r.read_result("inv-r") == result
        rec = r.record("inv-u")
        assert rec is not None and rec.outcome is Outcome.UNKNOWN and rec.generation == 1
        assert r.find_idempotency("api.create", "key-1") is not None
        lease = r.lease("inv-u")
        assert lease is not None and lease.holder == "old-broker"

    async def continue_there() -> None:
        # A broker on the new journal, with its own signing key, extends the migrated chain.
        async with Journal.open(
            pg_url, key_file=f"{db}.key", signing_key=tmp_path / "new.signing.key"
        ) as j:
            for ev in happy("inv-next"):
                await j.append(ev)
            # The calls the copied rows name are indexed (``linked_calls``) as migrate copies.
            with pytest.raises(ImpossibleEvent, match="act_q1 is named by an earlier row"):
                await j.append(_query(_CLAIM))

    trio.run(continue_there)
    old = SigningKey.load(f"{db}.signing.key").public_raw
    new = SigningKey.load(tmp_path / "new.signing.key").public_raw
    with JournalReader.open(pg_url) as r:
        assert r.verify(public_keys=[old, new]).ok
        assert r.verify(public_keys=[old]).first_bad_seq == head[0] + 1
    # Never into a journal that is not empty; nothing changes there.
    assert cli_main(["journal", "migrate", "--journal", str(db), "--to", cli_url]) == 2
    err = capsys.readouterr().err
    assert "already holds a journal" in err and pg.password not in err
    with JournalReader.open(pg_url) as r:
        assert r.head()[0] == head[0] + 7


def test_migrate_refuses_a_source_that_does_not_verify_and_copies_nothing(
    pg_url: str, cli_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sqlite3

    db = tmp_path / "j.db"
    trio.run(_sqlite_journal, db)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute("UPDATE events SET attrs = '{}' WHERE seq = 2")
    conn.close()
    assert cli_main(["journal", "migrate", "--journal", str(db), "--to", cli_url]) == 2
    assert "does not verify with the given signing key (first bad seq 2" in capsys.readouterr().err
    with pytest.raises(JournalError, match="no journal"):
        JournalReader.open(pg_url)
    assert cli_main(["journal", "migrate", "--journal", str(db), "--to", str(db)]) == 2
    assert "expected a postgresql:// URL" in capsys.readouterr().err


def test_migrate_verifies_the_source_with_the_brokers_key_never_the_one_it_records(
    pg_url: str, cli_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Someone who can write the file replaces the journal with a history of their own,
    signed with their own key and recording it.  The broker refuses to open it (its signing
    key does not match); migrate must too -- not verify it with the key it records, copy it
    and register the forger's key as a signer of the shared journal."""
    import shutil

    db = tmp_path / "j.db"
    trio.run(_sqlite_journal, db)
    forged = tmp_path / "forged" / "j.db"
    forged.parent.mkdir()

    async def forge() -> None:
        async with Journal.open(forged) as j:  # its own key files, beside it
            for ev in happy("inv-forged"):
                await j.append(ev)

    trio.run(forge)
    for leftover in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        leftover.unlink(missing_ok=True)
    shutil.copy(forged, db)  # db.signing.key, the broker's own, stays
    with JournalReader.open(db) as r:
        assert r.verify().ok  # with the key the file records: "ok"
    assert cli_main(["journal", "migrate", "--journal", str(db), "--to", cli_url]) == 2
    err = capsys.readouterr().err
    assert "does not verify with the given signing key" in err and "nothing was copied" in err
    with pytest.raises(JournalError, match="no journal"):
        JournalReader.open(pg_url)
    # The forger's key passed explicitly is the operator's choice; a key file that is no
    # key, or none at all, is a one-line refusal.
    (tmp_path / "nokey.pub").write_text("not a key")
    argv = ["journal", "migrate", "--journal", str(db), "--to", cli_url]
    assert cli_main([*argv, "--public-key", str(tmp_path / "nokey.pub")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    Path(f"{db}.signing.key").unlink()
    assert cli_main(argv) == 2
    assert "pass --public-key FILE" in capsys.readouterr().err


def test_migrate_takes_the_sources_public_key_from_a_file(
    pg_url: str, cli_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run away from the broker's key (an auditor's copy of the file): ``--public-key``."""
    db = tmp_path / "j.db"
    trio.run(_sqlite_journal, db)
    pub = tmp_path / "journal.pub"
    pub.write_bytes(public_key_pem(SigningKey.load(f"{db}.signing.key").public_raw))
    Path(f"{db}.signing.key").rename(tmp_path / "elsewhere.key")
    argv = ["journal", "migrate", "--journal", str(db), "--to", cli_url, "--public-key", str(pub)]
    assert cli_main(argv) == 0
    capsys.readouterr()
    with JournalReader.open(pg_url) as r:
        assert r.verify(public_keys=[SigningKey.load(tmp_path / "elsewhere.key").public_raw]).ok


def test_a_url_without_psycopg_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg -> ImportError
    monkeypatch.delitem(sys.modules, "affidavit.journal.postgres", raising=False)
    with pytest.raises(JournalError, match=r"affidavit\[postgresql\]"):
        JournalReader.open("postgresql://u@h/db")


@pytest.mark.parametrize("margin", [0.001, 0.5])
def test_a_shared_journal_refuses_a_lease_margin_below_the_clock_skew_floor(
    tmp_path: Path, margin: object
) -> None:
    """On a shared journal ``lease_margin`` is the clock skew tolerated between the hosts: with
    0, a host whose clock runs ahead closes and retries a call another is still dispatching
    (docs/configuration.md).  0 was refused already (a duration is positive); a millisecond
    was taken -- as good as none.  A config error at the field, not a silent zero tolerance."""
    url = "postgresql://broker@db.example:5432/affidavit"
    journal = {"url": url, "key_file": "k", "signing_key": "s"}
    with pytest.raises(ConfigError) as info:
        config_from_dict(
            {"journal": journal, "service": {"lease_margin": margin}}, base_dir=tmp_path
        )
    assert info.value.field == "service.lease_margin"
    assert f"at least {MIN_SHARED_LEASE_MARGIN:g} s on a shared journal" in info.value.message
    ok = {"journal": journal, "service": {"lease_margin": MIN_SHARED_LEASE_MARGIN}}
    assert config_from_dict(ok, base_dir=tmp_path).service.lease_margin == 1.0
    # One host's SQLite journal has one clock: no skew to tolerate, any positive margin will do.
    single = config_from_dict({"service": {"lease_margin": margin}}, base_dir=tmp_path)
    assert single.service.lease_margin < MIN_SHARED_LEASE_MARGIN
