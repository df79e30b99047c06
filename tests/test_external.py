"""The rule for tests that need an external program (tests/external.py): skipped with the
reason ``<package> not installed`` when it is missing, a failure instead when
``AFFIDAVIT_REQUIRE_PROGRAMS=1`` (what CI sets), so CI can never lose a real peer silently."""

from __future__ import annotations

import ast
import errno
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from tests import external
from tests.external import (
    HIDE_ENV,
    IN_USE,
    PORT_ATTEMPTS,
    PROGRAMS,
    REQUIRE_ENV,
    PortTaken,
    Program,
    ProgramFailed,
    listening,
    on_free_port,
    on_free_port_async,
)

ROOT = Path(__file__).resolve().parents[1]
PYTHON = Path(sys.executable)

MISSING_PROGRAM_TEST = """
from tests.external import Program

def test_needs_it():
    Program("affidavit-no-such-program", "no-such-package").require()
"""


def _pytest(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """pytest in a child process, with the environment the rule reads set or cleared."""
    full = {k: v for k, v in os.environ.items() if k not in (REQUIRE_ENV, HIDE_ENV)}
    full.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "0", "-q", "-rsfE", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def missing_program_test(tmp_path: Path) -> Path:
    (tmp_path / "test_needs_program.py").write_text(MISSING_PROGRAM_TEST)
    return tmp_path


@pytest.mark.parametrize("require", ["", "0"])
def test_a_missing_program_skips_with_the_package_named(
    missing_program_test: Path, require: str
) -> None:
    proc = _pytest([], missing_program_test, **{REQUIRE_ENV: require})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 skipped" in proc.stdout
    assert "no-such-package not installed" in proc.stdout


def test_with_require_programs_a_missing_program_fails(missing_program_test: Path) -> None:
    proc = _pytest([], missing_program_test, **{REQUIRE_ENV: "1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 failed" in proc.stdout and "skipped" not in proc.stdout
    assert (
        f"no-such-package not installed (affidavit-no-such-program not found; {REQUIRE_ENV}=1"
        in (proc.stdout)
    )


def test_a_program_is_found_on_path_or_in_its_extra_dirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = Program(PYTHON.name, "python3", dirs=(str(PYTHON.parent),))
    monkeypatch.setenv("PATH", str(tmp_path))  # not on PATH: found in its own dirs (sbin)
    assert python.find() == str(PYTHON)
    assert python.require() == str(PYTHON)
    assert Program(PYTHON.name, "python3").find() is None


def test_a_hidden_program_counts_as_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = Program(PYTHON.name, "python3", dirs=(str(PYTHON.parent),))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv(HIDE_ENV, f"dot, {PYTHON.name}")
    assert python.find() is None
    monkeypatch.setenv(HIDE_ENV, "dot")
    assert python.find() == str(PYTHON)


SSHD_TEST = (
    "tests/ssh/test_sshd.py::test_exit_status_zero_is_committed_success_with_separate_streams"
)


def test_the_real_sshd_tests_skip_without_openssh_server_and_fail_when_required() -> None:
    # The fixture every real-OpenSSH test uses, on a machine without sshd (hidden here).
    skipped = _pytest([SSHD_TEST], ROOT, **{HIDE_ENV: "sshd"})
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert "1 skipped" in skipped.stdout
    assert "openssh-server not installed" in skipped.stdout
    required = _pytest([SSHD_TEST], ROOT, **{HIDE_ENV: "sshd", REQUIRE_ENV: "1"})
    assert required.returncode == 1, required.stdout + required.stderr
    assert "1 error" in required.stdout and "skipped" not in required.stdout
    assert f"openssh-server not installed (sshd not found; {REQUIRE_ENV}=1" in required.stdout


PG_TEST = "tests/journal/conformance/test_store.py::test_attrs_that_are_not_json_are_a_clear_error"


def test_the_postgresql_tests_skip_without_the_server_and_fail_when_required() -> None:
    """Debian's server lives off PATH (/usr/lib/postgresql/N/bin) and is searched there only."""
    skipped = _pytest([f"{PG_TEST}[postgresql]"], ROOT, **{HIDE_ENV: "postgres"})
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert "1 skipped" in skipped.stdout and "postgresql not installed" in skipped.stdout
    required = _pytest([f"{PG_TEST}[postgresql]"], ROOT, **{HIDE_ENV: "postgres", REQUIRE_ENV: "1"})
    assert required.returncode == 1, required.stdout + required.stderr
    assert f"postgresql not installed (postgres not found; {REQUIRE_ENV}=1" in required.stdout


def test_a_program_searched_in_its_dirs_only_ignores_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(PYTHON.parent))  # on PATH, but not where it is looked for
    only = Program(PYTHON.name, "python3", dirs=(str(tmp_path),), only_dirs=True)
    assert only.find() is None
    assert Program(PYTHON.name, "python3", dirs=(str(PYTHON.parent),), only_dirs=True).find()


def test_ci_installs_every_program_and_forbids_the_skip() -> None:
    lines = (ROOT / ".ci" / "run").read_text().replace("\\\n", " ").splitlines()
    install = next(ln for ln in lines if "apt-get install" in ln)
    assert {p.package for p in PROGRAMS} <= set(install.split())
    pytest_line = lines.index("python3 -m pytest")
    assert f"export {REQUIRE_ENV}=1" in lines[:pytest_line]


def _skips_or_fails(
    monkeypatch: pytest.MonkeyPatch,
    check: Callable[[], object],
    skipped: str,
    failed: str | None = None,
) -> None:
    """The rule of every ``require_*``: ``check`` skips saying ``skipped`` without
    ``REQUIRE_ENV``, and fails saying ``failed`` (by default the same) with it."""
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match=skipped):
        check()
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=skipped if failed is None else failed):
        check()


def test_a_test_needing_root_skips_with_the_reason_or_fails_when_required(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The daemon's other-uid tests need root to switch uid: the same rule as a program."""
    from tests.external import require_root

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    _skips_or_fails(monkeypatch, require_root, "needs root to switch uid")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    require_root()  # root: nothing to skip


def test_a_host_without_a_boot_clock_skips_with_the_reason_or_fails_when_required(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The key-age tests by the boot clock (``journal/boot.py``): the same rule, a kernel
    feature for a program."""
    import time

    from tests.external import require_boot_clock

    require_boot_clock()  # (this host: Linux, nothing to skip)
    monkeypatch.delattr(time, "CLOCK_BOOTTIME", raising=False)
    _skips_or_fails(monkeypatch, require_boot_clock, "needs CLOCK_BOOTTIME")


def test_a_missing_python_package_of_an_extra_skips_or_fails_by_the_same_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.external import require_module

    _skips_or_fails(
        monkeypatch,
        lambda: require_module("affidavit_no_such_module", "dev"),
        "affidavit_no_such_module not installed",
        rf"pip install -e '\.\[dev\]'.*{REQUIRE_ENV}",
    )
    require_module("trio", "dev")  # installed: nothing to skip


SKIPS = {"skip", "skipif", "importorskip"}


def _skips(path: Path) -> list[str]:
    """Where a test module skips on its own (``pytest.skip``, ``pytest.importorskip``,
    ``pytest.mark.skip``/``skipif``) instead of through tests/external.py's rule."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in SKIPS:
            base = node.value
            if isinstance(base, ast.Attribute) and base.attr == "mark":
                base = base.value
            if isinstance(base, ast.Name) and base.id == "pytest":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: pytest...{node.attr}")
    return found


def test_every_skip_goes_through_the_rule_that_ci_turns_into_a_failure() -> None:
    """A skip of its own (``pytest.importorskip("mcp")``) would pass silently in CI, where
    ``AFFIDAVIT_REQUIRE_PROGRAMS=1`` must turn every missing dependency into a failure."""
    mine = {ROOT / "tests" / "external.py", Path(__file__).resolve()}
    found = [s for p in sorted((ROOT / "tests").rglob("*.py")) if p not in mine for s in _skips(p)]
    assert found == []


def test_a_test_needing_posix_acls_skips_with_the_reason_or_fails_when_required(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The ACL exposure tests set ``system.posix_acl_access``: a file system without ACLs (or
    a platform without extended attributes) skips them by the same rule as a program."""
    from affidavit.acl import GROUP_OBJ, OTHER, USER_OBJ, access_entries
    from tests.external import require_posix_acl

    path = tmp_path / "f"
    path.write_bytes(b"")

    def unsupported(*args: object) -> None:
        raise OSError(errno.ENOTSUP, "Operation not supported")

    base = ((USER_OBJ, 6, 0), (GROUP_OBJ, 0, 0), (OTHER, 0, 0))
    with monkeypatch.context() as m:
        m.setattr(os, "setxattr", unsupported)
        _skips_or_fails(m, lambda: require_posix_acl(path, *base), "needs POSIX ACL support")
    require_posix_acl(path, *base)  # this machine's /tmp takes them (CI's too)
    assert access_entries(path) in (None, ())  # a minimal ACL is the mode bits: none kept


# -- listening: a server of our own on a free port ----------------------------------------------

SERVER = """
import os, socket, sys
open(sys.argv[2], "a").write(f"{os.getpid()}\\n")
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
while True:
    c, _ = s.accept()
    c.sendall(str(os.getpid()).encode())
    c.close()
"""
"""A server on the port it is given (EADDRINUSE when it is taken); it answers with its pid and
notes it in a file first."""

NO_LISTENER = """
import os, sys, time
open(sys.argv[2], "a").write(f"{os.getpid()}\\n")
time.sleep(60)
"""
"""A program that lives and never listens."""


def _started(pids: Path) -> list[int]:
    return [int(line) for line in pids.read_text().split()] if pids.exists() else []


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_port_another_listener_took_is_not_our_servers_start_it_starts_on_another(
    tmp_path: Path, taken_port: int
) -> None:
    pids, given = tmp_path / "pids", []

    def argv_at(port: int) -> list[str]:
        given.append(port)
        return [sys.executable, "-c", SERVER, str(port), str(pids)]

    with listening(argv_at, tmp_path / "log", start_wait=20) as served:
        assert given[0] == taken_port and served.port == given[-1] != taken_port
        with socket.create_connection(("127.0.0.1", served.port), timeout=5) as c:
            assert c.recv(64) == str(served.proc.pid).encode()  # ours, not the other's
        first, *_, last = _started(pids)
        assert _gone(first) and last == served.proc.pid  # the first exited: address in use
    assert served.proc.poll() is not None


def test_a_descriptor_closed_while_it_is_read_is_not_a_held_socket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A program starting up closes descriptors between the listing of ``/proc/<pid>/fd`` and
    their ``readlink``: it does not hold them -- not "cannot tell", which ``_owns`` takes as
    ours (CI once counted a server that was about to fail with EADDRINUSE as started)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        inodes = external.listeners(s.getsockname()[1])
        assert inodes and external.holds(os.getpid(), inodes) is True
        real = os.readlink

        def closing(path: object) -> str:
            if str(path).endswith(f"/{s.fileno()}"):
                raise FileNotFoundError(path)
            return real(path)  # type: ignore[arg-type]

        monkeypatch.setattr(external.os, "readlink", closing)
        assert external.holds(os.getpid(), inodes) is False
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    assert external.holds(gone.pid, inodes) is False  # reaped: holds nothing


def test_a_live_program_while_another_holds_its_port_never_counts_as_started(
    tmp_path: Path, taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The port answers -- another's socket -- and our program lives: not a start.  After
    ``start_wait`` on each of ``attempts`` ports: ``PortTaken``, every program stopped."""
    monkeypatch.setattr(external, "free_port", lambda: taken_port)  # every time
    pids = tmp_path / "pids"

    def argv_at(port: int) -> list[str]:
        return [sys.executable, "-c", NO_LISTENER, str(port), str(pids)]

    taken = f"did not listen in 0.5 s, another process on {taken_port}"
    with (
        pytest.raises(PortTaken, match=taken),
        listening(argv_at, tmp_path / "log", start_wait=0.5, attempts=2),
    ):
        pytest.fail("another process's socket counted as our server's start")
    started = _started(pids)
    assert len(started) == 2 and all(_gone(pid) for pid in started)


def test_a_program_that_exits_with_its_port_free_fails_at_once_with_its_log(
    tmp_path: Path,
) -> None:
    """Nobody else on the port: the program's own failure, not a taken port -- not retried."""
    runs = tmp_path / "runs"

    def argv_at(port: int) -> list[str]:
        with runs.open("a") as f:
            f.write(f"{port}\n")
        return [sys.executable, "-c", "import sys; sys.exit('bad config line 3')"]

    with (
        pytest.raises(ProgramFailed, match=r"exited, nothing on .*bad config line 3") as failed,
        listening(argv_at, tmp_path / "log", start_wait=20),
    ):
        pytest.fail("an exited program counted as started")
    assert not isinstance(failed.value, PortTaken)
    assert len(runs.read_text().split()) == 1


def _bound(port: int) -> socket.socket:
    """A listener of ours on ``port``: the kernel's own ``Address already in use`` if taken."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        raise
    s.listen()
    return s


def test_a_start_that_finds_its_port_taken_is_made_again_on_another(taken_port: int) -> None:
    mine, port = on_free_port(_bound)
    with mine:
        assert port != taken_port and mine.getsockname()[1] == port


async def test_an_awaited_start_that_finds_its_port_taken_is_made_again_on_another(
    taken_port: int,
) -> None:
    tried: list[int] = []

    async def start(port: int) -> socket.socket:
        tried.append(port)
        await trio.sleep(0)
        return _bound(port)

    mine, port = await on_free_port_async(start)
    with mine:
        assert tried == [taken_port, port] and port != taken_port


async def test_a_start_failing_for_another_reason_is_not_made_again() -> None:
    tried: list[int] = []

    def start(port: int) -> None:
        tried.append(port)
        raise ChildProcessError("bad config line 3")

    async def start_awaited(port: int) -> None:
        start(port)

    with pytest.raises(ChildProcessError, match="bad config line 3"):
        on_free_port(start)
    with pytest.raises(ChildProcessError, match="bad config line 3"):
        await on_free_port_async(start_awaited)
    assert len(tried) == 2  # once each


async def test_a_port_taken_every_time_fails_after_the_bounded_attempts(
    taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(external, "free_port", lambda: taken_port)  # every time
    tried: list[int] = []

    async def start(port: int) -> socket.socket:
        tried.append(port)
        return _bound(port)

    with pytest.raises(OSError, match=IN_USE):
        await on_free_port_async(start)
    with pytest.raises(OSError, match=IN_USE):
        on_free_port(_bound, attempts=2)
    assert tried == [taken_port] * PORT_ATTEMPTS
