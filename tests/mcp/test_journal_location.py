"""The embedded MCP server never tells its caller where the journal lives, as the daemon never
does (``engine.unplaced``, the one function both use): an answer in the journal's own words --
here a call whose idempotency binding someone deleted (JOURNAL_UNREADABLE) -- says ``the
journal`` for the file's path, and for a PostgreSQL journal's URL (its host, port, database
and user; its password above all).  The server runs in the config owner's process, but its
caller is an agent."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import trio

from tests.broker.helpers import TOKEN_ENV, http_target
from tests.broker.test_journal_away_mid_call import journal_table
from tests.daemon.kit import client_env, write_daemon_config
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster

from .conftest import Remotes
from .kit import Connected, connected, structured

PAY = {"target": "pay", "method": "POST", "path": "/p", "body": "1", "idempotency_key": "k9"}
WORDS = "the call ended without an envelope: the journal: "


async def _unbound_call(mcp: Connected, action: dict[str, Any], unbind: Any) -> str:
    """Call ``action`` once, delete its binding (``unbind``), call it again: everything the
    second answer shows its caller (text and structured content), checked for its code."""
    first = await mcp.call("http_request", action)
    assert first.is_error is False, structured(first)
    unbind()
    again = await mcp.call("http_request", action)
    answer = structured(again)
    assert again.is_error is True, answer
    assert answer.get("api_error", {}).get("code") == "JOURNAL_UNREADABLE", answer
    assert answer["api_error"]["message"].startswith(WORDS), answer
    return json.dumps(answer) + "".join(c.text for c in again.content if hasattr(c, "text"))


async def test_an_embedded_answer_does_not_name_the_journal_file(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    cfg = remotes.config(tmp_path)
    journal = tmp_path / "journal.db"

    def unbind() -> None:
        conn = sqlite3.connect(journal, isolation_level=None)
        try:
            conn.execute("DELETE FROM idempotency WHERE key = 'k9'")
        finally:
            conn.close()

    async with connected(["--config", str(cfg)], remotes.env(token), tmp_path / "mcp.log") as mcp:
        shown = await _unbound_call(mcp, PAY, unbind)
    assert str(tmp_path) not in shown and "journal.db" not in shown, shown
    # The operator's log (stderr) is not the caller's: it may name it.
    assert "Traceback" not in (tmp_path / "mcp.log").read_text()


async def test_an_embedded_answer_does_not_name_the_journal_database(
    tmp_path: Path, pg: Cluster, pg_url: str, token: str
) -> None:
    """A PostgreSQL journal's event row altered in place (by its superuser) after another
    broker on the same journal wrote it (``affidavit call``): ``get_record`` answers
    JOURNAL_UNREADABLE in the journal's own words, which name the database."""
    url = urlsplit(pg_url)
    database = url.path.lstrip("/")
    assert url.password, pg_url  # the canary
    env = {**client_env(), TOKEN_ENV: token}
    async with HostileServer.running(scripts.serve(Reply(201))) as srv:
        cfg = write_daemon_config(
            tmp_path,
            {"api": http_target(srv.url)},
            socket=tmp_path / "unused.sock",
            journal=journal_table(tmp_path, pg_url),
        )
        action = b'{"target": "api", "method": "GET", "path": "/"}'
        called = []
        for _ in range(2):  # the second keeps the journal's tail intact, so it opens
            done = await trio.run_process(
                [sys.executable, "-m", "affidavit", "call", "--config", str(cfg), "-"],
                stdin=action,
                capture_stdout=True,
                env=env,
            )
            called.append(json.loads(done.stdout)["invocation_id"])
        iid = called[0]
        pg.sql("ALTER TABLE events DISABLE TRIGGER events_no_change", database)
        pg.sql("UPDATE events SET attrs = '{}' WHERE invocation_id = %s", database, (iid,))
        async with connected(["--config", str(cfg)], env, tmp_path / "mcp.log") as mcp:
            again = await mcp.call("get_record", {"invocation_id": iid})
    answer = structured(again)
    assert again.is_error is True, answer
    assert answer.get("api_error", {}).get("code") == "JOURNAL_UNREADABLE", answer
    assert "the journal" in answer["api_error"]["message"], answer
    shown = json.dumps(answer) + "".join(getattr(c, "text", "") for c in again.content)
    for part in (url.password, f"{url.hostname}:{url.port}", database, "postgresql://"):
        assert part not in shown, (part, shown)
    assert token not in shown


def test_the_url_as_configured_goes_too_password_and_all() -> None:
    """Not only the URL as the journal's words name it (without its password): a message
    quoting the configured URL whole (a driver's own words) loses it too -- in the journal's
    answers only; another echoes the caller's text as sent (tests/daemon/
    test_no_location_oracle.py)."""
    from affidavit.engine import unplaced

    url = "postgresql://broker:canary-pw@db.internal:5433/affidavit"
    said = f"cannot connect to {url}: refused; journal {url}: gone"
    out = unplaced("JOURNAL_UNREADABLE", said, url)
    assert "canary-pw" not in out and "db.internal" not in out, out
    assert out == "cannot connect to the journal: refused; the journal: gone", out
    assert unplaced("NO_SUCH_INVOCATION", said, url) == said


async def test_an_embedded_guess_is_no_oracle_when_the_journal_declines_the_read(
    tmp_path: Path, remotes: Remotes, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As through the daemon (tests/daemon/test_no_location_oracle.py): the journal's words
    about a declined read quote the id the caller sent, and taking the journal's file out of
    them took it out of a right guess sent as the id -- ``the journal`` back when right, the
    guess as sent when wrong."""
    from affidavit.mcp.backends import Embedded, Exchange
    from tests.journal.helpers import decline_every_record

    from .kit import WAIT

    monkeypatch.setenv(TOKEN_ENV, token)
    right = str(tmp_path / "journal.db")
    said: dict[tuple[str, str], str] = {}
    with trio.fail_after(WAIT):
        async with Embedded.open(str(remotes.config(tmp_path))) as backend:
            assert str(backend.broker.config.journal.location) == right
            decline_every_record(monkeypatch)
            for guess in (right, right + "x", "journal " + right, "journal " + right + "x"):
                for tool in ("record", "fetch_result"):
                    if tool == "record":
                        answer = await backend.record(guess)
                    else:
                        answer = await backend.fetch_result(guess, 0, None, Exchange())
                    error = answer["api_error"]
                    assert error["code"] == "JOURNAL_READ_DECLINED", answer
                    said[guess, tool] = error["message"].replace(guess, "<GUESS>")
    for tool in ("record", "fetch_result"):
        for guess in (right, "journal " + right):
            assert said[guess, tool] == said[guess + "x", tool], said
            assert "<GUESS>" in said[guess, tool], said


def test_a_quoted_guess_of_a_name_comes_back_as_sent_right_or_wrong() -> None:
    """The driver's quoted names (``database "x"``, ``user "y"``) are taken out of the
    journal's words; a caller's id holding a quote (no id the broker gives does) is echoed
    as sent whether it guessed a name right or wrong, never taken out with it."""
    from affidavit.engine import unplaced

    url = "postgresql://broker:canary-pw@db.internal:5433/affidavit"

    def said(guess: str) -> str:
        words = f"journal postgresql://broker@db.internal:5433/affidavit: the record of {guess}"
        message = unplaced("JOURNAL_READ_DECLINED", words + " cannot be read", url, (guess,))
        return message.replace(guess, "<GUESS>")

    for name in ("affidavit", "broker", "db.internal"):
        assert said(f'"{name}"') == said(f'"{name}x"'), said(f'"{name}"')
    driver = 'connection to server at "db.internal" (10.9.8.7), port 5433 failed: FATAL:  role '
    driver += '"broker"'
    out = unplaced("JOURNAL_UNREADABLE", driver, url)
    assert out == "connection to the journal's server failed: FATAL:  role (the journal's)", out
