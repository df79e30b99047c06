"""A daemon's stop has a bound even when a journal write never returns
(``affidavit.stopping.bound``): a disk that stopped answering holds the writer thread in its
transaction, every call waits for its write uncancellably, and the journal's close waits for
them -- the stop waited for ever.

The hang is real, in a real ``affidavit serve`` process: the writer thread's transaction that
carries a DISPATCH_STARTED holds for ever once its rows are inserted, before its COMMIT
(``HOLD``: ``journal.writer.attempts`` wrapped to set ``before_commit`` for that batch, as a
``-c`` script around ``affidavit.cli.main``), so the process ends inside the transaction.
SIGTERM: the process is gone within ``stop_bound`` (the grace, the stopped calls' recording,
their answers, the close) and not before, exit 74 (``EXIT_STOP_UNFINISHED``), one log line
naming the write that was pending.  Nothing claims more than the journal holds: the caller got
no envelope (its connection closed unanswered), the remote got no request (the request leaves
only once DISPATCH_STARTED is durable), and the daemon started again on the same socket and
journal finds a journal that verifies and closes the record as what its events prove -- not
dispatched.  The processes whose stop runs out of its bound have its fixed phases shortened
(``QUICK``): the bound is the same sum, of smaller parts, pinned by its exact number written
out.  ``QUICK`` is the head of a ``-c`` script and must run before anything imports the phases
(``affidavit.cli`` and what it imports): a module that took ``RECORD_WAIT`` and the rest by name
(``from ... import``) before the patch would keep the long ones."""

from __future__ import annotations

import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import trio

from affidavit.api.client import Client
from affidavit.api.wire import AnswerLost, ClientError, DaemonUnavailable
from affidavit.daemon.server import ANSWER_WAIT
from affidavit.journal import JournalReader
from affidavit.statemachine import EventKind
from affidavit.stopping.bound import EXIT_STOP_UNFINISHED, stop_bound
from tests.http.hostile import HostileServer, Peer, Reply, scripts
from tests.postgres import Cluster, Proxy

from .kit import (
    HUNG,
    Run,
    action,
    action_bytes,
    api_target,
    client_env,
    launch,
    run,
    start_daemon,
    stop,
    wait_until,
    write_daemon_config,
)

QUICK_WAITS = {"RECORD_WAIT": 1.25, "ANSWER_WAIT": 1.0, "CLOSE_WAIT": 1.5}
"""The stop's fixed phases (``affidavit.stopping.bound``), shortened in the processes whose
stop runs out of its bound (``QUICK``): a bound of 4.25 s (7.75 s embedded) proves what one of
15.5 s did.  ``RECORD_WAIT`` stays at least ``ANSWER_WAIT`` (as ``bound`` asserts) and differs
from it, so a bound that took one for the other is off by 0.25 s (the embedded stop's, whose
third phase is ``LOOP_WAIT``); ``CLOSE_WAIT`` over the shared journals' ``reconnect`` of 1 s
(``_through``)."""
QUICK_LOOP_WAIT = 4.5
"""``affidavit.mcp.stop.LOOP_WAIT`` so shortened (the late loop's test needs its slack)."""
QUICK = f"""
from affidavit.stopping import bound
for name, seconds in {QUICK_WAITS!r}.items():  # before any module imports them by name
    setattr(bound, name, seconds)
from affidavit.mcp import stop
stop.LOOP_WAIT = {QUICK_LOOP_WAIT!r}
"""
"""A ``-c`` script's head: the phases shortened, then the real command (``SERVE``, ``HOLD``)."""
SERVE = f"""{QUICK}
import sys
from affidavit.cli import main
sys.exit(main(["serve", "--config", sys.argv[1]]))
"""


GRACE = 0.5
BOUND = 4.25
"""The line's exact number, written out (not computed by the ``stop_bound`` under test): the
grace 0.5 + the recording ``max(grace, RECORD_WAIT)`` 1.25 + ``ANSWER_WAIT`` 1.0 +
``CLOSE_WAIT`` 1.5 (``QUICK``'s phases)."""
MARGIN = 20.0
"""Beyond the bound: a loaded machine's time to notice the exit (a ceiling, not a measure)."""
EARLY = 0.5
"""Under the bound: the watchdog's timer and ours started apart (a floor, not a measure)."""
SLOW = 2.5
"""Seconds the slow stop's remote takes to answer: most of its call's grace."""
QUIET = 1.0
"""Seconds a frozen database is left alone before the read, to tell its packets apart."""
HELD = "test hook: a DISPATCH_STARTED write holds"

HOLD = f"""{QUICK}
import sys, threading
from affidavit.journal import writer

real = writer.attempts

def kinds(batch):
    for r in batch:
        if r.about is not None:
            yield r.about[1]
        elif r.op is None and r.args:
            yield from (row[0].kind.value for row in (r.args if r.many else (r.args,)))

def holding(w):
    def hold(_batch):
        print({HELD!r}, "in a transaction:", w.conn.in_transaction, file=sys.stderr, flush=True)
        threading.Event().wait()  # for ever: a disk that stopped answering
    return hold

def attempts(w, batch, barrier):
    # Held inside the transaction: its rows inserted, its COMMIT not sent.
    w.before_commit = holding(w) if "DISPATCH_STARTED" in set(kinds(batch)) else None
    return real(w, batch, barrier)

writer.attempts = attempts
from affidavit.cli import main
sys.exit(main(["serve", "--config", sys.argv[1]]))
"""


async def test_a_stop_held_by_a_hung_journal_write_ends_within_its_bound(
    tmp_path: Path, token: str
) -> None:
    socket = tmp_path / "affidavit.sock"
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        config = write_daemon_config(
            tmp_path, api_target(srv.url), socket=socket, service={"shutdown_grace": GRACE}
        )
        held = await start_daemon(
            config,
            socket,
            tmp_path / "held.log",
            token,
            command=[sys.executable, "-c", HOLD, str(config)],
        )
        answered: list[Run] = []
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_call, socket, answered)
                await wait_until(lambda: HELD in held.log_text(), "the held write", watch=[held])
                signalled = time.monotonic()
                held.signal(signal.SIGTERM)
                status = await held.wait(BOUND + MARGIN)
                elapsed = time.monotonic() - signalled
        finally:
            if held.proc.poll() is None:  # it outlived its bound: the test fails, not hangs
                held.proc.kill()
                held.proc.wait(timeout=HUNG)
        log = held.log_text()
        assert status == EXIT_STOP_UNFINISHED, log
        assert f"{HELD} in a transaction: True" in log  # the process ends inside it
        assert BOUND - EARLY <= elapsed <= BOUND + MARGIN, (elapsed, BOUND)
        pending = re.search(r"stop unfinished after ([\d.]+)s: journal writes unanswered: .*", log)
        assert pending is not None, log
        assert float(pending.group(1)) == BOUND
        assert f"exiting {EXIT_STOP_UNFINISHED} without closing the journal" in pending.group(0)
        iid = re.search(r"\((\S+) DISPATCH_STARTED", pending.group(0))
        assert iid is not None, pending.group(0)
        assert token not in log
        # Nothing was answered as if it were durable, and nothing was sent.
        (caller,) = answered
        _lost(caller)
        assert srv.requests == []

        # The next start on the same socket and journal: the locks went with the process.
        after = await start_daemon(config, socket, tmp_path / "after.log", token)
        stop(after)
    assert after.proc.returncode == 0, after.log_text()
    assert iid.group(1) in after.log_text()  # closed by the start-up recovery
    with JournalReader.open(str(after.journal)) as reader:
        assert reader.verify().ok
        kinds = [e.kind for e in reader.events(iid.group(1))]
        rec = reader.record(iid.group(1))
    assert EventKind.DISPATCH_STARTED not in kinds
    assert EventKind.RESULT_DELIVERED not in kinds
    assert rec is not None and rec.final and rec.outcome.value == "not_attempted", rec


async def test_a_stop_held_by_a_database_that_never_answers_ends_within_its_bound(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    """A shared journal whose PostgreSQL takes every packet and never answers (``Proxy.freeze``:
    a stopped server, whose kernel still acknowledges -- no keepalive notices) while a call
    dispatched waits for its remote: the grace runs out, the call's stop writes where it stood
    and that write never returns.  The daemon exits 74 within the bound (its ``reconnect`` of
    1 s under ``CLOSE_WAIT``); restarted once the database answers again, the record still
    says dispatched and nothing more -- no result, no delivery, the remote asked once."""
    proxy = Proxy(pg.port)
    socket = tmp_path / "affidavit.sock"
    journal = _through(proxy, pg, pg_url, tmp_path)
    try:
        async with HostileServer.running(scripts.held(Reply(200, body=b"ok"))) as srv:
            config = write_daemon_config(
                tmp_path,
                api_target(srv.url),
                socket=socket,
                service={"shutdown_grace": GRACE},
                journal=journal,
            )
            held = await start_daemon(
                config, socket, tmp_path / "held.log", token, command=_quick(config)
            )
            answered: list[Run] = []
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_call, socket, answered)
                    with trio.fail_after(HUNG):
                        await srv.event("received").wait()  # dispatched: DISPATCH_STARTED durable
                    proxy.freeze()
                    signalled = time.monotonic()
                    held.signal(signal.SIGTERM)
                    status = await held.wait(BOUND + MARGIN)
                    elapsed = time.monotonic() - signalled
            finally:
                if held.proc.poll() is None:
                    held.proc.kill()
                    held.proc.wait(timeout=HUNG)
            log = held.log_text()
            assert status == EXIT_STOP_UNFINISHED, log
            assert BOUND - EARLY <= elapsed <= BOUND + MARGIN, (elapsed, BOUND)
            (caller,) = answered
            _lost(caller)
            pending = re.search(r"stop unfinished after ([\d.]+)s: .*", log)
            assert pending is not None, log
            assert float(pending.group(1)) == BOUND  # (reconnect 1 s < CLOSE_WAIT)
            iid = re.search(r"calls still running: 1 \((\S+)\)", pending.group(0))
            assert iid is not None, pending.group(0)
            assert f"({iid.group(1)} " in pending.group(0)  # its write, named
            assert token not in log
            proxy.thaw()
            after = await start_daemon(config, socket, tmp_path / "after.log", token)
            try:
                async with Client.open(socket) as client:
                    kinds = [e["kind"] for e in await client.events(iid.group(1))]
            finally:
                stop(after)
            assert after.proc.returncode == 0, after.log_text()
            assert len(srv.requests) == 1
    finally:
        proxy.close()
    assert "DISPATCH_STARTED" in kinds, kinds
    assert not {"RESULT_COMMITTED", "RESULT_DELIVERED"} & set(kinds), kinds


async def test_sigterm_while_the_loop_waits_for_a_database_read_ends_within_its_bound(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    """The event loop itself is held: a result read runs on it (``Engine.fetch_result``:
    ``recorder.read(journal.record)``), sent to a PostgreSQL that takes the packets and never
    answers, so trio never runs again -- and a signal receiver that is one of its tasks never
    hears SIGTERM.  The daemon's own signal thread (``stopping.signals``) takes it and starts the
    bound: exit 74 within it, not before, and the loop never got to the stop (no "received
    SIGTERM" line: that is logged on the loop).  The reader's wait is unanswered, not refused."""
    proxy = Proxy(pg.port)
    socket = tmp_path / "affidavit.sock"
    bound = BOUND  # its ``reconnect`` of 1 s is under ``CLOSE_WAIT``
    try:
        async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
            config = write_daemon_config(
                tmp_path,
                api_target(srv.url),
                socket=socket,
                service={"shutdown_grace": GRACE},
                journal=_through(proxy, pg, pg_url, tmp_path),
            )
            held = await start_daemon(
                config, socket, tmp_path / "held.log", token, command=_quick(config)
            )
            read: list[BaseException] = []
            try:
                async with Client.open(socket) as client:
                    iid = (await client.call(action()))["invocation_id"]
                    await wait_until(lambda: _delivered(client, iid), "the delivery recorded")
                    proxy.freeze()
                    await trio.sleep(QUIET)
                    before = proxy.swallowed  # (the daemon's own upkeep, if any)
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(_read, client, iid, read)
                        await wait_until(lambda: proxy.swallowed > before, "the read sent")
                        signalled = time.monotonic()
                        held.signal(signal.SIGTERM)
                        status = await held.wait(bound + MARGIN)
                        elapsed = time.monotonic() - signalled
            finally:
                if held.proc.poll() is None:
                    held.proc.kill()
                    held.proc.wait(timeout=HUNG)
    finally:
        proxy.close()
    log = held.log_text()
    assert status == EXIT_STOP_UNFINISHED, log
    assert bound - EARLY <= elapsed <= bound + MARGIN, (elapsed, bound)
    assert "received SIGTERM" not in log, log  # the loop was held: the thread stopped it
    pending = re.search(r"CRITICAL stop unfinished after ([\d.]+)s: .*", log)
    assert pending is not None, log
    assert float(pending.group(1)) == bound
    assert "the journal last finished a transaction " in pending.group(0)
    assert token not in log
    # No answer at all: its connection closed with the process -- seen as the connection
    # reset (AnswerLost) or, when the client's one retry of a read ran after the exit, as no
    # daemon; which of the two is a race with the kernel's teardown (1 run in ~5 saw a reset).
    (lost,) = read
    assert isinstance(lost, (AnswerLost, DaemonUnavailable)), repr(lost)
    assert len(srv.requests) == 1


async def _delivered(client: Client, iid: str) -> bool:
    return "RESULT_DELIVERED" in {e["kind"] for e in await client.events(iid)}


async def _read(client: Client, iid: str, read: list[BaseException]) -> None:
    try:
        await client.fetch_result(iid)
    except ClientError as exc:
        read.append(exc)


def _through(proxy: Proxy, pg: Cluster, pg_url: str, tmp_path: Path) -> dict[str, Any]:
    """A shared journal reached through ``proxy`` (``reconnect`` 1 s: under ``CLOSE_WAIT``)."""
    return {
        "url": proxy.url(pg, pg_url),
        "key_file": str(tmp_path / "shared.key"),
        "signing_key": str(tmp_path / "signing.key"),
        "reconnect": 1,
    }


async def test_a_slow_stop_of_a_healthy_journal_exits_0_with_nothing_critical(
    tmp_path: Path, token: str
) -> None:
    """The bound ends only stops that cannot end: a call that uses most of its grace (its
    remote answers after ``SLOW`` s) and a journal that answers -- the call's answer goes out,
    the watchdog is disarmed once the journal is closed, exit 0, no CRITICAL line."""
    socket = tmp_path / "affidavit.sock"
    grace = SLOW + 1.0

    async def slow(peer: Peer) -> None:
        if await peer.read_request() is not None:
            peer.server.event("received").set()
            await trio.sleep(SLOW)
            await peer.respond(Reply(200, body=b"done"))

    async with HostileServer.running(slow) as srv:
        config = write_daemon_config(
            tmp_path, api_target(srv.url), socket=socket, service={"shutdown_grace": grace}
        )
        daemon = await start_daemon(config, socket, tmp_path / "daemon.log", token)
        answered: list[Run] = []
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_call, socket, answered)
                with trio.fail_after(HUNG):
                    await srv.event("received").wait()
                signalled = time.monotonic()
                daemon.signal(signal.SIGTERM)
                status = await daemon.wait(stop_bound(grace, ANSWER_WAIT, None) + MARGIN)
                elapsed = time.monotonic() - signalled
        finally:
            if daemon.proc.poll() is None:
                daemon.proc.kill()
                daemon.proc.wait(timeout=HUNG)
    log = daemon.log_text()
    assert status == 0, log
    assert elapsed >= SLOW - EARLY  # it waited for the call
    assert "CRITICAL" not in log and "stop unfinished" not in log, log
    assert "grace ran out" not in log
    (caller,) = answered
    assert caller.returncode == 0, caller
    assert caller.json()["result"]["body"] == "done"


RECOVERING = "test hook: start-up recovery holds"

SLOW_RECOVERY = f"""
import sys, trio
from affidavit.api.broker import Broker

async def recover(self):
    print({RECOVERING!r}, file=sys.stderr, flush=True)
    await trio.sleep_forever()  # a long start-up recovery

Broker.recover = recover
from affidavit.cli import main
sys.exit(main(["serve", "--config", sys.argv[1]]))
"""


async def test_a_signal_during_the_start_up_ends_it_with_the_journal_closed(
    tmp_path: Path, token: str
) -> None:
    """SIGTERM while the start-up recovery runs (the socket not bound yet): the start-up is
    cancelled, the journal closed, exit 0 -- within the stop's bound, armed by the signal's
    thread.  (Before, the signal's default action ended the process mid-recovery.)"""
    socket = tmp_path / "affidavit.sock"
    config = write_daemon_config(
        tmp_path, api_target("http://127.0.0.1:9"), socket=socket, service={"shutdown_grace": GRACE}
    )
    starting = launch(
        config,
        socket,
        tmp_path / "starting.log",
        token,
        command=[sys.executable, "-c", SLOW_RECOVERY, str(config)],
    )
    try:
        await wait_until(
            lambda: RECOVERING in starting.log_text(),
            "the recovery",
            timeout=HUNG,
            watch=[starting],
        )
        starting.signal(signal.SIGTERM)
        status = await starting.wait(BOUND + MARGIN)
    finally:
        if starting.proc.poll() is None:
            starting.proc.kill()
            starting.proc.wait(timeout=HUNG)
    log = starting.log_text()
    assert status == 0, log
    assert "received SIGTERM" in log and "stopped" in log
    assert "CRITICAL" not in log
    assert not socket.exists()
    after = await start_daemon(config, socket, tmp_path / "after.log", token)
    stop(after)
    assert after.proc.returncode == 0, after.log_text()


def _quick(config: Path) -> list[str]:
    """``affidavit serve --config CONFIG`` with the stop's phases shortened (``QUICK``)."""
    return [sys.executable, "-c", SERVE, str(config)]


def _lost(caller: Run) -> None:
    """The caller got no envelope at all: the daemon closed its connection unanswered, which
    ``affidavit call`` says with the client's code for it (``ANSWER_LOST``), exit 2."""
    assert caller.returncode == 2, caller
    assert caller.stdout == b"", caller.stdout
    assert caller.stderr.startswith(b"affidavit: ANSWER_LOST: "), caller.stderr


async def _call(socket: Path, answered: list[Run]) -> None:
    """``affidavit call`` of the test's one action through the daemon; what it said, kept."""
    argv = [sys.executable, "-m", "affidavit", "call", "-", "--socket", str(socket)]
    answered.append(await run(argv, stdin=action_bytes(), env=client_env()))
