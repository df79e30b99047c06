"""``affidavit serve``: run the broker as its own process behind a Unix socket (docs/deployment.md).

Runs until SIGTERM or SIGINT, then stops accepting, lets calls in flight finish within
``[service] shutdown_grace`` and exits 0 -- or 74 when a journal write never returned: the stop
is bounded (``affidavit.stopping.bound``, docs/deployment.md). Exit 2 when it cannot start: a
bad config, a journal another process writes, a live daemon already on the socket, group or
others able to reach the journal (its lock, its result segments), a key, the vault (its lock) or
a ``file:`` or ``systemd:`` credential (by its mode bits or its POSIX ACL's entries) or another
user owning one, or to write the config, a file that decides whom the broker trusts (a target's
``ca_file`` or ``known_hosts``, the auditor's public key) or a directory on the path to any of
them (FILES_EXPOSED, unless ``--allow-exposed-files``) -- the message says which; another user
able to change the config itself (its owner, a write bit, a directory above it) is refused by
every command that holds secrets, override or not (CONFIG_EXPOSED, ``api.trusted``).
Log lines go to stderr; none carries a secret (only ids, uids, codes and counts).  Under systemd,
when stderr is the journal's stream, each line starts with its syslog priority (``<2>`` for
CRITICAL): journald files it at that priority (``journalctl -p crit``).  The process
runs with umask 077: the files it creates are readable by its own user only; it writes no core
file (``affidavit.coredump``: the command line forbids them before this runs).
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO

from affidavit.cli import SECRETS_ALWAYS, UsageError, config_refusal, journal_refusal, refusal

if TYPE_CHECKING:
    from affidavit.journal import Exposure

__all__ = ["LOG_FORMAT", "add_commands", "log_handler"]

LOG_FORMAT = "%(asctime)s affidavit serve[%(process)d] %(levelname)s %(message)s"
PRIORITIES = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}
"""syslog's priority of each logging level (sd-daemon(3)'s ``<N>`` prefixes)."""


class _Prioritized(logging.Formatter):
    """A line that journald files at its level's priority (``SyslogLevelPrefix=``, on by
    default), not all at ``info``."""

    def format(self, record: logging.LogRecord) -> str:
        return f"<{PRIORITIES.get(record.levelno, 6)}>{super().format(record)}"


def log_handler(environ: Mapping[str, str], stream: TextIO) -> logging.Handler:
    """The daemon's log: ``stream`` (stderr), its lines prefixed with their priority when it is
    the journal's stream -- ``$JOURNAL_STREAM`` (systemd.exec(5)) names its device and inode;
    a stderr redirected elsewhere by the unit or a shell is not, and gets plain lines."""
    handler = logging.StreamHandler(stream)
    journal = environ.get("JOURNAL_STREAM", "")
    try:
        st = os.fstat(stream.fileno())
        to_journal = journal == f"{st.st_dev}:{st.st_ino}"
    except (OSError, ValueError, io.UnsupportedOperation):
        to_journal = False
    handler.setFormatter((_Prioritized if to_journal else logging.Formatter)(LOG_FORMAT))
    return handler


def add_commands(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the broker as a daemon on a Unix socket")
    p.add_argument("--config", help="config file (default: $AFFIDAVIT_CONFIG or ./affidavit.toml)")
    p.add_argument(
        "--socket", help="listen here (default: [service] socket, affidavit.sock beside the config)"
    )
    p.add_argument(
        "--console",
        metavar="HOST:PORT",
        help="also serve the operator console here (default: [service] console; loopback "
        "only unless [service] console_allow_remote)",
    )
    p.add_argument(
        "--allow-exposed-files",
        action="store_true",
        help="start even though group/others can reach the journal, a key, the vault or a "
        "file:/systemd: credential, or write a CA file, a known_hosts, the auditor's public "
        "key or a directory above one, or another user owns one (each is logged); default: "
        "refuse (FILES_EXPOSED). Never a config another user can change (CONFIG_EXPOSED)",
    )
    p.set_defaults(handler=_serve, holds_secrets=SECRETS_ALWAYS)


def _serve(args: argparse.Namespace) -> int:
    import functools

    import trio

    from affidavit.config import ConfigError, console_address, served_through_tls
    from affidavit.daemon import DaemonError, serve
    from affidavit.journal import JournalError

    # No core file of this process: ``affidavit.cli`` forbade them before this ran.
    # Everything the daemon creates -- journal, WAL, sealing key, lock -- is its user's alone
    # (0600); the socket is the one file others reach (0660, set where it is bound).
    os.umask(0o077)
    # Before the config: loading it logs what it allows but an operator should know.
    logging.basicConfig(level=logging.INFO, handlers=[log_handler(os.environ, sys.stderr)])
    from affidavit.api.trusted import load_trusted_config

    try:
        config = load_trusted_config(args.config)  # before FILES_EXPOSED: no override lifts it
    except ConfigError as exc:
        raise config_refusal(exc) from None
    except OSError as exc:
        raise UsageError(f"cannot read config: {exc.strerror}", "CONFIG_UNREADABLE") from None
    exposed = _refuse_exposed(config, allowed=args.allow_exposed_files)
    console = None
    if args.console is not None:
        try:
            console = console_address(args.console, config.service.console_allow_remote)
            served_through_tls(console[0], config.service.console_public_origin)
        except ValueError as exc:
            raise refusal(str(exc), "INVALID_FIELD", "--console") from None
    from affidavit.engine import tune_collector
    from affidavit.heap import keep_freed_buffers

    tune_collector()  # this process serves calls at concurrency: engine/collector.py
    heap_left = keep_freed_buffers()  # large results' read buffers reused: affidavit/heap.py
    for words in heap_left:
        logging.getLogger("affidavit.serve").warning("heap: %s", words)
    for words in _systemd_unready(config):
        logging.getLogger("affidavit.serve").warning("%s", words)
    try:
        # The exposures found above are the ones logged: a journal with thousands of result
        # segments is not listed and stat'ed twice at every start.
        start = functools.partial(
            serve, config, socket_path=args.socket, console=console, exposed=exposed, _cli=True
        )
        trio.run(start)
    except JournalError as exc:
        raise journal_refusal(exc) from None
    except DaemonError as exc:
        raise UsageError(str(exc), exc.code) from None
    return 0


def _systemd_unready(config: Any) -> list[str]:
    """What the start says of each ``systemd:`` credential it cannot find -- no
    ``$CREDENTIALS_DIRECTORY`` (the unit has no ``LoadCredential=``), or no such file in it --
    before a call fails on it (CREDENTIAL_MISSING).  Looked at, never read."""
    from affidavit.secrets.credentials import CredentialError, systemd_path

    said: list[str] = []
    for ref in sorted({t.credential for t in config.targets.values()}):
        kind, _, name = ref.partition(":")
        if kind != "systemd":
            continue
        try:
            path = systemd_path(ref, name)
        except CredentialError as exc:
            said.append(f"{exc.detail} (a call with it is refused: CREDENTIAL_MISSING)")
            continue
        if not os.path.lexists(path):
            said.append(
                f"{ref}: no file {path} in the unit's credentials directory: add "
                f"LoadCredential={name}:/path/to/the/file to the unit (a call with it is "
                "refused: CREDENTIAL_MISSING)"
            )
    return said


def _refuse_exposed(config: Any, *, allowed: bool) -> list[Exposure]:
    """Refuse to serve (FILES_EXPOSED, exit 2) while another user can reach or owns the journal,
    a key, the vault or a ``file:``/``systemd:`` credential, or can write the config, a file
    that decides whom the broker trusts (``exposed_files``) or a directory on the path to one of
    them -- the daemon is the boundary that keeps them from every other account
    (docs/deployment.md, "Files others can reach") -- naming each file and the command that
    mends it.  ``allowed`` (``--allow-exposed-files``): serve, and log
    each (``Broker.open``, which is handed the list this returns: what it found, so that the
    start looks once)."""
    from affidavit.api.broker import exposed_files
    from affidavit.journal.exposure import serving, summarised

    with serving():  # root here is the broker: told the chown to root, as any daemon its chown
        exposed = exposed_files(config)
        if not exposed or allowed:
            return exposed
        files = "; ".join(summarised(exposed))  # a results directory's many segments: one entry
    raise UsageError(  # one line, as every refusal (a newline would be shown escaped)
        f"another user can reach or owns the broker's files: {files} -- mend them, or start "
        "with --allow-exposed-files to serve anyway (each is then logged)",
        "FILES_EXPOSED",
    )
