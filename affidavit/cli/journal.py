"""Journal views on the command line: ``affidavit journal verify``, ``affidavit actions``,
``affidavit record ID`` and ``affidavit sessions`` (each with ``--json``).

All of them open the journal read-only and need no key: the views read only plaintext,
secret-free columns, and ``verify`` recomputes the hash chain without any key.

Exit status: 0 success; 1 ``journal verify`` found a bad row; 2 usage or config error (for
example no journal at the path) — the message on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from affidavit.cli import UsageError, text_arg
from affidavit.config import CONFIG_ENV, DEFAULT_CONFIG, ConfigError, load_config
from affidavit.journal import JournalError, JournalReader
from affidavit.statemachine import Outcome, Phase
from affidavit.views import event_to_json, metrics, plain, record_to_json

__all__ = ["add_commands", "common_options", "open_reader", "print_json"]


def add_commands(sub: Any) -> None:
    p = sub.add_parser("journal", help="journal maintenance")
    jsub = p.add_subparsers(dest="journal_command", metavar="JOURNAL_COMMAND")
    jsub.required = True
    v = jsub.add_parser(
        "verify", help="recompute the hash chain; exit 1 and name the first bad seq if broken"
    )
    common_options(v)
    v.set_defaults(handler=_verify)

    a = sub.add_parser("actions", help="list actions with their phase, outcome and retry hint")
    common_options(a)
    a.add_argument("--session", help="only this session")
    a.add_argument("--outcome", choices=[o.value for o in Outcome])
    a.add_argument("--phase", choices=[ph.value for ph in Phase])
    a.add_argument("--since", help="accepted at or after (ISO 8601 or epoch seconds)")
    a.add_argument("--until", help="accepted at or before (ISO 8601 or epoch seconds)")
    a.set_defaults(handler=_actions)

    r = sub.add_parser("record", help="one invocation's events and projected record")
    common_options(r)
    r.add_argument("invocation_id")
    r.set_defaults(handler=_record)

    s = sub.add_parser("sessions", help="sessions with their action counts")
    common_options(s)
    s.set_defaults(handler=_sessions)

    m = sub.add_parser(
        "metrics", help="invocation counts by phase and outcome (and by code), never merged"
    )
    common_options(m)
    m.add_argument("--session", help="only this session")
    m.add_argument("--since", help="accepted at or after (ISO 8601 or epoch seconds)")
    m.add_argument("--prometheus", action="store_true", help="Prometheus text exposition format")
    m.set_defaults(handler=_metrics)


def common_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--journal", help="journal file (default: [journal] path of the config)")
    p.add_argument("--config", help="config file (default: $AFFIDAVIT_CONFIG or ./affidavit.toml)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


# --- opening -------------------------------------------------------------------------------


def _journal_path(args: argparse.Namespace) -> Path:
    """``--journal`` beats the config's ``[journal] path``; without any config file the
    default is ``affidavit.db``."""
    if args.journal:
        return Path(args.journal)
    explicit = args.config or os.environ.get(CONFIG_ENV)
    if not explicit and not Path(DEFAULT_CONFIG).exists():
        return Path("affidavit.db")
    try:
        return load_config(args.config).journal.path
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def open_reader(args: argparse.Namespace) -> JournalReader:
    path = _journal_path(args)
    try:
        return JournalReader.open(path)
    except JournalError as exc:
        raise UsageError(str(exc)) from None


# --- rendering -----------------------------------------------------------------------------


def _when(at: float | None) -> str:
    if at is None:
        return "-"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _time_arg(value: str | None, name: str) -> float | None:
    if value is None:
        return None
    try:
        t = float(value)
        if math.isfinite(t):
            return t
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--{name}: expected ISO 8601 or epoch seconds, got {value!r}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


# --- handlers ------------------------------------------------------------------------------


def _verify(args: argparse.Namespace) -> int:
    with open_reader(args) as j:
        report = j.verify()
    if args.json:
        print_json(
            {
                "ok": report.ok,
                "count": report.count,
                "first_bad_seq": report.first_bad_seq,
                "reason": report.reason,
                "head_hash": report.head_hash,
            }
        )
    elif report.ok:
        print(f"journal intact: {report.count} events, head {report.head_hash}")
    else:
        print(
            f"journal BROKEN at seq {report.first_bad_seq}: {report.reason} "
            f"({report.count} events before it are intact)"
        )
    return 0 if report.ok else 1


def _actions(args: argparse.Namespace) -> int:
    since = _time_arg(args.since, "since")
    until = _time_arg(args.until, "until")
    with open_reader(args) as j:
        records = j.list_actions(
            session=text_arg(args.session, "--session"),
            outcome=args.outcome,
            phase=args.phase,
            since=since,
            until=until,
        )
    if args.json:
        print_json([record_to_json(r) for r in records])
        return 0
    print(f"{'INVOCATION':28} {'SESSION':14} {'PHASE':20} {'OUTCOME':14} {'RETRY':20} CODE")
    for r in records:
        print(
            f"{r.invocation_id:28} {r.session or '-':14} {r.phase.value:20} "
            f"{r.outcome.value:14} {r.retry.value:20} {r.code.value if r.code else '-'}"
        )
    return 0


def _record(args: argparse.Namespace) -> int:
    text_arg(args.invocation_id, "the invocation id")
    with open_reader(args) as j:
        events = j.events(args.invocation_id)
        rec = j.record(args.invocation_id)
    if rec is None:
        raise UsageError(f"no invocation {args.invocation_id} in the journal")
    if args.json:
        print_json({"record": record_to_json(rec), "events": [event_to_json(e) for e in events]})
        return 0
    print(f"invocation {rec.invocation_id}  session {rec.session or '-'}  state {rec.state}")
    print(
        f"  phase {rec.phase.value}  outcome {rec.outcome.value}  retry {rec.retry.value}  "
        f"code {rec.code.value if rec.code else '-'}"
    )
    for ev in events:
        attrs = json.dumps(plain(ev.attrs), sort_keys=True, separators=(",", ":"))
        print(f"  {ev.seq:>8}  {_when(ev.at)}  {ev.kind.value:26} {ev.source.value:18} {attrs}")
    return 0


def _sessions(args: argparse.Namespace) -> int:
    with open_reader(args) as j:
        sessions = j.sessions()
    if args.json:
        print_json(sessions)
        return 0
    print(f"{'SESSION':24} {'ACTIONS':>8}  {'FIRST SEEN':28} {'LAST SEEN':28} OUTCOMES")
    for s in sessions:
        outcomes = " ".join(f"{k}={v}" for k, v in sorted(s["outcomes"].items()))
        print(
            f"{s['session'] or '-':24} {s['actions']:>8}  {_when(s['first_seen']):28} "
            f"{_when(s['last_seen']):28} {outcomes}"
        )
    return 0


def _metrics(args: argparse.Namespace) -> int:
    since = _time_arg(args.since, "since")
    with open_reader(args) as j:
        data = metrics(j.list_actions(session=text_arg(args.session, "--session"), since=since))
    if args.json:
        print_json(data)
    elif args.prometheus:
        print("# HELP affidavit_invocations Invocations by phase and outcome.")
        print("# TYPE affidavit_invocations gauge")
        for row in data["by_phase_outcome"]:
            print(
                f'affidavit_invocations{{phase="{row["phase"]}",outcome="{row["outcome"]}"}} '
                f"{row['count']}"
            )
        print("# HELP affidavit_invocations_by_code Invocations by error code and outcome.")
        print("# TYPE affidavit_invocations_by_code gauge")
        for row in data["by_code_outcome"]:
            print(
                f'affidavit_invocations_by_code{{code="{row["code"]}",outcome="{row["outcome"]}"}} '
                f"{row['count']}"
            )
        print(
            "# HELP affidavit_batch_items Batch items by outcome and code, apart from invocations."
        )
        print("# TYPE affidavit_batch_items gauge")
        for row in data["batch_items"]:
            print(
                f'affidavit_batch_items{{outcome="{row["outcome"]}",code="{row["code"]}"}} '
                f"{row['count']}"
            )
        print("# HELP affidavit_operations Jobs accepted by a 202, by state.")
        print("# TYPE affidavit_operations gauge")
        for row in data["operations"]:
            print(f'affidavit_operations{{state="{row["state"]}"}} {row["count"]}')
    else:
        print(f"{data['invocations']} invocations")
        print(f"{'phase':<22} {'outcome':<14} count")
        for row in data["by_phase_outcome"]:
            print(f"{row['phase']:<22} {row['outcome']:<14} {row['count']}")
        print()
        print(f"{'code':<26} {'outcome':<14} count")
        for row in data["by_code_outcome"]:
            print(f"{row['code']:<26} {row['outcome']:<14} {row['count']}")
        if data["batch_items"]:
            print()
            print(f"{'batch item outcome':<22} {'code':<26} count")
            for row in data["batch_items"]:
                print(f"{row['outcome']:<22} {row['code']:<26} {row['count']}")
        if data["operations"]:
            print()
            print(f"{'operation state':<22} count")
            for row in data["operations"]:
                print(f"{row['state']:<22} {row['count']}")
    return 0
