"""Every refusal of the command line carries a stable code, never a traceback: argparse's own
(an unknown option, a missing argument or value, a value not among the choices) is
``INVALID_ARGUMENT`` -- its usage text, then ``affidavit: INVALID_ARGUMENT: ...``; under
``--json`` one ``{"api_error": {...}}`` object on stdout instead of the usage -- exit status 2
as argparse's.  Each sub-command is walked with a bad option, each option that takes a value
without it and with a bad choice, each command with its required arguments left out (a bounded
list, built from the parser); then a refusal a handler makes of a bad value, one per command
family.  Before, argparse printed its usage with no code and ``--json`` got no JSON, and
``vault``, ``init``, ``journal`` ... refused with ``affidavit: <message>`` alone.  Every
refusal written in ``affidavit/cli`` names its code, and each code is in docs/configuration.md
(or the contract's table)."""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import affidavit.cli
from affidavit.cli import ArgvRefused, build_parser

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"affidavit: ([A-Z][A-Z0-9_]+)(?::| at) (.+)")  # "CODE at field: " names it
NOPE = "act_01J00000000000000000000000"


def _leaves(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """(command words, parser) of every parser, groups (``vault``, ``journal``) too."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _leaves(sub, (*path, name))


def _argv_cases() -> Iterator[tuple[tuple[str, ...], str | None]]:
    """(argv, the field the refusal names) -- argv without ``--json``."""
    for path, parser in _leaves(build_parser()):
        if not path:
            yield ("no-such-command",), "COMMAND"
            continue
        yield (*path, "--no-such-option"), None
        actions = parser._actions
        if any(a.required for a in actions):  # an argument, an option or a sub-command
            yield path, None  # left out
        for a in actions:
            if not a.option_strings or a.nargs in (0, "?"):  # a flag, --help, an optional value
                continue
            yield (*path, a.option_strings[-1]), a.option_strings[-1]  # no value
            if a.choices is not None:
                yield (*path, a.option_strings[-1], "no-such-choice"), a.option_strings[-1]


ARGV = list(_argv_cases())


def _main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = affidavit.cli.main(argv)
    return status, out.getvalue(), err.getvalue()


def test_the_walk_is_bounded_and_covers_every_command() -> None:
    commands = {argv[0] for argv, _ in ARGV}
    assert set(affidavit.cli.COMMANDS) <= commands
    assert 60 <= len(ARGV) <= 400, len(ARGV)


@pytest.mark.parametrize("argv, field", ARGV, ids=[" ".join(a) for a, _ in ARGV])
def test_argparse_refusals_carry_invalid_argument(argv: tuple[str, ...], field: str | None) -> None:
    # The parser alone first: a case that parses would run its handler here.
    with pytest.raises(ArgvRefused), contextlib.redirect_stdout(io.StringIO()):
        build_parser().parse_args(argv)
    status, out, err = _main(list(argv))
    assert (status, out) == (2, ""), (status, out, err)
    assert err.startswith("usage: affidavit") and "Traceback" not in err, err
    last = LINE.fullmatch(err.splitlines()[-1])
    assert last is not None and last[1] == "INVALID_ARGUMENT", err
    if field is not None:
        assert field in last[2], err
    status, out, err = _main([*argv, "--json"])
    assert status == 2 and "usage:" not in err, err  # no usage under --json
    assert err.count("\n") == 1 and err.startswith("affidavit: INVALID_ARGUMENT: "), err
    error = json.loads(out)["api_error"]
    assert error["code"] == "INVALID_ARGUMENT" and error["message"], error
    if field is not None:
        assert error.get("field") == field, error


def test_json_after_the_separator_is_an_argument_not_the_flag() -> None:
    status, out, err = _main(["record", "--", "--json", "extra"])
    assert (status, out) == (2, "") and err.startswith("usage: "), err


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("clicodes")
    done = _cli(tmp, "init", "--config", str(tmp / "affidavit.toml"))
    assert done.returncode == 0, done.stderr
    (tmp / "auditor.key").write_text("")
    return tmp


def _cli(cwd: Path, *argv: str, stdin: bytes | None = b"") -> subprocess.CompletedProcess[bytes]:
    """``stdin=None``: fd 0 closed (``<&-``: Python's ``sys.stdin`` is then None)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AFFIDAVIT_")}
    closed = ["sh", "-c", 'exec "$@" <&-', "sh"] if stdin is None else []
    return subprocess.run(
        [*closed, sys.executable, "-m", "affidavit", *argv],
        input=stdin,
        capture_output=True,
        cwd=cwd,
        env=env,
        timeout=60,
        check=False,
    )


PG = "postgresql://nobody@127.0.0.1:9/none"
CANARY = "pw-canary-5e1a"
PG_PASSWORD = f"postgresql://nobody:{CANARY}@127.0.0.1:9/none"
HANDLER_CASES: list[tuple[tuple[str, ...], str, str | None]] = [
    # (argv, code, field): a bad value a handler refuses (cwd: an `affidavit init` directory)
    (("init",), "FILE_EXISTS", None),
    (("init", "--config", "new.toml", "--journal-url", "mysql://x"), "INVALID_FIELD",
     "--journal-url"),
    (("actions", "--since", "bogus", "--json"), "INVALID_FIELD", "--since"),
    (("result", NOPE, "--from-chunk", "x"), "INVALID_FIELD", "--from-chunk"),
    (("call", "-", "--timeout", "0"), "INVALID_FIELD", "timeout"),
    (("serve", "--console", "not an address"), "INVALID_FIELD", "--console"),
    (("mcp", "--shutdown-grace", "soon"), "INVALID_FIELD", "--shutdown-grace"),
    (("console-url", "--json"), "CONSOLE_UNAVAILABLE", None),
    (("diagrams", "--root", "no-such-dir"), "INVALID_FIELD", "--root"),
    (("journal", "anchor"), "NO_CHECKPOINT", None),
    (("journal", "public-key", "--journal", PG), "INVALID_FIELD", "--signing-key"),
    (("journal", "open-sealed", NOPE, "--journal", PG), "INVALID_FIELD", "--key-file"),
    (("journal", "migrate", "--to", "sqlite.db"), "INVALID_FIELD", "--to"),
    # A URL's password on the command line: every local user reads /proc/<pid>/cmdline.
    (("journal", "migrate", "--to", PG_PASSWORD), "INVALID_FIELD", "--to"),
    (("journal", "verify", "--journal", PG_PASSWORD), "INVALID_FIELD", "--journal"),
    (("init", "--config", "new.toml", "--journal-url", PG_PASSWORD), "INVALID_FIELD",
     "--journal-url"),
    (("actions", "--journal", PG_PASSWORD.replace(":" + CANARY + "@", "@") + "?password="
      + CANARY), "INVALID_FIELD", "--journal"),
    (("journal", "audit-open", "--key", "auditor.key", "--seq", "1", "--json"), "INVALID_FIELD",
     "--public-key"),
    (("journal", "audit-keygen", "affidavit.toml", "new.pub"), "FILE_EXISTS", None),
    (("vault", "put", "not a name"), "INVALID_FIELD", "name"),
    (("vault", "init"), "PASSPHRASE_INVALID", None),  # no terminal, no stdin, no variable
    (("vault", "init", "--passphrase-stdin"), "PASSPHRASE_INVALID", None),  # empty
]  # fmt: skip


@pytest.mark.parametrize(
    "argv, code, field", HANDLER_CASES, ids=[" ".join(c[0]) for c in HANDLER_CASES]
)
def test_handler_refusals_carry_their_code(
    home: Path, argv: tuple[str, ...], code: str, field: str | None
) -> None:
    _assert_coded(_cli(home, *argv, stdin=b"\n"), argv, code, field)


CLOSED_STDIN_CASES: list[tuple[tuple[str, ...], str, str | None]] = [
    # (argv, code, field), run with stdin closed (`<&-`): each crashed reading None.buffer
    # or None.isatty() with a traceback (rv45 finding 8).
    (("vault", "put", "--vault", "open.vault", "x"), "INVALID_FIELD", "value"),
    (("vault", "init", "--vault", "new.vault"), "PASSPHRASE_INVALID", None),
    (("vault", "init", "--vault", "new.vault", "--passphrase-stdin"), "PASSPHRASE_INVALID",
     None),
    (("vault", "unlock", "--vault", "open.vault"), "PASSPHRASE_INVALID", None),
    (("vault", "unlock", "--vault", "open.vault", "--passphrase-stdin"), "PASSPHRASE_INVALID",
     None),
    (("call", "-"), "FILE_UNUSABLE", None),
    (("call", "--config", "affidavit.toml"), "FILE_UNUSABLE", None),  # the action defaults to -
]  # fmt: skip


@pytest.fixture(scope="module")
def open_vault(home: Path) -> Path:
    """An unlocked vault in ``home`` (``vault put`` reads the value only from one)."""
    from affidavit.secrets.vault import Vault

    vault = Vault.init(home / "open.vault", "pw", n_log2=10)
    vault.unlock("pw")
    return vault.path


@pytest.mark.parametrize(
    "argv, code, field", CLOSED_STDIN_CASES, ids=[" ".join(c[0]) for c in CLOSED_STDIN_CASES]
)
def test_a_closed_stdin_is_a_coded_refusal(
    home: Path, open_vault: Path, argv: tuple[str, ...], code: str, field: str | None
) -> None:
    _assert_coded(_cli(home, *argv, stdin=None), argv, code, field)
    assert not (home / "new.vault").exists()


UNREADABLE_STDIN_CASES: list[tuple[tuple[str, ...], str, str | None]] = [
    # (argv, code, field), run with an unconnected socket as stdin, which reading refuses
    # (EINVAL): each was `FILE_UNUSABLE: Invalid argument`, naming no field (re-review of
    # d446f96, finding 5).
    (("vault", "put", "--vault", "open.vault", "x"), "INVALID_FIELD", "value"),
    (("vault", "init", "--vault", "new.vault", "--passphrase-stdin"), "PASSPHRASE_INVALID",
     None),
    (("vault", "unlock", "--vault", "open.vault", "--passphrase-stdin"), "PASSPHRASE_INVALID",
     None),
]  # fmt: skip


@pytest.mark.parametrize(
    "argv, code, field",
    UNREADABLE_STDIN_CASES,
    ids=[" ".join(c[0]) for c in UNREADABLE_STDIN_CASES],
)
def test_an_unreadable_stdin_is_the_commands_own_refusal(
    home: Path, open_vault: Path, argv: tuple[str, ...], code: str, field: str | None
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AFFIDAVIT_")}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unconnected:
        done = subprocess.run(
            [sys.executable, "-m", "affidavit", *argv],
            stdin=unconnected.fileno(),
            capture_output=True,
            cwd=home,
            env=env,
            timeout=60,
            check=False,
        )
    _assert_coded(done, argv, code, field)
    assert b"stdin, which cannot be read: Invalid argument" in done.stderr, done.stderr
    assert not (home / "new.vault").exists()


def test_a_config_nested_too_deeply_is_a_coded_refusal(home: Path) -> None:
    """``zz = [[[[...`` 100,000 deep (under the 1 MiB cap) made tomllib raise RecursionError:
    a traceback at start; now the loader's CONFIG_INVALID line."""
    deep = home / "deep.toml"
    deep.write_text((home / "affidavit.toml").read_text() + "\nzz = " + "[" * 100_000 + "\n")
    done = _cli(home, "actions", "--config", str(deep))
    _assert_coded(done, ("actions",), "CONFIG_INVALID", "invalid TOML: nested too deeply")


def _assert_coded(
    done: subprocess.CompletedProcess[bytes], argv: tuple[str, ...], code: str, field: str | None
) -> None:
    """Exit status 2 and one line, ``affidavit: CODE: ...`` naming ``field``; under
    ``--json`` the same as an ``api_error`` on stdout, else nothing on stdout."""
    err = done.stderr.decode()
    assert done.returncode == 2 and "Traceback" not in err, err
    line = LINE.fullmatch(err.rstrip("\n"))
    assert line is not None and line[1] == code, err
    if field is not None:
        assert field in line[2], err
    assert CANARY not in err
    if "--json" in argv:
        error = json.loads(done.stdout)["api_error"]
        assert (error["code"], error.get("field")) == (code, field), error
    else:
        assert done.stdout == b"", done.stdout


def _documented() -> set[str]:
    docs = ROOT / "docs"
    text = (docs / "configuration.md").read_text() + (docs / "contract.md").read_text()
    # Every code a table row's first cell names (one row may name several: `A`, `B`, `C`).
    cells = re.findall(r"^\| ([^|]*) \|", text, re.M)
    return {code for cell in cells for code in re.findall(r"`([A-Z][A-Z0-9_]+)`", cell)}


def test_every_refusal_in_the_cli_names_a_documented_code() -> None:
    """``UsageError(message, code, ...)`` / ``refusal(message, code, ...)``: a code given
    (a literal one documented), never left out or None."""
    documented, bad = _documented(), []
    for path in sorted((ROOT / "affidavit" / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) in ("UsageError", "refusal")
            ):
                continue
            code = node.args[1] if len(node.args) > 1 else None
            code = code or next((k.value for k in node.keywords if k.arg == "code"), None)
            where = f"{path.name}:{node.lineno}"
            if code is None or (isinstance(code, ast.Constant) and code.value is None):
                bad.append(f"{where}: no code")
            elif isinstance(code, ast.Constant) and code.value not in documented:
                bad.append(f"{where}: {code.value} is not in docs/configuration.md")
    assert bad == []


def test_an_argv_refusal_is_still_argparses_exit_status_2() -> None:
    """``ArgvRefused`` is a ``SystemExit`` for a caller of ``parse_args``: its ``code`` is the
    exit status 2, as argparse's own -- the stable code is ``error_code`` (a class attribute
    ``code`` shadowed the status: an uncaught refusal exited 1, printing only the code)."""
    with pytest.raises(ArgvRefused) as caught, contextlib.redirect_stdout(io.StringIO()):
        build_parser().parse_args(["no-such-command"])
    assert caught.value.code == 2
    assert caught.value.error_code == "INVALID_ARGUMENT"
    run = subprocess.run(
        [sys.executable, "-c", "from affidavit.cli import build_parser\n"
         "build_parser().parse_args(['no-such-command'])"],
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 2, run


FIELD_CASES: list[tuple[tuple[str, ...], str, str]] = [
    *((argv, code, field) for argv, code, field in HANDLER_CASES if field is not None),
    # A ``UsageError(field=...)`` raised directly, its message not led by the field: the line
    # used to drop it (only ``--json`` had it).
    (("reconcile", NOPE, "--attest", "committed"), "NOTE_REQUIRED", "--note"),
    # An ``OperationError``'s field, passed on (it was dropped: the line had the code alone).
    (("operation", "poll", "op_" + NOPE.removeprefix("act_")), "OPERATION_ERROR",
     "operation_id"),
    (("journal", "audit-open", "--key", "auditor.key", "--seq", "1"), "INVALID_FIELD",
     "--public-key"),
    # Led by the field already: never twice.
    (("result", NOPE, "--stream", "body"), "INVALID_FIELD", "--stream"),
    # Outside the checkout (the module's directory), and --svg into the checkout's diagrams.
    (("diagrams",), "INVALID_FIELD", "--root"),
    (("diagrams", "--root", str(ROOT), "--svg", str(ROOT / "diagrams")), "INVALID_FIELD",
     "--svg"),
]  # fmt: skip


def _takes_json(argv: tuple[str, ...]) -> bool:
    """Whether the command ``argv`` names has a ``--json`` option."""
    leaves = dict(_leaves(build_parser()))
    words = next(p for n in range(len(argv), 0, -1) if (p := argv[:n]) in leaves)
    return any("--json" in a.option_strings for a in leaves[words]._actions)


@pytest.mark.parametrize(
    "argv, code, field", FIELD_CASES, ids=[" ".join(c[0]) for c in FIELD_CASES]
)
def test_the_plain_line_carries_the_field_once_as_json_does(
    home: Path, argv: tuple[str, ...], code: str, field: str
) -> None:
    """``affidavit: CODE: <field>: <message>`` (docs/configuration.md), where ``--json`` gives
    the code, the field and the message apart -- the field once: not added to a message that
    starts with it, nor named again by the message (``--note: --attest needs a --note ...``
    read it twice)."""
    bare = tuple(a for a in argv if a != "--json")
    plain = _cli(home, *bare, stdin=b"\n")
    line = plain.stderr.decode()
    assert plain.returncode == 2, line
    if line.startswith(f"affidavit: {code} at {field}: "):  # the message names both itself
        return
    assert line.startswith(f"affidavit: {code}: "), line
    rest = line.removeprefix(f"affidavit: {code}: ").rstrip("\n")
    assert rest.startswith(field) and not rest.startswith(f"{field}: {field}"), line
    assert not re.search(rf"(?<![\w-]){re.escape(field)}(?![\w-])", rest[len(field) :]), line
    if _takes_json(bare):
        as_json = _cli(home, *bare, "--json", stdin=b"\n")
        error = json.loads(as_json.stdout)["api_error"]
        assert (error["code"], error.get("field")) == (code, field), error
        message = error["message"]
        led = message if message.startswith(field) else f"{field}: {message}"
        assert line == f"affidavit: {code}: {led}\n", (line, error)
