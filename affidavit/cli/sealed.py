"""``affidavit journal open-sealed ID``: the operator opens the broker's own sealed copies of
one invocation's event payloads with the broker key file.

What is sealed there is for the operator only: the action as the caller sent it
(ACTION_ACCEPTED), what an approval will send where and with which credential reference
(APPROVAL_REQUESTED), and why a credential could not be obtained -- the reference, the file it
was read as, the OS's error (CREDENTIAL_FAILED's ``detail``).  A caller is told the field to fix
and what is wrong, never where the broker keeps its secrets; no payload holds a credential's
value (``CredentialError``).

The auditor's copy of the same payload opens with ``journal audit-open`` and the auditor's
private key; this opens the broker's copy, with the key the broker seals with
(``[journal] key_file``).  It runs embedded only: the daemon, its HTTP API and the MCP server
offer no route or tool that reads a sealed payload (``affidavit.views`` reads none), and this
module is below none of them (tests/test_layers.py: nothing but the CLI imports ``affidavit.cli``).

Verified: a key file that is missing, not 0600, not a key, or not this journal's key is
FILE_UNUSABLE naming the file; a blob that does not open with the journal's own key (AES-GCM,
bound to its event: invocation, kind and seq) was altered or moved from another event, and is
refused -- nothing is printed then, never a partial or garbage plaintext.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from affidavit.cli import SECRETS_ALWAYS, UsageError, config_refusal, text_arg

if TYPE_CHECKING:
    from affidavit.journal import JournalReader
    from affidavit.statemachine import Event

__all__ = ["add_command", "check_key", "key_file_of", "key_file_option", "keyed_events"]


def add_command(jsub: Any) -> None:
    """``journal open-sealed`` (declared by ``affidavit.cli.journal``: the ``journal`` group)."""
    from .journal import common_options

    op = jsub.add_parser(
        "open-sealed",
        help="open the broker's sealed copies of an invocation's event payloads (the "
        "operator's detail: why a credential failed, what was asked) with the broker key",
    )
    common_options(op)
    op.add_argument("invocation_id", metavar="INVOCATION_ID")
    key_file_option(op)
    op.set_defaults(handler=_open_sealed, holds_secrets=SECRETS_ALWAYS)


def key_file_option(parser: argparse.ArgumentParser) -> None:
    """``--key-file``, as ``key_file_of`` reads it (``open-sealed``, ``holder``)."""
    parser.add_argument(
        "--key-file",
        metavar="FILE",
        help="the broker key file (default: [journal] key_file of the config, or the .key "
        "file beside --journal)",
    )


KEY_FIX = (
    "name the broker's own key file: --key-file FILE, or --config with its [journal] key_file "
    "(beside --journal PATH it is PATH.key)"
)


def key_file_of(args: argparse.Namespace) -> Path:
    """``--key-file``, else the config's ``[journal] key_file`` (or the default beside
    ``--journal``), as the other journal commands find the signing key."""
    from affidavit.config import CONFIG_ENV, DEFAULT_CONFIG, ConfigError, load_config

    if args.key_file:
        return Path(args.key_file)
    if args.journal:
        if args.journal.startswith(("postgresql://", "postgres://")):
            raise UsageError(
                "required with a PostgreSQL journal, which has no key file beside it (or "
                "--config, whose [journal] key_file is the brokers' sealing key)",
                "INVALID_FIELD",
                "--key-file",
            )
        from affidavit.journal.names import beside

        return beside(args.journal, ".key")  # (beside the file a link names)
    explicit = args.config or os.environ.get(CONFIG_ENV)
    if not explicit and not Path(DEFAULT_CONFIG).exists():
        return Path("affidavit.db.key")
    try:
        return load_config(args.config).journal.key_file
    except ConfigError as exc:
        raise config_refusal(exc) from None


def check_key(j: JournalReader, key_file: Path) -> None:
    """Refuse a broker key file that is not ``j``'s own: missing, not 0600 or not a key
    (FILE_UNUSABLE), another journal's (FILE_UNUSABLE), or one the journal records no id to
    check it against (JOURNAL_UNREADABLE)."""
    from affidavit.journal import AlteredRow, JournalError, JournalUnavailable, ReadFailed

    try:
        matches = j.broker_key_matches()
    except (JournalUnavailable, ReadFailed, AlteredRow):
        raise  # the journal's, answered by ``reading``
    except JournalError as exc:  # the key file: missing, not 0600, not a key
        why = str(exc)
        if "chmod" not in why:  # a mode has its fix in its words; missing or not a key: this
            why += f"; {KEY_FIX}"
        raise UsageError(why, "FILE_UNUSABLE") from None
    if matches is False:
        raise UsageError(
            f"broker key file {key_file} does not match this journal (its id is not the "
            f"one the journal records); {KEY_FIX}",
            "FILE_UNUSABLE",
        )
    if matches is None:
        raise UsageError(
            f"the journal records no broker key id, so broker key file {key_file} cannot be "
            "checked against it (every broker records it before its first event: the "
            "journal was altered; `affidavit journal verify`)",
            "JOURNAL_UNREADABLE",
        )


@contextlib.contextmanager
def keyed_events(
    args: argparse.Namespace, what: str
) -> Iterator[tuple[JournalReader, Path, list[Event]]]:
    """The journal ``args`` names, opened with the broker key file (``key_file_of``, checked:
    ``check_key``), its key file and the events of ``args.invocation_id`` -- NO_SUCH_INVOCATION
    when it records none.  ``what``: what is read, for a journal that cannot be read
    (``reading``)."""
    from .journal import reading

    iid = args.invocation_id
    text_arg(iid, "the invocation id")
    key_file = key_file_of(args)
    with reading(args, f"{what} of {iid}", key_file=key_file) as j:
        check_key(j, key_file)
        events = j.events(iid)
        if not events:
            raise UsageError(f"no invocation {iid} in the journal", "NO_SUCH_INVOCATION")
        yield j, key_file, events


def _open_sealed(args: argparse.Namespace) -> int:
    iid = args.invocation_id
    opened: list[dict[str, Any]] = []
    with keyed_events(args, "the sealed payloads") as (j, key_file, events):
        for ev in events:
            assert ev.seq is not None  # a stored event has its seq
            # A blob that does not open with this journal's own key is an ``AlteredRow``:
            # ``reading`` refuses it (JOURNAL_UNREADABLE) and nothing is printed.
            payload = j.payload(ev.seq)
            item: dict[str, Any] = {"seq": ev.seq, "at": ev.at, "kind": ev.kind.value}
            if payload is not None:
                opened.append({**item, "payload": payload})
            elif j.auditor_only(ev.seq):  # said, not left out: there is a payload, not here
                opened.append({**item, "payload": None, "auditor_only": True})
    return _show(args.json, iid, key_file, opened)


def _show(as_json: bool, iid: str, key_file: Path, opened: list[dict[str, Any]]) -> int:
    from .journal import _out, _when, print_json

    if as_json:
        print_json({"invocation_id": iid, "key_file": str(key_file), "sealed": opened})
        return 0
    alone = sum(1 for item in opened if item.get("auditor_only"))
    more = f", {alone} sealed to the auditor alone" if alone else ""
    _out(f"invocation {iid}: {len(opened) - alone} payload(s) opened with {key_file}{more}")
    for item in opened:
        _out(f"  {item['seq']:>8}  {_when(item['at'])}  {item['kind']}")
        payload = item["payload"]
        if item.get("auditor_only"):
            _out(
                "            sealed to the auditor alone: `affidavit journal audit-open "
                f"--seq {item['seq']}` with the auditor's key"
            )
            continue
        detail = payload.get("detail") if isinstance(payload, dict) else None
        if isinstance(detail, str) and len(payload) == 1:
            _out(f"            detail: {detail}")
        else:
            _out("            " + json.dumps(payload, sort_keys=True, separators=(",", ":")))
    return 0
