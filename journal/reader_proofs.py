"""What a read proves, and with which keys: the broker key a payload or result is opened with,
the signing keys checkpoints are checked with (pinned by the caller, else those the journal
records), the checkpoint covering a row (``_cover``/``_proven``: an auditor read opens nothing
not proven), and ``verify``/``anchor``/``verify_since`` over one read snapshot -- public keys
only (``verify.py`` says what each key proves).  ``JournalReader`` (``reader.py``) is built on
it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from . import checkpoints
from .chain import GENESIS
from .checkpoints import Keys
from .connect import recorded_keys
from .errors import JournalError, VerifyReport
from .names import beside
from .reader_base import ReaderBase, pinned_keys
from .sealing import BrokerKey
from .signing import Anchor, Checkpoint
from .tables import Tables
from .verify import ANCHOR_KEY_DIFFERS, Trust, verify_after, verify_journal

__all__ = ["HOLDER_LABEL", "HOLDER_PREFIX", "ProvingReader", "default_signing_key"]

HOLDER_LABEL = "lease holder"
"""The purpose a holder's tag is keyed under: no other keyed digest shares it."""
HOLDER_PREFIX = "hmac-sha256:"


def _segments_hint(report: VerifyReport, tables: Tables) -> VerifyReport:
    """A broken report on a journal whose long results live in a ``<path>.results/`` that is
    not there: a copy made without it reads as altered chunks, and is -- nothing proves those
    results -- but the operator is told the likelier cause, not left to suspect tampering."""
    missing = getattr(tables, "segments_missing", None)
    if report.ok or "stored result" not in report.reason or missing is None or not missing():
        return report
    directory = getattr(tables, "segments", None)
    return dataclasses.replace(
        report,
        reason=f"{report.reason} -- its results directory {directory} is missing (a copy of "
        "the journal needs it: docs/journal.md)",
    )


def default_signing_key(path: Path) -> Path:
    """Where the signing key lives unless configured: ``<journal>.signing.key`` beside the
    file ``path`` names (``names.beside``)."""
    return beside(path, ".signing.key")


class _Source:
    """``verify.Source`` over one read transaction."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables

    def event_rows(self) -> Iterator[tuple[Any, ...]]:
        return self.tables.event_rows()

    def checkpoints(self) -> Iterator[Checkpoint]:
        return self.tables.checkpoints()

    def markers(self) -> Iterator[tuple[str, int, str, str, bytes]]:
        return self.tables.markers()

    def digests(self, invocation_id: str, audit: bool) -> Iterator[tuple[str, int, str]]:
        for stream, idx, data in self.tables.chunks(audit, invocation_id):
            yield stream, idx, hashlib.sha256(data).hexdigest()

    def bindings(self) -> Iterator[tuple[Any, ...]]:
        return self.tables.idempotency_rows()

    def leases(self) -> Iterator[tuple[Any, ...]]:
        return self.tables.leases()

    def linked_calls(self) -> Iterator[tuple[Any, ...]] | None:
        return self.tables.stored_linked_calls()

    def schema(self) -> tuple[str | None, int]:
        return self.tables.meta("schema"), self.tables.SIGNING_SCHEMA


class ProvingReader(ReaderBase):
    """The keys a reader opens and checks with, the checkpoints covering its rows, and
    ``verify``."""

    _holder_digest: Callable[[bytes], str] | None = None

    def reset(self) -> None:
        super().reset()
        self._holder_digest = None

    def _broker_key(self) -> BrokerKey:
        if self._key is None:
            if self._key_file is None:
                raise JournalError(
                    f"journal {self.where}: reading payloads and results needs the broker key "
                    "file ([journal] key_file)"
                )
            key = BrokerKey.load(self._key_file)
            stored = self._read(lambda t: t.meta("key_id"), "the broker key's id")
            if stored is not None and stored != key.key_id:
                raise JournalError(
                    f"broker key file {self._key_file} does not match this journal",
                    public="broker key file does not match this journal",
                )
            self._key_recorded = stored is not None
            self._key = key
        return self._key

    def holder_tag(self, invocation_id: str, holder: str) -> str:
        """A lease's ``holder`` as a caller is shown it (``statemachine.HolderTag``): this
        journal's keyed digest (``BrokerKey.digester``, label ``HOLDER_LABEL``) of the invocation
        id and the recorded holder, NUL-separated, as ``hmac-sha256:<hex>``.  The same in every
        process of the journal for the same holder of the same invocation, another for another
        holder; without the broker key it cannot be reversed or checked against a guessed
        ``hostname:pid``.  An operator maps it back (``affidavit journal holder``)."""
        digest = self._holder_digest
        if digest is None:  # (made once: a view tags a page of records)
            digest = self._holder_digest = self._broker_key().digester(HOLDER_LABEL)
        # ``surrogatepass``: a row's JSON may hold a lone surrogate (an altered row); tagged, not
        # a traceback in a caller's view.
        data = f"{invocation_id}\0{holder}".encode("utf-8", "surrogatepass")
        return HOLDER_PREFIX + digest(data)

    def broker_key_matches(self) -> bool | None:
        """Whether the broker key file is this journal's: its id against the one the journal
        records (None: it records none -- every broker records it before its first event).
        ``JournalError`` naming the file if it cannot be loaded (missing, not 0600, not a
        key); a database error as any read's."""
        if self._key_file is None:
            self._broker_key()  # its refusal: no key file for a database without one
        assert self._key_file is not None
        key = BrokerKey.load(self._key_file)
        stored = self._read(lambda t: t.meta("key_id"), "the broker key's id")
        return None if stored is None else stored == key.key_id

    def recorded_public_key(self) -> bytes | None:
        """The signing public key the journal records, when it records exactly one (None
        before signing, or on a shared journal with several brokers' keys)."""
        keys = self.recorded_public_keys()
        return next(iter(keys.values())) if len(keys) == 1 else None

    def recorded_public_keys(self) -> dict[str, bytes]:
        """Every signing public key the journal records (key id -> raw): its one key on
        SQLite, each registered broker's on a shared journal.  The journal holds them, so
        whoever rewrites it can replace them: pass keys kept elsewhere to ``verify`` for an
        independent check."""
        return self._read(recorded_keys, "the signing public keys")

    @property
    def key_source(self) -> str:
        """Where the keys reads check checkpoints with come from: ``public-key`` (given to
        ``open``) or ``journal`` (recorded in the journal itself: not independent of it)."""
        return "public-key" if self._pinned else "journal"

    def trusted_key_ids(self) -> tuple[str, ...]:
        """The ids of the keys reads check checkpoints with."""
        return tuple(sorted(self._trusted_keys()))

    def _trusted_keys(self, refresh: bool = False) -> Keys:
        """The keys a read checks checkpoints with (the writing journal uses its writer's):
        the pinned ones if given, else those the journal records."""
        if self._pinned:
            return self._pinned
        if self._recorded is None or refresh:
            self._recorded = self.recorded_public_keys()
        return self._recorded

    def _cover(self, seq: int) -> tuple[Checkpoint | None, tuple[Any, ...] | None, str | None]:
        """``checkpoints.cover`` with the trusted keys: the checkpoint covering the row at
        ``seq`` and the row, proven as ``verify`` proves them (the rows from it to that
        checkpoint re-hashed from their columns), or why not."""
        known = self._known_checkpoints
        what = f"the checkpoint covering seq {seq}"
        keys = self._trusted_keys()
        got = self._read(lambda t: checkpoints.cover(t, seq, keys, known), what)
        if got[0] is None and self.backend.multi_signer and not self._pinned:
            # A key registered by a broker that joined after these keys were read.
            keys = self._trusted_keys(refresh=True)
            got = self._read(lambda t: checkpoints.cover(t, seq, keys, known), what)
        return got

    def _covered(self, seq: int) -> Checkpoint:
        """The checkpoint covering the row at ``seq`` (``_cover``); ``JournalError`` if none
        does."""
        cp, _, why = self._cover(seq)
        if cp is None:
            raise JournalError(f"journal {self.where}: {why}")
        return cp

    def _proven(self, seq: int, what: str) -> tuple[Checkpoint, tuple[Any, ...]]:
        """The checkpoint and the row at ``seq``, proven (``_cover``) before an auditor read
        opens anything of it; else a ``JournalError`` naming ``what``, the seq, what failed and
        the keys -- never a byte of what it would have opened.  The auditor copy is sealed to
        the auditor's *public* key: anyone can make one, so only the signed chain says which
        copy the broker wrote."""
        cp, row, why = self._cover(seq)
        if cp is None or row is None:
            keys = ", ".join(self.trusted_key_ids()) or "none"
            raise JournalError(
                f"journal {self.where}: {what} is not proven, not opened: {why} (checked with "
                f"key {keys}, {self.key_source}) -- run affidavit journal verify"
            )
        return cp, row

    def latest_checkpoint(self) -> Checkpoint | None:
        return self._read(lambda t: t.latest_checkpoint(), "the latest checkpoint")

    def anchor(
        self,
        public_key: bytes | None = None,
        *,
        public_keys: Sequence[bytes] = (),
        previous: Anchor | None = None,
    ) -> tuple[VerifyReport, Anchor | None]:
        """Verify the journal with ``public_key`` / ``public_keys`` (default: the recorded
        ones) and, in the same read, take its last checkpoint as an anchor to keep elsewhere,
        with the key that signed it.  The anchor is None when the journal does not verify (an
        anchor must vouch only for a journal that does) or has no signed checkpoint.  Rows from
        before signing are accepted here: the anchor covers them as they are now.  Given the
        ``previous`` anchor, the journal must continue from it (``verify --anchor``'s check:
        its key trusted, the journal reaching its seq with its hash) -- the report's ``code``
        says which failed (``ANCHOR_KEY_DIFFERS``, ``ANCHOR_HISTORY_DIFFERS``).  With the
        recorded keys (none given), the head must be signed by the previous anchor's own key:
        a key the journal records beside it (a shared journal's) is one the file could have
        added, so only keys given may change it -- else ``ANCHOR_KEY_DIFFERS``, no anchor."""
        given = pinned_keys(public_key, public_keys)

        def run(t: Tables) -> tuple[VerifyReport, Checkpoint | None, dict[str, bytes]]:
            with self.snapshot():
                keys = given if given else recorded_keys(t)  # (in the rows' snapshot: verify)
                trust = Trust(keys, "public-key" if given else "journal", previous, True)
                return verify_journal(_Source(t), trust), t.latest_checkpoint(), keys

        report, cp, keys = self._read(run, "the rows a verify checks")
        if not report.ok or cp is None or cp.key_id not in keys:
            return report, None
        if previous is not None and not given and keys[cp.key_id] != previous.public_raw:
            return _key_added(report, cp, previous), None
        return report, Anchor(cp, keys[cp.key_id])

    def verify(
        self,
        *,
        public_key: bytes | None = None,
        public_keys: Sequence[bytes] = (),
        anchor: Anchor | None = None,
        accept_unsigned: bool = False,
    ) -> VerifyReport:
        """Check the hash chain, the signed checkpoints, every stored result against its
        chained hashes and, given one, an anchor -- with public keys only; report the first bad
        seq (``verify.py`` says what each key proves).  The checkpoints are checked with
        ``public_key`` / ``public_keys`` (raw Ed25519 bytes: on a shared journal, one per
        broker), else the anchor's key, else the keys the journal records itself."""
        given = pinned_keys(public_key, public_keys)
        fixed: Trust | None = None
        if given:
            fixed = Trust(given, "public-key", anchor, accept_unsigned)
        elif anchor is not None:
            fixed = Trust(pinned_keys(anchor.public_raw, ()), "anchor", anchor, accept_unsigned)

        def run(t: Tables) -> VerifyReport:
            with self.snapshot():
                trust = fixed
                if trust is None:  # the recorded keys, read in the rows' snapshot (verify_since)
                    recorded = recorded_keys(t)
                    source = "journal" if recorded else "none"
                    trust = Trust(recorded, source, None, accept_unsigned)
                return _segments_hint(verify_journal(_Source(t), trust), t)

        return self._read(run, "the rows a verify checks")

    def verify_since(self, base: VerifyReport) -> VerifyReport | None:
        """``verify()``'s report extended to this journal's head from ``base`` (an intact
        report of ``verify()`` with the recorded keys, as the console's journal page keeps
        it): only the rows after the one ``base`` reached are read, with the results they
        commit (``verify.verify_after``
        says what that proves, and what not).  None when ``base`` cannot be extended -- not
        intact, the row it reached is gone or another (the journal was replaced, rewound or
        re-chained), or the recorded keys changed: a whole ``verify()`` is then due."""
        if not base.ok or base.head_hash is None or base.key_source not in ("journal", "none"):
            return None

        def run(t: Tables) -> VerifyReport | None:
            with self.snapshot():
                # The keys in the rows' snapshot: read before it, a broker of a shared journal
                # that registered its key and signed a checkpoint in between would have its
                # checkpoint reported signed by an unrecorded key (an intact journal: BROKEN).
                recorded = recorded_keys(t)
                if tuple(sorted(recorded)) != base.key_ids:
                    return None
                trust = Trust(recorded, "journal" if recorded else "none", None, False)
                here = GENESIS if base.count == 0 else t.hash_at(base.count)
                if here != base.head_hash:
                    return None
                rows = t.event_rows(base.count + 1)
                cps = t.checkpoints_after(base.signed_seq or 0)
                return verify_after(base, rows, cps, trust, (_Source(t), t.marker))

        return self._read(run, "the rows a verify checks")


def _key_added(report: VerifyReport, cp: Checkpoint, previous: Anchor) -> VerifyReport:
    """``anchor``'s refusal of a head signed by another key than the previous anchor's, found
    with the keys the journal records: nothing proves the file did not add that key."""
    return dataclasses.replace(
        report,
        ok=False,
        first_bad_seq=None,
        reason=f"the journal's last checkpoint (seq {cp.seq}) is signed by key {cp.key_id}, "
        f"not the previous anchor's {previous.checkpoint.key_id}, and the journal names that "
        "key itself: pass the brokers' public keys to anchor another key's",
        code=ANCHOR_KEY_DIFFERS,
        complete_through=None,
    )
