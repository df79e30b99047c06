"""Fixtures every test directory may use: a real PostgreSQL server (``tests/postgres.py``), and
``core_dumps_forbidden``, ``umask_restored`` and ``process_state_restored`` -- which every test
has: ``affidavit.cli.main`` run in the test's own process neither hardens it nor leaves it
``affidavit serve``'s umask, logging or garbage-collector settings."""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests import external, hangs
from tests.hangs import (  # noqa: F401 (hooks pytest finds here)
    pytest_configure_node,
    pytest_terminal_summary,
    pytest_timeout_cancel_timer,
    pytest_timeout_set_timer,
)
from tests.postgres import Cluster, running_cluster

_CHECKOUT = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    """Refuse to test another checkout's code.  ``affidavit.journal``, ``.adapters`` and
    ``.statemachine`` live in top-level folders that an editable install maps by name
    (pyproject's ``package-dir``): with two checkouts on one machine, ``PYTHONPATH`` pointing
    at this one still imports those three from the one that was installed -- the tests would
    pass or fail on code they were not given, and say nothing."""
    # The files the tests write themselves (configs, keys they plant) get this process's umask:
    # under a desktop's 002 a config would be group-writable, which every broker warns of and
    # ``affidavit serve`` refuses (FILES_EXPOSED).  The tests that check those rules set their
    # files' modes themselves; the rest run as under CI's 022, whoever runs them.
    os.umask(TEST_UMASK)
    hangs.configure(config)
    import affidavit
    import affidavit.adapters
    import affidavit.journal
    import affidavit.statemachine

    for module in (affidavit, affidavit.adapters, affidavit.journal, affidavit.statemachine):
        where = Path(module.__file__ or "").resolve()
        if not where.is_relative_to(_CHECKOUT):
            raise pytest.UsageError(
                f"{module.__name__} is imported from {where.parent}, not from this checkout "
                f"({_CHECKOUT}): run `pip install -e .` here (or use this checkout's venv)"
            )
    # Like the umask: the TLS variables a broker ignores and names in a start-up WARNING
    # (``ENV_IGNORED``): a machine that sets ``SSL_CERT_FILE`` (a Nix or CI image) would put that
    # line on the stderr of every command a test runs that opens a broker with an HTTP target.
    # The tests of those warnings set the variables themselves.
    from affidavit.adapters.http.trust import ENV_IGNORED

    for name in ENV_IGNORED:
        os.environ.pop(name, None)


AUTO_ENV = "PYTEST_XDIST_AUTO_NUM_WORKERS"
"""xdist's own variable: ``-n auto`` means exactly this many workers when it is set."""


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: what ``PYTEST_XDIST_AUTO_NUM_WORKERS`` says when it is set, as xdist's
    own hook does (this one replaces it); else one worker per CPU this process may run on, at
    most 4 -- each worker may start sshd, PostgreSQL and chromium of its own, and the
    fault-injection tests' deadlines assume a machine not oversubscribed -- and none
    (everything in this process) on a single CPU, where a worker would only add its start-up."""
    return auto_workers(os.environ)


def auto_workers(environ: Mapping[str, str]) -> int:
    raw = environ.get(AUTO_ENV, "")
    if raw:
        try:
            return int(raw)
        except ValueError:  # xdist's words and rule: ignored
            warnings.warn(f"{AUTO_ENV} is not a number: {raw!r}. Ignoring it.", stacklevel=1)
    return workers_for(usable_cpus())


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (a cgroup cpuset or ``taskset``
    narrows it; ``os.cpu_count()`` counts the machine's), where the platform has one."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return len(affinity(0))
    return os.cpu_count() or 1


def workers_for(cpus: int) -> int:
    return 0 if cpus <= 1 else min(cpus, 4)


@pytest.fixture(scope="session")
def pg() -> Iterator[Cluster]:
    """One PostgreSQL server for the session (skipped with ``postgresql not installed`` without
    Debian's server, a failure when ``AFFIDAVIT_REQUIRE_PROGRAMS=1``); each test takes a fresh
    database of it with ``pg.database()``."""
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture
def pg_url(pg: Cluster) -> str:
    """A fresh, empty database's URL (the superuser's canary password in it)."""
    return pg.database()


@pytest.fixture
def taken_port(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A loopback port another listener holds -- this process, as another xdist worker's
    server would -- which ``tests.external.free_port`` hands out first (then free ones): the
    race a port picked free loses."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = int(s.getsockname()[1])
        first, free = iter([port]), external.free_port
        monkeypatch.setattr(external, "free_port", lambda: next(first, 0) or free())
        yield port


@pytest.fixture(autouse=True)
def core_dumps_forbidden(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each time a command run in this process asked to forbid core dumps (``affidavit.cli``
    does before a command that holds secrets), recorded here instead: made real, the test
    process would stay not dumpable with ``RLIMIT_CORE`` 0 -- and so would every child it
    starts after -- for the rest of the session.  tests/daemon/test_core_dumps.py watches the
    real settings in a child ``affidavit``."""
    asked: list[str] = []

    def record() -> list[str]:
        asked.append("forbid")
        return []

    monkeypatch.setattr("affidavit.coredump.forbid_core_dumps", record)
    return asked


TEST_UMASK = 0o022
"""The umask every test starts with (``pytest_configure`` sets it for the session)."""


@pytest.fixture(autouse=True)
def umask_restored() -> Iterator[None]:
    """``affidavit serve`` sets its process's umask to 077 before it reads its config; run in
    this process (``main(["serve", ...])``, a test of a refusal) it left every later test on the
    same worker creating its directories 0700 and its files 0600 -- CI's run then failed two
    tests far from the one that did it (a PostgreSQL server running as ``nobody`` could not read
    the ``port.conf`` root wrote; the deployment layout's daemon could not enter its ``etc``).
    Each test starts at ``TEST_UMASK`` and whatever it sets goes with it."""
    os.umask(TEST_UMASK)
    try:
        yield
    finally:
        os.umask(TEST_UMASK)


_SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGPIPE")
    if hasattr(signal, name)
)
"""What a command's stop handling may take over (``affidavit/stopping/signals.py`` gives them
back; this makes sure).  Not SIGALRM: pytest-timeout's."""


def _loggers() -> dict[str, logging.Logger]:
    found = {"": logging.getLogger()}
    for name, logger in logging.Logger.manager.loggerDict.items():
        if isinstance(logger, logging.Logger):
            found[name] = logger
    return found


@pytest.fixture(autouse=True)
def process_state_restored() -> Iterator[None]:
    """The rest of the process-wide state a command run in this process sets, given back after
    each test as the umask is (``umask_restored``).  An embedded ``affidavit mcp`` (and
    ``serve``) calls ``tune_collector`` before it reads its config -- ``gc.freeze`` and a young
    threshold of 20,000 for the rest of the worker's life -- sets the ``mcp`` logger's level and
    adds its ``BoundedLog`` filter to every root handler, pytest's capture handlers included
    (which cut long lines in every later test's ``caplog``).  Their ``logging.basicConfig`` adds
    nothing under pytest (the root has pytest's handlers), but a handler a test adds is removed
    all the same.  tests/test_process_state_restored.py shows the leaks and this undoing them."""
    loggers = {
        name: (lg.level, list(lg.handlers), list(lg.filters), lg.propagate)
        for name, lg in _loggers().items()
    }
    filters = {h: list(h.filters) for lg in _loggers().values() for h in lg.handlers}
    collector = (gc.get_threshold(), gc.isenabled(), gc.get_freeze_count())
    handlers = {signum: signal.getsignal(signum) for signum in _SIGNALS}
    try:
        yield
    finally:
        for name, logger in _loggers().items():
            level, kept, own_filters, propagate = loggers.get(name, (logging.NOTSET, [], [], True))
            for handler in list(logger.handlers):
                if handler in filters:
                    handler.filters[:] = filters[handler]
                elif handler not in kept and not type(handler).__module__.startswith("_pytest"):
                    logger.removeHandler(handler)
            logger.filters[:] = own_filters
            if logger.level != level:  # setLevel clears every logger's cache: only when needed
                logger.setLevel(level)
            logger.propagate = propagate
        threshold, enabled, frozen = collector
        if gc.get_freeze_count() > frozen:
            gc.unfreeze()
        gc.set_threshold(*threshold)
        (gc.enable if enabled else gc.disable)()
        for signum, handler in handlers.items():
            if signal.getsignal(signum) is not handler and handler is not None:
                signal.signal(signum, handler)
