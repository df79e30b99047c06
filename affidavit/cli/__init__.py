"""The ``affidavit`` command line.

Each sub-command lives in its own module exposing ``add_commands(subparsers)``; the module list
below is the only place that names them.  Every handler returns an exit status: 0 success,
1 the action answered with an error envelope (or a check failed), 2 usage or config error, or
the daemon could not be reached (message on stderr, never a traceback), 3 ``actions`` or
``sessions --socket`` printed only the page the daemon answered (``journal.TRUNCATED``).

Building the parser imports every command module, so their top level imports nothing heavy:
handlers import the engine, journal, config or trio when they run.  That keeps ``--help`` quick
and lets ``call|result|record|actions|sessions|metrics --socket PATH`` (or
``$AFFIDAVIT_SOCKET``) reach the daemon without loading any of them (tests/cli/).

Every command says whether it holds secrets (``holds_secrets`` among its parser's defaults:
``SECRETS_ALWAYS``, ``SECRETS_EMBEDDED`` or ``SECRETS_NONE``).  One that loads a credential, the
broker key, the signing key, an auditor's private key or the vault's key or values runs with
core dumps forbidden (``affidavit.coredump``), set here before its handler runs; a thin client
asking the daemon holds none and is left as it started (docs/deployment.md, "Core files").
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Sequence

TYPE_CHECKING = False  # not typing's: see affidavit/__init__.py

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any, BinaryIO, NoReturn, TypeVar

    from affidavit.api.wire import Response
    from affidavit.cli.stdin import InputReader

    T = TypeVar("T")

__all__ = [
    "COMMANDS",
    "COMMAND_HELP",
    "JSON_HELP",
    "SECRETS_ALWAYS",
    "SECRETS_EMBEDDED",
    "SECRETS_NONE",
    "ArgvRefused",
    "DaemonSocket",
    "UsageError",
    "add_socket_arg",
    "ascii_json_stdout",
    "ask_daemon",
    "config_refusal",
    "count_arg",
    "daemon_json",
    "daemon_refusal",
    "daemon_socket",
    "daemon_text",
    "journal_refusal",
    "main",
    "refusal",
    "stdin_bytes",
    "stdin_is_terminal",
    "text_arg",
    "time_arg",
]

COMMANDS: dict[str, str] = {
    "call": "affidavit.cli.call",
    "result": "affidavit.cli.call",
    "init": "affidavit.cli.call",
    "demo": "affidavit.cli.demo",
    "diagrams": "affidavit.cli.diagrams",
    "journal": "affidavit.cli.journal",
    "actions": "affidavit.cli.journal",
    "record": "affidavit.cli.journal",
    "sessions": "affidavit.cli.journal",
    "metrics": "affidavit.cli.journal",
    "mcp": "affidavit.cli.mcp",
    "operations": "affidavit.cli.operations",
    "operation": "affidavit.cli.operations",
    "approvals": "affidavit.cli.approvals",
    "reconcile": "affidavit.cli.approvals",
    "serve": "affidavit.cli.serve",
    "console-url": "affidavit.cli.console",
    "vault": "affidavit.cli.vault",
}
"""Each command and the module that declares it.  Running one command builds only its module's
parsers: all of them cost a start ~20-30 ms (argparse), a third of what a thin client may spend
in all.  tests/daemon/test_thin_client.py checks this map against what the modules declare."""
COMMAND_MODULES: tuple[str, ...] = tuple(dict.fromkeys(COMMANDS.values()))
COMMAND_HELP: dict[str, str] = {
    "call": "perform one action and print its envelope",
    "result": "print the stored envelope of an invocation (no re-run)",
    "init": "write a commented sample config and an empty journal",
    "demo": "run a scripted tour against a local server (no network)",
    "diagrams": "generate state diagrams and contract docs from the tables",
    "journal": "journal maintenance",
    "actions": "list actions with their phase, outcome and retry hint",
    "record": "one invocation's events and projected record",
    "sessions": "sessions with their action counts",
    "metrics": "invocation counts by phase and outcome (and by code), never merged",
    "mcp": "serve the broker as MCP tools over stdio",
    "operations": "list the jobs 202 responses accepted, with their state",
    "operation": "one job accepted by a 202",
    "approvals": "requests waiting for an operator; approve or deny one",
    "reconcile": "settle an unknown outcome: query the remote, or attest",
    "serve": "run the broker as a daemon on a Unix socket",
    "console-url": "print a one-time login link to the operator console (operators)",
    "vault": "manage the encrypted secrets vault",
}
"""Each command's line in ``affidavit --help``, as its module declares it: a command line that
names no command (``--help``, a typo) is answered from this list alone, importing no command
module -- all of them cost ``affidavit --help`` 15 ms with bytecode cached and ~90 ms without
(issue 15).  tests/daemon/test_thin_client.py checks it against what the modules declare."""

SECRETS_ALWAYS = "always"
"""``holds_secrets``: the command loads a credential or a key however it is run."""
JSON_HELP = (
    "machine-readable output; the text tables are for people (each cell escaped, quoted and "
    "cut to its column): a script reads --json, which has every value whole"
)
"""``--json``'s help on every command that prints a text table."""

SECRETS_EMBEDDED = "embedded"
"""``holds_secrets``: it does when run embedded; asking the daemon (``--socket`` or
``$AFFIDAVIT_SOCKET``) it holds none."""
SECRETS_NONE = "none"
"""``holds_secrets``: it loads no credential and no key (a read-only view, a public key)."""


class UsageError(Exception):
    """A usage or configuration problem: printed on stderr, exit status 2 -- after its stable
    ``code`` when it has one (``affidavit: CONFIG_INVALID: <file>: <field>: <message>``);
    ``field``: the option or field path to fix, when there is one, which its message then
    starts with, once (``with_field``): the plain line carries it as ``--json`` does.  Under
    ``--json`` it is also one ``{"api_error": {...}}`` object on stdout (``error_json``)."""

    def __init__(self, message: str, code: str | None = None, field: str | None = None) -> None:
        super().__init__(with_field(message, field))
        self.code = code
        self.field = field


def with_field(message: str, field: str | None) -> str:
    """``message`` led by the ``field`` it refuses, once: ``<field>: <message>``, unless it
    starts with the field already (``blind: ...``, ``--stream goes with --raw``) or names its
    own code and field first (``INVALID_FIELD at timeout: ...``) -- never twice."""
    if not field or _NAMES_ITS_CODE.match(message.removeprefix("action refused: ")):
        return message
    if message.startswith(field) and not _NAME_GOES_ON.match(message, len(field)):
        return message
    return f"{field}: {message}"


def refusal(message: str, code: str | None, field: str | None = None) -> UsageError:
    """A refusal with its stable ``code`` and the ``field`` path it names, in the one shape
    every command prints it in, embedded and through the daemon alike:
    ``affidavit: CODE: <field>: <message>`` (``with_field``).  A message that names its own
    code and field first (``INVALID_FIELD at timeout: ...``, ``action refused: INVALID_FIELD
    at action: ...``: the action's refusal, which the daemon answers HTTP 400 ``BAD_JSON``) is
    printed as it stands, as embedded, and carries the code and field it names."""
    named = _NAMES_ITS_CODE.match(message.removeprefix("action refused: "))
    if named:
        return UsageError(message, named[1], named[2])
    return UsageError(message, code, field)


_NAMES_ITS_CODE = re.compile(r"([A-Z][A-Z0-9_]*) at ([^ :]+): ")
_NAME_GOES_ON = re.compile(r"[\w.\[\]-]")
"""A character that would make a message's start a longer name than the field (``--key`` in
``--key-file``, ``timeout`` in ``timeouts.call``)."""


def error_json(message: str, code: str | None, field: str | None) -> dict[str, Any]:
    """A refusal under ``--json``: the daemon's own API error shape (``api_error_body``:
    ``code``, ``message``, ``field`` when there is one), so a script parses one shape whether
    the command ran embedded or asked the daemon.  The message is the stderr line's, without
    the field it starts with (given apart); a message naming its own code keeps its words.
    Every refusal has a code (tests/broker/test_cli_codes.py); one without would have
    ``"code": null``."""
    named = _NAMES_ITS_CODE.match(message.removeprefix("action refused: "))
    if named and code is None:
        code, field = named[1], named[2]
    if field and not named and message.startswith(f"{field}: "):
        message = message[len(field) + 2 :]
    error: dict[str, Any] = {"code": code, "message": message}
    if field is not None:
        error["field"] = field
    return {"api_error": error}


def stdin_bytes(message: str, code: str, field: str | None = None) -> InputReader | BinaryIO:
    """Stdin, read to the end of input (or the limit) whether fd 0 blocks or not
    (``affidavit.cli.stdin``); an in-memory ``sys.stdin`` (a program embedding ``main``, a
    test) has no descriptor to be non-blocking and is read as it is.  With none -- fd 0
    closed (``<&-``), when Python sets ``sys.stdin`` to None -- the refusal ``message`` with
    ``code`` (and ``field``), never the AttributeError traceback reading ``None.buffer`` was
    (rv45 finding 8)."""
    from affidavit.cli.stdin import InputReader

    if sys.stdin is None:
        raise refusal(message, code, field)
    try:
        fd = sys.stdin.fileno()
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        return sys.stdin.buffer
    return InputReader(fd)


def stdin_is_terminal() -> bool:
    """Whether stdin is a terminal to prompt on: False when fd 0 is closed (``stdin_bytes``)."""
    return sys.stdin is not None and sys.stdin.isatty()


def config_refusal(exc: Any, hint: str = "") -> UsageError:
    """A ``ConfigError`` as the command line reports it: its code, then ``<file>: <field
    path>: <message>`` (``hint``: what else the command accepts instead)."""
    return UsageError(f"{exc}{hint}", code=exc.code)


def journal_refusal(
    exc: BaseException, message: str | None = None, code: str | None = None
) -> UsageError:
    """A ``JournalError`` with its stable code: ``message`` and ``code`` are the command's own
    (a read's answer: ``read_failure``), else ``JOURNAL_LOCKED`` (the daemon owns it: ask it
    on its socket), ``JOURNAL_UNAVAILABLE`` (a shared journal's database is away: try again),
    ``JOURNAL_READ_DECLINED`` (the database declined a read this once: ``read_failure``'s words),
    ``JOURNAL_NOT_DURABLE`` (a shared journal's database would lose acknowledged commits in a
    crash: the message names the setting and the fix), ``JOURNAL_REPLACED`` (the SQLite file
    at the path is not the one this process writes: ``JournalReplaced``),
    ``SIGNING_RECORDS_REMOVED`` (a journal that looks from before signing but was written by
    a signing broker: ``SigningRecordsRemoved``, never adopted), ``JOURNAL_LOST`` (a SQLite
    file holding no journal beside its key files or segments: its -wal was lost,
    ``JournalLost``; no schema is made there) or
    ``JOURNAL_UNUSABLE`` (the file, its directory or a key cannot be used as this user: the
    message names it and the fix)."""
    from affidavit.journal import (
        JournalLocked,
        JournalLost,
        JournalNotDurable,
        JournalReplaced,
        JournalUnavailable,
        ReadFailed,
        SigningRecordsRemoved,
    )

    if code is None and message is None and isinstance(exc, ReadFailed):
        # Unread, not unusable: the same read may succeed (as every surface answers it).
        from affidavit.engine import read_failure

        _status, code, message = read_failure(exc, "the journal", operator=True)
    if code is None:
        if isinstance(exc, JournalLocked):
            code = "JOURNAL_LOCKED"
        elif isinstance(exc, JournalNotDurable):
            code = "JOURNAL_NOT_DURABLE"
        elif isinstance(exc, JournalReplaced):
            code = JournalReplaced.code
        elif isinstance(exc, JournalUnavailable):
            code = "JOURNAL_UNAVAILABLE"
        elif isinstance(exc, SigningRecordsRemoved):
            code = SigningRecordsRemoved.code
        elif isinstance(exc, JournalLost):
            code = JournalLost.code
        else:
            code = "JOURNAL_UNUSABLE"
    return UsageError(str(exc) if message is None else message, code=code)


def _stood(command: str) -> str:
    """What a command SIGTERM stopped may say was kept: a call's (``call``, ``operation poll``:
    its own invocation) where it stood, if it had begun -- stopped before the broker opened, or
    before it took the call, nothing is; any other (``init``, ``journal reclaim``,
    ``approvals``...) has no call of its own to speak of: only what it wrote."""
    if command in ("call", "operation"):
        return "if the call had begun, where it stood is recorded (affidavit actions lists it)"
    return f"what `affidavit {command}` had written to the journal is kept"


class Terminated(Exception):
    """SIGTERM stopped a command that uses the journal -- after it recorded where its call
    stood, if it had begun one (``call.run_journal``): exit status 143, as the signal's own
    would be.  Its text, if any, is what the command says was kept instead of ``_stood``'s
    (the demo's: whether its temporary journal was, and where)."""


def count_arg(value: str | None, what: str) -> int | None:
    """``value`` (an argv string) as a whole number from 0 to the journal's integer range, or
    a ``UsageError`` naming ``what`` -- never a traceback from deep in the database."""
    from affidavit.api.wire import parse_count

    return _parsed(value, what, parse_count)


def time_arg(value: str | None, what: str) -> float | None:
    """``value`` as epoch seconds or ISO 8601 (``wire.parse_time``), or a ``UsageError``."""
    from affidavit.api.wire import parse_time

    return _parsed(value, what, parse_time)


def timeout_arg(value: str | None) -> float | None:
    """``--timeout`` (``wire.parse_timeout``), or a ``UsageError`` in the daemon's words for
    ``?timeout=`` -- the same line embedded and through the socket."""
    from affidavit.api.wire import parse_timeout

    if value is None:
        return None
    try:
        return parse_timeout(value)
    except ValueError as exc:
        raise refusal(str(exc), "INVALID_FIELD") from None


def _parsed(value: str | None, what: str, parse: Callable[[str], T]) -> T | None:
    if value is None:
        return None
    try:
        return parse(value)
    except ValueError as exc:
        raise UsageError(f"{what}: {exc}", "INVALID_FIELD", what) from None


def text_arg(value: str | None, what: str) -> str | None:
    """``value`` if it is valid text.  argv bytes that are not UTF-8 arrive as lone surrogates
    (PEP 383); an identifier or filter holding one is refused here instead of failing with a
    UnicodeEncodeError traceback where SQLite binds it.  The value itself is not echoed."""
    if value is not None:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            field = what if what.startswith("--") else None  # an option, not "the invocation id"
            raise UsageError(f"{what} is not valid UTF-8 text", "INVALID_FIELD", field) from None
    return value


def add_socket_arg(p: argparse.ArgumentParser, *, inherited: bool = False) -> None:
    """``--socket`` and ``--daemon-uid``; ``inherited``: a sub-command's copy of its parent's,
    which leaves the parent's value alone when not given (argparse lets a sub-parser's default
    overwrite what was given before the sub-command's name)."""
    keep = argparse.SUPPRESS if inherited else None
    p.add_argument(
        "--socket",
        default=keep,
        help="ask the daemon on this socket (default: $AFFIDAVIT_SOCKET; neither: run embedded); "
        "it must be root's, yours or the daemon's user's (--daemon-uid)",
    )
    p.add_argument(
        "--daemon-uid",
        default=keep,
        metavar="UID",
        help="the uid or user name the daemon runs as, whose socket is then trusted (default: "
        "$AFFIDAVIT_DAEMON_UID; neither: only root's or yours)",
    )


class DaemonSocket:
    """Where to ask the daemon (``--socket``) and whom to trust there: ``uid``, its user
    named by ``--daemon-uid``, or None -- the one ``$AFFIDAVIT_DAEMON_UID`` names, if any.
    (A plain class: a thin client imports neither dataclasses nor typing.)"""

    __slots__ = ("path", "uid")

    def __init__(self, path: str, uid: int | None) -> None:
        self.path = path
        self.uid = uid


def daemon_socket(args: argparse.Namespace, *embedded_only: str) -> DaemonSocket | None:
    """The daemon's socket when this command should ask it (``--socket`` or
    ``$AFFIDAVIT_SOCKET``), else None.  An option only embedded use reads (``--config``,
    ``--journal``) beside a socket is refused rather than silently ignored, as is
    ``--daemon-uid`` without one; a ``--daemon-uid`` that is no uid and names no user is
    ``DAEMON_UID_INVALID``, before the socket is looked at."""
    from affidavit.api.wire import SOCKET_ENV, DaemonUidInvalid, parse_daemon_uid, socket_path

    path = socket_path(args.socket)
    named = getattr(args, "daemon_uid", None)
    if path is None:
        if named is not None:
            raise UsageError(
                "--daemon-uid names whose socket to trust: give the daemon's socket too "
                f"(--socket or ${SOCKET_ENV})",
                "INVALID_FIELD",
                "--daemon-uid",
            )
        return None
    for name in embedded_only:
        if getattr(args, name, None):
            raise UsageError(
                f"--{name} is for embedded use; the daemon at {path} has its own "
                f"(drop --socket or unset {SOCKET_ENV})",
                "INVALID_FIELD",
                f"--{name}",
            )
    try:
        uid = None if named is None else parse_daemon_uid(named, "--daemon-uid")
    except DaemonUidInvalid as exc:
        raise UsageError(str(exc), exc.code) from None
    return DaemonSocket(path, uid)


def ask_daemon(
    daemon: DaemonSocket,
    method: str,
    target: str,
    body: bytes | None = None,
    wait: float | None = None,
) -> Response:
    """One request to the daemon; no answer, or an API-level refusal, is a UsageError-style
    message (exit 2) -- an action's own error is an envelope, answered with HTTP 200.
    ``wait``: the seconds its answer may take (``blocking_request``)."""
    from affidavit.api.wire import ClientError, blocking_request

    try:
        response = blocking_request(daemon.path, method, target, body, daemon.uid, wait)
    except ClientError as exc:
        raise daemon_refusal(exc) from None
    return response


def daemon_refusal(exc: Exception) -> UsageError:
    """The daemon's refusal as the command line says it: an API refusal (``ApiError``) with
    its code and field path (``refusal``) -- the line the same refusal prints embedded; no
    answer in the client's words, with the code MCP gives it (``mcp.backends``): an unsafe
    socket was never asked (``DAEMON_SOCKET_UNSAFE``), nothing answers on it
    (``DAEMON_UNAVAILABLE``), the connection ended before a whole answer (``ANSWER_LOST``)."""
    from affidavit.api.wire import AnswerLost, ApiError, DaemonUnavailable

    if isinstance(exc, ApiError):
        return refusal(exc.message, exc.code, exc.field)
    code = getattr(exc, "code", None)
    if not isinstance(code, str):
        code = (
            "ANSWER_LOST"
            if isinstance(exc, AnswerLost)
            else "DAEMON_UNAVAILABLE"
            if isinstance(exc, DaemonUnavailable)
            else None
        )
    return UsageError(str(exc), code)


def daemon_json(response: Response) -> Any:
    """The JSON of a 200 answer; the daemon's refusal (``ApiError``) as a usage error."""
    from affidavit.api.wire import ClientError

    try:
        return response.json()
    except ClientError as exc:
        raise daemon_refusal(exc) from None


def daemon_text(response: Response) -> str:
    from affidavit.api.wire import ClientError

    try:
        return response.text()
    except ClientError as exc:
        raise daemon_refusal(exc) from None


class _Formatter(argparse.HelpFormatter):
    """argparse's own, told the terminal's width as ``shutil.get_terminal_size`` would find it
    ($COLUMNS, else stdout's terminal, else 80).  argparse builds a formatter for every argument
    it adds, and without a width each one imports shutil -- with zlib, bz2 and lzma, ~3 ms of
    a thin client's start."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24) -> None:
        try:
            columns = int(os.environ.get("COLUMNS", ""))
        except ValueError:
            columns = 0
        if columns <= 0:
            try:
                columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
            except (AttributeError, ValueError, OSError):
                columns = 0
        super().__init__(prog, indent_increment, max_help_position, (columns or 80) - 2)


class _Parser(argparse.ArgumentParser):
    """Every parser of the command line (sub-parsers take the parent's class) uses
    ``_Formatter``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """argparse's usage error (an unknown command or option, a missing argument, a value
        not among the choices), raised as ``ArgvRefused`` for ``main`` to print; its message
        one line: it echoes the arguments it refuses."""
        from affidavit.text import printable

        raise ArgvRefused(printable(message), self.format_usage())


class ArgvRefused(SystemExit):
    """argparse's refusal of the command line: ``INVALID_ARGUMENT``, exit status 2 as
    argparse's own (a ``SystemExit``, for a caller of ``parse_args``: its ``code`` is that
    status; the stable code is ``error_code``).  ``field``: the argument it names (``argument
    --since: ...``, ``arguments are required: ID``), if one; ``message`` starts with it.
    ``main`` prints the usage, then the refusal's line -- or, under ``--json``, the refusal as
    one ``api_error`` object instead of the usage."""

    error_code = "INVALID_ARGUMENT"

    def __init__(self, message: str, usage: str) -> None:
        super().__init__(2)
        named = _ARGPARSE_NAMES.fullmatch(message)
        self.field = named and (named[1] or named[2])
        self.message = message if named is None or named[1] is None else message[9:]
        self.usage = usage


_ARGPARSE_NAMES = re.compile(
    r"argument ([^ :]+(?:/[^ :]+)*): .*|the following arguments are required: ([^ ,]+)", re.S
)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``command`` (a key of ``COMMANDS``), only the parsers of
    the module that declares it -- what running that command needs."""
    parser, sub = _top()
    for name in (COMMANDS[command],) if command in COMMANDS else COMMAND_MODULES:
        importlib.import_module(name).add_commands(sub)
    return parser


def _listing_parser() -> argparse.ArgumentParser:
    """What ``build_parser()`` answers a command line naming no command with -- its help, or
    its refusal of an unknown command -- built from ``COMMAND_HELP`` alone: no command's
    module imported, nothing it could run."""
    parser, sub = _top()
    for name, words in COMMAND_HELP.items():
        sub.add_parser(name, help=words)
    return parser


def _top() -> tuple[argparse.ArgumentParser, Any]:
    """The ``affidavit`` parser and its (required) commands' action, to add commands to."""
    parser = _Parser(
        prog="affidavit",
        description="A secrets broker whose every error is backed by durable evidence.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    return parser, sub


class _Escaping:
    """A text stream written through ``affidavit.text.printable`` (line feeds and tabs kept):
    everything the command line prints -- tables, messages, argparse's errors, a config error
    naming a target, a refusal echoing an argument -- shows a control character, DEL, or a
    bidi or zero-width character as its escape (``\\u001b``), never to the terminal to act on.
    JSON output (``--json``, envelopes) passes unchanged: ``json.dumps``' default
    ``ensure_ascii`` writes everything outside printable ASCII -- C0, DEL, C1, U+2028/2029,
    bidi -- as ``\\uNNNN`` already.  Bytes written to ``.buffer`` are not text: ``result --raw``
    and ``approvals show --content`` refuse a terminal instead."""

    def __init__(self, stream: Any) -> None:
        from affidavit.text import printable  # light: it imports nothing at its top

        self._stream = stream
        self._printable = printable

    def write(self, text: str) -> int:
        self._stream.write(self._printable(text, keep="\n\t"))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def ascii_json_stdout() -> Any:
    """Standard output without the escaping (``_Escaping``), for a command writing ASCII JSON
    only -- ``ensure_ascii`` text, which holds no character the rule escapes -- in bulk:
    ``actions --json`` writes a million records' worth, and the rule's passes over every block
    cost ~10% of the command's time for nothing."""
    out = sys.stdout
    return out._stream if isinstance(out, _Escaping) else out


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; whatever it writes to stdout and stderr as text is escaped
    (``_Escaping``), then the streams are put back."""
    out, err = sys.stdout, sys.stderr
    if out is not None and err is not None:
        sys.stdout, sys.stderr = _Escaping(out), _Escaping(err)
    try:
        return _main(argv)
    finally:
        sys.stdout, sys.stderr = out, err


def _asks_daemon(args: argparse.Namespace) -> bool:
    """The command will ask the daemon (``daemon_socket``'s first test): it loads no config
    here, so it needs no handler showing the config's warnings (``logline``) -- nor
    ``logging``, which that handler imports: ~9 ms of a thin client's ~44 over a bare
    interpreter's start (issue 15)."""
    if not hasattr(args, "socket"):
        return False
    from affidavit.api.wire import socket_path

    return socket_path(args.socket) is not None


def _main(argv: Sequence[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    named = argv[0] if argv else None
    if named in COMMANDS:
        parser = build_parser(named)
    elif any(word in COMMANDS for word in argv):  # a command after an option: argparse's way
        parser = build_parser()
    else:  # no command at all: help, or the refusal naming the commands
        parser = _listing_parser()
    try:
        args = parser.parse_args(argv)
    except ArgvRefused as exc:
        wants_json = "--json" in argv[: argv.index("--") if "--" in argv else None]
        if not wants_json:
            sys.stderr.write(exc.usage)
        _complain(exc.message, exc.error_code, exc.field, argparse.Namespace(json=wants_json))
        return 2
    if _holds_secrets(args):
        _forbid_core_dumps()
    if not _asks_daemon(args):
        from .logline import show_logged_warnings

        show_logged_warnings()
    try:
        _refuse_passwords(args)
        status: int = args.handler(args)
    except UsageError as exc:
        _complain(str(exc), exc.code, exc.field, args)
        return 2
    except KeyboardInterrupt:
        return 130
    except Terminated as exc:
        print(f"affidavit: stopped by SIGTERM; {str(exc) or _stood(args.command)}", file=sys.stderr)
        return 143
    except BrokenPipeError:
        # The reader went away (`affidavit actions | head`): not our failure to report.
        # Point stdout at /dev/null so the interpreter's final flush cannot raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except OSError as exc:
        # A file the command needs (config, key, vault) cannot be used; never a traceback.
        where = f"{exc.filename}: " if exc.filename else ""
        _complain(f"{where}{exc.strerror or type(exc).__name__}", "FILE_UNUSABLE", None, args)
        return 2
    except Exception as exc:
        # An unusable journal (missing directory, a directory, read-only, disk full) is the
        # operator's to fix: one line naming the path; its messages never hold a payload.  Only
        # a command that imported the journal can raise one (a thin client never loads it).
        # So is a config refused where the broker opens (``Broker.open``: CONFIG_EXPOSED).
        schema = sys.modules.get("affidavit.schema")
        journal = sys.modules.get("affidavit.journal")
        if schema is not None and isinstance(exc, schema.ConfigError):
            refusal = config_refusal(exc)
        elif journal is None or not isinstance(exc, journal.JournalError):
            raise
        else:
            refusal = journal_refusal(exc)
        _complain(str(refusal), refusal.code, None, args)
        return 2
    return status


_URL_OPTIONS = (("journal", "--journal"), ("to", "--to"), ("journal_url", "--journal-url"))
"""The options that take a PostgreSQL journal's URL: (argparse dest, option)."""


def _refuse_passwords(args: argparse.Namespace) -> None:
    """A PostgreSQL URL with a password in it, given on the command line, is refused
    (INVALID_FIELD at the option; the message holds neither URL nor password): every local
    user -- an agent the broker serves included -- reads it in ``/proc/<pid>/cmdline``, and it
    writes the journal.  libpq reads the password from ``~/.pgpass`` (or ``$PGPASSFILE``) or
    ``$PGPASSWORD`` instead; the config's ``[journal] url`` may hold it (its file 0600)."""
    for dest, option in _URL_OPTIONS:
        value = getattr(args, dest, None)
        if not isinstance(value, str) or not value.startswith(("postgresql://", "postgres://")):
            continue
        from affidavit.journal.exposure import holds_password

        if holds_password(value):
            config = " or in the config file's [journal] url (chmod 600)"
            where = config if dest in ("journal", "journal_url") else ""
            raise UsageError(
                "a password in a URL on the command line is readable by every local user "
                "(/proc/<pid>/cmdline): give the URL without it and keep the password in "
                f"~/.pgpass (or the file $PGPASSFILE names) or $PGPASSWORD{where}",
                "INVALID_FIELD",
                option,
            )


def _holds_secrets(args: argparse.Namespace) -> bool:
    """Whether the command ``args`` runs will load a credential or a key: what its parser's
    ``holds_secrets`` says (a command that says nothing is taken to, the safe side), a
    ``SECRETS_EMBEDDED`` one only when no daemon socket is given (a thin client)."""
    holds = getattr(args, "holds_secrets", SECRETS_ALWAYS)
    if holds == SECRETS_EMBEDDED:
        from affidavit.api.wire import socket_path

        return socket_path(getattr(args, "socket", None)) is None
    return holds != SECRETS_NONE


def _forbid_core_dumps() -> None:
    """No core file of this process (``affidavit.coredump``), before the command reads a
    config or a key; what could not be done is a warning on stderr, and the command runs on."""
    from affidavit import coredump

    for words in coredump.forbid_core_dumps():
        print(f"affidavit: warning: core dumps: {words}", file=sys.stderr)


def _complain(message: str, code: str | None, field: str | None, args: argparse.Namespace) -> None:
    """An error message as one line on stderr, after its stable code if it has one and the
    message does not start by naming it (``CHUNK_OUT_OF_RANGE at from_chunk: ...``): it may
    echo an argument, a config key or a remote's words, so even a line feed in it is shown
    escaped (``\\n``), never a new line.  Under ``--json`` it is also one ``error_json``
    object on stdout, ASCII (``ensure_ascii`` escapes what ``printable`` would)."""
    from affidavit.text import printable

    if getattr(args, "json", False) is True:
        import json
        from contextlib import suppress

        with suppress(BrokenPipeError):  # the reader went away: stderr still says it
            print(json.dumps(error_json(message, code, field), sort_keys=True), flush=True)
    named = _NAMES_ITS_CODE.match(message.removeprefix("action refused: "))
    head = f"{code}: " if code and not (named and named[1] == code) else ""
    print(f"affidavit: {head}{printable(message)}", file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
