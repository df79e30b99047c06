"""Journal views on the command line: ``affidavit actions``, ``affidavit record ID``,
``affidavit sessions`` and ``affidavit metrics`` (each with ``--json`` where it prints data) --
and the ``journal`` maintenance group, declared here and written in ``maintenance.py``
(``verify|anchor|public-key|migrate|audit-keygen|audit-open``), ``reclaim.py`` and
``sealed.py`` (``open-sealed``).  The opening and printing helpers every one of them uses are
here.

The views open the journal read-only and need no secret key: they read only plaintext,
secret-free columns.

With ``--socket PATH`` (or ``$AFFIDAVIT_SOCKET``) ``actions``, ``record``, ``sessions`` and
``metrics`` ask the daemon instead and print the same bytes: both paths render the same plain
JSON (``affidavit.views``), here, from data -- but for a lease's holder, which the daemon (a
caller's view) shows as its tag and the embedded view (the operator's) as recorded
(``journal holder`` maps one to the other).

Exit status: 0 success; 1 ``journal verify`` (or ``anchor``) found a bad row; 3 ``actions`` or
``sessions`` through ``--socket`` printed a page the daemon cut (``TRUNCATED``: older records,
or sessions seen earlier, left out -- the output as embedded, the count on stderr); 2 usage or
config error (for example no journal at the path, an unreadable key or anchor file), or a view
or check the journal could not answer (a shared journal's database away: "the journal cannot be
read now (the actions view) ...", as the daemon says) — the message on stderr, never a
traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from affidavit.cli import (
    JSON_HELP,
    SECRETS_NONE,
    DaemonSocket,
    UsageError,
    add_socket_arg,
    ask_daemon,
    config_refusal,
    daemon_json,
    daemon_socket,
    daemon_text,
    journal_refusal,
    text_arg,
    time_arg,
)
from affidavit.text import utc_time

if TYPE_CHECKING:
    from affidavit.journal import JournalReader

__all__ = [
    "OUTCOMES",
    "PHASES",
    "add_commands",
    "common_options",
    "failure_line",
    "print_json",
    "read_refusal",
    "reading",
]

OUTCOMES = ("not_attempted", "rejected", "committed", "unknown")
PHASES = (
    "validation",
    "credential_injection",
    "connection_setup",
    "remote_execution",
    "result_delivery",
)
"""The contract's ``Outcome`` and ``Phase`` values, written out: importing the contract costs
the parser ~0.1 s (tests/daemon/test_thin_client.py checks these equal the enums)."""

TRUNCATED = 3
"""Exit status of ``actions``/``sessions --socket`` when the daemon's page left some out: the
output keeps the embedded shape (a bare array, the table), so a script told only by stdout
would take the page for the whole -- the status says it is not (the count on stderr)."""


def add_commands(sub: Any) -> None:
    from affidavit.cli import maintenance

    maintenance.add_command(sub)  # the journal group: verify, anchor, public-key, migrate, ...

    a = sub.add_parser("actions", help="list actions with their phase, outcome and retry hint")
    common_options(a, socket=True)
    a.add_argument("--session", help="only this session")
    a.add_argument("--outcome", choices=OUTCOMES)
    a.add_argument("--phase", choices=PHASES)
    a.add_argument("--since", help="accepted at or after (ISO 8601 or epoch seconds)")
    a.add_argument("--until", help="accepted at or before (ISO 8601 or epoch seconds)")
    a.set_defaults(handler=_actions, holds_secrets=SECRETS_NONE)

    r = sub.add_parser("record", help="one invocation's events and projected record")
    common_options(r, socket=True)
    r.add_argument("invocation_id")
    r.set_defaults(handler=_record, holds_secrets=SECRETS_NONE)

    s = sub.add_parser("sessions", help="sessions with their action counts")
    common_options(s, socket=True)
    s.set_defaults(handler=_sessions, holds_secrets=SECRETS_NONE)

    m = sub.add_parser(
        "metrics", help="invocation counts by phase and outcome (and by code), never merged"
    )
    common_options(m, socket=True)
    m.add_argument("--session", help="only this session")
    m.add_argument("--since", help="accepted at or after (ISO 8601 or epoch seconds)")
    m.add_argument("--prometheus", action="store_true", help="Prometheus text exposition format")
    m.set_defaults(handler=_metrics, holds_secrets=SECRETS_NONE)


def common_options(p: argparse.ArgumentParser, *, socket: bool = False) -> None:
    p.add_argument(
        "--journal",
        help="journal file or postgresql:// URL (default: [journal] path or url of the config)",
    )
    p.add_argument("--config", help="config file (default: $AFFIDAVIT_CONFIG or ./affidavit.toml)")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    if socket:
        add_socket_arg(p)


def _daemon(args: argparse.Namespace) -> DaemonSocket | None:
    return daemon_socket(args, "config", "journal")


# --- opening -------------------------------------------------------------------------------


def _journal_path(args: argparse.Namespace) -> str | Path:
    """``--journal`` (a file or a ``postgresql://`` URL) beats the config's ``[journal] path``
    or ``url``; without any config file the default is ``affidavit.db``."""
    from affidavit.config import CONFIG_ENV, DEFAULT_CONFIG, ConfigError, load_config

    if args.journal:
        return args.journal if _is_url(args.journal) else Path(args.journal)
    explicit = args.config or os.environ.get(CONFIG_ENV)
    if not explicit and not Path(DEFAULT_CONFIG).exists():
        return Path("affidavit.db")
    try:
        return load_config(args.config).journal.location
    except ConfigError as exc:
        raise config_refusal(exc) from None


def _send_windows(args: argparse.Namespace) -> dict[str, float] | None:
    """The config's targets' send windows under its ``[service] lease_margin``
    (``JournalReader.send_windows``): the hints a view shows judged as the daemon judges them.
    None without a config file (``--journal`` alone, or none found): the records alone."""
    from affidavit.config import CONFIG_ENV, DEFAULT_CONFIG, ConfigError, load_config, send_windows

    explicit = args.config or os.environ.get(CONFIG_ENV)
    if not explicit and not Path(DEFAULT_CONFIG).exists():
        return None
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        if args.journal:
            return None  # the journal was named; the config is not needed to read it
        raise config_refusal(exc) from None
    return send_windows(config, config.service.lease_margin)


def _is_url(location: str) -> bool:
    return location.startswith(("postgresql://", "postgres://"))


@contextmanager
def reading(
    args: argparse.Namespace,
    what: str,
    public_keys: Sequence[bytes] = (),
    key_file: Path | None = None,
) -> Iterator[JournalReader]:
    """The journal ``args`` names, opened for a view: a journal that cannot be read, on open
    or mid-read, is one line naming ``what`` (exit 2), in the words the daemon answers
    (``read_failure``) -- a shared journal away is "cannot be read now", never a traceback --
    followed by the journal's own words (its URL's password redacted): run here, there is no
    daemon log."""
    from affidavit.journal import JournalError, JournalReader

    path = _journal_path(args)
    windows = _send_windows(args)
    try:
        with JournalReader.open(path, key_file=key_file, public_keys=public_keys) as reader:
            reader.send_windows = windows
            yield reader
    except JournalError as exc:
        raise read_refusal(exc, what) from None


def read_refusal(exc: Exception, what: str) -> UsageError:
    """``read_failure``'s code and message for the command line (``failure_line``)."""
    from affidavit.engine.recovery import read_failure

    answer = read_failure(exc, what, operator=True)
    return journal_refusal(exc, failure_line(exc, answer), answer[1])


def failure_line(exc: Exception, answer: tuple[int, str, str]) -> str:
    """The message of a surface's ``answer`` (status, code, message) to ``exc``, for the
    command line: when the journal is away (503), followed by the journal's own one-line
    words (where, and why: its URL's password redacted) -- run here, there is no daemon log
    to find them in."""
    status, _, message = answer
    return f"{message} -- {exc}" if status == 503 else message


# --- rendering -----------------------------------------------------------------------------


def _when(at: float | None) -> str:
    return utc_time(at, "%Y-%m-%dT%H:%M:%S.%fZ")


def _out(line: str = "") -> None:
    """One line of text output, escaped: journal values never reach a terminal raw (a session
    holding ESC sequences or a CR would rewrite what the operator reads)."""
    from affidavit.text import printable

    print(printable(line))


def _err(line: str) -> None:
    """One line on stderr, escaped as ``_out``'s."""
    from affidavit.text import printable

    print(f"affidavit: {printable(line)}", file=sys.stderr)


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


# --- handlers ------------------------------------------------------------------------------


def _actions(args: argparse.Namespace) -> int:
    since = time_arg(args.since, "--since")
    until = time_arg(args.until, "--until")
    session = text_arg(args.session, "--session")
    filters = {
        "session": session,
        "outcome": args.outcome,
        "phase": args.phase,
        "since": since,
        "until": until,
    }
    socket = _daemon(args)
    if socket is not None:
        from affidavit.api.wire import MAX_ACTIONS_LIMIT, target

        # The daemon answers a page, the newest (its memory is the agents' to fill): the
        # largest it gives, and a line on stderr when older records were left out.
        query = {**filters, "limit": MAX_ACTIONS_LIMIT}
        page = daemon_json(ask_daemon(socket, "GET", target("/v1/actions", query)))
        _print_actions(args.json, page["actions"])
        if page["truncated"]:
            _err(
                f"only the newest {len(page['actions'])} of {page['total']} records: the "
                "daemon answers a page; run without --socket (embedded) to list them all"
            )
            return TRUNCATED
        return 0
    from affidavit.views import record_to_json

    from .actions_json import write_actions_json

    with reading(args, "the actions view") as j:
        # Streamed: one record folded, rendered and written at a time (issue 15: 1M events
        # took 51 s and 554 MB held whole).
        if args.json:
            write_actions_json(j, filters)
            return 0
        rows = (record_to_json(r, operator=True) for r in j.iter_actions(**filters))
        return _print_actions(False, rows)


def _print_actions(as_json: bool, rows: Iterable[dict[str, Any]]) -> int:
    """The actions view, written as the rows come: a JSON array with one record per line (the
    C encoder: ``indent`` would take Python's, ~200 us a record), or the table."""
    if as_json:
        from .actions_json import write_array

        write_array(map(json.JSONEncoder(sort_keys=True).encode, rows))
        return 0
    from affidavit.text import cell, session_cell, shown_outcome

    _out(f"{'INVOCATION':30} {'SESSION':24} {'PHASE':20} {'OUTCOME':20} {'RETRY':20} CODE")
    for r in rows:
        # Each cell by ``cell``: a session name is the caller's, spaces and all, and must not
        # look like the columns after it.
        _out(
            f"{cell(r['invocation_id'], 30)} {session_cell(r['session'], 24)} "
            f"{cell(r['phase'], 20)} {shown_outcome(cell(r['outcome'], 0), r['evidence']):20} "
            f"{cell(r['retry'], 20)} "
            f"{cell(r['code'] or '-', 0)}"
        )
    return 0


def _record(args: argparse.Namespace) -> int:
    text_arg(args.invocation_id, "the invocation id")
    socket = _daemon(args)
    if socket is not None:
        from affidavit.api.wire import invocation_path

        response = ask_daemon(socket, "GET", invocation_path(args.invocation_id))
        data = daemon_json(response)
    else:
        from affidavit.views import record_view

        with reading(args, f"the record of {args.invocation_id}") as j:
            events = j.events(args.invocation_id)
            rec = j.record(args.invocation_id)
        if rec is None:
            raise UsageError(
                f"no invocation {args.invocation_id} in the journal",
                "NO_SUCH_INVOCATION",
                "invocation_id",  # as the daemon's 404 names it: the argument to correct
            )
        # Embedded: whoever reads the journal is its operator, shown what was recorded.
        data = record_view(rec, events, operator=True)
    if args.json:
        print_json(data)
        return 0
    rec_json = data["record"]
    from affidavit.text import cell, session_cell, shown_outcome

    _out(
        f"invocation {cell(rec_json['invocation_id'], 0)}  "
        f"session {session_cell(rec_json['session'], 0)}  state {cell(rec_json['state'], 0)}"
    )
    _out(
        f"  phase {rec_json['phase']}  "
        f"outcome {shown_outcome(cell(rec_json['outcome'], 0), rec_json['evidence'])}  "
        f"retry {rec_json['retry']}  "
        f"code {rec_json['code'] or '-'}"
    )
    for ev in data["events"]:
        attrs = json.dumps(ev["attrs"], sort_keys=True, separators=(",", ":"))
        _out(f"  {ev['seq']:>8}  {_when(ev['at'])}  {ev['kind']:26} {ev['source']:18} {attrs}")
    return 0


def _sessions(args: argparse.Namespace) -> int:
    socket = _daemon(args)
    if socket is not None:
        from affidavit.api.wire import MAX_SESSIONS_LIMIT, target

        # The daemon answers a page, those seen last (a caller names its sessions): the
        # largest it gives, and a line on stderr when others were left out.
        query = target("/v1/sessions", {"limit": MAX_SESSIONS_LIMIT})
        page = daemon_json(ask_daemon(socket, "GET", query))
        sessions = page["sessions"]
        if page["truncated"]:
            _err(
                f"only the {len(sessions)} of {page['total']} sessions seen last: the daemon "
                "answers a page; run without --socket (embedded) to list them all"
            )
        done = TRUNCATED if page["truncated"] else 0
    else:
        with reading(args, "the sessions view") as j:
            sessions = j.sessions()
        done = 0
    if args.json:
        print_json(sessions)
        return done
    from affidavit.text import cell, outcome_counts, session_cell

    _out(f"{'SESSION':24} {'ACTIONS':>8}  {'FIRST SEEN':28} {'LAST SEEN':28} OUTCOMES")
    for s in sessions:
        outcomes = " ".join(cell(f"{k}={v}", 0) for k, v in outcome_counts(s))
        _out(
            f"{session_cell(s['session'], 24)} {cell(s['actions'], 8, right=True)}  "
            f"{cell(_when(s['first_seen']), 28)} {cell(_when(s['last_seen']), 28)} {outcomes}"
        )
    return done


def _metrics(args: argparse.Namespace) -> int:
    since = time_arg(args.since, "--since")
    session = text_arg(args.session, "--session")
    socket = _daemon(args)
    if socket is not None:
        from affidavit.api.wire import target

        fmt = "prometheus" if args.prometheus and not args.json else "json"
        query = {"session": session, "since": since, "format": fmt}
        response = ask_daemon(socket, "GET", target("/v1/metrics", query))
        if fmt == "prometheus":
            sys.stdout.write(daemon_text(response))
            return 0
        data = daemon_json(response)
        data.pop("as_of", None)  # (the daemon's marker of its kept counts: not the CLI's view)
    else:
        from affidavit.views import metrics

        with reading(args, "the records the metrics count") as j:
            data = metrics(j.iter_actions(session=session, since=since))
    if args.json:
        print_json(data)
    elif args.prometheus:
        from affidavit.views import prometheus_text

        sys.stdout.write(prometheus_text(data))
    else:
        _print_metrics(data)
    return 0


def _print_metrics(data: dict[str, Any]) -> None:
    """The metrics view's tables, each cell by ``text.cell``."""
    from affidavit.text import cell

    _out(f"{data['invocations']} invocations")
    _out(f"{'phase':<22} {'outcome':<14} count")
    for row in data["by_phase_outcome"]:
        _out(f"{cell(row['phase'], 22)} {cell(row['outcome'], 14)} {cell(row['count'], 0)}")
    _out()
    _out(f"{'code':<26} {'outcome':<14} count")
    for row in data["by_code_outcome"]:
        _out(f"{cell(row['code'], 26)} {cell(row['outcome'], 14)} {cell(row['count'], 0)}")
    if data["batch_items"]:
        _out()
        _out(f"{'batch item outcome':<22} {'code':<26} count")
        for row in data["batch_items"]:
            _out(f"{cell(row['outcome'], 22)} {cell(row['code'], 26)} {cell(row['count'], 0)}")
    if data["operations"]:
        _out()
        _out(f"{'operation state':<22} count")
        for row in data["operations"]:
            _out(f"{cell(row['state'], 22)} {cell(row['count'], 0)}")
