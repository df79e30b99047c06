"""``affidavit record ID`` and ``affidavit actions`` (text and ``--json``), ``affidavit journal
verify|anchor|audit-open`` and ``affidavit operations`` run embedded on a shared journal whose
database is away: exit 2 and one line on stderr naming what could not be read, in the words the
daemon answers (``read_failure``: "the journal cannot be read now (...)"), then the journal's
own words (where, and why) with the URL's password redacted -- never a traceback, never a wait,
never JOURNAL_UNREADABLE's words for a database that is only away.  Once the database is back,
the same commands answer.

Two moments: PostgreSQL stopped before the command starts (its open fails), and stopped
mid-way -- the reader open, the server stopped just before the read (in process, through
``affidavit.cli.main``: a read of the record, the actions view's stream, a verify, an auditor
copy, the operations view).  The checks and the operations view used to print the driver's bare
line ("cannot connect to journal ...", "the signing public keys cannot be read: ..."), naming
nothing the operator had asked for.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.cli import main
from affidavit.engine import unread
from affidavit.journal import JournalReader
from tests.daemon.kit import client_env, run_all
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster, argv_url, password_apart

from .awaykit import database_stopped
from .helpers import TOKEN_ENV, http_target, write_config
from .test_journal_away_mid_call import ACTION, journal_table

BODY = b'{"id":"ch_1"}'
PYTHON_M = [sys.executable, "-m", "affidavit"]
LIMIT = 20
"""Seconds any one command may take: a refused connection fails at once (well within it)."""


async def _stored(tmp_path: Path, pg_url: str) -> tuple[Path, str]:
    """A config journaling to ``pg_url`` and the id of one stored call in it."""
    from affidavit.api.broker import Broker

    async with HostileServer.running(scripts.serve(Reply(201, body=BODY))) as srv:
        cfg = write_config(
            tmp_path, {"api": http_target(srv.url)}, journal=journal_table(tmp_path, pg_url)
        )
        async with Broker.open(str(cfg)) as broker:
            env = await broker.call(ACTION)
    assert env["result"]["body"] == BODY.decode(), env
    return cfg, str(env["invocation_id"])


def _says_away(rc: int, out: str, err: str, what: str, pg: Cluster) -> None:
    """Exit 2, one line on stderr: the daemon's words for ``what``, then the journal's (where:
    the URL, its password redacted), no traceback; on stdout no record -- under ``--json``
    only the refusal, as one ``{"api_error": ...}`` object saying what the stderr line says."""
    assert rc == 2, (rc, out, err)
    if not out.startswith("{"):
        assert "act_" not in out, out  # a table's heading at most
    else:
        assert out.endswith("}\n") and out.count("\n") == 1, out
        refused = json.loads(out)
        assert list(refused) == ["api_error"], out
        assert refused["api_error"]["code"] == "JOURNAL_UNAVAILABLE", out
        assert err == f"affidavit: JOURNAL_UNAVAILABLE: {refused['api_error']['message']}\n", out
    assert pg.password not in out, out
    assert err.startswith(f"affidavit: JOURNAL_UNAVAILABLE: {unread(what)} -- "), err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err, err
    # The config's URL holds the password (redacted); --journal's cannot (refused in argv).
    assert "postgresql://affidavit:***@" in err or "postgresql://affidavit@" in err, err
    assert pg.password not in err, err


def _commands(iid: str) -> list[tuple[list[str], str]]:
    return [
        (["record", iid], f"the record of {iid}"),
        (["record", iid, "--json"], f"the record of {iid}"),
        (["actions"], "the actions view"),
        (["actions", "--json"], "the actions view"),
    ]


async def test_record_and_actions_exit_2_naming_what_while_the_database_is_stopped(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    cfg, iid = await _stored(tmp_path, pg_url)
    bare, password = password_apart(pg_url)  # (a password in argv is refused)
    env = {**client_env(), TOKEN_ENV: token, "PGPASSWORD": password}
    where = [("--config", str(cfg)), ("--journal", bare)]
    with trio.fail_after(LIMIT * 10):
        async with database_stopped(pg):  # (readers all: independent, run a few at once)
            cases = [(args, what) for args, what in _commands(iid) for _ in where]
            argvs = [[*PYTHON_M, *args, *w] for args, _ in _commands(iid) for w in where]
            runs = await run_all(argvs, env=env, within=LIMIT)
            for (args, what), done in zip(cases, runs, strict=True):
                err = done.stderr.decode()
                _says_away(done.returncode, done.stdout.decode(), err, what, pg)
                assert (done.stdout == b"") == ("--json" not in args), done.stdout
                assert " -- cannot connect to journal " in err, err
        # Back: the same commands answer (and the record by --journal's URL, its password apart).
        argvs = [[*PYTHON_M, *args, "--config", str(cfg)] for args, _ in _commands(iid)]
        argvs.append([*PYTHON_M, "record", iid, "--json", "--journal", bare])
        runs = await run_all(argvs, env=env, within=LIMIT)
    for done in runs:
        assert done.returncode == 0, done.stderr
        assert iid.encode() in done.stdout, done.stdout
    assert json.loads(runs[-1].stdout)["record"]["outcome"] == "committed", runs[-1].stdout


@contextmanager
def _stopped_before(
    monkeypatch: pytest.MonkeyPatch, pg: Cluster, name: str
) -> Iterator[list[bool]]:
    """``JournalReader.<name>`` stops PostgreSQL first (the reader is open: its connection is
    then lost mid-way); PostgreSQL is started again after the block."""
    original: Callable[..., Any] = getattr(JournalReader, name)
    stopped: list[bool] = []

    def stopping(self: JournalReader, *args: Any, **kwargs: Any) -> Any:
        if not stopped:
            pg.stop()
            stopped.append(True)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(JournalReader, name, stopping)
    try:
        yield stopped
    finally:
        monkeypatch.setattr(JournalReader, name, original)
        if stopped:
            pg.start()


@pytest.mark.parametrize(
    ("args", "method", "what"),
    [
        (["record", "{iid}"], "events", "the record of {iid}"),
        (["record", "{iid}", "--json"], "events", "the record of {iid}"),
        (["actions"], "iter_actions", "the actions view"),
        (["actions", "--json"], "iter_actions", "the actions view"),
    ],
)
async def test_record_and_actions_exit_2_naming_what_when_the_database_stops_mid_way(
    tmp_path: Path,
    token: str,
    pg: Cluster,
    pg_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    method: str,
    what: str,
) -> None:
    cfg, iid = await _stored(tmp_path, pg_url)
    argv = [a.format(iid=iid) for a in args] + ["--config", str(cfg)]
    capsys.readouterr()
    with trio.fail_after(LIMIT), _stopped_before(monkeypatch, pg, method) as stopped:
        rc = await trio.to_thread.run_sync(main, argv)
        assert stopped, "the database was never stopped: the test read nothing"
    out, err = capsys.readouterr()
    # The reader tried one new connection, found none: away (never "unreadable").
    _says_away(rc, out, err, what.format(iid=iid), pg)
    with trio.fail_after(LIMIT):
        assert await trio.to_thread.run_sync(main, argv) == 0
    assert iid in capsys.readouterr().out


# -- the journal's checks and the operations view ---------------------------------------------


async def _audited(tmp_path: Path, pg_url: str) -> tuple[Path, str, int, Path]:
    """``_stored`` with an auditor key: the config, the call's id, the seq of its
    ACTION_ACCEPTED (which has an auditor copy) and the auditor's private key."""
    from affidavit.journal import generate_auditor_keypair
    from affidavit.statemachine import EventKind

    priv, pub = tmp_path / "auditor.pem", tmp_path / "auditor.pub"
    generate_auditor_keypair(priv, pub)
    journal = {**journal_table(tmp_path, pg_url), "auditor_public_key": str(pub)}
    async with HostileServer.running(scripts.serve(Reply(201, body=BODY))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)}, journal=journal)
        from affidavit.api.broker import Broker

        async with Broker.open(str(cfg)) as broker:
            env = await broker.call(ACTION)
    iid = str(env["invocation_id"])
    with JournalReader.open(pg_url) as reader:
        seq = next(e.seq for e in reader.events(iid) if e.kind is EventKind.ACTION_ACCEPTED)
    assert seq is not None
    # The auditor pins the journal's signing key (audit-open refuses without it).
    from affidavit.journal import SigningKey, public_key_pem

    raw = SigningKey.load(journal["signing_key"]).public_raw
    priv.with_name("journal.pub").write_bytes(public_key_pem(raw))
    return cfg, iid, seq, priv


CHECKS = [
    (["journal", "verify"], "verify", "the rows a verify checks"),
    (["journal", "verify", "--json"], "verify", "the rows a verify checks"),
    (["journal", "anchor"], "anchor", "the rows an anchor vouches for"),
    (
        ["journal", "audit-open", "--seq", "{seq}", "--key", "{key}", "--public-key", "{pub}"],
        "audit_payload",
        "the auditor copy of event {seq}",
    ),
    (
        ["journal", "audit-open", "--result", "{iid}", "--key", "{key}", "--public-key", "{pub}"],
        "audit_result",
        "the auditor copy of invocation {iid}",
    ),
    (["operations"], "list_actions", "the operations view"),
    (["operations", "--json"], "list_actions", "the operations view"),
    # Away while the key file is checked against the journal: the journal's, not the file's.
    (
        ["journal", "open-sealed", "{iid}", "--key-file", "{broker_key}"],
        "broker_key_matches",
        "the sealed payloads of {iid}",
    ),
    (
        ["journal", "open-sealed", "{iid}", "--key-file", "{broker_key}"],
        "payload",
        "the sealed payloads of {iid}",
    ),
]
"""(argv, the ``JournalReader`` method it reads through, what it names): ``{iid}``, ``{seq}``
and ``{key}`` are ``_audited``'s; ``{pub}`` the journal's signing public key it exports,
``{broker_key}`` the broker key file (``journal_table``'s)."""


def _checks(iid: str, seq: int, priv: Path) -> list[tuple[list[str], str, str]]:
    names = {
        "iid": iid,
        "seq": seq,
        "key": priv,
        "pub": priv.with_name("journal.pub"),
        "broker_key": priv.with_name("journal.key"),
    }
    return [([a.format(**names) for a in args], m, w.format(**names)) for args, m, w in CHECKS]


async def test_journal_checks_and_operations_exit_2_naming_what_while_the_database_is_stopped(
    tmp_path: Path,
    pg: Cluster,
    pg_url: str,
    token: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg, iid, seq, priv = await _audited(tmp_path, pg_url)
    where = [("--config", str(cfg)), ("--journal", argv_url(pg_url, monkeypatch))]
    capsys.readouterr()
    with trio.fail_after(LIMIT * 10):
        async with database_stopped(pg):
            for args, _, what in _checks(iid, seq, priv):
                for flag, value in where:
                    with trio.fail_after(LIMIT):
                        rc = await trio.to_thread.run_sync(main, [*args, flag, value])
                    out, err = capsys.readouterr()
                    _says_away(rc, out, err, what, pg)
                    assert (out == "") == ("--json" not in args), (args, out)
                    assert " -- cannot connect to journal " in err, err
        # Back: the same commands answer.
        for args, _, _ in _checks(iid, seq, priv):
            with trio.fail_after(LIMIT):
                rc = await trio.to_thread.run_sync(main, [*args, "--config", str(cfg)])
            out, err = capsys.readouterr()
            assert rc == 0, (args, out, err)
            # (an anchor made with the keys the journal records says so: test_verify_claims)
            noted = args[:2] == ["journal", "anchor"]
            assert err.startswith("affidavit: note: verified with signing key") == noted, err
            assert err.count("\n") == noted, (args, err)


@pytest.mark.parametrize(("args", "method", "what"), CHECKS)
async def test_journal_checks_and_operations_exit_2_naming_what_when_the_database_stops_mid_way(
    tmp_path: Path,
    pg: Cluster,
    pg_url: str,
    token: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    method: str,
    what: str,
) -> None:
    cfg, iid, seq, priv = await _audited(tmp_path, pg_url)
    names = {
        "iid": iid,
        "seq": seq,
        "key": priv,
        "pub": priv.with_name("journal.pub"),
        "broker_key": priv.with_name("journal.key"),
    }
    argv = [a.format(**names) for a in args] + ["--config", str(cfg)]
    capsys.readouterr()
    with trio.fail_after(LIMIT), _stopped_before(monkeypatch, pg, method) as stopped:
        rc = await trio.to_thread.run_sync(main, argv)
        assert stopped, "the database was never stopped: the test read nothing"
    out, err = capsys.readouterr()
    _says_away(rc, out, err, what.format(**names), pg)
    with trio.fail_after(LIMIT):
        assert await trio.to_thread.run_sync(main, argv) == 0
