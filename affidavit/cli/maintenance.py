"""Journal maintenance on the command line: ``affidavit journal verify|anchor|public-key|migrate|
audit-keygen|audit-open`` (and ``reclaim``, ``reclaim.py``; ``open-sealed``, ``sealed.py``;
``holder``, ``holder.py``) --
the ``journal`` command group, declared by ``affidavit.cli.journal`` beside the views.

``verify`` and ``anchor`` open the journal read-only and check the hash chain, the signed
checkpoints and the stored results with a public key (``--public-key``, an ``--anchor``'s, or
the one the journal records -- each note says when the key is not independent of the
journal; ``anchor --previous`` refuses a journal that does not continue from the anchor before);
``audit-open`` uses the *auditor's* private key, which the broker
never holds.  Only ``public-key`` reads the broker's signing key file, to export its public
half; ``migrate`` (``migrate.py``) reads it only to verify the source with its public half.

Exit status: 0 success; 1 ``journal verify`` (or ``anchor``) found a bad row; 2 usage or
config error (an unreadable key or anchor file is ``FILE_UNUSABLE``), or a check the journal
could not answer -- the message on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from affidavit.cli import (
    SECRETS_ALWAYS,
    SECRETS_NONE,
    UsageError,
    config_refusal,
    count_arg,
    text_arg,
)
from affidavit.cli.journal import (
    _err,
    _is_url,
    _journal_path,
    _out,
    _when,
    common_options,
    print_json,
    reading,
)

__all__ = ["add_command"]


def add_command(sub: Any) -> None:
    """The ``journal`` command group (declared by ``affidavit.cli.journal``)."""
    p = sub.add_parser("journal", help="journal maintenance")
    jsub = p.add_subparsers(dest="journal_command", metavar="JOURNAL_COMMAND")
    jsub.required = True
    v = jsub.add_parser(
        "verify",
        help="check the hash chain, signed checkpoints, stored results, idempotency "
        "bindings and lease rows; exit 1 and name the first bad seq",
    )
    common_options(v)
    _trust_args(v)
    v.add_argument(
        "--anchor", metavar="FILE", help="an anchor from `journal anchor`, kept elsewhere"
    )
    v.add_argument(
        "--accept-unsigned",
        action="store_true",
        help="accept rows written before the journal was signed, on the hash chain alone",
    )
    v.set_defaults(handler=_verify, holds_secrets=SECRETS_NONE)

    an = jsub.add_parser(
        "anchor", help="verify, then export the signed head (seq, hash, signature, key) to keep"
    )
    common_options(an)
    _trust_args(an)
    an.add_argument("--out", metavar="FILE", help="write it here (default: stdout)")
    an.add_argument(
        "--previous",
        metavar="FILE",
        help="the anchor taken before this one: refuse (exit 1, ANCHOR_KEY_DIFFERS or "
        "ANCHOR_HISTORY_DIFFERS) unless the journal continues from it, signed by its key",
    )
    an.set_defaults(handler=_anchor, holds_secrets=SECRETS_NONE)

    pk = jsub.add_parser(
        "public-key", help="export the signing key's public half (PEM) for auditors"
    )
    common_options(pk)
    pk.add_argument(
        "--signing-key", metavar="FILE", help="default: [journal] signing_key of the config"
    )
    pk.add_argument("--out", metavar="FILE", help="write it here (default: stdout)")
    pk.set_defaults(handler=_public_key, holds_secrets=SECRETS_ALWAYS)

    mg = jsub.add_parser(
        "migrate",
        help="copy this journal into a new shared PostgreSQL journal and verify both sides",
    )
    common_options(mg)
    mg.add_argument(
        "--to", required=True, metavar="URL", help="the empty postgresql:// database to fill"
    )
    mg.add_argument(
        "--accept-unsigned",
        action="store_true",
        help="accept rows written before the journal was signed, on the hash chain alone",
    )
    mg.add_argument(
        "--public-key",
        metavar="FILE",
        action="append",
        help="the source's signing public key (PEM, from `journal public-key`) to verify it with "
        "and register in the new journal (default: the public half of the config's [journal] "
        "signing_key -- never the key the file records)",
    )
    mg.set_defaults(handler=_migrate, holds_secrets=SECRETS_ALWAYS)

    from affidavit.cli import reclaim

    reclaim.add_command(jsub)

    kg = jsub.add_parser(
        "audit-keygen",
        help="make an auditor key pair (run it on the auditor's host; the broker gets PUBLIC)",
    )
    kg.add_argument("private", metavar="PRIVATE", help="auditor private key file (created 0600)")
    kg.add_argument("public", metavar="PUBLIC", help="public key file for auditor_public_key")
    kg.set_defaults(handler=_audit_keygen, holds_secrets=SECRETS_ALWAYS)

    ao = jsub.add_parser(
        "audit-open",
        help="open an event's or a result's auditor copy with the auditor's private key",
    )
    common_options(ao)
    ao.add_argument("--key", required=True, metavar="FILE", help="the auditor's private key")
    ao.add_argument(
        "--public-key",
        metavar="FILE",
        action="append",
        help="the journal's signing public key (PEM, from `journal public-key`, kept apart from "
        "the journal) to check the row's checkpoint with; one per broker of a shared journal. "
        "Required unless --trust-journal-key",
    )
    ao.add_argument(
        "--trust-journal-key",
        action="store_true",
        help="check with the signing keys the journal records itself -- which whoever can "
        "rewrite the journal can replace: the copy is then proven against the file only",
    )
    which = ao.add_mutually_exclusive_group(required=True)
    which.add_argument("--seq", metavar="N", help="the event whose sealed payload to open")
    which.add_argument("--result", metavar="ID", help="the invocation whose result to open")
    ao.set_defaults(handler=_audit_open, holds_secrets=SECRETS_ALWAYS)

    from affidavit.cli import sealed

    sealed.add_command(jsub)  # journal open-sealed: the broker's own copy, with the broker key

    from affidavit.cli import holder

    holder.add_command(jsub)  # journal holder: a shown lease holder mapped back, with the key


def _trust_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--public-key",
        metavar="FILE",
        action="append",
        help="a signing public key (PEM) to check checkpoints with; give one per broker of a "
        "shared journal (default: the anchor's, else the keys the journal records -- which "
        "are not independent of it)",
    )


def _signing_key_path(args: argparse.Namespace) -> Path:
    """The config's ``[journal] signing_key`` (or the default beside ``--journal``)."""
    from affidavit.config import CONFIG_ENV, DEFAULT_CONFIG, ConfigError, load_config
    from affidavit.journal.reader import default_signing_key

    if args.journal:
        if _is_url(args.journal):
            raise UsageError(
                "required with a PostgreSQL journal, which has no signing key beside it (or "
                "--config, whose [journal] signing_key is this broker's)",
                "INVALID_FIELD",
                "--signing-key",
            )
        return default_signing_key(Path(args.journal))
    explicit = args.config or os.environ.get(CONFIG_ENV)
    if not explicit and not Path(DEFAULT_CONFIG).exists():
        return default_signing_key(Path("affidavit.db"))
    try:
        return load_config(args.config).journal.signing_key
    except ConfigError as exc:
        raise config_refusal(exc) from None


def _journal_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(...)`` with a ``JournalError`` (an unreadable key or anchor file named on the
    command line or in the config) as a usage error: ``FILE_UNUSABLE``, not the journal's."""
    from affidavit.journal import JournalError

    try:
        return fn(*args, **kwargs)
    except JournalError as exc:
        raise UsageError(str(exc), "FILE_UNUSABLE") from None


def _public_keys_arg(args: argparse.Namespace) -> list[bytes]:
    from affidavit.journal import load_public_key

    return [_journal_call(load_public_key, f) for f in args.public_key or ()]


def _verify(args: argparse.Namespace) -> int:
    import dataclasses

    from affidavit.journal import load_anchor

    public_keys = _public_keys_arg(args)
    anchor = _journal_call(load_anchor, args.anchor) if args.anchor else None
    with reading(args, "the rows a verify checks") as j:
        report = j.verify(
            public_keys=public_keys, anchor=anchor, accept_unsigned=args.accept_unsigned
        )
    codes = _also_codes(report)
    if args.json:
        print_json(dict(dataclasses.asdict(report), also_codes=list(codes)))
        return 0 if report.ok else 1
    key = _keys_text(report.key_ids, report.key_source)
    if report.ok:
        _out(f"journal intact: {report.count} events, head {report.head_hash}")
        if report.signed_seq:
            _out(f"  signed through seq {report.signed_seq} at {_when(report.signed_at)}, {key}")
        _out(f"  {_completeness(report.complete_through)}")
        if report.unsigned_through:
            _out(f"  rows 1..{report.unsigned_through} predate signing (accepted on the chain)")
        whole = report.results - report.results_marker_only
        _out(f"  {whole} stored results match their chained hashes")
        if report.results_marker_only:
            _out(
                f"  {report.results_marker_only} stored results predate per-chunk hashes: only "
                "their marker matches the chained event (their chunks are checked when read "
                "with the broker key)"
            )
        _out(f"  {report.bindings} idempotency bindings match their chained ACTION_ACCEPTED")
        _out(f"  {report.leases} lease rows match their chained lease events")
        if report.key_source == "journal":
            _out(
                "  note: checked with the public keys the journal records itself; pass "
                "--public-key (one per broker) or --anchor for a check independent of it"
            )
        elif report.key_source == "anchor":
            _out(
                "  note: checked with the key the anchor names itself; an anchor taken from a "
                "journal someone replaced vouches for their key -- pass --public-key (one per "
                "broker) for a check independent of both"
            )
        elif report.key_source == "none":
            _out(
                "  note: checked on the hash chain alone (the journal records no signing key), "
                "which whoever can write the file can re-compute; pass --public-key (one per "
                "broker) or --anchor for a check independent of it"
            )
    else:
        _out(f"{_broken(report)} ({report.count} events before it are intact; checked with {key})")
        for more, more_code in zip(report.also, codes, strict=True):
            _out(f"  also{f' ({more_code})' if more_code else ''}: {more}")
    return 0 if report.ok else 1


def _also_codes(report: Any) -> tuple[str | None, ...]:
    """One code per ``also`` entry, in order: ``also_codes`` padded with None (no code) or cut
    to ``also``'s length -- never a traceback should the two ever differ."""
    return (*report.also_codes, *[None] * len(report.also))[: len(report.also)]


def _broken(report: Any) -> str:
    """``journal BROKEN at seq N (CODE): reason`` -- no seq for a journal-level problem (an
    anchor signed by another key)."""
    where = "" if report.first_bad_seq is None else f" at seq {report.first_bad_seq}"
    code = f" ({report.code})" if report.code else ""
    return f"journal BROKEN{where}{code}: {report.reason}"


def _completeness(through: int | None) -> str:
    """What a passing report proves of the journal's end: a tail cut back to a checkpoint (its
    checkpoints removed too) leaves a shorter journal, every row signed -- only an anchor kept
    elsewhere shows it, and only up to the anchor's seq."""
    if through is None:
        return (
            "no anchor: rows after any checkpoint could have been removed unseen (a tail cut "
            "back to a checkpoint leaves a shorter journal, every row signed); pass --anchor "
            "FILE, kept elsewhere, to prove it complete through the anchor's seq"
        )
    return (
        f"matches the anchor at seq {through}: complete through seq {through} only -- rows "
        "after it could have been removed unseen, back to any checkpoint"
    )


def _keys_text(key_ids: tuple[str, ...], source: str) -> str:
    if not key_ids:
        return "no key"
    which = f"key {key_ids[0]}" if len(key_ids) == 1 else f"keys {', '.join(key_ids)}"
    return f"{which} ({_KEY_SOURCES[source]})"


_KEY_SOURCES = {
    "public-key": "--public-key",
    "anchor": "the anchor's",
    "journal": "recorded in the journal",
    "none": "none",
}


def _write_out(path: str | None, data: bytes, what: str) -> None:
    """``data`` on stdout, or in a new 0644 file at ``path`` (public: a key, an anchor) put in
    place whole (``write_private_file``), replacing a regular file there -- never written
    through a link (``--out`` in a directory another user can write: a planted link would have
    root overwrite the file it names) nor onto a device or FIFO: those are refused."""
    if path is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    from affidavit.privatefile import write_private_file

    try:
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISREG(os.lstat(path).st_mode):
                raise UsageError(
                    f"cannot write {what} {path}: not a regular file (a link is never written "
                    "through; leave --out off for stdout)",
                    "FILE_UNUSABLE",
                )
        write_private_file(Path(os.path.abspath(path)), data, replace=True, mode=0o644)
    except OSError as exc:
        raise UsageError(f"cannot write {what} {path}: {exc.strerror}", "FILE_UNUSABLE") from None


def _anchor(args: argparse.Namespace) -> int:
    from affidavit.journal import load_anchor

    public_keys = _public_keys_arg(args)
    if args.previous == "":  # an unset variable in a cron line: not "no continuation check"
        raise UsageError(
            "empty: name the previous anchor's file (or leave --previous off to take a first "
            "anchor)",
            "INVALID_FIELD",
            "--previous",
        )
    previous = _journal_call(load_anchor, args.previous) if args.previous is not None else None
    with reading(args, "the rows an anchor vouches for") as j:
        report, anchor = j.anchor(public_keys=public_keys, previous=previous)
    if not report.ok:
        _out(
            f"{_broken(report)}; no anchor written (an anchor must vouch only for a journal "
            "that verifies" + (", and continues from the previous anchor)" if previous else ")")
        )
        return 1
    if anchor is None:
        raise UsageError("the journal has no signed checkpoint to anchor yet", "NO_CHECKPOINT")
    if not public_keys:
        _err(
            f"note: verified with signing key {', '.join(report.key_ids) or 'none'} recorded "
            "in the journal itself, which whoever rewrites the journal can replace: the anchor "
            "vouches for that key; pass --public-key (and --previous) for one independent of it"
        )
    text = json.dumps(anchor.to_json(), indent=2, sort_keys=True) + "\n"
    _write_out(args.out, text.encode("utf-8"), "anchor file")
    if args.out:
        cp = anchor.checkpoint
        _out(f"anchored seq {cp.seq} (hash {cp.hash}, key {cp.key_id}) in {args.out}")
    return 0


def _public_key(args: argparse.Namespace) -> int:
    from affidavit.journal import SigningKey, public_key_pem

    path = Path(args.signing_key) if args.signing_key else _signing_key_path(args)
    key = _journal_call(SigningKey.load, path)
    _write_out(args.out, public_key_pem(key.public_raw), "public key file")
    if args.out:
        _out(f"public key {key.key_id} written to {args.out}")
    return 0


def _migrate(args: argparse.Namespace) -> int:
    from affidavit.cli.migrate import run
    from affidavit.journal import SigningKey

    source = _journal_path(args)
    keys = _public_keys_arg(args)
    if not keys and not (isinstance(source, str) and _is_url(source)):
        path = _signing_key_path(args)
        if not path.exists():
            raise UsageError(
                f"no signing key at {path} to verify the source with: pass --public-key FILE "
                "(the source's, from `affidavit journal public-key`)",
                "FILE_UNUSABLE",
            )
        keys = [_journal_call(SigningKey.load, path).public_raw]
    return run(args, source, keys)


def _audit_keygen(args: argparse.Namespace) -> int:
    from affidavit.journal import generate_auditor_keypair

    try:
        generate_auditor_keypair(args.private, args.public)
    except ValueError as exc:
        raise UsageError(str(exc), "INVALID_FIELD", "PUBLIC") from None
    except FileExistsError as exc:
        raise UsageError(f"{exc.filename} exists; not overwriting a key", "FILE_EXISTS") from None
    except OSError as exc:
        raise UsageError(f"cannot write {exc.filename}: {exc.strerror}", "FILE_UNUSABLE") from None
    _out(f"auditor private key {args.private} (keep it off the broker host); public key "
          f"{args.public} (set it as [journal] auditor_public_key)")  # fmt: skip
    return 0


AUDIT_KEY_FIX = (
    "name with --key FILE the private half of the auditor_public_key the broker had when it "
    "wrote the copy"
)


def _auditor_key(path: str) -> None:
    """Refuse an auditor private key file that cannot be used (missing, readable by others,
    not an X25519 PEM key): FILE_UNUSABLE at ``--key``, before the journal is read."""
    from affidavit.journal import AuditOpener, JournalError

    try:
        AuditOpener.load(path)
    except JournalError as exc:
        why = str(exc)
        raise UsageError(
            why if "chmod" in why else f"{why}; {AUDIT_KEY_FIX}", "FILE_UNUSABLE", "--key"
        ) from None


def _audit_open(args: argparse.Namespace) -> int:
    from affidavit.engine.recorder import result_payload
    from affidavit.journal import NoAuditorCopy, ResultUnverified, SealUnopened

    args.seq = count_arg(args.seq, "--seq")
    if args.seq is not None:
        what = f"event {args.seq}"
    else:
        text_arg(args.result, "--result")
        what = f"invocation {args.result}"
    public_keys = _public_keys_arg(args)
    if not public_keys and not args.trust_journal_key:
        raise UsageError(
            "audit-open needs the journal's signing public key (a FILE), kept apart "
            "from the journal (`affidavit journal public-key --out journal.pub` on the broker "
            "host). The auditor copy is sealed to the auditor's public key, so anyone can make "
            "one; only a checkpoint signed with a key you trust says which copy the broker "
            "wrote. --trust-journal-key checks with the key the journal records itself instead, "
            "which whoever rewrites the journal can replace",
            "INVALID_FIELD",
            "--public-key",
        )
    _auditor_key(args.key)
    with reading(args, f"the auditor copy of {what}", public_keys) as j:
        if not public_keys:
            keys = ", ".join(j.trusted_key_ids()) or "none"
            _err(
                f"note: checking with signing key {keys} recorded in the journal itself "
                "(--trust-journal-key): not independent of the journal; pass --public-key"
            )
        try:
            if args.seq is not None:
                value: Any = j.audit_payload(args.seq, args.key)
            else:
                stored = j.audit_result(args.result, args.key)
                value = None if stored is None else result_payload(stored)
        except SealUnopened as exc:  # the copy is proven first: the key is not its
            proof = (
                "the copy is proven by the signed chain, so the key is not the one it was sealed to"
                if public_keys
                else "the key is not the one it was sealed to, or the journal was rewritten "
                "(proven only with the key it records itself: pass --public-key)"
            )
            raise UsageError(f"{exc}; {proof}: {AUDIT_KEY_FIX}", "FILE_UNUSABLE", "--key") from None
        except ResultUnverified as exc:  # as `affidavit result` answers the broker's copy
            raise UsageError(str(exc), "RESULT_UNVERIFIED") from None
        except NoAuditorCopy as exc:  # what the chained event proves: not an unreadable journal
            raise UsageError(str(exc), "NO_AUDITOR_COPY") from None
    if value is None:
        raise UsageError(f"{what} has no auditor copy in the journal", "NO_AUDITOR_COPY")
    print_json(value)
    return 0
