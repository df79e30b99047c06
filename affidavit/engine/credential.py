"""The credential step shared by a dispatch and an approval request: write the events before
it, resolve the target's credential and prepare the request with it.

Seed, "Validation and credential injection finish before dispatch": everything here is local;
a failure is a ``CredentialError`` (credential_injection, not_attempted) before any connection
exists.  An approval request prepares the request only to bind the credential's version and the
resolved injection (``approval.py``); the prepared request itself is dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import trio

from affidavit.protocols import Binding, Prepared
from affidavit.secrets.credentials import Credential, CredentialError, resolve
from affidavit.secrets.redaction import MIN_ANY_CASE, retain
from affidavit.statemachine import Event, EventKind, ImpossibleEvent

from .snapshot import first_validated

log = logging.getLogger("affidavit.engine")

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["Preamble", "prepare_after", "prepare_request"]

Preamble = tuple[tuple[Event, Mapping[str, Any] | None], ...]
"""Events written before the credential step, each with its sealed payload (or None)."""


def prepare_request(
    engine: Engine,
    action: Any,
    target: Any,
    binding: Binding,
    key: str | None,
    trusted: Mapping[str, str],
) -> tuple[Credential, Prepared]:
    """Resolve the target's credential and prepare the request with it (``CredentialError``),
    trusting the files of the account the call recorded (``trusted``:
    ``ConfigSnapshot.trusted``)."""
    ref = target.credential
    path = engine.config.path
    credential = resolve(
        ref,
        vault=engine.vault,
        # Only a ``file:`` reference is read relative to the config's directory: not a
        # ``Path.parent`` made on every call for the others (issue 15).
        base_dir=path.parent if path and isinstance(ref, str) and ref.startswith("file:") else None,
        versioner=engine.journal.keyed_digest,
    )
    prepared = binding.prepare(action, target, credential, key, trusted)
    # A rotated credential's old value leaves the redaction cache now, not when it ages out.
    # (Scoped by the engine: ``release(id(engine))`` when its broker closes.)
    retain((id(engine), target.credential), credential.version, prepared.secrets)
    # An empty value (``alice:``'s password) is no form: nothing is replaced, nothing to warn.
    if any(0 < len(v) < MIN_ANY_CASE for v in prepared.secrets):
        warn_short(getattr(target, "name", "?"), credential.version)
    return credential, prepared


_SHORT_WARNED: set[tuple[str, str]] = set()
"""(target, credential version) pairs this process warned of (``warn_short``)."""


def warn_short(name: str, version: str) -> None:
    """CREDENTIAL_SHORT on the operator's log, once per target and credential version (a
    rotation to another short value is told again) per process: the credential of
    target ``name`` injects a value under ``MIN_ANY_CASE`` bytes (a short Basic password, a
    PIN).  Known only here: a credential is resolved per call, never when the config is read
    (an ``env:`` or ``vault:`` one may not be there yet).  Every occurrence of such a value in
    an answer is replaced, so one echoed request tests as many guesses as it carries, and
    ordinary text (a year, an id) is rewritten (recorded ``short_redacted``,
    docs/redaction.md).  The value, and its length, are never said."""
    if (name, version) in _SHORT_WARNED:
        return
    if len(_SHORT_WARNED) >= 4096:
        _SHORT_WARNED.clear()  # a bound: at worst a warning said again
    _SHORT_WARNED.add((name, version))
    log.warning(
        "CREDENTIAL_SHORT: targets.%s.credential injects a value under %d bytes (a short "
        "password or PIN): an agent can test guesses of it through a remote that echoes its "
        "requests (the guess an answer shows replaced by [REDACTED] is the value), and any "
        "text in answers that matches it (a year, an id) is replaced too; use a credential of "
        "%d bytes or more",
        name,
        MIN_ANY_CASE,
        MIN_ANY_CASE,
    )


async def prepare_after(
    engine: Engine,
    iid: str,
    action: Any,
    target: Any,
    binding: Binding,
    key: str | None,
    preamble: Preamble,
    generation: int | None = None,
) -> tuple[Credential, Prepared] | dict[str, Any]:
    """Resolve the credential and prepare the request, after ``preamble``: the caller writes
    the preamble together with the event that follows it (``Recorder.write_many``: one queued
    write for the section, issue 15) -- preparing is local and synchronous, so those events
    are queued exactly as if written before it.  If preparing fails, the preamble is written
    here first: a ``CredentialError`` is recorded CREDENTIAL_FAILED and its envelope returned;
    anything else is raised once the preamble is queued.  Success awaits nothing when the
    call's own validation holds its trusted files' account (no checkpoint: the caller's next
    write is queued as if in one section with this); a record of another process's reads them
    in a worker thread first, abandoned on cancellation (``ConfigSnapshot.trusted``); each way of
    failing writes in a shielded section of its own -- a caller's cancellation never leaves it
    unclear which of its events landed.  ``generation``: the attempt's, named by
    CREDENTIAL_FAILED (a stale worker's is refused: ``attempt.stamped``)."""
    try:
        # The bytes of each file the target trusts as PREFLIGHT_VALIDATED's account recorded
        # them: the adapter trusts those or refuses (what is recorded is what is used).  Held
        # from the call's own validation, this awaits nothing; a record of another process's
        # (or one long gone from the cache) reads the files in a worker thread, never on the
        # loop -- a cancellation there writes the preamble as any failure does, below.
        recorded = _recorded_account(engine, iid, preamble)
        trusted = await engine.snapshot.trusted(target, recorded)
        return prepare_request(engine, action, target, binding, key, trusted)
    except CredentialError as exc:
        with trio.CancelScope(shield=True):
            refused = await _credential_failed(engine, iid, target, preamble, generation, exc)
        return refused
    except BaseException:
        with trio.CancelScope(shield=True):
            await engine.recorder.write_many(preamble)
        raise


async def _credential_failed(
    engine: Engine,
    iid: str,
    target: Any,
    preamble: Preamble,
    generation: int | None,
    exc: CredentialError,
) -> dict[str, Any]:
    recorder = engine.recorder
    # The field to fix and what is wrong with it, for the caller: ``exc.message`` names
    # neither the reference (``file:/etc/...``, ``env:NAME``) nor a path -- an agent has no
    # business learning where the broker keeps its secrets.  The operator's ``exc.detail``
    # (the reference, the file it was read as, the vault's path) goes to the broker's log and
    # is sealed with the event (the auditor's ``journal audit-open --seq N``).  Neither holds
    # the value (``CredentialError``).  Logged before the writes: the line survives a journal
    # that fails them, a stale worker's row refused (its invocation is on record), a process
    # killed while they are in flight.  Only a linked call's line waits for its first write
    # (the claim heading its preamble, ``takeup.py``): its claim refused, nothing of the call
    # is on record, and a line about it would claim one -- skipped then, and only then.
    linked = bool(preamble) and preamble[0][0].invocation_id != iid
    if not linked:
        _log_failure(iid, exc)
    attrs: dict[str, Any] = {
        "code": exc.code.value,
        "field": f"targets.{target.name}.credential",
        "message": exc.message,
    }
    if generation is not None:
        attrs["generation"] = generation
    failed = Event(EventKind.CREDENTIAL_FAILED, iid, attrs)
    claimed = False
    try:
        await recorder.write_many(preamble)
        await recorder.write(failed, barrier=True, payload={"detail": exc.detail})
    except ImpossibleEvent as refused:
        claimed = refused.event.invocation_id != iid  # the claim (and the call with it)
        raise
    finally:
        if linked and not claimed:  # written, refused on its own record, or the journal failed
            _log_failure(iid, exc)
    return recorder.envelope(await recorder.record(iid))


def _log_failure(iid: str, exc: CredentialError) -> None:
    log.warning("%s: %s: %s", iid, exc.code.value, exc.detail)


def _recorded_account(engine: Engine, iid: str, preamble: Preamble) -> str | None:
    """The ``account_hash`` the call's PREFLIGHT_VALIDATED records: in ``preamble`` when it is
    about to be written with the credential step (a new call), else in the journal (a retry,
    a take-over, an approved call resumed); None for a record from before it was recorded."""
    for event, _payload in preamble:
        if event.kind is EventKind.PREFLIGHT_VALIDATED:
            return event.attrs.get("account_hash")
    validated = first_validated(engine.journal.events(iid))
    return None if validated is None else validated.get("account_hash")
