"""The Python API.

    async with affidavit.Broker.open("affidavit.toml") as broker:
        envelope = await broker.call({"target": "billing", "method": "GET", "path": "/v1/x"})
        again = await broker.fetch_result(envelope["invocation_id"])   # a read, never a re-run
        rest = await broker.fetch_result(envelope["invocation_id"], from_chunk=3)  # resume
        await broker.settled()      # the call's RESULT_DELIVERED, queued: for the sync reads
        record = broker.record(envelope["invocation_id"])              # the projected record
        polled = await broker.poll_operation(envelope["operation"]["id"])  # after a 202

        # operators (docs/approvals.md): this process's user is the identity
        waiting = broker.approvals()                    # requests waiting for a decision
        await broker.approve(waiting[0]["invocation_id"], note="checked the amount")
        await broker.reconcile(iid, query=True)         # the target's reconciliation query
        await broker.reconcile(iid, attest="committed", note="seen in the dashboard")

Runs under trio.  ``call`` never raises for preflight, connection or remote trouble — those are
envelopes whose phase, outcome and retry hint come from the journal.  Exceptions are for misuse
(bad config file, journal unusable).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import trio

from affidavit.approvals import Operator, OperatorError, OperatorPolicy
from affidavit.approvals import service as approvals
from affidavit.config import Config, ConfigError, trust_anchors
from affidavit.engine import CallControl, Deliver, Engine, EngineSettings
from affidavit.engine import approval as engine_approval
from affidavit.engine.delivery import STORE_ONLY
from affidavit.journal import (
    CREDENTIAL,
    TARGET_CREDENTIAL,
    TRUST_ANCHOR,
    Exposure,
    Journal,
    JournalReader,
    ResultStream,
    config_exposure,
    directory_exposures,
    exposure,
    journal_exposures,
    warn_exposed,
)
from affidavit.protocols import Binding, ProtocolLoadError, load_bindings
from affidavit.protocols.catalog import catalog
from affidavit.reconcile import service as reconcile
from affidavit.secrets import redaction
from affidavit.secrets.credentials import CREDENTIALS_DIRECTORY, CredentialError, systemd_path
from affidavit.secrets.vault import Vault, VaultError
from affidavit.statemachine import Event, Record, operation_json

from . import readers as view_readers
from .readers import BoundedTurn, ThreadTurn, ViewReaders
from .trusted import load_trusted_config, refuse_exposed_config
from .wire import check_timeout

__all__ = ["Broker", "exposed_files"]

T = TypeVar("T")


def exposed_files(config: Config) -> list[Exposure]:
    """The broker's files named by ``config`` that another user may reach or that another user
    owns (``journal.exposure``): a SQLite journal and its ``-wal``/``-shm``, its lock and its
    result segments, the vault, its unlock file and its lock, the broker key, the signing key
    and each ``file:`` and ``systemd:`` credential (these root's lent by an ACL, as systemd
    does, too) -- the config itself, and the files that decide whom the broker trusts (the
    auditor's public key, each file a target's fields declare ``trust_anchor``: a CA bundle, a
    ``known_hosts``), which others may read but not write -- then the directories
    on the path to each, which no one else may write (unless sticky) or own."""
    files: list[Exposure | None] = []
    placed: list[tuple[Path, str]] = []  # the files whose directories are looked at
    if config.path is not None:
        agents = (*config.service.allow_gids, *config.service.operator_gids)
        files.append(config_exposure(config.path, config.journal.url, agents))
        placed.append((config.path, "config file"))
    if config.journal.url is None:
        files += journal_exposures(config.journal.path, segments=True)
        placed.append((config.journal.path, "journal"))
    for path, what in (
        (config.journal.key_file, "broker key file"),
        (config.journal.signing_key, "signing key file"),
    ):
        # A credential's rule, as the journal reads them (``sealing.read_secret_file``): root's
        # key lent to this user by an ACL entry (systemd's ``LoadCredential=``) is read.
        files.append(exposure(path, what, CREDENTIAL))
        placed.append((path, what))
    if config.vault_path:
        vault = Vault(config.vault_path)
        files.append(exposure(vault.path, "vault file"))
        # Read as a credential is (``Vault._key``: ``read_small_file``, ``private``).
        files.append(exposure(vault.unlock_path, "vault unlock file", CREDENTIAL))
        files.append(exposure(vault.lock_path, "vault lock file"))
        # Walked from the name the config gives (``walk``: through a link to the file it names,
        # beside which the unlock file and lock are): the directories of both are looked at.
        placed.append((Path(config.vault_path), "vault file"))
    for path, what in _credential_files(config):
        files.append(exposure(path, what, TARGET_CREDENTIAL))  # (looked at, never read)
        placed.append((path, what))
    anchors = _trust_anchors(config)
    if config.journal.auditor_public_key is not None:
        anchors.insert(0, (config.journal.auditor_public_key, "auditor public key file"))
    for path, what in anchors:
        files.append(exposure(path, what, TRUST_ANCHOR))  # (public: others may read it)
        placed.append((path, what))
    return [e for e in files if e is not None] + directory_exposures(placed)


def _credential_files(config: Config) -> list[tuple[Path, str]]:
    """The file each ``file:`` and ``systemd:`` credential names (``systemd:``: in
    ``$CREDENTIALS_DIRECTORY``, none without it -- the call then says what the unit lacks),
    once, with what a message calls it."""
    found: list[tuple[Path, str]] = []
    for ref in sorted({t.credential for t in config.targets.values()}):
        kind, _, name = ref.partition(":")
        if kind == "file":  # the loader made the path absolute
            found.append((Path(name), "credential file"))
        elif kind == "systemd" and os.environ.get(CREDENTIALS_DIRECTORY):
            try:
                found.append((systemd_path(ref, name), "systemd credential file"))
            except CredentialError:  # a directory systemd would not name: the call says so
                continue
    return found


def _trust_anchors(config: Config) -> list[tuple[Path, str]]:
    """Each file the config's targets declare a trust anchor (``schema.trust_anchors``), once,
    with what it is and whose: ``CA file of target billing`` (``of targets a and b``)."""
    whose: dict[tuple[Path, str], list[str]] = {}
    for name in sorted(config.targets):
        for anchor in trust_anchors(config.targets[name]):
            whose.setdefault(anchor, []).append(name)
    return [
        (path, f"{what} of target{'s' if len(names) > 1 else ''} {_listed(names)}")
        for (path, what), names in whose.items()
    ]


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


log = logging.getLogger("affidavit.broker")

_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(words: Sequence[str]) -> None:
    """Each of ``words`` on the operator's log once per process (``affidavit serve`` and an
    embedder's ``Broker.open`` alike; a process opening many brokers says it once), as the
    journal's exposure warnings are (``warn_exposed``)."""
    for line in words:
        with _warned_lock:
            if line in _warned:
                continue
            _warned.add(line)
        log.warning("%s", line)


class Broker:
    def __init__(self, config: Config, journal: Journal, engine: Engine) -> None:
        self.config = config
        self.journal = journal
        self._engine = engine
        self.view_wait = view_readers.VIEW_WAIT
        """Seconds a view waits at most for a thread, or for a lock the database holds
        (``readers.VIEW_WAIT``), then ``ReadFailed``."""
        self.view_readers = ViewReaders(
            config.journal.location,
            config.journal.key_file,
            lock_wait=self.view_wait,
            writer_file=journal.backend.require_writer_file,
        )
        """The idle read-only readers ``view`` reads on (closed by ``close``)."""

    def close(self) -> None:
        """The idle view readers closed (``open`` does it on leaving); a view still reading
        in an abandoned thread closes its own when its read ends."""
        self.view_readers.close()

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        config_path: str | Path | None = None,
        *,
        config: Config | None = None,
        holder: str | None = None,
        settings: EngineSettings | None = None,
        owner: str | None = None,
        exposed: Sequence[Exposure] | None = None,
    ) -> AsyncIterator[Broker]:
        """Open the journal named by the config and the protocol bindings; close both after.
        ``holder``: the name this broker's first events and leases carry -- it must be unique
        among the brokers of a journal, as a take-over, a fence and the first-dispatch gate
        tell one worker from another by it (generation 0 is the binder's and a taker's alike);
        None, the default: host, pid and a random part.
        ``settings`` overrides the engine's own numbers (lease margin, inline result limit).
        ``owner`` (the daemon's description, naming its socket) opens the journal as its only
        writer; without it, a journal a daemon owns raises ``JournalLocked`` naming it.
        ``exposed``: ``exposed_files(config)`` as this start found it already (``affidavit
        serve`` looked before it would refuse), logged as it is; None: looked at here."""
        if config is None:
            config = load_trusted_config(config_path)  # another user choosing where they go
        else:
            refuse_exposed_config(config)  # (and the file judged is the one it was parsed from)
        # A configured vault is handed over even before its file exists: a lookup then says
        # the vault file is missing (CREDENTIAL_MISSING), not that no vault is configured.
        vault = Vault(config.vault_path) if config.vault_path else None
        if vault is not None:
            try:
                vault.refuse_other_names()  # (a hard-linked vault: a rotation misses a name)
            except VaultError as exc:
                raise ConfigError("vault.path", str(exc), config.path, exc.code) from None
        if exposed is None:
            exposed = exposed_files(config)  # a journal of thousands of segments: not twice
        warn_exposed(exposed)  # the operator's log, once a file (`serve` refuses)
        # Only the configured kinds: an HTTP-only config never imports the SSH library.
        try:
            bindings: dict[str, Binding] = load_bindings({t.kind for t in config.targets.values()})
        except ProtocolLoadError as exc:
            # A binding made by a factory is judged only once made (a class is judged when the
            # config is read): the same CONFIG_INVALID at the first target of that kind.
            name = next(n for n, t in config.targets.items() if t.kind == exc.kind)
            raise ConfigError(f"targets.{name}.kind", exc.message, config.path) from None
        for kind, binding in bindings.items():
            # Optional for an out-of-tree protocol written before it existed: no words.
            words = getattr(binding, "start_warnings", None)
            if words is not None:
                _warn_once(words([t for t in config.targets.values() if t.kind == kind]))
        try:
            async with Journal.open(
                config.journal.location,
                key_file=config.journal.key_file,
                signing_key=config.journal.signing_key,
                auditor_public_key=config.journal.auditor_public_key,
                owner=owner,
                reconnect_within=config.journal.reconnect,
            ) as journal:
                engine = Engine(
                    config, journal, bindings, holder=holder, vault=vault, settings=settings
                )
                broker = cls(config, journal, engine)
                try:
                    yield broker
                finally:
                    with trio.CancelScope(shield=True):
                        await broker.settled()  # the calls' queued deliveries, failures logged
                    broker.close()
                    # The engine's credentials leave the redaction cache with it.
                    redaction.release(id(engine))
        finally:
            for binding in bindings.values():
                await binding.aclose()

    async def call(
        self,
        action: Mapping[str, Any],
        *,
        timeout: float | None = None,
        deliver: Deliver | None = None,
        control: CallControl | None = None,
        requester: int | None = None,
    ) -> dict[str, Any]:
        """Perform one action; return its envelope (``invocation_id``, ``error`` or ``result``,
        ``evidence``).  ``control`` lets a host (the daemon) withdraw or stop it;
        ``requester`` is the uid asking (the daemon's peer; default this process's user), which
        may not approve its own request.  An action the target's ``approval`` covers waits up
        to the policy's ``wait`` for an operator, then answers APPROVAL_PENDING (fetch the
        result later: the approved request is sent once, by whoever holds it).  A shared
        journal unreachable beyond ``[journal] reconnect`` leaves no record to answer from:
        ``affidavit.engine.CallNotRecorded`` (``code``, ``invocation_id``: fetch it once the
        journal is back).

        ``timeout``: None (the target's own) or seconds in (0, 100 years] -- anything else is a
        ``ValueError`` in the words of ``affidavit call --timeout`` (``wire.check_timeout``)."""
        return await self._engine.call(
            action,
            timeout=check_timeout(timeout),
            deliver=deliver,
            control=control,
            requester=requester,
        )

    async def in_progress(self, invocation_id: str) -> dict[str, Any] | None:
        """The answer of a call that runs on past its caller's deadline
        (``CallControl.answer_by``): IN_PROGRESS with the record as it stands -- fetch the
        result later.  None if the record is already final (its result committed, its delivery
        to come): not in progress, the caller is answered the result."""
        recorder = self._engine.recorder
        record = await recorder.record(invocation_id)
        return None if record.final else recorder.envelope(record, in_progress=True)

    async def recover(self) -> list[Record]:
        """Close the records a stopped broker left open, with what their events prove
        (dispatched without a result: unknown, never not_attempted): the daemon at start-up.
        The owner of a SQLite journal (``owner=``) knows no other writer is alive and closes
        every one; on a shared journal other brokers may be running theirs, so only those
        whose lease has expired are closed (``Journal.exclusive``)."""
        if self.journal.exclusive:
            return await self._engine.recover_orphans()
        return await self._engine.recover_expired()

    async def fetch_result(
        self,
        invocation_id: str,
        *,
        from_chunk: int | None = None,
        chunks: int | None = None,
        deliver: Deliver | None = None,
        as_operator: bool = False,
        defer: bool = False,
        reader: int | None = None,
    ) -> dict[str, Any] | None:
        """The recorded envelope of an invocation — never a re-execution.  None if unknown id,
        or (unless ``as_operator``: the console, the embedded command line, a script reading
        as the journal's owner) an invocation on a target this broker's configuration does not
        name: a caller reads only what it may call, and cannot tell the two apart.
        ``from_chunk=N``: the result's streams from chunk N on, plus ``result.resume`` (each
        stream's chunk count, size and hash) — to resume an interrupted delivery;
        ``chunks=M`` with it: a page, at most M chunks of each stream (``result.resume.next_chunk``
        is where the next page starts, null after the last).  ``defer``: the streams are left
        unread, ``Deferred`` (``engine.stored_payload``), for a writer that reads them chunk by
        chunk (the daemon's answer; not JSON until it does).  Raises
        ``JournalError`` if the stored result fails verification (never altered bytes).  A whole
        result that had not reached its caller is recorded RESULT_DELIVERED by this read (after
        ``deliver``, when given, has handed the envelope over) -- unless ``reader`` (the uid that
        reads: the daemon's peer; default this process's user) is not the uid that asked for it:
        only a read."""
        return await self._engine.fetch_result(
            invocation_id,
            from_chunk=from_chunk,
            chunks=chunks,
            deliver=deliver,
            operator=as_operator,
            defer=defer,
            reader=reader,
        )

    def callable_by_caller(self, record: Record) -> bool:
        """Whether a caller (not an operator) may read ``record``, or learn that it exists: it
        is on a target this broker's configuration names (``Engine.callable_by_caller``).
        The daemon's and MCP's record and list views ask it, as ``fetch_result`` does."""
        return self._engine.callable_by_caller(record)

    def callable_target(self, target: str | None) -> bool:
        """``callable_by_caller`` of a record on ``target``: what a caller's list holds."""
        return self._engine.callable_target(target)

    def result_stream(self, invocation_id: str) -> ResultStream | None:
        """The stored result, chunk by chunk: ``stream.chunks(name, from_chunk)`` yields each
        chunk of stream ``name`` (``body``; ``stdout``/``stderr``) only after verifying it,
        and raises ``JournalError`` at the first that fails.  None without a stored result."""
        return self._engine.result_stream(invocation_id)

    async def poll_operation(
        self,
        operation_id: str,
        *,
        timeout: float | None = None,
        control: CallControl | None = None,
        requester: int | None = None,
        deliver: Deliver | None = None,
        as_operator: bool = False,
    ) -> dict[str, Any]:
        """Query a job's status resource once, as a linked invocation of its target, and return
        ``{"operation": {...}, "poll": the poll's envelope}`` (``poll`` is None when the job had
        already succeeded or failed: nothing is sent).  A poll that gets no readable answer
        leaves the operation's state as it was; the submission is never sent again.  Raises
        ``OperationError`` for an unknown id or a job with no status resource to query, a
        ``JournalError`` when the journal could not take the poll (``engine.poll_failure``
        answers it as every interface does).

        The seam for every interface that polls (``affidavit operation poll``, the daemon, the
        MCP tool ``poll_operation``): each calls this, none re-implements it.  ``control``:
        the poll's, as ``call``'s (a host's shutdown stops it where it is); ``requester``: as
        ``call``'s -- the poll waits for an operator when the target's approval covers it;
        ``deliver``: as ``call``'s -- the answer is written through it, and the poll's result
        recorded delivered only once it was written whole; ``as_operator``: as ``fetch_result``'s
        -- an operator's channel (the embedded command line) polls an operation a caller may not
        read (``callable_by_caller``), which any other asker is told does not exist, word for
        word as an unknown id."""
        await self.settled()  # the submission's record as its caller was told it
        return await self._engine.poll_operation(
            operation_id,
            timeout=check_timeout(timeout),
            control=control,
            requester=requester,
            deliver=deliver,
            operator=as_operator,
        )

    def catalog(self) -> dict[str, Any]:
        """The configured targets as callers may know them and one action schema per protocol
        (``affidavit.protocols.catalog``): what the MCP server's tools are built from."""
        return catalog(self.config.targets, self.config.descriptions)

    def operations(self) -> list[dict[str, Any]]:
        """Every operation in the journal, oldest first (``statemachine.operation_json``)."""
        return [operation_json(r) for r in self.journal.list_actions() if r.operation is not None]

    # -- operators: approvals and reconciliation (docs/approvals.md) ---------------------------
    #
    # Every interface's operator actions end here, with the ``Operator`` its channel identified
    # (default: this process's user); the rules live in ``affidavit.approvals`` and
    # ``affidavit.reconcile``.  Refusals raise ``OperatorError`` (code, message, status).

    @property
    def operator_policy(self) -> OperatorPolicy:
        return OperatorPolicy.of(self.config.service)

    def approvals(self) -> list[dict[str, Any]]:
        """Requests waiting for a decision: what will be sent where, with which credential
        (by name), by whom, until when."""
        return approvals.pending(self.journal)

    def approval(self, invocation_id: str) -> dict[str, Any]:
        """One invocation's approval, whatever became of it."""
        return approvals.show(self.journal, invocation_id)

    async def approve(
        self,
        invocation_id: str,
        *,
        note: str | None = None,
        operator: Operator | None = None,
        blind: bool = False,
    ) -> dict[str, Any]:
        """Approve a pending request (APPROVAL_GRANTED with the operator and the note).  One
        whose sealed request cannot be read here is refused REQUEST_UNREADABLE unless
        ``blind`` (then the grant records that it was blind)."""
        return await self._decide(invocation_id, True, note, operator, blind)

    async def deny(
        self, invocation_id: str, *, note: str | None = None, operator: Operator | None = None
    ) -> dict[str, Any]:
        """Deny a pending request (APPROVAL_DENIED: never sent; retry ``never``)."""
        return await self._decide(invocation_id, False, note, operator)

    async def revoke(
        self, invocation_id: str, *, note: str | None, operator: Operator | None = None
    ) -> dict[str, Any]:
        """Take back a grant not yet sent (APPROVAL_REVOKED: ends it as denied, retry
        ``never``); refused while a dispatcher holds it (``approvals.revoke``)."""
        who = operator or Operator.current()
        await self.settled()
        try:
            return await approvals.revoke(
                self._engine, self.operator_policy, who, invocation_id, note=note
            )
        finally:
            self._engine.recorder.done()  # as a call's: nothing kept for this task after it

    async def _decide(
        self,
        invocation_id: str,
        approve: bool,
        note: str | None,
        operator: Operator | None,
        blind: bool = False,
    ) -> dict[str, Any]:
        who = operator or Operator.current()
        policy = self.operator_policy
        await self.settled()
        try:
            return await approvals.decide(
                self._engine, policy, who, invocation_id, approve=approve, note=note, blind=blind
            )
        finally:
            self._engine.recorder.done()  # as a call's: nothing kept for this task after it

    async def reconcile(
        self,
        invocation_id: str,
        *,
        query: bool = False,
        attest: str | None = None,
        note: str | None = None,
        operator: Operator | None = None,
        timeout: float | None = None,
        control: CallControl | None = None,
        requester: int | None = None,
        deliver: Deliver | None = None,
        as_operator: bool = False,
    ) -> dict[str, Any]:
        """Settle an unknown outcome: ``query=True`` runs the target's reconciliation query as a
        linked invocation; ``attest="committed" | "rejected"`` (with a ``note``; operators
        only) records what an operator found -- a ``note`` with a query is refused
        (INVALID_FIELD), never dropped.  Returns ``{"reconciled", "envelope"`` (the
        reconciled invocation's) ``, "query"`` (the query's envelope, for ``query``)``}``.
        ``control``: the query's, as ``call``'s (a host's shutdown stops it where it is);
        ``requester``: as ``call``'s -- the query waits for an operator when the target's
        approval covers it; ``deliver``: a query's answer is written through it, as
        ``poll_operation``'s (an attestation's is returned).  A query names an invocation a
        caller may not read (``callable_by_caller``) only ``as_operator`` (the console, the
        embedded command line: an operator's channel, as ``fetch_result``'s); for
        any other asker it is refused as an id that names nothing, word for word -- its state
        untold (an attestation is an operator's: it reads every record)."""
        if query == (attest is not None):
            # ``query`` the field to correct: the one any asker may give (``attest`` is an
            # operator's), whether neither or both were given.
            raise OperatorError(
                "BAD_REQUEST", "query: give exactly one of query or attest", 400, "query"
            )
        reconcile.note_refused(query, note)  # never dropped unsaid: a query records no note
        await self.settled()  # the record as its caller was told it (its delivery included)
        try:
            if query:
                timeout = check_timeout(timeout)
                return await reconcile.query(
                    self._engine,
                    invocation_id,
                    timeout=timeout,
                    control=control,
                    requester=requester,
                    deliver=deliver,
                    operator=as_operator,
                )
            assert attest is not None
            envelope = await reconcile.attest(
                self._engine,
                self.operator_policy,
                operator or Operator.current(),
                invocation_id,
                attest,
                note,
            )
        finally:
            self._engine.recorder.done()  # as a call's: nothing kept for this task after it
        return {"reconciled": True, "envelope": envelope, "query": None}

    # -- the daemon's dispatcher ----------------------------------------------------------------

    def watch_approvals(self) -> None:
        """Learn the approvals the journal has open (the daemon, at start)."""
        engine_approval.watch(self._engine)

    async def approvals_ready(self) -> list[str]:
        """Approved invocations nobody dispatches: no caller waits here, no live lease holds
        them (expired ones are closed APPROVAL_EXPIRED on the way)."""
        return await engine_approval.ready(self._engine)

    async def approvals_changed(self, timeout: float) -> None:
        """Return when a decision is recorded in this process, or after ``timeout``."""
        await self._engine.approvals.wait_changed(timeout)

    def forget_dispatch(self, invocation_id: str) -> None:
        """``approvals_ready`` marked it for a dispatch that will not run (overloaded)."""
        self._engine.approvals.dispatching.discard(invocation_id)

    async def dispatch_approved(
        self, invocation_id: str, *, control: CallControl | None = None
    ) -> dict[str, Any] | None:
        """Send an approved invocation whose caller is gone, once (under its dispatch lease,
        through the gate that re-checks the approval); the result is stored for the caller's
        fetch.  None when there was nothing to do.  A shared journal unreachable beyond
        ``[journal] reconnect``: ``affidavit.engine.CallNotRecorded``, as ``call`` raises."""
        return await self._engine.dispatch_approved(invocation_id, STORE_ONLY, control)

    async def settled(self, *, cancellable: bool = False) -> None:
        """Wait until the deliveries this broker's calls queued are committed (an in-process
        ``call`` returns its envelope before its RESULT_DELIVERED is: issue 15).  Every async
        read here (``fetch_result``, ``view``, ``poll_operation``, operator actions) and
        ``open``'s exit wait for them themselves; the synchronous reads below (``record``,
        ``events``, ``operations``, ``approvals``, ``approval``) run on the event loop's
        thread, where the journal's writer cannot be waited for -- they show what is
        committed, a delivery still queued not yet: await this first to read it.  Not
        cancellable unless ``cancellable`` (then the writes go on, unwaited)."""
        await self._engine.recorder.delivered(cancellable=cancellable)

    def record(self, invocation_id: str) -> Record | None:
        """The invocation's record as the journal proves it now: its retry hint computed at
        this moment (the broker's clock), never at the record's last event -- a same-key
        resend that was safe then may not be any more (docs/contract.md, "When the hint is
        computed"); on a shared journal the database's clock, in whose time a key's retention
        is recorded (docs/journal.md, "Clocks")."""
        return self.journal.record(invocation_id)

    def events(self, invocation_id: str) -> list[Event]:
        return self.journal.events(invocation_id)

    async def view(
        self, read: Callable[[JournalReader], T], limiter: trio.CapacityLimiter | ThreadTurn
    ) -> T:
        """``read`` -- a view or an operator's read (a record and its events, the actions,
        the sessions, the metrics, the approvals, a verify) -- on a read-only connection no
        other read uses meanwhile, in a worker thread of ``limiter`` (a host's own, never
        trio's default threads, which the calls' journal opens share): a slow database (a lock
        another session holds, a long scan, a stalled server) stalls that read alone, never the
        calls on the event loop.  The reader is one of the broker's idle ones when one waits
        (``ViewReaders``: no new connection per view), reset as a new one (its own clock and
        snapshot per read), given back after a clean read -- at most ``limiter``'s threads
        wait idle -- and closed after one that raised.  Hints are judged as the broker's own
        reads judge them (``send_windows``, as they are at this call); an approval's request
        is opened with the broker key.  A ``JournalError`` is raised as the read raised it.

        Bounded waits (``view_wait``): a view that found every ``limiter`` thread busy that
        long (a ``ThreadTurn``: its own bound and order), or whose read met a lock another
        session held that long (the reader's ``lock_wait``), is ``ReadFailed`` -- unread this
        once, 503 ``JOURNAL_READ_DECLINED`` -- never parked behind the views or the session
        that hold them.

        Cancellable: its connection has no statement timeout (a long scan is a view's right),
        so a cancelled view -- a shutdown past its grace, a caller gone -- abandons its thread
        rather than wait as long as the database holds the read (a daemon asked to stop
        stopped only when the database let go).  The thread keeps its ``limiter`` slot (a
        ``ThreadTurn``'s place) until the read ends, then closes its reader (never given
        back); it only reads, so nothing is left half done (a view that folds ``summary`` does
        so under that summary's own lock)."""
        # A call's queued delivery shows in the view that follows it -- waited for no longer
        # than a view waits for anything (``view_wait``), and cancellably: a writer held up (a
        # shared journal reconnecting) leaves the view to show what is committed, a result
        # ``stored`` and not yet delivered, with the same outcome and hint.
        with trio.move_on_after(self.view_wait):
            await self.settled(cancellable=True)
        readers, windows = self.view_readers, self.journal.send_windows
        if isinstance(limiter, trio.CapacityLimiter):
            limiter = BoundedTurn(limiter, self.view_wait)
        total = limiter.total_tokens
        keep = int(total) if total != float("inf") else 1 << 16
        abandoned = threading.Event()

        def run() -> T:
            reader = readers.take()
            try:
                reader.send_windows = windows
                got = read(reader)
            except BaseException:
                readers.discard(reader)
                raise
            if abandoned.is_set():
                readers.discard(reader)
            else:
                readers.give_back(reader, keep)
            return got

        try:
            return await trio.to_thread.run_sync(
                run,
                limiter=limiter,  # type: ignore[arg-type]  # (trio takes any limiter-like object)
                abandon_on_cancel=True,
            )
        except trio.Cancelled:
            abandoned.set()
            raise
