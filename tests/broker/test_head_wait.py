"""A call on a shared PostgreSQL journal whose chain head another session holds -- as a broker's
lost session does, its COMMIT never arriving, until the server ends it.  The call's writes wait
for the head no longer than ``[journal] reconnect`` (``journal/commit.py``); unbounded, the
call waited for as long as the head was held.  Its DISPATCH_STARTED not written, nothing is
sent, and the answer says what the durable record proves: not attempted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from affidavit.engine.recovery import call_failure
from affidavit.journal import JournalWriteError
from affidavit.journal.postgres import _LOCK
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster

from .helpers import http_target, open_broker, pg_journal, write_config

WITHIN = 1.0  # seconds: [journal] reconnect
UNBOUNDED = WITHIN * 3 + 10
"""When the head is freed: a call whose waits were unbounded took this long; a bounded one
(two waits of ``WITHIN``) takes ~2 s, and the bound, 4 s short of this, leaves a loaded
machine room (it was 2 s short of ``WITHIN * 3 + 4``)."""
POST = {"target": "api", "method": "POST", "path": "/charge", "body": "{}"}


async def test_a_held_chain_head_refuses_the_dispatch_within_reconnect(
    tmp_path: Path, pg_url: str, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = pg_journal(tmp_path, pg_url, reconnect=WITHIN)
    async with HostileServer.running(scripts.serve(Reply(201, body=b"{}"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)}, journal=journal)
        with psycopg.connect(pg_url, autocommit=True) as other:
            async with open_broker(cfg) as broker:
                real_append = broker.journal.append

                async def append(event: Event, **kw: Any) -> Any:
                    if event.kind is E.DISPATCH_STARTED:  # another session takes the head
                        other.execute("BEGIN")
                        other.execute(
                            "SELECT pg_advisory_xact_lock(%s, hashtext(current_schema()))",
                            (_LOCK,),
                        )
                    return await real_append(event, **kw)

                monkeypatch.setattr(broker.journal, "append", append)

                async def release_later() -> None:
                    # Unbounded, the call waited (uncancellable) for the head: free it well
                    # after the bound, so the test ends either way.
                    await trio.sleep(UNBOUNDED)
                    other.execute("ROLLBACK")

                env: dict[str, Any] | None = None
                refused: JournalWriteError | None = None
                started = trio.current_time()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(release_later)
                    try:
                        env = await broker.call(POST)
                    except JournalWriteError as exc:
                        refused = exc
                    elapsed = trio.current_time() - started
                    nursery.cancel_scope.cancel()
                other.execute("ROLLBACK")
                kinds = [k for (k,) in other.execute("SELECT kind FROM events").fetchall()]
    # The gate's wait and the closing event's: each bounded by reconnect.
    assert elapsed < UNBOUNDED - 4, elapsed
    assert srv.requests == [] and "DISPATCH_STARTED" not in kinds, kinds
    if env is None:
        # The preamble rode in DISPATCH_STARTED's transaction (posted events): nothing of the
        # call is durable, and that is said (the daemon's 503 JOURNAL_UNAVAILABLE).
        said = str(refused)
        assert "another session held the journal's chain head" in said, said
        assert f"[journal] reconnect lets a write wait for it ({WITHIN:g} s)" in said, said
        assert "ACTION_ACCEPTED" not in kinds, kinds
    else:
        err = env["error"]
        assert (err["phase"], err["outcome"]) == ("connection_setup", "not_attempted"), env
        # The journal stopped the call, and the answer says so (not a transport failure).
        assert err["message"].startswith("The journal could not record"), err


async def test_a_call_refused_for_a_held_head_never_names_its_holder(
    tmp_path: Path,
    pg: Cluster,
    pg_url: str,
    token: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A login role granted nothing holds the chain head (audit 51c S2): the call is refused
    after ``reconnect``, and what its caller is told -- the envelope, or every surface's answer
    to a call with none (``call_failure``) -- never names the holder: the refusal's ``held by
    pid N, role R`` (``journal/postgres.py`` ``_holder``) is the operator's, not a caller's."""
    database = pg_url.rsplit("/", 1)[1]
    nobody = f"{database}_nobody"
    pg.sql(f"CREATE ROLE {nobody} LOGIN PASSWORD 'nobody-pw'")
    journal = pg_journal(tmp_path, pg_url, reconnect=WITHIN)
    async with HostileServer.running(scripts.serve(Reply(201, body=b"{}"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)}, journal=journal)
        url = pg.url(database, user=nobody, password="nobody-pw")
        with psycopg.connect(url, autocommit=True) as other:
            pid = other.info.backend_pid
            async with open_broker(cfg) as broker:
                real_append = broker.journal.append

                async def append(event: Event, **kw: Any) -> Any:
                    if event.kind is E.DISPATCH_STARTED:  # the role takes the head, and keeps it
                        other.execute("SELECT pg_advisory_lock(%s, hashtext('public'))", (_LOCK,))
                    return await real_append(event, **kw)

                monkeypatch.setattr(broker.journal, "append", append)
                answer = ""
                with trio.fail_after(UNBOUNDED):
                    try:
                        answer = json.dumps(await broker.call(POST))
                    except JournalWriteError as exc:
                        answer = json.dumps(call_failure(exc, None))
    assert srv.requests == []
    assert answer, answer
    for shown in ("held by", f"pid {pid}", nobody):
        assert shown not in answer, (shown, answer)
