"""``affidavit mcp`` run embedded opens its journal itself, so its stop is bounded as the
daemon's is (``affidavit.mcp.stop``): a journal that never answers cannot hold it for ever.

Real ``affidavit mcp`` processes spoken to in raw JSON-RPC lines, with a short grace (from
``--shutdown-grace``, or from the config alone).  A journal write that never returns (the
daemon test's hook, in a ``-c`` script around ``affidavit.cli.main``: the writer's transaction
carrying DISPATCH_STARTED holds before its COMMIT), then SIGTERM or the client gone: exit 74
within ``stop_bound`` and not before, one line naming the write and the call.  A PostgreSQL
that takes every packet and never answers (``Proxy.freeze``) while the loop itself waits in a
result read: trio's receiver, a task on that loop, would never hear SIGTERM; the process's own
signal thread does.  Each bound is pinned by its exact number in the line, so a grace or a
``reconnect`` (3 s: over ``CLOSE_WAIT``) the bound failed to count fails the test.  A healthy
stop, by SIGTERM or SIGINT: the call's answer goes out, exit 0, nothing critical.  The
processes whose stop runs out of its bound have its fixed phases shortened (``QUICK``): the
bound is the same sum, of smaller parts."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.mcp import run
from affidavit.mcp.stop import LOOP_WAIT
from affidavit.mcp.transport import StdioTransport
from affidavit.stopping.bound import EXIT_STOP_UNFINISHED, stop_bound
from tests.broker.helpers import http_target, write_config
from tests.daemon.kit import wait_until
from tests.daemon.test_stop_bound_parts import (
    _no_watchdog_thread,
    serve_s_signals,  # noqa: F401 (a fixture)
)
from tests.daemon.test_stop_bounded import (
    HELD,
    HOLD,
    QUICK,
    QUICK_WAITS,
    _through,
)
from tests.http.hostile import HostileServer, Peer, Reply
from tests.postgres import Cluster, Proxy

from .conftest import Remotes
from .kit import PYTHON, WAIT
from .test_protocol import FAST, INIT, Raw, call

GRACE = 0.5
BOUND = 7.75
"""The embedded stop's exact number, written out (not computed by the ``stop_bound`` under
test): the grace 0.5 + the recording ``max(grace, RECORD_WAIT)`` 1.25 + the loop's slack
``LOOP_WAIT`` 4.5 (``affidavit.mcp.stop``; no answer wait) + ``CLOSE_WAIT`` 1.5, as shortened by
``QUICK`` in the processes whose stop runs out of its bound."""
RECONNECT_BOUND = 9.25
"""``BOUND`` with a shared journal's ``reconnect`` of 3 s in place of ``CLOSE_WAIT``'s 1.5 s."""
START = 60.0
"""Seconds a process may take to start (a ceiling, not a measure: a loaded machine's)."""
EARLY = 0.5
"""Under the bound: the watchdog's timer and ours started apart (a floor, not a measure)."""
MARGIN = 20.0
"""Beyond the bound: a loaded machine's time to notice the exit (a ceiling, not a measure)."""
SLOW = 1.5
"""Seconds the healthy stop's remote takes to answer, within its grace."""
RECONNECT = 3.0
"""A shared journal's ``[journal] reconnect``: over ``CLOSE_WAIT`` (``QUICK``'s), so the bound
counts it."""
assert QUICK_WAITS["CLOSE_WAIT"] < RECONNECT
HOLD_MCP = HOLD.replace('["serve", "--config", sys.argv[1]]', '["mcp", *sys.argv[1:]]')
MCP = f"""{QUICK}
import sys
from affidavit.cli import main
sys.exit(main(["mcp", *sys.argv[1:]]))
"""
"""``affidavit mcp ARGS`` with the stop's phases shortened (``QUICK``)."""


@asynccontextmanager
async def started(
    argv: list[str], env: dict[str, str], log: Path, initialize: bool = True
) -> AsyncIterator[Raw]:
    """A real ``affidavit mcp`` process, initialized (unless not ``initialize``); killed at the
    end if still running (the test then fails on its status, never hangs)."""
    with log.open("ab") as errlog:
        proc = await trio.lowlevel.open_process(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errlog, env=env
        )
    raw = Raw(proc, log)
    try:
        if initialize:
            await raw.send(INIT)
            await raw.answer(0)
            await raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        yield raw
    finally:
        if proc.returncode is None:
            proc.kill()
        with trio.move_on_after(WAIT, shield=True):
            await proc.wait()


async def exit_within(raw: Raw, bound: float) -> tuple[int, float]:
    """The exit status and the seconds from now to the exit (at most ``bound + MARGIN``)."""
    started_at = time.monotonic()
    with trio.fail_after(bound + MARGIN):
        status = await raw.proc.wait()
    return status, time.monotonic() - started_at


def unfinished(log: str, bound: float) -> str:
    """The bound's one line, checked for what every such line says."""
    found = re.search(r"CRITICAL stop unfinished after ([\d.]+)s: .*", log)
    assert found is not None, log
    assert float(found.group(1)) == bound, found.group(0)
    assert f"exiting {EXIT_STOP_UNFINISHED} without closing the journal" in found.group(0)
    return found.group(0)


@pytest.mark.parametrize(
    ("ending", "grace_from"),
    [("SIGTERM", "--shutdown-grace"), ("end of input", "--shutdown-grace"), ("SIGTERM", "config")],
)
async def test_a_stop_held_by_a_hung_journal_write_exits_74_within_its_bound(
    tmp_path: Path, remotes: Remotes, token: str, ending: str, grace_from: str
) -> None:
    """The call's DISPATCH_STARTED write never returns: the call waits for it uncancellably,
    and the journal's close waits for it.  Whatever ended the session -- a signal, or the
    client gone -- the process is gone within the bound, exit 74, the write and the call named;
    the remote was asked nothing (the request leaves only once DISPATCH_STARTED is durable).
    The bound counts the grace the command line gives, else the config's ``[service]
    shutdown_grace`` (its exact number in the line)."""
    cfg = write_config(tmp_path, remotes.targets())
    argv = [PYTHON, "-c", HOLD_MCP, "--config", str(cfg)]
    if grace_from == "config":
        cfg.write_text(cfg.read_text() + f"[service]\nshutdown_grace = {GRACE}\n")
    else:
        argv += ["--shutdown-grace", str(GRACE)]
    async with started(argv, remotes.env(token), tmp_path / "mcp.log") as raw:
        await raw.send(call(1, "http_request", FAST))
        await wait_until(lambda: HELD in raw.stderr(), "the held write")
        if ending == "SIGTERM":
            raw.proc.send_signal(signal.SIGTERM)
        else:
            await raw.proc.stdin.aclose()  # type: ignore[union-attr]
        status, elapsed = await exit_within(raw, BOUND)
    log = raw.stderr()
    assert status == EXIT_STOP_UNFINISHED, log
    assert elapsed >= BOUND - EARLY, (elapsed, BOUND)
    line = unfinished(log, BOUND)
    iid = re.search(r"journal writes unanswered: 1 \((\S+) DISPATCH_STARTED\)", line)
    assert iid is not None, line
    assert f"calls still running: 1 ({iid.group(1)})" in line
    assert token not in log
    assert remotes.ok.requests == []


async def test_sigterm_while_the_loop_waits_for_a_database_read_exits_74_within_its_bound(
    tmp_path: Path, remotes: Remotes, token: str, pg: Cluster, pg_url: str
) -> None:
    """A shared journal whose PostgreSQL stops answering while a ``fetch_result`` reads it on
    the event loop: the loop never runs again, so the stop is not started there (no "signal
    15: stopping" line: that is logged on the loop) -- the process's signal thread arms the
    bound (its ``reconnect`` of 3 s over ``CLOSE_WAIT``, so counted: the line's exact number
    says it was), which ends it: exit 74."""
    proxy = Proxy(pg.port)
    bound = RECONNECT_BOUND
    try:
        journal = {**_through(proxy, pg, pg_url, tmp_path), "reconnect": RECONNECT}
        cfg = write_config(tmp_path, remotes.targets(), journal=journal)
        argv = [PYTHON, "-c", MCP, "--config", str(cfg), "--shutdown-grace", str(GRACE)]
        async with started(argv, remotes.env(token), tmp_path / "mcp.log") as raw:
            await raw.send(call(1, "http_request", FAST))
            answer: dict[str, Any] = (await raw.answer(1))["result"]["structuredContent"]
            iid = answer["invocation_id"]

            async def delivered() -> bool:
                await raw.send(call("r", "get_record", {"invocation_id": iid}))
                events = (await raw.answer("r"))["result"]["structuredContent"]["events"]
                return "RESULT_DELIVERED" in {e["kind"] for e in events}

            await wait_until(delivered, "the delivery recorded")
            proxy.freeze()
            before = proxy.swallowed
            await raw.send(call(2, "fetch_result", {"invocation_id": iid}))
            await wait_until(lambda: proxy.swallowed > before, "the read sent")
            raw.proc.send_signal(signal.SIGTERM)
            status, elapsed = await exit_within(raw, bound)
    finally:
        proxy.close()
    log = raw.stderr()
    assert status == EXIT_STOP_UNFINISHED, log
    assert bound - EARLY <= elapsed, (elapsed, bound)
    assert "signal 15: stopping" not in log, log  # the loop was held: the thread stopped it
    line = unfinished(log, bound)
    assert "the journal last finished a transaction " in line
    assert token not in log
    assert len(remotes.ok.requests) == 1


NO_WATCHDOG = """
import sys, threading

real_start = threading.Thread.start

def start(thread):  # the watchdog's thread never starts, as when no thread is left; others do
    if thread.name == "affidavit-stop-bound":
        raise RuntimeError("can't start new thread")
    real_start(thread)

threading.Thread.start = start
from affidavit.cli import main
sys.exit(main(["mcp", *sys.argv[1:]]))
"""
UNBOUNDED = "the stop's bound could not be armed (RuntimeError): the stop goes on unbounded"


@pytest.mark.parametrize(
    ("signum", "watchdog"),
    [(signal.SIGTERM, True), (signal.SIGINT, True), (signal.SIGTERM, False)],
    ids=["SIGTERM", "SIGINT", "SIGTERM-no-watchdog-thread"],
)
async def test_a_healthy_stop_by_a_signal_drains_its_call_and_exits_0(
    tmp_path: Path, token: str, remotes: Remotes, signum: signal.Signals, watchdog: bool
) -> None:
    """The bound ends only stops that cannot end: a call whose remote answers within the grace
    gets its answer out, the journal closes, the watchdog is disarmed -- exit 0, no CRITICAL
    line; SIGINT (Ctrl-C) as SIGTERM.  And when no thread can be started for the watchdog at
    all (a cgroup's ``pids.max``): neither the signal's thread nor the loop can arm the bound;
    the loop's failed arming is logged by its type and the stop goes on unbounded, the call
    given its grace (before: the RuntimeError left ``serve`` before its drain, the call
    cancelled unanswered, and the process ended in a traceback, exit 1)."""
    grace = SLOW + 2.0

    async def slow(peer: Peer) -> None:
        if await peer.read_request() is not None:
            peer.server.event("received").set()
            await trio.sleep(SLOW)
            await peer.respond(Reply(200, body=b"done"))

    async with HostileServer.running(slow) as srv:
        cfg = write_config(tmp_path, {"slow": http_target(srv.url)})
        argv = [PYTHON, "-m", "affidavit", "mcp"] if watchdog else [PYTHON, "-c", NO_WATCHDOG]
        argv += ["--config", str(cfg), "--shutdown-grace", str(grace)]
        async with started(argv, remotes.env(token), tmp_path / "mcp.log") as raw:
            await raw.send(
                call(1, "http_request", {"target": "slow", "method": "GET", "path": "/"})
            )
            with trio.fail_after(WAIT):
                await srv.event("received").wait()
            raw.proc.send_signal(signum)
            answer: dict[str, Any] = (await raw.answer(1))["result"]["structuredContent"]
            status, _ = await exit_within(raw, stop_bound(grace, LOOP_WAIT, None))
    log = raw.stderr()
    assert status == 0, log
    assert answer["result"]["body"] == "done", answer
    assert f"signal {int(signum)}: stopping (1 call(s) running)" in log
    assert "CRITICAL" not in log and "stop unfinished" not in log, log
    assert "grace ran out" not in log
    assert len(srv.requests) == 1
    if not watchdog:
        assert f"{signum.name}: the stop's bound could not be armed (RuntimeError)" in log
        assert UNBOUNDED in log, log


@pytest.mark.usefixtures("serve_s_signals")  # (should run take the process's signals)
async def test_run_called_in_process_leaves_the_signals_as_it_found_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``affidavit.mcp.run`` called by a program of its own (not ``affidavit mcp``, whose
    ``_cli`` is private), embedded: trio's receiver takes SIGTERM while it runs -- here in its
    start-up, which it ends -- no thread of ours, and once it returned the process's SIGTERM
    handler is the one it found (before: ``run`` took the process's signals, and a SIGTERM
    after it returned ran ``os._exit(0)`` in the caller)."""
    claiming = trio.Event()

    @asynccontextmanager
    async def held() -> AsyncIterator[None]:
        claiming.set()
        await trio.sleep_forever()  # stdio never claimed: the start-up goes on
        yield

    monkeypatch.setattr(StdioTransport, "claim", held)
    caplog.set_level(logging.INFO, "affidavit.mcp")
    cfg = write_config(tmp_path, {"ok": http_target("http://127.0.0.1:9")})
    found = signal.getsignal(signal.SIGTERM)
    seen: list[list[str]] = []

    async def signalled() -> None:
        await claiming.wait()
        seen.append([t.name for t in threading.enumerate()])
        os.kill(os.getpid(), signal.SIGTERM)

    with trio.fail_after(WAIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(signalled)
            await run(config=str(cfg), socket=None)
    assert signal.getsignal(signal.SIGTERM) is found
    assert "affidavit-stop-signals" not in seen[0], seen
    assert "signal 15: stopping the start-up" in caplog.text


@pytest.mark.usefixtures("serve_s_signals")  # (should run take the process's signals)
async def test_a_failure_whose_bound_cannot_start_is_the_failure_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A failure while the journal is open (here: stdio cannot be claimed) arms the bound
    before the close; that arming failing too is logged, and the failure is what ``run``
    raises -- what the CLI reports (before: the arming's RuntimeError, raised in ``run``'s
    ``finally``, replaced it: a traceback, exit 1)."""

    def fail() -> None:
        raise ValueError("a failure while serving")

    monkeypatch.setattr(StdioTransport, "claim", fail)
    _no_watchdog_thread(monkeypatch)
    cfg = write_config(tmp_path, {"ok": http_target("http://127.0.0.1:9")})
    with pytest.raises(ValueError, match="a failure while serving"):
        await run(config=str(cfg), socket=None)
    assert UNBOUNDED in [r.getMessage() for r in caplog.records]


OPENED = "test hook: the broker is open, the session not begun"
SLOW_START = f"""
import contextlib, sys, trio
from affidavit.mcp import backends

real = backends.Embedded.open

@contextlib.asynccontextmanager
async def opening(*args, **kwargs):
    async with real(*args, **kwargs) as embedded:
        print({OPENED!r}, file=sys.stderr, flush=True)
        await trio.sleep_forever()  # a long start-up
        yield embedded

backends.Embedded.open = opening
from affidavit.cli import main
sys.exit(main(["mcp", *sys.argv[1:]]))
"""


async def test_a_signal_before_the_session_began_ends_the_start_up_with_the_journal_closed(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    """SIGTERM while the broker is open and no session has begun: the signal thread cancels the
    start-up and the process ends through the broker's close, exit 0, nothing critical.
    (Before, the signal's default action killed the process there: status -15.)"""
    cfg = write_config(tmp_path, remotes.targets())
    argv = [PYTHON, "-c", SLOW_START, "--config", str(cfg), "--shutdown-grace", str(GRACE)]
    log = tmp_path / "mcp.log"
    async with started(argv, remotes.env(token), log, initialize=False) as raw:
        await wait_until(lambda: OPENED in raw.stderr(), "the start-up", START)
        raw.proc.send_signal(signal.SIGTERM)
        status, _ = await exit_within(raw, BOUND)
    assert status == 0, raw.stderr()
    assert "signal 15: stopping the start-up" in raw.stderr()
    assert "CRITICAL" not in raw.stderr()


SIGNALLED_AT_THE_END = """
import os, signal, sys
from affidavit.stopping import signals as stopsignals

real_exit = stopsignals.StopSignals.__exit__
signum = signal.Signals[sys.argv[1]]
when = sys.argv[2]

def exit_signalled(self, *exc):
    if when == "before":  # the thread takes it: its stop reaches the loop after the close
        os.kill(os.getpid(), signum)
    real_exit(self, *exc)
    if when == "after":  # once the process's signals are let go
        os.kill(os.getpid(), signum)
        os.kill(os.getpid(), signum)

stopsignals.StopSignals.__exit__ = exit_signalled
from affidavit.cli import main
sys.exit(main(["mcp", *sys.argv[3:]]))
"""


async def _signalled_at_the_end(
    tmp_path: Path, remotes: Remotes, token: str, signum: signal.Signals, when: str
) -> tuple[int, list[str]]:
    """One call answered, then the client closes its input (as MCP hosts stop a server), with
    ``signum`` sent ``when`` the signals' thread ends ("before": taken by the thread; "after":
    once the signals are let go)."""
    cfg = write_config(tmp_path, remotes.targets())
    argv = [PYTHON, "-c", SIGNALLED_AT_THE_END, signum.name, when, "--config", str(cfg)]
    async with started(argv, remotes.env(token), tmp_path / "mcp.log") as raw:
        await raw.send(call(1, "http_request", FAST))
        await raw.answer(1)
        await raw.proc.stdin.aclose()  # type: ignore[union-attr]
        status, _ = await exit_within(raw, BOUND)
    return status, raw.stderr().splitlines()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
async def test_a_signal_taken_as_the_stop_closed_the_journal_starts_no_stop(
    tmp_path: Path, remotes: Remotes, token: str, signum: signal.Signals
) -> None:
    """The stop ran clean: a SIGTERM or SIGINT just before the signals' thread ends -- taken by
    the thread, its stop reaching the loop after the journal closed -- starts nothing
    (``EmbeddedStop._end``'s guard): before, "signal N: stopping (0 call(s) running)" was
    logged after the stop was over."""
    status, lines = await _signalled_at_the_end(tmp_path, remotes, token, signum, "before")
    assert status == 0, lines
    assert lines[-1].endswith(" INFO the client closed its end"), lines
    assert not [line for line in lines if re.search(r" signal \d+: ", line)], lines


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
async def test_a_signal_after_the_stop_let_the_signals_go_ends_it_at_once(
    tmp_path: Path, remotes: Remotes, token: str, signum: signal.Signals
) -> None:
    """The stop ran clean: a SIGTERM or SIGINT once the signals' thread ended ends the process
    at once -- exit 0, not SIGTERM's default nor trio's KeyboardInterrupt (-15 or 130),
    nothing logged after the stop's own lines."""
    status, lines = await _signalled_at_the_end(tmp_path, remotes, token, signum, "after")
    assert status == 0, lines
    assert lines[-1].endswith(" INFO the client closed its end"), lines
    assert not [line for line in lines if re.search(r" signal \d+: ", line)], lines


HUNG_START = QUICK + SLOW_START.replace(
    "await trio.sleep_forever()  # a long start-up",
    "with trio.CancelScope(shield=True): await trio.sleep_forever()  # a start-up held",
)
CONFIG_GRACE = 0.5
"""The ``[service] shutdown_grace`` of the tests where only the config sets it."""


@pytest.mark.parametrize("journal", ["sqlite", "postgresql"])
async def test_a_signal_during_the_start_up_is_bounded_by_the_config_s_terms(
    tmp_path: Path, remotes: Remotes, token: str, request: pytest.FixtureRequest, journal: str
) -> None:
    """A start-up that never ends (held where ``Broker.open`` recovers a shared journal whose
    PostgreSQL restarts) and SIGTERM: the bound counts the config's terms from the signal on --
    its ``[service] shutdown_grace`` when no ``--shutdown-grace`` is given (SQLite), a shared
    journal's ``[journal] reconnect`` of 3 s over ``CLOSE_WAIT`` (PostgreSQL): exit 74 at
    that bound, not before, the exact number in its line.  (Before, until the broker was open
    the bound was the default grace's, 65 s, and no reconnect's: a writer still legitimately
    reconnecting was ended at ``CLOSE_WAIT``.)"""
    if journal == "sqlite":
        cfg = write_config(tmp_path, remotes.targets())
        cfg.write_text(cfg.read_text() + f"[service]\nshutdown_grace = {CONFIG_GRACE}\n")
        flags: list[str] = []
        bound = BOUND  # CONFIG_GRACE is GRACE
    else:
        shared = {
            "url": request.getfixturevalue("pg_url"),
            "key_file": str(tmp_path / "shared.key"),
            "signing_key": str(tmp_path / "signing.key"),
            "reconnect": RECONNECT,
        }
        cfg = write_config(tmp_path, remotes.targets(), journal=shared)
        flags = ["--shutdown-grace", str(GRACE)]
        bound = RECONNECT_BOUND
    argv = [PYTHON, "-c", HUNG_START, "--config", str(cfg), *flags]
    async with started(argv, remotes.env(token), tmp_path / "mcp.log", initialize=False) as raw:
        await wait_until(lambda: OPENED in raw.stderr(), "the start-up", START)
        raw.proc.send_signal(signal.SIGTERM)
        status, elapsed = await exit_within(raw, bound)
    log = raw.stderr()
    assert status == EXIT_STOP_UNFINISHED, log
    assert elapsed >= bound - EARLY, (elapsed, bound)
    unfinished(log, bound)
    assert token not in log


LATE = 2.0
"""Seconds the late loop comes after the phases' sum with no slack: 2.5 s under
``QUICK_LOOP_WAIT``."""
LATE_LOOP = f"""{QUICK}
import sys, time
from affidavit.mcp import stop

real_end = stop.EmbeddedStop._end
held = float(sys.argv[1])

def late(self, signum):  # the loop gets to the stop late: a read on it still in progress
    time.sleep(held)
    real_end(self, signum)

stop.EmbeddedStop._end = late
from affidavit.cli import main
sys.exit(main(["mcp", *sys.argv[2:]]))
"""


async def test_a_stop_the_loop_starts_late_is_not_ended_while_it_progresses(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    """The bound starts at the signal, on the signals' thread; the stop's own timers only once
    the loop runs it -- a read held on the loop delays that.  A healthy stop whose loop comes
    to it later than the phases' sum with no slack (``stop_bound`` without ``LOOP_WAIT``) but
    within the slack still ends on its own: exit 0, nothing critical (before: 74, the
    journal not closed, while the stop made progress)."""
    held = 3.25 + LATE  # BOUND without its LOOP_WAIT (0.5 + 1.25 + 1.5), then LATE
    cfg = write_config(tmp_path, remotes.targets())
    argv = [
        PYTHON,
        "-c",
        LATE_LOOP,
        str(held),
        "--config",
        str(cfg),
        "--shutdown-grace",
        str(GRACE),
    ]
    async with started(argv, remotes.env(token), tmp_path / "mcp.log") as raw:
        raw.proc.send_signal(signal.SIGTERM)
        status, elapsed = await exit_within(raw, held)
    log = raw.stderr()
    assert status == 0, log
    assert elapsed >= held - EARLY, (elapsed, held)
    assert "CRITICAL" not in log, log
    assert f"signal {int(signal.SIGTERM)}: stopping (0 call(s) running)" in log
