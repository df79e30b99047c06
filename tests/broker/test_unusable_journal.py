"""An unusable journal -- a missing directory, a directory, a read-only file or directory, a
full disk -- is exit 2 with one line naming the path, for every command that opens it; and no
view prints a raw control character to a terminal (issue 9, item 4).

Read-only cases need the permission bits to apply: as root the child drops
CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from its bounding set first (``prctl``), so root
honours them like any owner (no other user could start this interpreter).  The full disk is
a file size limit (``RLIMIT_FSIZE``) in the child: writing past it fails with EFBIG, as a full
disk fails with ENOSPC, and needs no privilege.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from affidavit.journal import Journal
from affidavit.statemachine import Event, EventKind
from tests.daemon.kit import AT_ONCE

from .helpers import TOKEN_ENV, http_target, write_config

LIMIT = 60
ACTION = json.dumps({"target": "api", "method": "GET", "path": "/x"}).encode()
COMMANDS: list[list[str]] = [
    ["call"],
    ["result", "act_0000000000000000000000000"],
    ["record", "act_0000000000000000000000000"],
    ["actions"],
    ["sessions"],
    ["metrics"],
    ["journal", "verify"],
]
PR_CAPBSET_DROP = 24
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2


def _run(
    args: list[str], cfg: Path, *, stdin: bytes = ACTION, preexec: Callable[[], None] | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "affidavit", *args, "--config", str(cfg)],
        input=stdin,
        capture_output=True,
        env={**os.environ, TOKEN_ENV: "tok-unusable-journal"},
        timeout=LIMIT,
        check=False,
        preexec_fn=preexec,
    )


def _run_all(
    commands: list[list[str]],
    cfg: Path,
    *,
    stdin: bytes = ACTION,
    preexec: Callable[[], None] | None = None,
) -> list[subprocess.CompletedProcess[bytes]]:
    """``_run`` each of ``commands`` (independent: none can change the journal they fail on,
    or they only read it) a few at a time -- their Python start-ups overlap: results in order.
    With a ``preexec`` one at a time: a ``preexec_fn`` is not safe to start from several threads
    (the child runs Python code between fork and exec, and another thread's lock may be held)."""
    if preexec is not None:
        return [_run(a, cfg, stdin=stdin, preexec=preexec) for a in commands]
    with ThreadPoolExecutor(AT_ONCE) as pool:
        return list(pool.map(lambda a: _run(a, cfg, stdin=stdin, preexec=preexec), commands))


def _one_line_naming(p: subprocess.CompletedProcess[bytes], path: Path) -> str:
    assert b"Traceback" not in p.stderr, p.stderr.decode()
    line = p.stderr.decode()
    assert line.count("\n") == 1 and line.startswith("affidavit: "), line
    assert str(path) in line, line
    return line


def _config(tmp: Path, journal: Path) -> Path:
    cfg = write_config(tmp, {"api": http_target("http://127.0.0.1:9")})
    text = cfg.read_text().replace(str(tmp / "journal.db"), str(journal))
    cfg.write_text(text)
    return cfg


@pytest.mark.parametrize("case", ["missing directory", "a directory"])
def test_a_journal_path_that_cannot_be_a_journal_is_exit_2_naming_it(
    tmp_path: Path, case: str
) -> None:
    journal = tmp_path / "nope" / "journal.db" if case == "missing directory" else tmp_path / "d"
    if case == "a directory":
        journal.mkdir()
    cfg = _config(tmp_path, journal)
    for args, p in zip(COMMANDS, _run_all(COMMANDS, cfg), strict=True):
        assert p.returncode == 2, (args, p.stderr)
        assert p.stdout == b""
        _one_line_naming(p, journal)


def test_init_with_an_unusable_journal_path_is_exit_2_naming_it(tmp_path: Path) -> None:
    (tmp_path / "affidavit.db").mkdir()  # where the sample config puts the journal
    p = _run(["init"], tmp_path / "affidavit.toml", stdin=b"")
    assert p.returncode == 2, p.stderr
    _one_line_naming(p, tmp_path / "affidavit.db")


def _honour_permissions() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes a root child obey permission bits (None when not root)."""
    if os.geteuid() != 0:
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    def drop() -> None:
        for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
            if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")

    return drop


@pytest.mark.parametrize("where", ["file", "directory"])
def test_a_read_only_journal_is_exit_2_for_a_call_and_readable_for_the_views(
    tmp_path: Path, where: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    journal = home / "journal.db"
    cfg = _config(tmp_path, journal)
    assert _run(["call"], cfg).returncode == 1  # connection refused: one recorded call
    # Read-only to their owner and closed to others (a mode others could read is a warning
    # line of its own: journal/exposure.py).
    for f in home.iterdir():
        os.chmod(f, 0o600 if where == "directory" else 0o400)
    os.chmod(home, 0o500 if where == "directory" else 0o700)
    preexec = _honour_permissions()
    try:
        _check_read_only(cfg, journal, preexec)
    finally:
        os.chmod(home, 0o700)
        for f in home.iterdir():
            os.chmod(f, 0o600)


def _check_read_only(cfg: Path, journal: Path, preexec: Callable[[], None] | None) -> None:
    for args, p in zip(COMMANDS, _run_all(COMMANDS, cfg, preexec=preexec), strict=True):
        assert b"Traceback" not in p.stderr, (args, p.stderr.decode())
        if args[0] in ("call", "result"):
            # They write (a call's record; a result read closes a stale record): refused.
            assert p.returncode == 2, (args, p.stderr)
            line = _one_line_naming(p, journal)
            assert any(w in line for w in ("read-only", "readonly", "Permission denied")), line
            # A stable code and the fix: the directory, or another journal ([journal] path).
            assert line.startswith(
                ("affidavit: JOURNAL_UNUSABLE: ", "affidavit: JOURNAL_UNREADABLE: ")
            ), line
            assert "[journal] path or --journal" in line, line
        else:
            assert p.returncode in (0, 2), (args, p.stderr)  # "no invocation act_0…" is 2


def test_a_full_disk_is_exit_2_naming_the_journal_and_the_next_call_answers_too(
    tmp_path: Path,
) -> None:
    cfg = _config(tmp_path, tmp_path / "journal.db")
    assert _run(["call"], cfg).returncode == 1
    sizes = [f.stat().st_size for f in tmp_path.glob("journal.db*")]
    limit = max(sizes) + 512  # room for nothing more than a page

    def full() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    for _ in range(2):  # the call after a disk-full write error answers just as cleanly
        p = _run(["call"], cfg, preexec=full)
        assert b"Traceback" not in p.stderr, p.stderr.decode()
        if p.returncode == 2:
            _one_line_naming(p, tmp_path / "journal.db")
        else:  # some of it was durable: an envelope rendered from the record
            assert p.returncode == 1 and "error" in json.loads(p.stdout)


# --- views never print raw control characters ------------------------------------------------


async def test_views_escape_control_characters_from_the_journal(tmp_path: Path) -> None:
    """Whoever could write the journal (or an older broker) may have left an ESC sequence, a CR
    or a bidi override in a session, an id or a message: the text views escape them."""
    evil = "\x1b[2J\rOK\u202e\x07"
    iid = "act_" + evil
    async with Journal.open(tmp_path / "journal.db") as j:
        op = {"target": "api", "protocol": "http", "idempotent": False, "fingerprint": None}
        await j.append(Event(EventKind.ACTION_ACCEPTED, iid, {"operation": op, "session": evil}))
        await j.append(
            Event(EventKind.PREFLIGHT_FAILED, iid, {"code": "INVALID_FIELD", "message": evil}),
            barrier=True,
        )
    cfg = _config(tmp_path, tmp_path / "journal.db")
    views = [["actions"], ["sessions"], ["record", iid]]
    for args, p in zip(views, _run_all(views, cfg, stdin=b""), strict=True):
        assert p.returncode == 0, (args, p.stderr)
        out = p.stdout.decode()
        for raw in ("\x1b", "\r", "\u202e", "\x07"):
            assert raw not in out, (args, out)
        assert "\\x1b[2J\\x0dOK\\u202e\\x07" in out or "\\u001b" in out, (args, out)
