"""The stop's bound in parts (``affidavit.stopping``: ``bound``, ``signals``): what it counts,
what its line says, that a disarmed watchdog leaves nothing running, that the exit does not wait
for a log line nobody takes, and that a signal reaches the stop through a thread of its own."""

from __future__ import annotations

import fcntl
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from affidavit.api.client import Client
from affidavit.cli.serve import log_handler
from affidavit.config import load_config
from affidavit.daemon import server
from affidavit.daemon.server import ANSWER_WAIT, Daemon, DaemonError
from affidavit.stopping import bound as stopbound
from affidavit.stopping.bound import (
    CLOSE_WAIT,
    EXIT_STOP_UNFINISHED,
    LOG_WAIT,
    StopBound,
    pending_words,
    stop_bound,
)
from affidavit.text import NAMED
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import HostileServer, Peer, Reply

from .kit import (
    HUNG,
    PYTHON,
    action,
    api_target,
    start_daemon,
    wait_until,
    write_daemon_config,
)

WAIT = 10.0


def test_the_bound_counts_the_grace_the_recording_the_answers_and_the_close() -> None:
    assert stop_bound(30.0, 5.0, None) == 30 + 30 + 5 + CLOSE_WAIT
    assert stop_bound(1.0, 5.0, None) == 1 + 5 + 5 + CLOSE_WAIT  # the recording: at least 5 s
    assert stop_bound(1.0, 5.0, 30.0) == 1 + 5 + 5 + 30  # a reconnect longer than the close
    assert stop_bound(1.0, 5.0, 2.0) == 1 + 5 + 5 + CLOSE_WAIT


@pytest.mark.parametrize(
    ("shared", "reconnect"), [(False, None), (True, 30.0)], ids=["sqlite", "shared"]
)
def test_the_reconnect_counts_for_a_shared_journal_only(
    tmp_path: Path, shared: bool, reconnect: float | None
) -> None:
    """``[journal] reconnect`` is a shared journal's writer's wait; a SQLite journal's close
    has no such wait, so its bound does not grow with a setting it ignores."""
    journal: dict[str, object] = {"reconnect": 30}
    if shared:  # (never connected to: the bound is computed from the configuration)
        journal["url"] = "postgresql://affidavit@127.0.0.1:9/affidavit"
        journal["key_file"] = str(tmp_path / "shared.key")
        journal["signing_key"] = str(tmp_path / "signing.key")
    config = write_daemon_config(
        tmp_path,
        api_target("http://127.0.0.1:9"),
        socket=tmp_path / "s.sock",
        service={"shutdown_grace": 15},
        journal=journal,
    )
    daemon = Daemon(load_config(config))
    daemon._stop_bound = watchdog = StopBound(lambda: "", None)
    daemon._arm_stop_bound()
    watchdog.disarm()
    assert watchdog.bound == stop_bound(15.0, ANSWER_WAIT, reconnect)


def test_the_line_names_at_most_named_writes_and_calls_and_the_last_transaction() -> None:
    writes = [(f"inv-{i}", "DISPATCH_STARTED") for i in range(NAMED + 5)]
    words = pending_words(writes, [], 12.34)
    assert words.startswith(f"journal writes unanswered: {NAMED + 5} (inv-0 DISPATCH_STARTED, ")
    assert f"inv-{NAMED - 1} DISPATCH_STARTED and 5 more)" in words
    assert f"inv-{NAMED} " not in words
    assert "calls still running: none" in words
    assert words.endswith("the journal last finished a transaction 12.3s ago")
    calls = [f"inv-c{i}" for i in range(NAMED)]
    assert f"calls still running: {NAMED} ({', '.join(calls)})" in pending_words([], calls, None)
    assert "no transaction since it opened" in pending_words([], [], None)


def test_a_watchdog_run_inside_another_program_only_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.CRITICAL, logger="affidavit.stopping"):
        watchdog = StopBound(lambda: "journal writes unanswered: none", None)
        watchdog.arm(0.05)
        deadline = time.monotonic() + WAIT
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.01)
        watchdog.disarm()  # (the thread has ended: disarm joins it)
    (record,) = caplog.records
    assert "stop unfinished after 0.05s: journal writes unanswered: none" in record.message
    assert "not exiting: run inside another program" in record.message
    assert not _watchdogs()


def test_a_pending_account_that_fails_is_named_by_its_type_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def pending() -> str:
        raise RuntimeError("canary-secret")

    with caplog.at_level(logging.CRITICAL, logger="affidavit.stopping"):
        watchdog = StopBound(pending, None)
        watchdog.arm(0.01)
        deadline = time.monotonic() + WAIT
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.01)
        watchdog.disarm()
    (record,) = caplog.records
    assert "what was pending could not be read (RuntimeError)" in record.message
    assert "canary-secret" not in record.message


def test_a_disarmed_watchdog_leaves_no_thread_and_cannot_be_armed_again() -> None:
    watchdog = StopBound(lambda: "", EXIT_STOP_UNFINISHED)
    watchdog.arm(60.0)
    assert watchdog.deadline is not None and len(_watchdogs()) == 1
    watchdog.arm(0.01)  # the first arming counts
    assert watchdog.bound == 60.0
    watchdog.disarm()
    assert not _watchdogs()
    watchdog.arm(0.01)
    time.sleep(0.05)
    assert not _watchdogs()  # (and this process is still here)
    never = StopBound(lambda: "", EXIT_STOP_UNFINISHED)
    never.disarm()  # disarmed unarmed: nothing to join
    never.arm(0.01)
    assert not _watchdogs() and never.deadline is None


def test_a_watchdog_that_cannot_start_never_shows_a_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``deadline`` is read on other threads (``<socket>.lock``'s stopping state): while an
    arming whose watchdog fails to start is under way, it is not the end of a bound that will
    never run out (before: set before the start, reset after its failure)."""
    watchdog = StopBound(lambda: "", EXIT_STOP_UNFINISHED)
    seen: list[float | None] = []

    def start(_thread: threading.Thread) -> None:
        seen.append(watchdog.deadline)
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(RuntimeError):
        watchdog.arm(60.0)
    assert seen == [None] and watchdog.deadline is None


BLOCKED_LOG = """
import logging, sys, threading, time
from affidavit.stopping.bound import StopBound

class Stuck(logging.Handler):
    def emit(self, record):
        threading.Event().wait()  # a stderr nobody reads: the write never returns

logging.getLogger().addHandler(Stuck())
StopBound(lambda: "none", int(sys.argv[1])).arm(0.1)
time.sleep(60)
sys.exit(3)
"""


def test_the_exit_does_not_wait_for_a_log_line_that_cannot_be_written() -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED_LOG, str(EXIT_STOP_UNFINISHED)],
        capture_output=True,
        timeout=HUNG,
        check=False,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == EXIT_STOP_UNFINISHED, done.stderr
    # It waited for the line, that long and no longer (the ceiling: the interpreter's start;
    # the child sleeps 60 s otherwise).
    assert 0.1 + LOG_WAIT <= elapsed < 0.1 + LOG_WAIT + WAIT


SIGNALLED = """
import logging, os, select, signal, sys, threading
from affidavit.stopping.signals import StopSignals

logging.basicConfig(stream=sys.stdout, format="%(levelname)s %(message)s")
taken, got = [], threading.Event()

def on_signal(signum):
    taken.append((signal.Signals(signum).name, threading.current_thread().name))
    got.set()
    if len(taken) == 1:
        raise RuntimeError("can't start new thread")  # as StopBound.arm's, threads run out

def drained(fd):
    out = b""
    while select.select([fd], [], [], 0)[0]:
        out += os.read(fd, 64)
    return out

# a host's wakeup descriptor (trio's, under serve), and a signal of its own it wants woken by
found_read, found = os.pipe()
os.set_blocking(found, False)
signal.set_wakeup_fd(found)
signal.signal(signal.SIGUSR1, lambda signum, frame: None)
before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
with StopSignals(on_signal):
    os.kill(os.getpid(), signal.SIGUSR1)
    assert select.select([found_read], [], [], 10)[0], "SIGUSR1 forwarded to the found fd"
    for signum in (signal.SIGTERM, signal.SIGINT):
        got.clear()
        os.kill(os.getpid(), signum)
        assert got.wait(10), signum
assert {s: signal.getsignal(s) for s in before} == before, "handlers restored"
assert signal.set_wakeup_fd(-1) == found, "wakeup descriptor restored"
assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == set(), "nothing blocked"
assert threading.enumerate() == [threading.main_thread()], threading.enumerate()
print(taken)
print(list(drained(found_read)))
"""


def test_a_signal_is_taken_by_a_thread_of_its_own_and_everything_is_restored_after() -> None:
    """In a process of its own (the test process's handlers untouched).  The first
    ``on_signal`` raises (``StopBound.arm`` when no thread can be started): logged by its
    type, and the next signal is taken all the same.  The host's wakeup descriptor is put
    back, and meanwhile got the bytes of its own signal -- not the stop's (a host's loop
    would act on those a second time)."""
    done = subprocess.run(
        [sys.executable, "-c", SIGNALLED], capture_output=True, timeout=HUNG, check=False
    )
    assert done.returncode == 0, done.stderr
    logged, taken, forwarded = done.stdout.decode().strip().splitlines()
    assert logged == "ERROR SIGTERM: the stop's bound could not be armed (RuntimeError)"
    assert taken == "[('SIGTERM', 'affidavit-stop-signals'), ('SIGINT', 'affidavit-stop-signals')]"
    assert forwarded == f"[{int(signal.SIGUSR1)}]"


INTERRUPTED_ENTRY = """
import os, signal, threading
from affidavit.stopping import signals as stopsignals

class Interrupting:
    # KeyboardInterrupt at the first handler's install: after the pipe, the wakeup fd, the thread
    def __getattr__(self, name):
        return getattr(signal, name)
    def signal(self, signum, handler):
        if handler is stopsignals._nothing:
            raise KeyboardInterrupt
        return signal.signal(signum, handler)

found_read, found = os.pipe()
os.set_blocking(found, False)
signal.set_wakeup_fd(found)
fds = sorted(os.listdir("/proc/self/fd"))
before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
stopsignals.signal = Interrupting()
try:
    stopsignals.StopSignals(lambda signum: None).__enter__()
except KeyboardInterrupt:
    pass
else:
    raise AssertionError("entered")
stopsignals.signal = signal
assert {s: signal.getsignal(s) for s in before} == before, "handlers"
assert signal.set_wakeup_fd(-1) == found, "wakeup descriptor"
assert threading.enumerate() == [threading.main_thread()], threading.enumerate()
assert sorted(os.listdir("/proc/self/fd")) == fds, "the pipe closed"
print("rolled back")
"""


def test_an_entry_interrupted_part_way_puts_back_all_it_did() -> None:
    """A KeyboardInterrupt between the wakeup descriptor and the handlers' install: the pipe,
    the thread and the wakeup descriptor are undone (before, all three were left)."""
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_ENTRY], capture_output=True, timeout=HUNG, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().strip() == "rolled back"


DURING_EXIT = """
import os, signal, threading, time
from affidavit.stopping import signals as stopsignals

host, ours, injected, active = [], [], [], []
signal.signal(signal.SIGTERM, lambda signum, frame: host.append(signum))

class Injecting:
    # the module __exit__ calls: a SIGTERM sent before and after each of its calls
    def __init__(self, module):
        self._module = module
    def __getattr__(self, name):
        real = getattr(self._module, name)
        if not callable(real) or isinstance(real, type):
            return real
        def call(*args, **kwargs):
            inject = active and threading.current_thread() is threading.main_thread()
            if inject:
                injected.append(name)
                os.kill(os.getpid(), signal.SIGTERM)
            try:
                return real(*args, **kwargs)
            finally:
                if inject:
                    injected.append(name)
                    os.kill(os.getpid(), signal.SIGTERM)
        return call

stopsignals.signal = Injecting(signal)
stopsignals.os = Injecting(os)
taking = stopsignals.StopSignals(ours.append)
taking.__enter__()
active.append(True)
taking.__exit__(None, None, None)
active.clear()
time.sleep(0.1)
assert len(host) + len(ours) >= len(injected) > 0, (host, ours, injected)
print(len(injected))
"""


def test_a_signal_during_the_exit_reaches_the_daemon_or_the_handler_found_at_entry() -> None:
    """A SIGTERM before and after each call ``__exit__`` makes: each is acted on -- by
    ``on_signal`` or by the host's own handler, put back first -- none swallowed (with the
    handlers put back last, those after the thread ended reached neither)."""
    done = subprocess.run(
        [sys.executable, "-c", DURING_EXIT], capture_output=True, timeout=HUNG, check=False
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 8  # (a send before and after 4 calls at least)


INHERITED = """
import signal, subprocess, trio
from affidavit.stopping.signals import StopSignals

async def daemon():
    with StopSignals(lambda signum: None):
        await trio.to_thread.run_sync(lambda: None)  # a worker made while the daemon runs

def child():
    sleeper = subprocess.Popen(["sleep", "30"])
    sleeper.terminate()
    try:
        return signal.pthread_sigmask(signal.SIG_BLOCK, set()), sleeper.wait(10)
    finally:
        sleeper.kill()

async def later():
    return await trio.to_thread.run_sync(child)  # the same worker: idle ones are kept ~10 s

trio.run(daemon)
print(trio.run(later))
"""


def test_after_stop_signals_a_child_started_from_a_trio_worker_takes_sigterm() -> None:
    """trio's worker threads outlive the run that made them and are shared by every run in the
    process: one made while ``StopSignals`` took the signals (``affidavit serve``'s) must block
    nothing once it is left, nor the processes it starts (``trio.run_process``) -- a signal
    mask would have been inherited by both (the thread's first design, ``sigwait``)."""
    done = subprocess.run(
        [sys.executable, "-c", INHERITED], capture_output=True, timeout=HUNG, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().strip() == f"(set(), {-signal.SIGTERM})"


@pytest.fixture
def serve_s_signals() -> Iterator[None]:
    """A daemon run in this process as ``serve`` runs it leaves SIGTERM and SIGINT ending the
    process once stopped (it only ends then): the test's process gets the handlers it had back."""
    found = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in found.items():
        signal.signal(signum, handler)


def _as_serve(daemon: Daemon) -> None:
    """The daemon as ``serve`` makes it: its exit status past the bound, and the process its
    own -- its signals' thread, the signals ending the process once stopped (restore them:
    ``serve_s_signals``)."""
    daemon.exit_when_stop_unfinished = EXIT_STOP_UNFINISHED
    daemon._process_ours = True


def _logged_at_info(caplog: pytest.LogCaptureFixture) -> None:
    """The daemon's lines and the stop's (its signals' and its bound's: ``affidavit.stopping``),
    INFO and up."""
    for name in ("affidavit.daemon", "affidavit.stopping"):
        caplog.set_level(logging.INFO, name)


def _watchdogs() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "affidavit-stop-bound" and t.is_alive()]


LOGGER = {logging.CRITICAL: "affidavit.stopping", logging.INFO: "affidavit.daemon"}
"""Who logs the stop's lines: the bound's (``StopBound``), the daemon's own ("stopped")."""


def test_the_critical_line_reaches_journald_at_crit_priority(tmp_path: Path) -> None:
    """Under systemd, stderr is the journal's stream (``$JOURNAL_STREAM``: its device and
    inode): each line starts with its syslog priority, CRITICAL ``<2>``, so ``journalctl -p
    crit`` finds the stop's line.  Any other stderr gets the plain line."""
    with (tmp_path / "stderr").open("w", encoding="utf-8") as stream:
        st = os.fstat(stream.fileno())
        ours = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        elsewhere = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino + 1}"}
        for environ, critical, info in (
            (ours, "<2>", "<6>"),
            (elsewhere, "", ""),
            ({}, "", ""),
        ):
            handler = log_handler(environ, stream)
            for level, prefix in ((logging.CRITICAL, critical), (logging.INFO, info)):
                name = LOGGER[level]
                record = logging.LogRecord(name, level, "", 0, "stop", (), None)
                line = handler.format(record)
                assert line.startswith(prefix) and line[len(prefix)].isdigit(), (prefix, line)
                assert line.endswith(
                    f"affidavit serve[{os.getpid()}] {logging.getLevelName(level)} stop"
                )


async def test_serve_prefixes_its_lines_when_its_stderr_is_the_journal_s_stream(
    tmp_path: Path,
) -> None:
    """``affidavit serve`` itself (not only ``log_handler``): started with ``$JOURNAL_STREAM``
    naming its stderr's device and inode, as systemd starts it, each line has its priority."""
    log = tmp_path / "daemon.log"
    log.touch()
    st = os.stat(log)
    socket = tmp_path / "s.sock"
    config = write_daemon_config(tmp_path, api_target("http://127.0.0.1:9"), socket=socket)
    command = [
        "env",
        f"JOURNAL_STREAM={st.st_dev}:{st.st_ino}",
        PYTHON,
        "-m",
        "affidavit",
        "serve",
        "--config",
        str(config),
    ]
    daemon = await start_daemon(config, socket, log, None, command=command)
    daemon.signal(signal.SIGTERM)
    assert await daemon.wait() == 0
    lines = daemon.log_text().splitlines()
    listening = [line for line in lines if " INFO listening on " in line]
    assert listening and all(line.startswith("<6>") for line in listening), lines
    assert lines[-1].startswith("<6>") and lines[-1].endswith(" INFO stopped"), lines


SIGNALLED_AT_THE_END = """
import os, signal, sys
from affidavit.stopping import signals as stopsignals

real_exit = stopsignals.StopSignals.__exit__
signum = signal.Signals[sys.argv[2]]
when = sys.argv[3]

def exit_signalled(self, *exc):
    if when == "before":  # the thread takes it: its stop reaches the loop after the close
        os.kill(os.getpid(), signum)
    real_exit(self, *exc)
    if when == "after":  # once the daemon's signals are let go
        os.kill(os.getpid(), signum)
        os.kill(os.getpid(), signum)

stopsignals.StopSignals.__exit__ = exit_signalled
from affidavit.cli import main
sys.exit(main(["serve", "--config", sys.argv[1]]))
"""


async def _signalled_at_the_end(
    tmp_path: Path, signum: signal.Signals, when: str
) -> tuple[int, list[str]]:
    """``affidavit serve`` stopped by SIGTERM, with ``signum`` sent again ``when`` its signals'
    thread ends ("before": taken by the thread; "after": once the signals are let go)."""
    socket = tmp_path / "s.sock"
    config = write_daemon_config(tmp_path, api_target("http://127.0.0.1:9"), socket=socket)
    command = [PYTHON, "-c", SIGNALLED_AT_THE_END, str(config), signum.name, when]
    daemon = await start_daemon(config, socket, tmp_path / "daemon.log", None, command=command)
    daemon.signal(signal.SIGTERM)
    status = await daemon.wait()
    return status, daemon.log_text().splitlines()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
async def test_a_signal_taken_as_serve_closed_its_journal_starts_no_stop(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """``affidavit serve`` stopped cleanly: a second SIGTERM or SIGINT just before its signals'
    thread ends -- taken by the thread, its stop reaching the loop after the journal closed --
    starts no stop (``Daemon._over``): "stopped" is the last line, one "received" only.
    (Without the guard: "received SIGTERM" after "stopped".)"""
    status, lines = await _signalled_at_the_end(tmp_path, signum, "before")
    assert status == 0, lines
    assert lines[-1].endswith(" INFO stopped"), lines
    received = [line for line in lines if " received SIG" in line]
    assert len(received) == 1 and received[0].endswith(" SIGTERM"), lines


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
async def test_a_signal_after_serve_let_its_signals_go_ends_it_at_once(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """``affidavit serve`` stopped cleanly: a SIGTERM or SIGINT once its signals' thread ended
    ends the process at once with the journal closed -- exit 0, not SIGTERM's default nor
    trio's KeyboardInterrupt (-15 or 130), before it says "stopped"."""
    status, lines = await _signalled_at_the_end(tmp_path, signum, "after")
    assert status == 0, lines
    assert not [line for line in lines if line.endswith(" INFO stopped")], lines
    received = [line for line in lines if " received SIG" in line]
    assert len(received) == 1 and received[0].endswith(" SIGTERM"), lines


def test_arming_inside_an_arming_does_not_deadlock() -> None:
    """A signal's Python handler runs on the main thread between two bytecodes -- possibly in
    the middle of that thread's own ``arm`` or ``disarm``, its lock held -- and arms again."""
    watchdog = StopBound(lambda: "", None)
    done = threading.Event()

    def nested() -> None:
        with watchdog._lock:  # as the interrupted ``arm`` holds it
            watchdog.arm(60.0)
        done.set()

    threading.Thread(target=nested, daemon=True).start()
    assert done.wait(WAIT)
    watchdog.disarm()
    assert not _watchdogs()


def test_an_arming_re_entered_on_its_own_thread_starts_one_watchdog(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Re-entered on the arming thread just after its check (at its reading of the clock) --
    no handler of ours arms, but a host's Python signal handler runs between any two
    bytecodes: the inner arming finds it armed (``_armed``) and returns, the outer one starts
    the one watchdog."""
    watchdog = StopBound(lambda: "", None)
    entered: list[float] = []

    def time_re_entering() -> float:
        if not entered:
            entered.append(time.time())
            watchdog.arm(60.0)
        return time.time()

    monkeypatch.setattr(stopbound, "time", SimpleNamespace(time=time_re_entering))
    watchdog.arm(60.0)
    assert entered and len(_watchdogs()) == 1
    watchdog.disarm()
    assert not _watchdogs()


def test_disarming_does_not_wait_for_a_line_nobody_takes() -> None:
    """A watchdog that only logs (``exit_status`` None) writes its line on its own thread: a
    stderr that never takes it holds that thread, not the disarming, past ``LOG_WAIT``."""
    writing, release = threading.Event(), threading.Event()

    class Stuck(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            writing.set()
            release.wait(HUNG)

    stuck = Stuck()
    logging.getLogger("affidavit.stopping").addHandler(stuck)
    try:
        watchdog = StopBound(lambda: "", None)
        watchdog.arm(0.01)
        assert writing.wait(WAIT)
        started = time.monotonic()
        disarming = threading.Thread(target=watchdog.disarm, daemon=True)
        disarming.start()
        disarming.join(LOG_WAIT + WAIT)
        assert not disarming.is_alive()
        assert LOG_WAIT <= time.monotonic() - started < LOG_WAIT + WAIT
    finally:
        release.set()
        logging.getLogger("affidavit.stopping").removeHandler(stuck)


async def test_a_stop_no_signal_started_is_bounded_from_the_journal_s_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure while the journal is open (here the start-up's, after the journal opened):
    no signal, so nobody armed the bound -- the failure does, before the journal's close,
    which a journal that stopped answering would hold for ever."""

    def fail(_broker: object) -> None:
        raise RuntimeError("a failure while serving")

    monkeypatch.setattr(server, "_refuse_unusable_segments", fail)
    config = write_daemon_config(
        tmp_path, api_target("http://127.0.0.1:9"), socket=tmp_path / "s.sock"
    )
    daemon = Daemon(load_config(config))
    with pytest.raises(RuntimeError, match="a failure while serving"):
        await daemon.run()
    watchdog = daemon._stop_bound
    assert watchdog is not None and watchdog.deadline is not None  # armed, then disarmed
    assert watchdog.bound == stop_bound(30.0, ANSWER_WAIT, None)
    assert not _watchdogs()


async def test_a_signal_whose_bound_cannot_start_still_stops_the_daemon(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    serve_s_signals: None,
) -> None:
    """The daemon of ``serve`` (``_as_serve``: its own signals' thread).
    The watchdog's thread cannot start once (the real ``Thread.start`` fails, as when no
    thread is left): the signal thread logs it and the loop is asked to stop all the same;
    the arming after the shutdown starts the watchdog, the stop disarms it, the path's lock
    is let go and the daemon says it stopped (before: the failed arming stayed "armed", so no
    watchdog ever ran, and disarm raised joining a thread never started)."""
    real_start = threading.Thread.start
    failed: list[str] = []
    started: list[str] = []

    def start_failing_once(thread: threading.Thread) -> None:
        if thread.name == "affidavit-stop-bound" and not failed:
            failed.append(thread.name)
            raise RuntimeError("can't start new thread")
        real_start(thread)
        started.append(thread.name)

    monkeypatch.setattr(threading.Thread, "start", start_failing_once)
    _logged_at_info(caplog)
    config = write_daemon_config(
        tmp_path, api_target("http://127.0.0.1:9"), socket=tmp_path / "s.sock"
    )
    daemon = Daemon(load_config(config))
    _as_serve(daemon)
    with trio.fail_after(WAIT):
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.run)
            os.kill(os.getpid(), signal.SIGTERM)
    assert failed and "affidavit-stop-bound" in started  # the next arming's watchdog ran
    assert "SIGTERM: the stop's bound could not be armed (RuntimeError)" in caplog.text
    assert "received SIGTERM" in caplog.text
    assert daemon._stop_bound is not None and daemon._stop_bound.deadline is not None
    assert caplog.records[-1].getMessage() == "stopped"
    assert not _watchdogs()
    with open(f"{tmp_path / 's.sock'}.lock", "rb") as lock:  # let go: another may take it
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)


async def test_a_bound_armed_before_the_path_is_claimed_is_disarmed_when_the_claim_fails(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    serve_s_signals: None,
) -> None:
    """A signal between the signals' thread's start and the socket path's claim arms the
    bound; the claim then refused (another daemon holds the path) still disarms it -- before,
    only a claimed path's end did, and the watchdog ended the refused process 74 later.  Its
    stop, reaching the loop after the refusal, logs nothing: there is nothing left to stop
    (before: "received SIGTERM" after the refusal)."""
    _logged_at_info(caplog)
    config = write_daemon_config(
        tmp_path, api_target("http://127.0.0.1:9"), socket=tmp_path / "s.sock"
    )
    daemon = Daemon(load_config(config))
    _as_serve(daemon)

    def claim_signalled(_path: Path) -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + WAIT
        while daemon._stop_bound.deadline is None and time.monotonic() < deadline:  # type: ignore[union-attr]
            time.sleep(0.01)
        raise DaemonError("another daemon holds the path")

    monkeypatch.setattr(server, "claim_socket_path", claim_signalled)
    with pytest.raises(DaemonError):
        await daemon.run()
    await trio.sleep(0.1)  # (the stop the thread asked for runs on the loop, after the refusal)
    assert "received SIGTERM" not in caplog.text
    watchdog = daemon._stop_bound
    assert watchdog is not None
    try:
        assert watchdog.deadline is not None  # the signal armed it
        assert not _watchdogs()
    finally:
        watchdog.disarm()  # (failing, not this process's end 74 later)


SLOW = 1.0
"""Seconds the remote of the call in flight at the stop takes to answer (under its grace)."""


async def test_a_stop_whose_bound_cannot_start_on_the_loop_keeps_its_grace(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    token: str,
    serve_s_signals: None,
) -> None:
    """No thread can be started for the watchdog at all (as under a cgroup's ``pids.max``):
    neither the signal's thread nor the loop can arm the bound.  The loop's failed arming is
    logged by its type and the stop goes on unbounded -- the call in flight is given its
    grace and answered, "stopped", ``run`` returns (before: the RuntimeError left the serving,
    its calls cancelled without grace, and ``serve`` ended with a traceback, exit 1).  A daemon
    started on the path meanwhile is told the stop has no bound, never a time it will have
    exited by "at the latest" (before: the lock said ``stopping`` with no time, and the
    refusal named the end of a bound that did not exist)."""
    monkeypatch.setenv(TOKEN_ENV, token)

    async def slow(peer: Peer) -> None:
        if await peer.read_request() is not None:
            peer.server.event("received").set()
            await trio.sleep(SLOW)
            await peer.respond(Reply(200, body=b"done"))

    _no_watchdog_thread(monkeypatch)
    _logged_at_info(caplog)
    socket = tmp_path / "s.sock"
    answered: list[dict[str, Any]] = []

    async def call() -> None:
        async with Client.open(socket) as client:
            answered.append(await client.call(action()))

    async with HostileServer.running(slow) as srv:
        config = write_daemon_config(
            tmp_path, api_target(srv.url), socket=socket, service={"shutdown_grace": WAIT}
        )
        daemon = Daemon(load_config(config))
        _as_serve(daemon)
        with trio.fail_after(3 * WAIT):
            async with trio.open_nursery() as nursery:
                await nursery.start(daemon.run)
                nursery.start_soon(call)
                await srv.event("received").wait()
                os.kill(os.getpid(), signal.SIGTERM)
                refusal = await _refused_while_stopping(socket)
    said = [r.getMessage() for r in caplog.records]
    assert "SIGTERM: the stop's bound could not be armed (RuntimeError)" in said
    assert UNBOUNDED in said, said
    assert refusal.code == "DAEMON_STOPPING", refusal
    assert "its stop has no bound" in str(refusal), refusal
    assert "at the latest" not in str(refusal) and "bound ([service]" not in str(refusal)
    assert not any("grace ran out" in line for line in said), said
    assert said[-1] == "stopped"
    (answer,) = answered
    assert "error" not in answer and answer["result"]["body"] == "done", answer


async def test_a_bound_armed_after_the_lock_said_unbounded_is_named_there(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    token: str,
    serve_s_signals: None,
) -> None:
    """The stop began unbounded (no thread for the watchdog: ``<socket>.lock`` says
    "stopping unbounded"); a later SIGTERM, once a thread can be started again, arms the
    bound -- its watchdog will end the process at the deadline, so the lock file says that
    end, and a daemon started on the path is told it "at the latest" (before: still "no
    bound", while the watchdog would exit 74)."""
    monkeypatch.setenv(TOKEN_ENV, token)

    async def held(peer: Peer) -> None:
        if await peer.read_request() is not None:
            peer.server.event("received").set()
            await peer.server.event("release").wait()
            await peer.respond(Reply(200, body=b"done"))

    no_thread = [True]
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        if thread.name == "affidavit-stop-bound" and no_thread[0]:
            raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    socket = tmp_path / "s.sock"
    lock = Path(f"{socket}.lock")

    async def call() -> None:
        async with Client.open(socket) as client:
            await client.call(action())

    async with HostileServer.running(held) as srv:
        config = write_daemon_config(
            tmp_path, api_target(srv.url), socket=socket, service={"shutdown_grace": WAIT}
        )
        daemon = Daemon(load_config(config))
        _as_serve(daemon)
        with trio.fail_after(3 * WAIT):
            async with trio.open_nursery() as nursery:
                await nursery.start(daemon.run)
                nursery.start_soon(call)
                await srv.event("received").wait()
                os.kill(os.getpid(), signal.SIGTERM)
                unbounded = await _refused_while_stopping(socket)
                no_thread[0] = False
                os.kill(os.getpid(), signal.SIGTERM)
                await wait_until(
                    lambda: lock.read_text(encoding="ascii").split()[2:3] != ["unbounded"],
                    "the lock file rewritten",
                )
                words = lock.read_text(encoding="ascii").split()
                watchdog = daemon._stop_bound
                assert watchdog is not None and watchdog.deadline is not None
                assert words[1:] == ["stopping", str(math.ceil(watchdog.deadline))], words
                with pytest.raises(DaemonError) as bounded:
                    server.claim_socket_path(socket)
                srv.event("release").set()
    assert "its stop has no bound" in str(unbounded), unbounded
    assert "at the latest" in str(bounded.value), bounded.value
    assert "no bound" not in str(bounded.value), bounded.value


async def _refused_while_stopping(socket: Path) -> DaemonError:
    """What a daemon started on ``socket`` is told once the one there noted it stops."""
    lock = Path(f"{socket}.lock")
    with trio.fail_after(WAIT):
        while " stopping" not in lock.read_text(encoding="ascii"):
            await trio.sleep(0.01)
    with pytest.raises(DaemonError) as refused:
        server.claim_socket_path(socket)
    return refused.value


async def test_a_failure_whose_bound_cannot_start_is_the_failure_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A failure while the journal is open arms the bound before the close; that arming
    failing too is logged, and the failure is what ``run`` raises (before: the arming's
    RuntimeError, raised inside the handler, replaced it)."""

    def fail(_broker: object) -> None:
        raise ValueError("a failure while serving")

    monkeypatch.setattr(server, "_refuse_unusable_segments", fail)
    _no_watchdog_thread(monkeypatch)
    config = write_daemon_config(
        tmp_path, api_target("http://127.0.0.1:9"), socket=tmp_path / "s.sock"
    )
    daemon = Daemon(load_config(config))
    with pytest.raises(ValueError, match="a failure while serving"):
        await daemon.run()
    assert UNBOUNDED in [r.getMessage() for r in caplog.records]


UNBOUNDED = "the stop's bound could not be armed (RuntimeError): the stop goes on unbounded"


def _no_watchdog_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watchdog's thread never starts (the real ``Thread.start`` fails, as when no thread
    is left); every other thread does."""
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        if thread.name == "affidavit-stop-bound":
            raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)


DISARM_AT_THE_BOUND = """
import logging, sys, threading
from affidavit.stopping.bound import StopBound

class DisarmedAsTheWaitRanOut(threading.Event):
    def wait(self, timeout=None):
        self.set()  # the journal closed, and disarm came, just as the bound ran out
        return False

class Held(logging.Handler):
    def emit(self, record):
        print(self.format(record), file=sys.stderr, flush=True)
        threading.Event().wait()  # then a stderr that takes nothing more: LOG_WAIT runs out

logging.getLogger().addHandler(Held())
reading = threading.Event()

def pending():
    reading.set()
    if sys.argv[1] == "once exiting":  # the disarm comes once the account started
        assert watchdog._disarmed.wait(10)
    return "slow"

watchdog = StopBound(pending, 74)
if sys.argv[1] == "before the re-check":
    watchdog._disarmed = DisarmedAsTheWaitRanOut()
    watchdog.arm(0.01)
else:
    watchdog.arm(0.01)
    assert reading.wait(10)
watchdog.disarm()
print("stopped", flush=True)  # (at once: an exit that follows cannot lose it)
"""


@pytest.mark.parametrize(
    ("when", "status", "said"),
    [("before the re-check", 0, "stopped"), ("once exiting", EXIT_STOP_UNFINISHED, "")],
)
def test_a_disarm_as_the_bound_runs_out_either_stops_the_exit_or_waits_for_it(
    when: str, status: int, said: str
) -> None:
    """A disarm that lands after the watchdog's wait ran out: before the watchdog's re-check
    (under the lock) it counts -- no exit, no CRITICAL line; once the watchdog is exiting
    (its account of what was pending started before the disarm, and ends after it), disarm
    waits for the exit (``EXIT_WAIT`` at most: the account, then ``LOG_WAIT`` for a line its
    stderr does not take) rather than return to a "stopped" line and exit 0 while the
    watchdog logs "exiting 74"."""
    done = subprocess.run(
        [sys.executable, "-c", DISARM_AT_THE_BOUND, when],
        capture_output=True,
        timeout=HUNG,
        check=False,
    )
    assert done.returncode == status, done.stderr
    assert done.stdout.decode().strip() == said
    assert (b"CRITICAL" in done.stderr or b"stop unfinished" in done.stderr) == bool(status)


HELD_ON_SIGNAL = """
import os, signal, threading, time
from affidavit.stopping.signals import JOIN_WAIT, StopSignals

entered, release = threading.Event(), threading.Event()

def on_signal(signum):
    entered.set()
    release.wait(60)  # an on_signal that hangs

fds = sorted(os.listdir("/proc/self/fd"))
with StopSignals(on_signal):
    os.kill(os.getpid(), signal.SIGTERM)
    assert entered.wait(10)
    started = time.monotonic()
took = time.monotonic() - started
assert JOIN_WAIT <= took < JOIN_WAIT + 5, took
release.set()  # the thread ends, and closes the read end it was left
deadline = time.monotonic() + 10
while sorted(os.listdir("/proc/self/fd")) != fds and time.monotonic() < deadline:
    time.sleep(0.01)
assert sorted(os.listdir("/proc/self/fd")) == fds, "the pipe closed"
assert threading.enumerate() == [threading.main_thread()], threading.enumerate()
print("bounded")
"""


def test_the_exit_waits_for_a_held_on_signal_join_wait_at_most() -> None:
    """An ``on_signal`` that never returns holds its thread, not the exit: ``JOIN_WAIT``, then
    the pipe's read end is the thread's to close once it ends (before: an unbounded join)."""
    done = subprocess.run(
        [sys.executable, "-c", HELD_ON_SIGNAL], capture_output=True, timeout=HUNG, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().strip() == "bounded"


async def test_serve_called_in_process_leaves_the_signals_as_it_found_them(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    serve_s_signals: None,
) -> None:
    """``affidavit.daemon.serve`` called by a program of its own (not ``affidavit serve``,
    whose ``_cli`` is private): trio's receiver takes SIGTERM while it runs, no thread of ours,
    and once it returned the process's SIGTERM handler is the one it found (before: ``serve``
    took the process's signals, and a SIGTERM after it returned ran ``os._exit(0)`` in the
    caller)."""
    monkeypatch.setattr(server, "_raise_open_files", lambda: None)  # (not this process's)
    caplog.set_level(logging.INFO, "affidavit.daemon")
    socket = tmp_path / "s.sock"
    config = load_config(
        write_daemon_config(tmp_path, api_target("http://127.0.0.1:9"), socket=socket)
    )
    found = signal.getsignal(signal.SIGTERM)
    seen: list[Any] = []

    async def signalled() -> None:
        await wait_until(socket.exists, "listening")
        seen.append([t.name for t in threading.enumerate()])
        os.kill(os.getpid(), signal.SIGTERM)

    with trio.fail_after(WAIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(signalled)
            await server.serve(config)
    assert signal.getsignal(signal.SIGTERM) is found
    assert "affidavit-stop-signals" not in seen[0], seen
    assert "received SIGTERM" in caplog.text and caplog.records[-1].getMessage() == "stopped"


@pytest.mark.parametrize("status", [None, EXIT_STOP_UNFINISHED])
async def test_a_daemon_run_inside_another_program_leaves_the_signals_to_trio(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, status: int | None
) -> None:
    """Not ``serve``'s daemon: trio's receiver takes SIGTERM on the loop (no thread of ours,
    no handler of ours), the stop's bound is armed once the loop saw it, and the handler found
    is there again once ``run`` returned -- ``exit_when_stop_unfinished`` set or not: it is
    the watchdog's exit status only (before, setting it also took the process's signals and
    left them ignored after ``run``)."""
    caplog.set_level(logging.INFO, "affidavit.daemon")
    config = write_daemon_config(
        tmp_path, api_target("http://127.0.0.1:9"), socket=tmp_path / "s.sock"
    )
    daemon = Daemon(load_config(config))
    daemon.exit_when_stop_unfinished = status
    found = signal.getsignal(signal.SIGTERM)
    with trio.fail_after(WAIT):
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.run)
            names = [t.name for t in threading.enumerate()]
            handler = signal.getsignal(signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
    assert "affidavit-stop-signals" not in names
    assert getattr(handler, "__module__", "") != "affidavit.stopping.signals"
    assert signal.getsignal(signal.SIGTERM) is found
    assert "received SIGTERM" in caplog.text and caplog.records[-1].getMessage() == "stopped"
    assert daemon._stop_bound is not None and daemon._stop_bound.deadline is not None
    assert not _watchdogs()
