"""``affidavit journal holder ID [SHOWN]``: the operator maps the lease holder a caller was
shown back to the holder the journal records.

A caller never sees the recorded holder (``hostname:pid:hex``: on a shared journal, other
brokers' host names and pids).  Its envelopes, and the record and actions views the daemon and
MCP answer, show the journal's keyed digest of the invocation id and the recorded holder
(``JournalReader.holder_tag``; docs/contract.md, "The lease holder").  This lists every holder
the invocation's events record (ACTION_ACCEPTED, the lease events, LEASE_LOST), each beside the
value a caller is shown for it and the events that name it; given ``SHOWN`` (a value from an
envelope), it prints only the recorded holder it stands for -- NO_SUCH_HOLDER (exit 2) when no
holder of that invocation is shown so.

The digest is keyed by the broker key (``[journal] key_file``, as ``journal open-sealed``
reads it), checked against the id the journal records.  It runs embedded only: no daemon route
or MCP tool maps a shown holder back.
"""

from __future__ import annotations

import argparse
from typing import Any

from affidavit.cli import SECRETS_ALWAYS, UsageError, text_arg

__all__ = ["add_command"]


def add_command(jsub: Any) -> None:
    """``journal holder`` (declared by ``affidavit.cli.journal``: the ``journal`` group)."""
    from .journal import common_options
    from .sealed import key_file_option

    h = jsub.add_parser(
        "holder",
        help="map the lease holder a caller was shown (evidence.lease.holder) back to the "
        "holder the journal records, or list an invocation's holders",
    )
    common_options(h)
    h.add_argument("invocation_id", metavar="INVOCATION_ID")
    h.add_argument("shown", metavar="SHOWN", nargs="?", help="the holder a caller was shown")
    key_file_option(h)
    h.set_defaults(handler=_holder, holds_secrets=SECRETS_ALWAYS)


def _holder(args: argparse.Namespace) -> int:
    from .journal import _out, print_json
    from .sealed import keyed_events

    iid = args.invocation_id
    if args.shown is not None:
        text_arg(args.shown, "the shown holder")
    holders: dict[str, dict[str, Any]] = {}
    with keyed_events(args, "the lease holders") as (j, key_file, events):
        for ev in events:
            recorded = ev.attrs.get("holder")
            if type(recorded) is not str:
                continue
            entry = holders.get(recorded)
            if entry is None:
                shown = j.holder_tag(iid, recorded)
                entry = holders[recorded] = {"recorded": recorded, "shown": shown, "events": []}
            entry["events"].append({"seq": ev.seq, "kind": ev.kind.value})
    rows = list(holders.values())
    if args.shown is not None:
        rows = [r for r in rows if r["shown"] == args.shown]
        if not rows:
            raise UsageError(
                f"no lease holder of invocation {iid} is shown as {args.shown!r} under broker "
                f"key file {key_file} ({len(holders)} holder(s) recorded)",
                "NO_SUCH_HOLDER",
            )
    if args.json:
        print_json({"invocation_id": iid, "holders": rows})
        return 0
    if args.shown is not None:
        _out(rows[0]["recorded"])
        return 0
    _out(f"invocation {iid}: {len(rows)} lease holder(s) recorded")
    for row in rows:
        seqs = ", ".join(f"{e['seq']} {e['kind']}" for e in row["events"])
        _out(f"  {row['recorded']}")
        _out(f"    shown as {row['shown']}")
        _out(f"    in {seqs}")
    return 0
