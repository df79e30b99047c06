"""``affidavit journal migrate --to postgresql://...``: a SQLite journal copied into a new shared
one, verified end to end on both sides (``affidavit.journal.migrate``).

The source is verified with its signing public key kept apart from it -- ``--public-key``, else
the public half of the config's ``[journal] signing_key`` (the broker's own, as the broker itself
checks the file) -- never with the key the file records.  The source is held under its
exclusive writer lock from its verify until the copy has verified: a daemon that owns it, or an
embedded broker that has it open, refuses the migrate (``JOURNAL_LOCKED``, naming the daemon;
nothing copied) -- what they appended afterwards would not be in the copy.  A source on a file
system mounted read-only as a whole (a backup snapshot) is copied without it, and the output
says so (``source_read_only`` in ``--json``): no lock can be made there, and no writer can be
appending to it.  On a read-only *bind* mount the lock file there is held, opened read-only
(none there: refused, nothing copied).

Exit 0 when both sides verify to the same head; 2 (one line, never a traceback) when the source
is being written or does not verify, the target is not empty or unreachable, or the copy does
not verify.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from affidavit.cli import journal_refusal, refusal
from affidavit.cli.journal import print_json

__all__ = ["run"]


def run(args: argparse.Namespace, source: str | Path, public_keys: Sequence[bytes]) -> int:
    """``public_keys``: the source's signing public keys, kept apart from it (``--public-key``,
    or the config's ``[journal] signing_key``): what it is verified with and the new journal
    registers."""
    from affidavit.journal import JournalError
    from affidavit.journal.backend import is_url, redact
    from affidavit.journal.migrate import migrate

    if not is_url(args.to):
        raise refusal(
            "expected a postgresql:// URL (the new shared journal)", "INVALID_FIELD", "--to"
        )
    if isinstance(source, str) and is_url(source):
        raise refusal(
            "the source is already a shared journal: migrate copies a SQLite file",
            "INVALID_FIELD",
            "--journal" if args.journal else None,
        )
    try:
        done = migrate(
            source, args.to, public_keys=public_keys, accept_unsigned=args.accept_unsigned
        )
    except JournalError as exc:
        raise journal_refusal(exc) from None
    target = redact(args.to)
    if args.json:
        print_json(
            {
                "source": str(source),
                "target": target,
                "copied": done.counts,
                "head_seq": done.target.count,
                "head_hash": done.target.head_hash,
                "source_ok": done.source.ok,
                "target_ok": done.target.ok,
                "source_read_only": done.read_only,
            }
        )
        return 0
    c = done.counts
    if done.read_only:
        print(
            f"the source {source} is on a read-only file system, so no writer can be appending "
            "to it: copied without taking its writer lock"
        )
    print(
        f"copied {c['events']} events, {c['checkpoints']} checkpoints, {c['results']} results "
        f"({c['chunks']} chunks, {c['auditor_copies']} auditor copies), {c['leases']} leases and "
        f"{c['idempotency']} idempotency records from {source} to {target}"
    )
    print(
        f"both verify: head seq {done.target.count}, hash {done.target.head_hash}; "
        f"{done.target.results} stored results match their chained hashes"
    )
    print(
        "next: point every broker's [journal] url at it (with the same key_file; each broker "
        "its own signing_key)"
    )
    return 0
