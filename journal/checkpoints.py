"""Checkpoints: writing the signed checkpoint of a transaction, refusing to extend a head no
trusted checkpoint covers, and checking that one row is covered.

``signing.py`` says what a checkpoint is and how it is signed; this module only stores and checks
it.  The writer signs one per transaction that appended rows, inside that transaction, so a crash
can never leave a committed row without a checkpoint at or after it (``commit.py``).

The keys a checkpoint may be signed with are a set (``Keys``: key id -> raw public key): one key
on a SQLite journal, every broker's own key on a shared PostgreSQL journal -- each checkpoint
names the key that signed it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from affidavit.statemachine import EventKind

from .chain import check_row, row_hash
from .errors import JournalError
from .signing import Checkpoint, SigningKey, verify_signature
from .tables import Tables

__all__ = [
    "Keys",
    "Known",
    "adopt",
    "cover",
    "covering_problem",
    "first_signing_era_row",
    "remember",
    "require_covered",
    "sign",
    "signed_by",
    "signing_era",
    "signing_era_row",
]

Keys = Mapping[str, bytes]
"""Trusted signing keys: key id -> raw Ed25519 public key."""

_KNOWN_MAX = 10_000


Known = dict[int, Checkpoint]
"""Checkpoints found valid (or signed by this process), by seq: each whole -- everything its
signature covers (seq, hash, prev, at, adopted), its key id and its signature."""


def remember(known: Known, cp: Checkpoint) -> None:
    """Note a checkpoint known to be valid (bounded: forgotten wholesale when full)."""
    if len(known) >= _KNOWN_MAX:
        known.clear()
    known[cp.seq] = cp


def signed_by(cp: Checkpoint, keys: Keys) -> bool:
    """Whether ``cp`` is validly signed by one of ``keys`` (the one its ``key_id`` names)."""
    raw = keys.get(cp.key_id)
    return raw is not None and verify_signature(cp, raw)


def sign(tables: Tables, key: SigningKey, seq: int, hash_: str, prev: int, at: float) -> Checkpoint:
    """Sign and store the checkpoint of a transaction whose last row is ``seq``."""
    cp = key.sign(seq, hash_, prev, at)
    tables.insert_checkpoint(cp)
    return cp


_RESULT_COMMITTED = EventKind.RESULT_COMMITTED.value


def signing_era_row(kind: Any, attrs: Any) -> bool:
    """Whether an event row (its ``kind`` and ``attrs`` JSON) is one only a signing broker
    writes: a RESULT_COMMITTED carrying ``marker_sha256`` -- per-chunk hashes and signing came
    in one change (schema 2), so no broker from before signing wrote the field."""
    if kind != _RESULT_COMMITTED or type(attrs) is not str:
        return False
    try:
        parsed = json.loads(attrs)
    except ValueError:  # not a row the broker wrote: the chain check says so
        return False
    return isinstance(parsed, dict) and "marker_sha256" in parsed


def first_signing_era_row(rows: Iterable[Any]) -> int | None:
    """The seq of the first of ``rows`` (``chain.EVENT_COLUMNS``) that ``signing_era_row``."""
    return next((row[0] for row in rows if signing_era_row(row[4], row[8])), None)


def signing_era(schema: str | None, signing_schema: int, era_row: int | None) -> str | None:
    """Why a journal whose rows claim to predate signing was written by a signing broker --
    its signing records were removed -- or None: it may be from before signing.  ``schema``:
    the ``meta`` schema it recorded before a writer's open raised it (``Backend.create``), or
    None when not to be counted (an adopted journal's is raised legitimately); a signing broker
    records ``signing_schema`` or later and, in the same transaction, its key and an ``adopted``
    checkpoint over any rows.  ``era_row``: the first of those rows a signing broker wrote
    (``first_signing_era_row``)."""
    if schema is not None and schema.isdigit() and int(schema) >= signing_schema:
        return f"it records schema {schema}, which only signing brokers write"
    if era_row is not None:
        return (
            f"its row {era_row} (RESULT_COMMITTED) carries marker_sha256, which only signing "
            "brokers write"
        )
    return None


def adopt(tables: Tables, key: SigningKey, clock: Callable[[], float]) -> None:
    """Sign the head of a journal written before signing existed, marked ``adopted``."""
    seq, h = tables.head()
    if seq:
        tables.insert_checkpoint(key.sign(seq, h, 0, clock(), adopted=True))


def require_covered(tables: Tables, where: str, seq: int, hash_: str, keys: Keys) -> None:
    """Refuse (``JournalError``) to extend a head that no valid checkpoint covers: signing the
    next transaction would vouch for rows no trusted broker wrote (a forged appended row, a
    re-chained edit, a row edited in place).  The head row is re-hashed from its columns, so
    its stored ``hash`` is not taken on trust: one row read and one hash, paid only for a head
    this writer did not commit itself.  ``verify`` tells which rows; the broker does not write
    until then."""
    cp = tables.latest_checkpoint()
    if cp is not None and cp.seq == seq and cp.hash == hash_ and signed_by(cp, keys):
        why = _head_problem(tables, seq, hash_)
        if why is None:
            return
        signed = f"the checkpoint at seq {seq} is valid, but {why}"
    else:
        signed = "no checkpoint" if cp is None else f"the last checkpoint row is at seq {cp.seq}"
    raise JournalError(
        f"journal {where}: its last row (seq {seq}) is not covered by a valid signed checkpoint "
        f"({signed}); rows were written without a trusted signing key or altered -- run "
        "`affidavit journal verify`; the broker will not sign over them"
    )


def _head_problem(tables: Tables, seq: int, hash_: str) -> str | None:
    """None if the row at ``seq`` hashes, from its columns, to ``hash_``; otherwise why not."""
    rows = list(tables.event_rows(seq, seq))
    if len(rows) != 1 or rows[0][0] != seq:
        return "its row cannot be read back"
    r = rows[0]
    try:
        computed = row_hash(r[11], *r[:11])
    except (TypeError, ValueError, RecursionError):
        return "its row is not one the broker writes"
    if computed != hash_ or r[12] != hash_:
        return "its row does not hash to its stored hash (it was edited in place)"
    return None


def cover(
    tables: Tables, seq: int, keys: Keys, known: Known
) -> tuple[Checkpoint | None, tuple[Any, ...] | None, str | None]:
    """``(checkpoint, row, None)``: the row at ``seq`` (``chain.EVENT_COLUMNS``), proven the
    way ``verify`` proves it -- the rows from it to the first checkpoint at or after it pass
    ``chain.check_row`` (each hash recomputed from its columns, the sealed payload and the
    auditor copy included; each linked to the one before) and end in the hash of that
    checkpoint, signed with one of ``keys``.  Otherwise ``(None, None, why)``, naming the seqs.
    ``known`` holds the checkpoints already found valid -- or signed by this process -- whole,
    by seq (``Known``): a row equal to one of them in every field needs no second signature
    check (the costliest step of a result read); one whose hash (or anything else the
    signature covers) was changed under a remembered signature is checked again, and fails."""
    cp = tables.checkpoint_from(seq)
    if cp is None:
        return None, None, f"row {seq} is not covered by a signed checkpoint"
    if known.get(cp.seq) != cp:
        if not signed_by(cp, keys):
            why = f"the checkpoint at seq {cp.seq} (covering row {seq}) is not validly signed"
            return None, None, why
        remember(known, cp)
    first: tuple[Any, ...] | None = None
    expected, prev, prev_digest, broken = seq, None, None, None
    for r in tables.event_rows(seq, cp.seq):
        digest, broken = check_row(r, expected, r[11] if prev is None else prev, prev_digest)
        if digest is None:
            break
        if first is None:
            first = tuple(r)
        prev, prev_digest, expected = r[12], digest, expected + 1
    if first is None or expected != cp.seq + 1 or prev != cp.hash:
        why = f"rows {seq}..{cp.seq} differ from the signed checkpoint at seq {cp.seq}"
        return None, None, why if broken is None else f"{broken}; {why}"
    return cp, first, None


def covering_problem(tables: Tables, seq: int, keys: Keys, known: Known) -> str | None:
    """None if the row at ``seq`` is covered by a checkpoint signed with one of ``keys``
    (``cover``), otherwise why not."""
    return cover(tables, seq, keys, known)[2]
