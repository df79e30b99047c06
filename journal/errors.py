"""Journal errors and the small records the journal hands out.

Every message names ids, seqs, files and codes — never a payload, a result or a key (seed: "Do not
put credential contents into either the error or the action record").
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ApprovalLapsed",
    "CommitUnknown",
    "HeadHeld",
    "IdempotencyMismatch",
    "IdempotencyRecord",
    "JournalError",
    "JournalLost",
    "JournalNotDurable",
    "JournalReplaced",
    "JournalUnavailable",
    "JournalWriteError",
    "KeyRetentionPassed",
    "Lease",
    "LeaseBusy",
    "LeaseEventRefused",
    "LeaseLost",
    "ReadFailed",
    "ResultStoreFailed",
    "ResultStoreReplaced",
    "ResultStoreUnknown",
    "SigningRecordsRemoved",
    "VerifyReport",
    "told",
]


@dataclass(frozen=True, slots=True)
class Lease:
    """An invocation's retry lease (seed: "take a lease on the invocation, record the retry
    generation, and allow only one active attempt")."""

    generation: int
    expires_at: float
    holder: str
    invocation_id: str = ""
    seq: int | None = None
    """The seq of the RETRY_LEASE_ACQUIRED event that granted it."""


@dataclass(frozen=True, slots=True)
class IdempotencyRecord:
    """The four facts the seed requires before dispatch: key, fingerprint, scope, retention."""

    scope: str
    key: str
    fingerprint: str
    invocation_id: str
    expires_at: float | None
    """Earliest time a retry with this key is no longer safe (end of the retention window)."""
    created_at: float
    send_by: float | None = None
    """When the binder's own first attempt may send no more: the lease end it writes into its
    ACTION_ACCEPTED (its caller's timeout, its target's total, its ``lease_margin``), in the
    clock leases are judged by -- what ``binder.judge`` waits out while nothing is recorded.
    None for a row from before the column (SQLite schema 9, PostgreSQL schema 3) or bound
    without it: judged by the window of the judging call's target, and fenced."""
    target: str | None = None
    """The binder's target (its configured name), bound beside ``send_by``: what a fence names
    as the closed invocation's target, so only callers of a broker configuring that target see
    it (a scope may be shared by several targets).  None for a row from before the column:
    the fenced record is an operator's only (``binder.UNKNOWN_TARGET``)."""


@dataclass(frozen=True, slots=True)
class VerifyReport:
    ok: bool
    count: int
    """Rows checked and found intact (all of them when ``ok``)."""
    first_bad_seq: int | None
    reason: str
    head_hash: str | None = None
    """Hash of the last intact row."""
    signed_seq: int | None = None
    """The last seq covered by a valid signed checkpoint."""
    signed_at: float | None = None
    """When that checkpoint was signed."""
    key_id: str | None = None
    """Fingerprint of the public key checkpoints were checked with (when there was one)."""
    key_ids: tuple[str, ...] = ()
    """Every trusted key's fingerprint (several on a shared journal: one per broker)."""
    key_source: str = "journal"
    """Where that key came from: ``public-key`` (a file passed in), ``anchor``, ``journal``
    (recorded in the journal itself: not independent of it) or ``none``."""
    anchor_seq: int | None = None
    """The seq of the anchor checked against, if any."""
    unsigned_through: int | None = None
    """Rows 1..this were written before the journal was signed (accepted only on request)."""
    results: int = 0
    """Stored results checked against their chained hashes."""
    results_marker_only: int = 0
    """Of ``results``, those stored before per-chunk hashes: only their marker is checked
    against the chained event (the chunks are checked when read with the broker key)."""
    bindings: int = 0
    """Idempotency bindings proven by the chained ACTION_ACCEPTED of the invocation they name."""
    leases: int = 0
    """Lease rows proven by their invocation's last chained lease event (holder, generation,
    expires_at): the rows the writer decides "busy" from."""
    also: tuple[str, ...] = ()
    """Further problems found after the first."""
    also_codes: tuple[str | None, ...] = ()
    """``also``'s stable codes, one each, in the same order (``code``'s kinds)."""
    complete_through: int | None = None
    """The last seq the journal is proven *complete* through: an intact verify's anchor seq
    (the journal still reaches it, with its hash); None without an anchor.  A tail cut back
    to a checkpoint, the later checkpoints removed too, leaves a shorter journal every row of
    which is signed: only an anchor kept elsewhere shows rows were there -- and only up to its
    own seq (rows after it, back to a checkpoint, could have been removed unseen)."""
    code: str | None = None
    """The first problem's stable code (None: intact): one per kind of break -- ``ROW_ALTERED``,
    ``CHUNK_MISSING``, ... (``verify_codes``, listed in docs/journal.md), ``ANCHOR_*``
    (``verify``), ``SIGNING_RECORDS_REMOVED`` (rows that look from before signing were written
    by a signing broker; ``--accept-unsigned`` does not accept them)."""


class JournalError(Exception):
    """The journal cannot do what was asked (bad key, corrupt row, closed journal, misuse).
    ``public``: the words a caller of the broker is told instead of ``str()`` (``told``), when
    those hold what only the operator may read -- a key file refused for its owner or an ACL
    entry names their uids (``sealing.read_secret_file``); None: ``str()`` is fit for both.

    The rule: a message that names a key file's path or a uid sets ``public`` (every key
    file's read: ``sealing``, ``reader_proofs``); one that names the journal's own location
    need not -- the daemon's and MCP's answers take it out (``engine.location.unplaced``), as
    they take out every configured key file's path.  The operator's command line answers with
    ``str()`` (``engine.read_failure(..., operator=True)``): the path and uid it must mend."""

    def __init__(self, *args: object, public: str | None = None) -> None:
        super().__init__(*args)
        self.public = public


def told(exc: BaseException) -> str:
    """What a caller of the broker is told of ``exc``: its ``public`` words, if it has them
    (``JournalError``), else ``str()``.  The operator's log and CLI keep ``str()``."""
    public = getattr(exc, "public", None) if isinstance(exc, JournalError) else None
    return str(exc) if public is None else public


class SigningRecordsRemoved(JournalError):
    """A journal with rows and no record of its signing key, whose rows or files show a signing
    broker wrote it (``checkpoints.signing_era``): not a journal from before signing but one
    whose signing records were removed -- to have a broker sign over rows rewritten meanwhile.
    No broker adopts it and ``verify --accept-unsigned`` does not accept it."""

    code = "SIGNING_RECORDS_REMOVED"


class JournalLost(JournalError):
    """A SQLite file that holds no journal (no ``events`` table) beside files only a journal
    made there leaves: its key files or result segments (``SqliteBackend.create``).  Its
    ``-wal`` was lost (removed with the ``-shm``, a backup that copied the main file alone):
    every commit since the last checkpoint went with it, the schema too.  Made anew there, a
    broker re-signed with the old keys, ``verify`` said "intact: 0 events", a same-key POST was
    sent again and start-up compaction deleted the only surviving sealed segment files as
    unreferenced.  So no schema is made there: the message names the files and the way out
    (restore the ``-wal`` or a backup; or move those files away to start a new journal)."""

    code = "JOURNAL_LOST"


class ResultUnverified(JournalError):
    """A stored result that fails its verification (a chunk, its marker or its summary against
    the chained hashes): a verdict on the bytes, not a journal that could not be read -- every
    surface answers it RESULT_UNVERIFIED (``engine.result_failure``, ``engine.call_failure``),
    never the bytes.  The message names the invocation, stream and chunk, never a value."""


class NoAuditorCopy(JournalError):
    """A stored result whose chained RESULT_COMMITTED names no auditor copy of its summary nor
    of any stream (stored while no auditor key was configured): what the records prove, not a
    journal that cannot be read -- ``journal audit-open`` answers it NO_AUDITOR_COPY.  A marker
    that lists a stream's auditor copy without the event naming the summary's is not this: the
    records contradict each other (``ResultUnverified``)."""


class SealUnopened(JournalError):
    """A sealed blob the key given does not open (its AEAD tag refused, or not a blob of that
    key's form): the wrong key, or the bytes altered -- a reader that proved the bytes against
    the signed chain first knows it is the key (``journal audit-open``: FILE_UNUSABLE at
    ``--key``).  The message names the key file -- an operator's words: a caller-facing
    surface withholds it (``engine.unplaced``) -- never a byte of the blob."""


class HeadHeld(JournalError):
    """A write's bounded wait for the chain head ran out: another session held it longer than
    the journal lets a write wait (on PostgreSQL ``[journal] reconnect``: a broker's lost
    session holds it until the server ends it).  The transaction was not committed."""


class JournalUnavailable(JournalError):
    """A read found the connection to a shared journal lost and could not make a new one, or
    opening one found no server to connect to (the database restarting, the network cut) --
    never a server that answered and refused (a wrong password: a plain ``JournalError``).
    Nothing is wrong with the journal: the same read may succeed within
    ``Backend.reconnect_within``, as a write would (the writer waits that long itself; a
    reader on the event loop must not, so it raises this for the caller to wait without
    blocking)."""


class JournalNotDurable(JournalError):
    """A shared journal's database would acknowledge a commit it may lose in a crash (``fsync``
    or ``full_page_writes`` off, a table of the journal UNLOGGED, or a transaction that cannot
    ask for ``synchronous_commit``):
    DISPATCH_STARTED would not be durable before the first byte is sent, so the broker refuses
    to write it.  The message names the setting and the fix."""


class ReadFailed(JournalError):
    """The database answered a read with an error of its own -- a statement timeout, a
    cancelled query, a lock it could not take, too many connections -- on a connection it did
    not drop.  Nothing is known to be wrong with the rows: unlike an altered row or a sealed
    blob the key cannot open, the same read may succeed later, so a caller must not take it
    for "unreadable" and give up on what it was reading."""


class JournalWriteError(JournalError):
    """A storage fault (disk full, I/O error, read-only database) stopped a write.  The
    transaction was rolled back: nothing of it is durable and every earlier row is intact."""


class JournalReplaced(JournalWriteError):
    """The SQLite file at the journal's path is not the one this process's writer has open: it
    was replaced (renamed over, deleted and made again) or removed since the writer opened it
    (``SqliteBackend.require_writer_file``).  Refused before anything is read from or written
    to it: the writer would go on writing the file it holds while a reader opened by the path
    read another -- a record answered from a file the writer is not writing.  A fault that does
    not pass (``code``, 503 with no ``Retry-After``): the broker must be restarted on the file
    now at the path.  A write refused so wrote nothing (``begin``, before the transaction)."""

    code = "JOURNAL_REPLACED"


class CommitUnknown(JournalWriteError):
    """The connection to a shared journal was lost while a transaction was committing, and no
    new connection could read whether it landed; or SQLite's COMMIT raised after writing the
    transaction to the -wal (its fsync failed), where no read can tell: a crash before the
    journal's next commit may recover it.  The write may or may not be durable: the caller must
    act as if it had failed (the engine does not dispatch on it) while the record, read again
    later, says which it was -- on SQLite, once a later commit has landed, or after a crash."""


class ResultStoreFailed(JournalWriteError):
    """A storage fault while storing a result (chunk or completeness marker).  The engine
    records RESULT_STORE_FAILED and renders only what the durable record proves."""


class ResultStoreUnknown(ResultStoreFailed, CommitUnknown):
    """A result's write whose COMMIT may have landed (``CommitUnknown``): a store failure to the
    code that stores the result, yet the record -- on SQLite read after a crash, before the
    journal's next commit -- may hold it committed.  The engine never answers a store failure
    the record may later contradict: unless a later write of the call settles it, the call is
    not recorded (``CallNotRecorded``)."""


class ResultStoreReplaced(ResultStoreFailed, JournalReplaced):
    """``JournalReplaced`` refusing a result's write: a ``ResultStoreFailed`` still, as every
    storage fault storing a result is to the engine."""


class LeaseBusy(JournalError):
    """A lease on the invocation has not expired (another holder's, or another task's of this
    holder: a dispatch lease is busy even to its holder).  The holder is data
    (``current.holder``, for an operator's tools), never words: a recorded holder is
    ``hostname:pid:hex`` -- where the broker runs -- and callers are shown only its keyed tag
    (``JournalReader.holder_tag``), so the message, one refactor away from an envelope, names
    the lease by its generation and end alone."""

    def __init__(self, current: Lease) -> None:
        self.current = current
        super().__init__(
            f"invocation {current.invocation_id} is leased (generation {current.generation}) "
            f"until {current.expires_at:.3f}"
        )


class KeyRetentionPassed(JournalError):
    """A same-key retry refused in the transaction that would take its lease: by the clock the
    key's retention is recorded and judged in (the database's, on a shared journal) the remote
    may have forgotten the key, so resending it could apply the request twice.  Nothing was
    written; ``now`` is that clock's reading, for the record's hint (reconcile) -- or, when the
    key would pass its retention only while the retry's lease runs (``lease``: its length),
    the lease's end, the moment the hint is then computed for."""

    def __init__(self, invocation_id: str, now: float, *, lease: float | None = None) -> None:
        self.invocation_id = invocation_id
        self.now = now
        if lease is None:
            why = "is past its retention by the journal's clock"
        else:
            # ``now`` is then the lease's end: the moment the key had to be usable at.
            why = (
                f"would pass its retention by the journal's clock while the retry's lease"
                f" ({lease:g} s: the call's timeout and [service] lease_margin) may still send it"
            )
        super().__init__(f"invocation {invocation_id}: its idempotency key {why}; not resent")


class ApprovalLapsed(JournalError):
    """An approved dispatch refused in the transaction that would write its DISPATCH_STARTED:
    by the clock the approval's expiry is recorded and judged in (the database's, on a shared
    journal) its window ran out while the write waited (for the chain head, a busy writer)
    after the gate's own check.  Nothing was written."""

    def __init__(self, invocation_id: str) -> None:
        self.invocation_id = invocation_id
        super().__init__(
            f"invocation {invocation_id}: its approval expired before its dispatch was recorded"
        )


class LeaseEventRefused(JournalError):
    """``append``/``post`` of a lease event (RETRY_/DISPATCH_LEASE_ACQUIRED): only
    ``Journal.acquire_lease`` writes one, with its lease row in the same transaction -- an event
    without its row would leave the journal verifying BROKEN ("the row was removed"), and a
    caller writing lease events without their row would decide nothing the row decides.
    Nothing was written."""

    code = "LEASE_EVENT_REFUSED"

    def __init__(self, invocation_id: str, kind: str) -> None:
        self.invocation_id = invocation_id
        super().__init__(
            f"invocation {invocation_id}: {kind} is written by acquire_lease only "
            f"({self.code}); nothing written"
        )


class LeaseLost(JournalError):
    """The caller's lease is stale or expired; the event was not written (a LEASE_LOST event
    was, when the lifecycle allows it).  Seed: "the generation check must stop it before
    dispatch"."""

    def __init__(
        self,
        invocation_id: str,
        holder: str,
        generation: int,
        current: Lease | None,
        seq: int | None,
    ) -> None:
        self.invocation_id = invocation_id
        self.holder = holder
        self.generation = generation
        self.current = current
        self.seq = seq
        # The holders are data (``holder``, ``current.holder``), not words: as ``LeaseBusy``.
        now = f"generation {current.generation}" if current is not None else "no lease"
        super().__init__(
            f"lease generation {generation} on invocation {invocation_id} "
            f"is stale or expired (current: {now})"
        )


class IdempotencyMismatch(JournalError):
    """The key is already bound to a different request fingerprint (IDEMPOTENCY_MISMATCH)."""

    def __init__(self, existing: IdempotencyRecord, fingerprint: str) -> None:
        self.existing = existing
        self.fingerprint = fingerprint
        super().__init__(
            f"idempotency key in scope {existing.scope!r} is bound to fingerprint "
            f"{existing.fingerprint} (invocation {existing.invocation_id}), not {fingerprint}"
        )
