"""``verify``: the hash chain, the signed checkpoints, an optional anchor, and every stored result
against the hashes its chained event carries -- with a public key alone, never a secret key.

What it proves depends on the key it trusts (docs/journal.md, "Threat model"):

* the chain alone (every backend, no key) -- that no row was edited or removed *without
  re-computing the chain*; anybody who can write the file can re-chain;
* with the signing public key -- that every row up to the last checkpoint is what the holder of
  the signing key committed: a re-chained edit no longer matches a signed hash, a forged appended
  row is after the last valid checkpoint, a removed checkpoint breaks the ``prev`` links, and a
  checkpoint signed by another key (a swapped key file) is refused.  A tail cut back to an earlier
  checkpoint, with the later checkpoints removed too, still looks whole;
* with an anchor kept elsewhere -- also that the journal still reaches the anchor's seq with the
  anchor's hash, which catches that cut.

Stored results are checked without the broker key: the marker against the chained
RESULT_COMMITTED event, and each sealed chunk (and auditor copy) against the hash the marker
lists.  Each idempotency binding row is checked against the chained ACTION_ACCEPTED of the
invocation it names, and each chained key against its binding row (``bindings.py``); each lease
row against its invocation's last chained lease event (``verify_leases.py``).  The
trusted key is the ``--public-key`` file, else the anchor's, else the one recorded in the journal
itself -- which someone rewriting the file could have replaced, so the report says which one it
was.

Nothing here knows SQLite: a backend hands over its rows, checkpoints and results (``Source``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from affidavit.statemachine import EventKind

from . import bindings, verify_leases
from .chain import GENESIS, canonical_json, check_row
from .checkpoints import signing_era, signing_era_row
from .errors import SigningRecordsRemoved, VerifyReport
from .signing import Anchor, Checkpoint, key_id_of, verify_signature
from .verify_codes import (
    AUDIT_COPY_DIFFERS,
    AUDIT_COPY_MISSING,
    AUDIT_COPY_TWICE,
    CHAIN_BROKEN,
    CHECKPOINT_INVALID,
    CHECKPOINT_MISMATCH,
    CHECKPOINT_MISSING,
    CHECKPOINT_OUT_OF_PLACE,
    CHECKPOINT_UNCHECKED,
    CHUNK_DIFFERS,
    CHUNK_MISSING,
    CHUNK_TWICE,
    MARKER_DIFFERS,
    MARKER_MISPLACED,
    MARKER_MISSING,
    ROW_ALTERED,
    ROW_MISSING,
    ROWS_REMOVED,
    ROWS_UNSIGNED,
    ROWS_UNSIGNED_BEFORE_SIGNING,
    SUMMARY_DIFFERS,
)
from .verify_linked import LinkedCheck

__all__ = [
    "ANCHOR_HISTORY_DIFFERS",
    "ANCHOR_KEY_DIFFERS",
    "Source",
    "Trust",
    "verify_after",
    "verify_journal",
]

ANCHOR_KEY_DIFFERS = "ANCHOR_KEY_DIFFERS"
"""``VerifyReport.code``: the anchor checked against is signed by a key the check does not trust
(``anchor --previous``: a journal that now names another key than the anchor before it)."""
ANCHOR_HISTORY_DIFFERS = "ANCHOR_HISTORY_DIFFERS"
"""``VerifyReport.code``: the journal does not continue from the anchor -- it ends before the
anchor's seq, or holds another history up to it."""

_RESULT_COMMITTED = EventKind.RESULT_COMMITTED.value
_LEASE_KINDS = frozenset(
    {EventKind.RETRY_LEASE_ACQUIRED.value, EventKind.DISPATCH_LEASE_ACQUIRED.value}
)
"""``leases.LEASE_KINDS``' values: the events a lease row names (written out: importing
``leases`` would bring trio into a reader, tests/journal/test_reader_imports.py)."""


class Source(Protocol):
    """What ``verify_journal`` reads from a backend, each in seq (or key) order."""

    def event_rows(self) -> Iterable[tuple[Any, ...]]:
        """Rows as ``chain.EVENT_COLUMNS``, by seq."""
        ...

    def checkpoints(self) -> Iterable[Checkpoint]:
        """By seq."""
        ...

    def markers(self) -> Iterable[tuple[str, int, str, str, bytes]]:
        """(invocation_id, seq, sha256, streams JSON, sealed summary) of every results row."""
        ...

    def digests(self, invocation_id: str, audit: bool) -> Iterable[tuple[str, int, str]]:
        """(stream, idx, hex SHA-256 of the stored blob) of the result's chunks (``audit``: of
        its auditor copies, the summary's under stream ``""``), by stream and idx."""
        ...

    def bindings(self) -> Iterable[tuple[Any, ...]]:
        """Idempotency rows as ``rows.IDEMPOTENCY_COLUMNS``."""
        ...

    def leases(self) -> Iterable[tuple[Any, ...]]:
        """Every lease row: (invocation_id, holder, generation, expires_at, seq)."""
        ...

    def linked_calls(self) -> Iterable[tuple[Any, ...]] | None:
        """Every ``linked_calls`` row (invocation_id, call_sha256, seq); None for a journal
        from before the table."""
        ...

    def schema(self) -> tuple[str | None, int]:
        """The schema the journal records (``meta``), and the first one only signing brokers
        write (``Tables.SIGNING_SCHEMA``)."""
        ...


@dataclass(frozen=True)
class Trust:
    """The keys checkpoints must be signed with, where they came from, and what else to check.
    One key for a SQLite journal; on a shared journal each broker signs with its own, and a
    checkpoint names the key that signed it (``Checkpoint.key_id``)."""

    keys: Mapping[str, bytes]
    """key id -> raw Ed25519 public key (empty: no key to check with)."""
    source: str
    """``public-key`` (a file the operator passed), ``anchor``, ``journal`` (recorded in the
    journal itself), or ``none`` (a journal from before signing)."""
    anchor: Anchor | None = None
    accept_unsigned: bool = False
    """Accept rows written before signing (a journal adopted by a signing broker, or one never
    opened by one) on the strength of the hash chain alone."""


@dataclass
class _Problems:
    """The first bad seq found so far, and why (the smallest seq wins)."""

    seq: int | None = None
    reason: str = ""
    extra: list[str] = field(default_factory=list)
    extra_codes: list[str | None] = field(default_factory=list)
    """``extra``'s codes, one each (``VerifyReport.also_codes``)."""
    code: str | None = None
    """The first problem's stable code (``VerifyReport.code``, ``verify_codes``)."""

    def add(self, seq: int | None, reason: str, code: str | None) -> None:
        """``code``: the problem's stable code (``verify_codes``); every check passes one."""
        if seq is None:
            if self.seq is None and not self.reason:
                self.reason, self.code = reason, code
            else:
                self._also(reason, code)
            return
        if self.seq is None or seq < self.seq:
            if self.reason:
                self._also(self.reason, self.code)
            self.seq, self.reason, self.code = seq, reason, code
        else:
            self._also(reason, code)

    def _also(self, reason: str, code: str | None) -> None:
        self.extra.append(reason)
        self.extra_codes.append(code)

    @property
    def found(self) -> bool:
        return self.seq is not None or bool(self.reason)


@dataclass
class _Walk:
    """State of the pass over rows and checkpoints."""

    rows: int = 0
    """Rows checked (the last intact seq)."""
    complete: bool = False
    """Every row was checked (the pass did not stop at a problem)."""
    head: str = GENESIS
    signed_seq: int = 0
    signed_at: float | None = None
    last_checkpoint: int = 0
    unsigned_through: int | None = None
    unsigned_at: float | None = None
    anchor_hash: str | None = None
    committed: dict[str, tuple[int, str]] = field(default_factory=dict)
    """RESULT_COMMITTED rows: invocation -> (seq, attrs JSON)."""
    era_row: int | None = None
    """The first row only a signing broker writes (``checkpoints.signing_era_row``)."""
    accepted: dict[str, tuple[int, bindings.Claim | None]] = field(default_factory=dict)
    """ACTION_ACCEPTED rows: invocation -> (seq, the idempotency key it names, if any)."""
    linked: LinkedCheck | None = None
    """``linked_calls`` read beside the rows (None: a journal from before the table)."""
    leased: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Lease events: invocation -> (seq, attrs JSON) of its last (``verify_leases``)."""


def verify_journal(source: Source, trust: Trust) -> VerifyReport:
    problems = _Problems()
    stored = source.linked_calls()
    walk = _walk(source, trust, problems, None if stored is None else LinkedCheck(stored))
    walked_bad = problems.seq
    limit = walked_bad if walked_bad is not None else walk.rows + 1
    _unsigned(walk, trust, problems, source.schema())
    if trust.anchor is not None:
        _check_anchor(walk, trust, trust.anchor, problems)
    results, marker_only = _check_results(source, walk, limit, problems)
    bound = bindings.check(source.bindings(), walk.accepted, problems.add)
    leases = verify_leases.check(
        source.leases(), walk.leased, limit, walk.rows if walk.complete else None, problems.add
    )
    if walk.linked is not None:
        # The walk intact: a stored row past its last row has no event, so it is one too many
        # (planted at head+1 it would wait for the next row).  Otherwise nothing from the first
        # bad row on is judged.
        walk.linked.finish(walked_bad, problems.add)
    anchor_seq = trust.anchor.checkpoint.seq if trust.anchor is not None else None
    return VerifyReport(
        **_verdict(walk, problems),
        key_id=next(iter(trust.keys)) if len(trust.keys) == 1 else None,
        key_ids=tuple(sorted(trust.keys)),
        key_source=trust.source,
        anchor_seq=anchor_seq,
        complete_through=anchor_seq if not problems.found else None,
        results=results,
        results_marker_only=marker_only,
        bindings=bound,
        leases=leases,
    )


def _verdict(walk: _Walk, problems: _Problems) -> dict[str, Any]:
    """What a walk found, as the report's fields: a whole verify's and an extension's alike."""
    ok = not problems.found
    return {
        "ok": ok,
        "count": walk.rows if problems.seq is None else max(0, min(walk.rows, problems.seq - 1)),
        "first_bad_seq": problems.seq,
        "reason": "intact" if ok else problems.reason,
        "head_hash": walk.head,
        "signed_seq": walk.signed_seq or None,
        "signed_at": walk.signed_at,
        "unsigned_through": walk.unsigned_through,
        "also": tuple(problems.extra),
        "also_codes": tuple(problems.extra_codes),
        "code": problems.code,
    }


Marker = Callable[[str], "tuple[int, str, Any, bytes] | None"]
"""An invocation's completeness marker: (seq, sha256, streams JSON, sealed summary), or None."""


def verify_after(
    base: VerifyReport,
    rows: Iterable[tuple[Any, ...]],
    checkpoints: Iterable[Checkpoint],
    trust: Trust,
    stored: tuple[Source, Marker] | None = None,
) -> VerifyReport:
    """The rows after an intact ``base`` (a whole verify's report, ``ok``, with ``trust``)
    checked as ``verify_journal`` checks them, continuing its walk from the row it reached
    (``base.count``, hash ``base.head_hash``): each row links to the one before and hashes to
    what it says, each checkpoint after ``base.signed_seq`` is signed by a trusted key and
    signs the chain so far, and the rows after the last one are reported unsigned.  The chain
    makes this sound -- a row after ``base.count`` that links to ``base.head_hash`` extends
    what ``base`` proved -- for the rows after it only: a row before it altered since is not
    read (nor a stored result, an idempotency binding or a lease row), a whole verify finds
    that.
    ``rows``: ``chain.EVENT_COLUMNS`` from ``base.count + 1``, by seq; ``checkpoints``: by
    seq, those after ``base.signed_seq`` at least.  Given ``stored`` (the result chunks'
    digests, each invocation's marker), the results the new rows commit are checked against
    their chained hashes too, as a whole verify checks them (``results``: ``base``'s and
    these); the idempotency bindings, the lease rows and ``linked_calls`` are not.  The
    caller checks first that the row at ``base.count`` still has the hash ``base.head_hash``
    (or this journal is not ``base``'s)."""
    if not base.ok or base.head_hash is None:
        raise ValueError("only an intact report is extended")
    problems = _Problems()
    signed = base.signed_seq or 0
    walk = _Walk(
        rows=base.count,
        head=base.head_hash,
        signed_seq=signed,
        signed_at=base.signed_at,
        last_checkpoint=signed,
        unsigned_through=base.unsigned_through,
        unsigned_at=None,
    )
    later = (cp for cp in checkpoints if cp.seq > signed)
    cp = next(later, None)
    if cp is not None and cp.seq <= base.count:
        problems.add(cp.seq, f"a checkpoint at seq {cp.seq} appeared among rows already "
                     f"verified (through seq {base.count}): verify the whole journal",
                     CHECKPOINT_OUT_OF_PLACE)  # fmt: skip
    else:
        _extend(walk, rows, later, cp, trust, problems)
    _unsigned(walk, trust, problems)
    checked, only = (0, 0) if stored is None else _check_new_results(walk, problems, *stored)
    return dataclasses.replace(
        base,
        **_verdict(walk, problems),
        # An anchor proves completeness through its seq only while nothing is found: as
        # ``verify_journal``'s report, a broken one claims none.
        complete_through=base.complete_through if not problems.found else None,
        results=base.results + checked,
        results_marker_only=base.results_marker_only + only,
    )


def _check_new_results(
    walk: _Walk, problems: _Problems, source: Source, marker: Marker
) -> tuple[int, int]:
    """The results committed by the rows an extension read (``walk.committed``), each against
    its marker and stored chunks, as ``_check_results`` checks them -- up to the first bad row.
    Returns (checked, of them checked by their marker only)."""
    limit = problems.seq if problems.seq is not None else walk.rows + 1
    checked = only = 0
    for iid, (seq, attrs) in walk.committed.items():
        if seq >= limit:
            continue
        found = marker(iid)
        if found is None:
            problems.add(seq, f"the result of invocation {iid} (seq {seq}) has no completeness "
                         "marker (its results row was removed)", MARKER_MISSING)  # fmt: skip
            continue
        mseq, sha, streams, summary = found
        if mseq != seq:
            problems.add(seq, f"results row of invocation {iid} names seq {mseq}, which is "
                         "not its RESULT_COMMITTED event", MARKER_MISPLACED)  # fmt: skip
            continue
        why, code, marker_only = _check_result(source, iid, sha, streams, bytes(summary), attrs)
        if why is not None:
            problems.add(seq, f"stored result of invocation {iid} (seq {seq}): {why}", code)
        checked += 1
        only += marker_only
    return checked, only


def _extend(
    walk: _Walk,
    rows: Iterable[tuple[Any, ...]],
    later: Iterator[Checkpoint],
    cp: Checkpoint | None,
    trust: Trust,
    problems: _Problems,
) -> None:
    expected, prev_digest = walk.rows + 1, None
    for row in rows:
        digest, why = check_row(row, expected, walk.head, prev_digest)
        if digest is None:
            problems.add(
                expected, why or f"row {expected} was altered", _row_code(row, expected, walk.head)
            )
            return
        walk.head, prev_digest, walk.rows = row[12], digest, expected
        if row[4] == _RESULT_COMMITTED:
            walk.committed[row[2]] = (expected, row[8])
        expected += 1
        if cp is not None and cp.seq == walk.rows:
            if not _check_checkpoint(walk, trust, cp, problems):
                return
            cp = next(later, None)
    walk.complete = True
    if cp is not None:
        problems.add(
            walk.rows + 1,
            f"the journal ends at seq {walk.rows} but a checkpoint covers seq {cp.seq}: rows "
            f"{walk.rows + 1}..{cp.seq} were removed",
            ROWS_REMOVED,
        )


def _named(trust: Trust, one: str = "key") -> str:
    """The trusted keys as a message names them: ``key K (source)`` or ``any of keys ...``."""
    ids = sorted(trust.keys)
    if len(ids) == 1:
        return f"{one} {ids[0]} ({trust.source})"
    return f"any of the trusted keys {', '.join(ids)} ({trust.source})"


def _when(at: float | None) -> str:
    if at is None:
        return "?"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _walk(
    source: Source, trust: Trust, problems: _Problems, linked: LinkedCheck | None = None
) -> _Walk:
    """One pass over rows and checkpoints together (and ``linked_calls``, given ``linked``);
    stops at the first problem."""
    walk = _Walk(linked=linked)
    checkpoints: Iterator[Checkpoint] = iter(source.checkpoints())
    cp = next(checkpoints, None)
    anchor_seq = trust.anchor.checkpoint.seq if trust.anchor is not None else None
    expected, prev_digest = 1, bytes(32)
    for row in source.event_rows():
        digest, why = check_row(row, expected, walk.head, prev_digest)
        if digest is None:
            problems.add(
                expected, why or f"row {expected} was altered", _row_code(row, expected, walk.head)
            )
            return walk
        seq = expected
        walk.head, prev_digest = row[12], digest
        walk.rows = seq
        expected += 1
        if seq == anchor_seq:
            walk.anchor_hash = walk.head
        if row[4] == _RESULT_COMMITTED:
            walk.committed[row[2]] = (seq, row[8])
            if walk.era_row is None and signing_era_row(row[4], row[8]):
                walk.era_row = seq
        elif row[4] == bindings.ACCEPTED:
            walk.accepted[row[2]] = (seq, bindings.claim_of(row[8]))
        elif row[4] in _LEASE_KINDS:
            walk.leased[row[2]] = (seq, row[8])
        if linked is not None:
            linked.row(seq, row[2], row[8])
        if cp is not None and cp.seq == seq:
            if not _check_checkpoint(walk, trust, cp, problems):
                return walk
            cp = next(checkpoints, None)
    walk.complete = True
    if cp is not None:
        problems.add(
            walk.rows + 1,
            f"the journal ends at seq {walk.rows} but a checkpoint covers seq {cp.seq}: rows "
            f"{walk.rows + 1}..{cp.seq} were removed",
            ROWS_REMOVED,
        )
    return walk


def _check_checkpoint(walk: _Walk, trust: Trust, cp: Checkpoint, problems: _Problems) -> bool:
    first = walk.signed_seq + 1
    if not trust.keys:
        problems.add(
            first,
            f"checkpoint at seq {cp.seq}: no public key to check it with",
            CHECKPOINT_UNCHECKED,
        )
        return False
    raw = trust.keys.get(cp.key_id)
    if raw is None or not verify_signature(cp, raw):
        problems.add(
            first,
            f"checkpoint at seq {cp.seq} is not signed by {_named(trust)}; it names key "
            f"{cp.key_id}: rows {first}..{cp.seq} are not authenticated",
            CHECKPOINT_INVALID,
        )
        return False
    if cp.prev != walk.last_checkpoint:
        missing = cp.prev if cp.prev > walk.last_checkpoint else walk.last_checkpoint
        problems.add(
            missing,
            f"checkpoint at seq {cp.seq} follows the one at seq {cp.prev}, but the checkpoint "
            f"before it is at seq {walk.last_checkpoint}: a checkpoint was removed",
            CHECKPOINT_MISSING,
        )
        return False
    if cp.hash != walk.head:
        problems.add(
            first,
            f"rows {first}..{cp.seq} differ from the signed checkpoint at seq {cp.seq} "
            "(altered and re-chained)",
            CHECKPOINT_MISMATCH,
        )
        return False
    if cp.adopted:
        if cp.prev != 0:
            problems.add(
                first, f"checkpoint at seq {cp.seq} claims adoption mid-journal", CHECKPOINT_INVALID
            )
            return False
        walk.unsigned_through, walk.unsigned_at = cp.seq, cp.at
    walk.signed_seq, walk.signed_at, walk.last_checkpoint = cp.seq, cp.at, cp.seq
    return True


def _unsigned(
    walk: _Walk, trust: Trust, problems: _Problems, schema: tuple[str | None, int] | None = None
) -> None:
    """Rows after the last checkpoint, and rows from before signing not accepted -- never,
    whatever ``accept_unsigned`` says, when a signing broker wrote them (``_removed``).
    ``schema``: ``Source.schema()`` (a whole verify's)."""
    if walk.complete and walk.signed_seq < walk.rows:
        _unsigned_tail(walk, trust, problems)
    if walk.unsigned_through and _removed(walk, problems, schema):
        return
    if walk.unsigned_through and not trust.accept_unsigned:
        problems.add(
            1,
            f"rows 1..{walk.unsigned_through} were written before this journal was signed "
            + (
                "(adopted by a signing broker at " + _when(walk.unsigned_at) + ")"
                if walk.unsigned_at is not None
                else "(it has no checkpoint)"
            )
            + "; they rest on the hash chain alone -- pass --accept-unsigned to accept them",
            ROWS_UNSIGNED_BEFORE_SIGNING,
        )


def _removed(walk: _Walk, problems: _Problems, schema: tuple[str | None, int] | None) -> bool:
    """Rows 1..``unsigned_through`` claimed to predate signing that a signing broker wrote
    (``checkpoints.signing_era``): its signing records were removed.  The recorded schema
    counts only for a journal with no checkpoint (an adoption raises it legitimately)."""
    through = walk.unsigned_through or 0
    recorded, first = schema if schema is not None else (None, 0)
    era_row = walk.era_row if walk.era_row is not None and walk.era_row <= through else None
    why = signing_era(recorded if walk.unsigned_at is None else None, first, era_row)
    if why is None:
        return False
    problems.add(
        1,
        f"rows 1..{through} look written before this journal was signed, but {why}: its "
        "signing records (checkpoints, recorded key) were removed -- --accept-unsigned does "
        "not accept them",
        SigningRecordsRemoved.code,
    )
    return True


def _unsigned_tail(walk: _Walk, trust: Trust, problems: _Problems) -> None:
    if walk.signed_seq == 0 and trust.source == "none":
        # Never signed at all: a journal from before signing (reported as an unsigned prefix).
        walk.unsigned_through = walk.rows
        return
    first = walk.signed_seq + 1
    problems.add(
        first,
        f"rows {first}..{walk.rows} are not covered by a signed checkpoint (appended without the "
        "signing key, or their checkpoints were removed)",
        ROWS_UNSIGNED,
    )


def _check_anchor(walk: _Walk, trust: Trust, anchor: Anchor, problems: _Problems) -> None:
    a = anchor.checkpoint
    if trust.keys and trust.keys.get(key_id_of(anchor.public_raw)) != anchor.public_raw:
        problems.add(None, f"the anchor (seq {a.seq}) is signed by key {a.key_id}, not "
                     f"{_named(trust, 'the trusted key')}", ANCHOR_KEY_DIFFERS)  # fmt: skip
        return
    if walk.complete and walk.rows < a.seq:
        problems.add(
            walk.rows + 1,
            f"the journal ends at seq {walk.rows}, before the anchor's seq {a.seq}: rows "
            f"{walk.rows + 1}..{a.seq} were removed",
            ANCHOR_HISTORY_DIFFERS,
        )
    elif walk.anchor_hash is not None and walk.anchor_hash != a.hash:
        problems.add(
            a.seq,
            f"the journal's history up to seq {a.seq} differs from the anchor's (signed at "
            f"{_when(a.at)})",
            ANCHOR_HISTORY_DIFFERS,
        )


def _check_results(source: Source, walk: _Walk, limit: int, problems: _Problems) -> tuple[int, int]:
    """Each results row against its chained event, each stored blob against the marker's list.
    Only results whose event is before ``limit`` (the first bad row) are checked.  Returns
    (checked, of them checked by their marker only: stored before per-chunk hashes)."""
    checked = only = 0
    seen: set[str] = set()
    for iid, seq, sha, streams_json, summary in source.markers():
        seen.add(iid)
        chained = walk.committed.get(iid)
        if type(seq) is not int or type(iid) is not str:  # not a row the broker wrote
            named = f"invocation {iid}" if type(iid) is str else "an invocation id not text"
            problems.add(
                None if chained is None else chained[0],
                f"the results row of {named} was altered: a column is not of its type",
                MARKER_MISPLACED,
            )
            continue
        if chained is None or chained[0] != seq:
            _misplaced(iid, seq, chained, walk, limit, problems)
            continue
        if seq >= limit:
            continue
        why, code, marker_only = _check_result(
            source, iid, sha, streams_json, bytes(summary), chained[1]
        )
        if why is not None:
            problems.add(seq, f"stored result of invocation {iid} (seq {seq}): {why}", code)
        checked += 1
        only += marker_only
    for iid, (seq, _) in walk.committed.items():
        if iid not in seen and seq < limit:
            problems.add(seq, f"the result of invocation {iid} (seq {seq}) has no completeness "
                         "marker (its results row was removed)", MARKER_MISSING)  # fmt: skip
    return checked, only


def _misplaced(
    iid: str,
    seq: int,
    chained: tuple[int, str] | None,
    walk: _Walk,
    limit: int,
    problems: _Problems,
) -> None:
    """A results row whose seq is not its invocation's RESULT_COMMITTED.  With a chained one,
    it is judged there, whatever seq the row names (past the journal's end included: SQLite
    checks no foreign key).  With none, at the seq it names if the walk read that row.  Past the
    rows read: once the walk read every row (no later row can be its event), at the journal's
    end (``rows + 1``, as the anchor reports rows removed from the end: a RESULT_COMMITTED cut
    off with them would explain it).  At a seq no row can have (0 or less): at journal level
    (None).  Never at a seq the journal does not have ("BROKEN at seq 999998" of 40 rows)."""
    if chained is not None:
        if chained[0] < limit:
            problems.add(
                chained[0],
                f"results row of invocation {iid} names seq {seq}, not its RESULT_COMMITTED "
                f"event (seq {chained[0]})",
                MARKER_MISPLACED,
            )
        return
    why = f"results row of invocation {iid} names seq {seq}, but the invocation has no "
    if seq < 1:
        problems.add(
            None, why + "RESULT_COMMITTED event, and no row has that seq", MARKER_MISPLACED
        )
    elif seq <= walk.rows:
        problems.add(seq, why + "RESULT_COMMITTED event", MARKER_MISPLACED)
    elif walk.complete:
        problems.add(
            walk.rows + 1,
            why + f"RESULT_COMMITTED event, and the journal ends at seq {walk.rows}: rows from "
            f"{walk.rows + 1} on were removed, or the row was altered",
            MARKER_MISPLACED,
        )


def _row_code(row: tuple[Any, ...], seq: int, head: str) -> str:
    """The code of a row ``chain.check_row`` refused, by its first failed check."""
    if row[0] != seq:
        return ROW_MISSING
    return CHAIN_BROKEN if row[11] != head else ROW_ALTERED


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_MARKER_ONLY = "stored before per-chunk hashes"
"""``_check_result_fields``' answer for a result whose marker alone matches its chained event:
its chained event lists no chunk hash to check the stored chunks against."""


def _check_result(
    source: Source, iid: str, sha: str, streams_json: str, summary: bytes, attrs_json: str
) -> tuple[str | None, str | None, bool]:
    """Why the stored result differs from its chained event and its code (None: it does
    not), and whether only its marker could be checked (stored before per-chunk hashes)."""
    try:
        found = _check_result_fields(source, iid, sha, streams_json, summary, attrs_json)
    except (TypeError, ValueError, KeyError, AttributeError):  # rows not as the broker writes them
        return "its marker is not readable", MARKER_DIFFERS, False
    if found is None:
        return None, None, False
    if found[0] is _MARKER_ONLY:
        return None, None, True
    return found[0], found[1], False


def _check_result_fields(
    source: Source, iid: str, sha: str, streams_json: str, summary: bytes, attrs_json: str
) -> tuple[str, str] | None:
    attrs = json.loads(attrs_json)
    declared = json.loads(streams_json)
    whole = _sha(canonical_json({s: v["sha256"] for s, v in declared.items()}).encode())
    if attrs.get("sha256") != sha or whole != sha:
        return "marker hash differs from the chained event", MARKER_DIFFERS
    if "marker_sha256" not in attrs:
        return _MARKER_ONLY, ""  # opening it with the broker key checks its stream's hash
    if _sha(canonical_json(declared).encode("utf-8")) != attrs["marker_sha256"]:
        return "marker differs from the chained event", MARKER_DIFFERS
    if _sha(summary) != attrs.get("sealed_summary_sha256"):
        return "sealed summary differs from the chained event", SUMMARY_DIFFERS
    why = _check_blobs(source.digests(iid, False), declared, "sealed", _CHUNK)
    if why is not None:
        return why
    if "audit_summary_sha256" in attrs:
        audit = list(source.digests(iid, True))
        summary_copy = [d for s, i, d in audit if s == "" and i == 0]
        if summary_copy != [attrs["audit_summary_sha256"]]:
            return "the summary's auditor copy differs from the chained event", SUMMARY_DIFFERS
        return _check_blobs(
            ((s, i, d) for s, i, d in audit if s != ""), declared, "audit", _AUDIT_COPY
        )
    return None


_CHUNK = ("chunk", CHUNK_TWICE, CHUNK_MISSING, CHUNK_DIFFERS)
_AUDIT_COPY = ("auditor copy", AUDIT_COPY_TWICE, AUDIT_COPY_MISSING, AUDIT_COPY_DIFFERS)
"""What ``_check_blobs`` checks: its name, and the codes of a blob stored twice, missing, and
differing."""


def _check_blobs(
    digests: Iterable[tuple[str, int, str]],
    declared: Mapping[str, Any],
    which: str,
    kind: tuple[str, str, str, str],
) -> tuple[str, str] | None:
    what, twice_code, missing_code, differs_code = kind
    stored: dict[str, dict[int, str]] = {}
    twice: set[tuple[str, int]] = set()
    for stream, idx, digest in digests:
        have = stored.setdefault(stream, {})
        if idx in have:
            twice.add((stream, idx))  # a row and a reference (or a tampered key): which one?
        have[idx] = digest
    for stream, info in declared.items():
        listed = info.get(which) or []
        have = stored.get(stream, {})
        for idx, want in enumerate(listed):
            if (stream, idx) in twice:
                return f"stream {stream!r} {what} {idx} is stored twice", twice_code
            got = have.get(idx)
            if got is None:
                return f"stream {stream!r} {what} {idx} is missing", missing_code
            if got != want:
                return f"stream {stream!r} {what} {idx} differs from its chained hash", differs_code
    return None
