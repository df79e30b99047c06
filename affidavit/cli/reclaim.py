"""``affidavit journal reclaim [--dry-run]``: drop the chunk rows of results that never committed
(``affidavit.journal.reclaim``) now, as a daemon does at each start -- for a journal used only
embedded (``affidavit call``, ``Broker.open``), whose users otherwise have only
``Journal.reclaim_chunks()``.

Only the chunks of a record that is final and has no marker go; an open record's stay (an
attempt under way, or one a stopped broker left open: a daemon's start-up recovery closes it).
Nothing is appended, so the chain and ``verify`` are unchanged.  ``--dry-run`` lists what would
go -- the same checks in the same writer transactions, nothing written.

On a SQLite journal it then compacts the result segment files (``affidavit.journal.compact``):
the bytes of long results that never committed -- named by no ``result_segments`` row, in a
segment no running writer holds -- go back to the filesystem (a segment no row names is
removed, the tail past its last named byte cut, the blocks between punched out on Linux).
``--dry-run`` reports the bytes that would go on this filesystem -- whether it can punch holes
is tried on a scratch file there, and the report says which (``holes``); ``--json`` has them
under ``segments`` (``null`` when there are no segment files: nothing to compact).  A journal
a broker of an earlier affidavit may still write (it leaves its segment files unlocked) is not
compacted -- if it has segment files at all: the chunk report is printed, then exit 2 with
``SEGMENT_WRITERS_UNPROVEN`` -- its daemon's next start records that none is left.  Likewise
when ``<path>.results`` is there but is not a directory: ``SEGMENT_DIR_UNUSABLE``, never "does
not exist".

It opens the journal as a writer, with the journal's sealing and signing keys (the config's, or
``<path>.key`` and ``<path>.signing.key`` beside ``--journal PATH``): both must exist -- a key
it made anew would not be the journal's.  A SQLite journal a daemon owns is refused
(``JOURNAL_LOCKED``: the daemon reclaims at its own start; stop it to run this).  A shared
(PostgreSQL) journal is not locked: its brokers reclaim alongside each other, each batch under
the chain head.

Exit status: 0 done (also when nothing was to drop); 2 (one line, a stable code, never a
traceback) when the journal or a key cannot be used, or a daemon owns the journal.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from affidavit.cli import SECRETS_ALWAYS, UsageError, config_refusal

if TYPE_CHECKING:
    from affidavit.journal.reclaim import Reclaimed, Reclamation

__all__ = ["add_command"]


def add_command(jsub: Any) -> None:
    from affidavit.cli.journal import common_options

    rc = jsub.add_parser(
        "reclaim",
        help="drop the stored chunks of results that never committed (of closed records only) "
        "and give their bytes in result segment files back",
    )
    common_options(rc)
    rc.add_argument(
        "--dry-run",
        action="store_true",
        help="list what would be dropped, and the segment bytes that would go; change nothing",
    )
    rc.set_defaults(handler=_reclaim, holds_secrets=SECRETS_ALWAYS)


def _opening(args: argparse.Namespace) -> dict[str, Any]:
    """``Journal.open``'s arguments: ``--journal`` (its keys beside a file) or the config's
    ``[journal]``; a key file that is not there is refused, never created."""
    from affidavit.cli import journal_refusal
    from affidavit.cli.journal import _is_url, _journal_path
    from affidavit.config import ConfigError, load_config
    from affidavit.journal import JournalError
    from affidavit.journal.backend import open_backend
    from affidavit.journal.names import beside, refuse_left_beside

    location = _journal_path(args)
    try:  # "no journal at ...": never create one here
        backend = open_backend(location)
        backend.close(backend.connect("tool"))
    except JournalError as exc:
        raise journal_refusal(exc) from None
    if args.journal and not _is_url(args.journal):
        path = Path(args.journal)
        found: dict[str, Any] = {  # the keys beside the file a link names (names.py)
            "path": path,
            "key_file": beside(path, ".key"),
            "signing_key": beside(path, ".signing.key"),
        }
    else:
        try:
            journal = load_config(args.config).journal
        except ConfigError as exc:
            raise config_refusal(exc) from None
        found = {
            "path": location,
            "key_file": journal.key_file,
            "signing_key": journal.signing_key,
            "auditor_public_key": journal.auditor_public_key,
            "reconnect_within": journal.reconnect,
        }
    keys = (("sealing key", "key_file", ".key"), ("signing key", "signing_key", ".signing.key"))
    for what, name, suffix in keys:
        if not _is_url(str(location)):  # one left beside a link's name: the ``mv`` that fixes it
            try:
                refuse_left_beside(location, suffix, what, found[name])
            except JournalError as exc:
                raise journal_refusal(exc) from None
        if not found[name].is_file():
            raise UsageError(
                f"no {what} at {found[name]}: reclaim opens the journal with its own keys "
                "(name them in the config's [journal], or keep them beside --journal PATH)",
                "FILE_UNUSABLE",
            )
    return found


def _reclaim(args: argparse.Namespace) -> int:
    from affidavit.cli.call import run_journal
    from affidavit.journal import Journal

    opening = _opening(args)
    location = opening.pop("path")

    async def main() -> Reclamation:
        async with Journal.open(location, **opening) as journal:
            return await journal.reclaim(dry_run=args.dry_run, measure=True, segments=True)

    done = run_journal(main)
    _report(args, done, str(location))
    if done.compacted is not None and done.compacted.refused is not None:
        if args.json:
            return 2  # the refusal's code and message are in the report's ``segments``
        from affidavit.journal.compact import refusal_message

        code = done.compacted.refused
        raise UsageError(refusal_message(str(location), code), code=code)
    return 0


def _report(args: argparse.Namespace, done: Reclamation, where: str) -> None:
    from affidavit.cli.journal import _out, print_json
    from affidavit.journal.names import beside

    chunks = sum(r.chunks for r in done.measured)
    audit = sum(r.audit for r in done.measured)
    size = sum(r.bytes for r in done.measured)
    if args.json:
        print_json(
            {
                "dry_run": args.dry_run,
                "records": [_record(r) for r in done.measured],
                "chunks": chunks,
                "auditor_copies": audit,
                "bytes": size,
                "kept_open": done.kept,
                "segments": _segments(done, where),
            }
        )
        return
    for r in done.measured:
        _out(f"{r.invocation_id}  {r.chunks} chunks, {r.audit} auditor copies, {r.bytes} bytes")
    verb = "would reclaim" if args.dry_run else "reclaimed"
    _out(
        f"{verb} the uncommitted chunks of {len(done.dropped)} closed record(s): {chunks} chunks, "
        f"{audit} auditor copies, {size} bytes"
    )
    if done.kept:
        _out(
            f"kept those of {len(done.kept)} open record(s) (an attempt under way, or one a "
            "stopped broker left open: a daemon's start-up recovery closes it)"
        )
    seg = _segments(done, where)
    if done.compacted is not None and done.compacted.absent:
        results = beside(where, ".results")  # (beside the file a link names)
        _out(f"no result segment files ({results} does not exist): nothing to compact")
    elif seg is not None and "refused" not in seg:
        _out(
            f"{verb} {seg['bytes']} bytes of result segment files no committed result names: "
            f"{seg['files']} file(s) looked at, {seg['removed']} removed whole"
            + (f", {seg['busy']} left (held by a running writer)" if seg["busy"] else "")
            + (
                f", {seg['spared']} left (written after the journal's newest row)"
                if seg["spared"]
                else ""
            )
            + (
                "; holes punched between committed chunks"
                if seg["holes"]
                else "; this filesystem cannot punch holes: only whole files and tails count"
            )
        )


def _segments(done: Reclamation, where: str) -> dict[str, Any] | None:
    """The segment compaction's account (None: the journal has no segment files, nothing to
    compact -- a shared one, or a SQLite one without a segment directory; ``refused`` and
    ``message``: not compacted, ``compact.refusal_message``)."""
    from affidavit.journal.compact import refusal_message

    c = done.compacted
    if c is None or c.absent:
        return None
    if c.refused is not None:
        return {"refused": c.refused, "message": refusal_message(where, c.refused)}
    return {
        "files": c.segments,
        "removed": c.removed,
        "busy": c.busy,
        "spared": c.spared,
        "bytes": c.bytes,
        "holes": c.holes,
    }


def _record(r: Reclaimed) -> dict[str, Any]:
    return {
        "invocation_id": r.invocation_id,
        "chunks": r.chunks,
        "auditor_copies": r.audit,
        "bytes": r.bytes,
    }
