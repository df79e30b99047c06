"""The operator's side of approvals: list what waits, show one, approve or deny it.

One set of rules for every interface -- ``affidavit approvals`` (embedded or through the
daemon), the daemon's API, ``Broker``/``Client``, and the console (``affidavit.console``): each
passes the ``Operator`` its channel identified and calls these functions.  No call API and no
MCP tool reaches them (DESIGN: "an MCP tool never approves or attests").

What an operator sees is what the approval binds (``affidavit.engine.approval``): the request as
it will be sent and where (sealed in the journal, read with the broker's key), the credential
by *name* and version -- never its value -- the requester's uid, the expiry and the
fingerprint.  A decision is APPROVAL_GRANTED (naming that fingerprint) or APPROVAL_DENIED, with
the operator and the note, appended as a barrier; the approved request is then dispatched by its
waiting caller or by the daemon (``affidavit.engine.approval.dispatch_approved``).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from affidavit.engine.approval import expire_if_due
from affidavit.engine.recovery import act_failure
from affidavit.journal import (
    AlteredRow,
    ApprovalLapsed,
    JournalError,
    JournalReader,
    JournalUnavailable,
    LeaseBusy,
    ReadFailed,
)
from affidavit.protocols import get
from affidavit.statemachine import (
    Code,
    Event,
    EventKind,
    ImpossibleEvent,
    Record,
    current_code,
)
from affidavit.text import SPACES, echoed, escape_char, pieces

from .operator import Operator, OperatorError, OperatorPolicy

if TYPE_CHECKING:
    from affidavit.engine import Engine

__all__ = [
    "MAX_NOTE",
    "approval_view",
    "check_note",
    "content",
    "decide",
    "decision_failure",
    "pending",
    "pending_page",
    "revoke",
    "show",
]

E = EventKind
MAX_NOTE = 2000
log = logging.getLogger("affidavit.approvals")

UNOPENED = (
    "the sealed request cannot be read with this broker's key file (the broker's log says why; "
    "`affidavit journal verify` tells whether the row was altered)"
)
ALTERED = (
    "the sealed request does not open with the key this journal records as its own: the row "
    "was altered (`affidavit journal verify`)"
)
SEALED_AWAY = "it is sealed to a key this broker lacks (only an auditor can read it)"
"""``request_unreadable``: fixed words, never the journal's own (``journal <path>: ...``,
``broker key file <path>``) -- the view answers an operator on the daemon's socket, where no
answer names where the journal or its keys live (``engine.unplaced``).  The log keeps them."""


def check_note(note: str | None, *, required: bool = False) -> str | None:
    """An operator's note as the journal keeps it (plain text: it is evidence, in the clear);
    refused with ``OperatorError`` at field ``note`` -- the name the daemon API's key, the
    console's form field and ``Broker``'s argument give it; its words name no interface's own
    spelling (the command line shows ``--note``: ``affidavit.cli.approvals``)."""
    if note is None or not note.strip():
        if required:
            raise OperatorError(
                "NOTE_REQUIRED", "note: required, saying what was checked", 400, "note"
            )
        return None
    if len(note) > MAX_NOTE:
        raise OperatorError(
            "BAD_NOTE",
            f"note: at most {MAX_NOTE} characters (this one has {len(note)})",
            400,
            "note",
        )
    # The rule every view escapes by (affidavit.text): a note is evidence, read on terminals
    # and in the console, so it holds nothing that would be shown as an escape -- but a tab and
    # the spaces typed text holds (U+00A0 from Option+Space or French typing, U+202F), which
    # an operator cannot see to remove: kept as typed, and shown escaped wherever it is read.
    bad = next((c for c, escaped in pieces(note, "\t" + SPACES) if escaped), None)
    if bad is not None:
        raise OperatorError(
            "BAD_NOTE",
            f"note: holds a character shown as an escape ({escape_char(bad)}): one line of "
            "plain text, without control, bidi, zero-width or invisible characters",
            400,
            "note",
        )
    return note


def _approval_now(reader: JournalReader) -> float:
    """Now, by the clock approvals expire in: the database's on a shared journal (the journal
    records APPROVAL_REQUESTED's ``expires_at`` in it), this process's own on SQLite -- read
    through a reader, where ``engine.approval.approval_now`` reads through the recorder."""
    return reader.now("the approvals view")


def approval_view(
    reader: JournalReader, record: Record, now: float | None = None
) -> dict[str, Any]:
    """One approval as every interface shows it; ``expired`` as of ``now`` (else
    ``_approval_now``), and ``expires_in`` the seconds left by that same clock (None once the
    approval is no longer live): an operator's tool shows this, never ``expires_at`` less its
    own host's clock -- on a shared journal ``expires_at`` is in the database's time."""
    approval = record.evidence.get("approval")
    assert isinstance(approval, Mapping)
    requested = next(
        e for e in reader.events(record.invocation_id) if e.kind is E.APPROVAL_REQUESTED
    )
    attrs = requested.attrs
    live = record.state in ("awaiting_approval", "approved")
    at = (_approval_now(reader) if now is None else now) if live else None
    expires = float(attrs.get("expires_at", 0)) if live else 0.0
    # Closed, the record says what became of it -- not the clock: an approval that ran out
    # is recorded APPROVAL_EXPIRED (validation_failed), never shown pending and unexpired.
    lapsed = record.code is Code.APPROVAL_EXPIRED
    view: dict[str, Any] = {
        "invocation_id": record.invocation_id,
        "approval": _decision(approval["state"], live, lapsed),
        "state": record.state,
        "target": record.target,
        "session": record.session,
        "requested_at": requested.at,
        "expires_at": attrs.get("expires_at"),
        "expired": at >= expires if at is not None else lapsed,
        "expires_in": None if at is None else max(0.0, expires - at),
        "requester": attrs.get("requester"),
        "version": attrs.get("version"),
        "injection": attrs.get("injection"),
        "fingerprint": attrs.get("fingerprint"),
        "operator": approval.get("operator"),
        "note": approval.get("note"),
    }
    if approval.get("blind") is True:  # granted with the request unread (``decide``)
        view["blind"] = True
        view["unreadable"] = approval.get("unreadable")
    try:
        sealed = reader.payload(requested.seq) if requested.seq is not None else None
    except (JournalUnavailable, ReadFailed):  # unread (away, or declined once), not sealed
        raise
    except JournalError as exc:
        log.warning("%s: the sealed request: %s", record.invocation_id, exc)
        sealed = None
        view["request_unreadable"] = ALTERED if isinstance(exc, AlteredRow) else UNOPENED
    view["request"] = dict(sealed.get("request", {})) if sealed is not None else None
    # Sealed since the reference left the attrs (a caller reads those); older records: attrs.
    view["credential"] = (sealed or {}).get("credential", attrs.get("credential"))
    # The code the record's views show (``current_code``): none of an attempt before a retry
    # that holds its lease; none while the approval is live (``approval`` says it waits).
    code = current_code(record)
    if code is not None and not live:
        view["code"] = code.value
    return view


def _revoked(record: Record) -> bool:
    """Whether ``record``'s grant was taken back (APPROVAL_REVOKED)."""
    approval = record.evidence.get("approval")
    return isinstance(approval, Mapping) and approval.get("state") == "revoked"


def _decision(state: str, live: bool, lapsed: bool) -> str:
    """The view's ``approval``: ``granted`` or ``denied`` once decided (whatever came after:
    ``state`` and ``code`` say); undecided, ``pending`` while the request waits, ``expired``
    once recorded APPROVAL_EXPIRED, else ``closed`` (ended otherwise before a decision: its
    caller withdrew it -- ``code`` says why)."""
    if state != "requested":
        return state
    if live:
        return "pending"
    return "expired" if lapsed else "closed"


def pending(reader: JournalReader) -> list[dict[str, Any]]:
    """Every request waiting for a decision, oldest first (streamed: one projection held at a
    time; how many wait is bounded per requester: ``[service] max_pending_approvals``)."""
    waiting = [r for r in reader.iter_actions() if r.state == "awaiting_approval"]
    now = _approval_now(reader)
    return [approval_view(reader, r, now) for r in waiting]


def pending_page(reader: JournalReader, limit: int) -> tuple[list[dict[str, Any]], int]:
    """The ``limit`` oldest requests waiting for a decision -- the ones closest to expiring
    unseen -- and how many wait in all: a page of them (the console's), never every view."""
    oldest: list[Record] = []
    total = 0
    for r in reader.iter_actions():
        if r.state == "awaiting_approval":
            total += 1
            if len(oldest) < limit:
                oldest.append(r)
    # Each view reads its own events and payload: once the stream is done with the connection.
    now = _approval_now(reader)
    return [approval_view(reader, r, now) for r in oldest], total


def show(reader: JournalReader, invocation_id: str) -> dict[str, Any]:
    """One invocation's approval, whatever became of it; ``OperatorError`` (404) when it asked
    for none."""
    return approval_view(reader, _approval_record(reader, invocation_id))


def content(reader: JournalReader, invocation_id: str, name: str) -> bytes:
    """The exact bytes of one content the approval's view names (``name``: ``body``, ``stdin``;
    the view has ``name_bytes`` and ``name_sha256``), whole whatever its size: read from the
    action the broker sealed with ACTION_ACCEPTED -- what the dispatcher sends (no credential
    is in it: it is injected at send time) -- through the protocol's ``operator_contents``, and
    served only when its SHA-256 is the one the view recorded.  ``OperatorError``: no such
    approval or content, or a protocol that does not say where its contents are (404); the
    request sealed beyond this broker's reading, e.g. to the auditor's key alone, or the sealed
    action not matching the view (409)."""
    record = _approval_record(reader, invocation_id)
    view = approval_view(reader, record)
    request = view.get("request")
    if not isinstance(request, Mapping):
        unread = view.get("request_unreadable")  # (not sealed away: it did not open)
        why = unread if unread is not None else SEALED_AWAY
        raise OperatorError(
            "REQUEST_SEALED",
            f"the request of {invocation_id} cannot be read here -- {why}: its content "
            "cannot be shown",
        )
    digest = request.get(f"{name}_sha256")
    if not isinstance(digest, str) or f"{name}_bytes" not in request:
        raise OperatorError(
            "NO_SUCH_CONTENT",
            f"the request of {invocation_id} has no content {name!r}",
            404,
            "name",  # the path's last segment: the content to correct
        )
    accepted = next((e for e in reader.events(invocation_id) if e.kind is E.ACTION_ACCEPTED), None)
    try:
        sealed = reader.payload(accepted.seq) if accepted and accepted.seq is not None else None
    except (JournalUnavailable, ReadFailed):  # unread, not unreadable
        raise
    except JournalError:  # an altered row, or sealed to a key this broker lacks
        sealed = None
    action = sealed.get("action") if sealed is not None else None
    spec = get(record.protocol or "")
    pick = spec.action.operator_contents if spec is not None else None
    if pick is None:
        raise OperatorError(
            "CONTENT_UNSUPPORTED",
            f"the {record.protocol} protocol does not say where an action holds its {name} "
            "(operator_contents): it cannot be fetched whole",
            404,
        )
    if not isinstance(action, Mapping):
        raise OperatorError(
            "REQUEST_SEALED",
            f"the accepted request of {invocation_id} cannot be read by this broker (sealed "
            f"to the auditor's key alone, or not a request it can open): its {name} cannot "
            "be shown here",
        )
    try:
        data = pick(action).get(name)
    except ValueError:
        data = None
    if data is None or hashlib.sha256(data).hexdigest() != digest:
        raise OperatorError(
            "CONTENT_MISMATCH",
            f"the {name} of {invocation_id} in the accepted request does not match the one the "
            f"approval view recorded (sha256 {digest}): not served -- check the journal "
            "(`affidavit journal verify`)",
        )
    return data


def _blindness(
    reader: JournalReader, record: Record, invocation_id: str, blind: bool
) -> dict[str, Any]:
    """What a grant adds about its reading: nothing when the sealed request is readable here;
    ``blind`` and the fixed words of why (``unreadable``) when it is not and the operator said
    ``blind``; else ``OperatorError`` REQUEST_UNREADABLE."""
    view = approval_view(reader, record)
    if isinstance(view.get("request"), Mapping):
        return {}
    why = view.get("request_unreadable") or SEALED_AWAY
    if not blind:
        raise OperatorError(
            "REQUEST_UNREADABLE",
            f"blind: the request of {invocation_id} cannot be read here -- {why}: approving "
            "it is approving blind; deny it, or approve it blind and the grant records that "
            "nobody read it",
            409,
            "blind",
        )
    return {"blind": True, "unreadable": why}


def _approval_record(reader: JournalReader, invocation_id: str) -> Record:
    record = reader.record(invocation_id)
    if record is None or not isinstance(record.evidence.get("approval"), Mapping):
        raise OperatorError(
            "NO_SUCH_APPROVAL",
            f"no approval was requested for {echoed(invocation_id)}",
            404,
            "invocation_id",  # the id in the path names none: the part to correct
        )
    return record


def decision_failure(
    exc: Exception, invocation_id: str, *, operator: bool = False
) -> tuple[int, str, str]:
    """A decision the journal could not take, as every interface answers it (``act_failure``):
    (HTTP status, code, message).  Its write failed (a shared journal away beyond ``[journal]
    reconnect``, perhaps while committing): 503 JOURNAL_UNAVAILABLE -- the decision may or may
    not be recorded, and ``approvals show`` tells which once the journal is back.  A read
    failed (the approval unread, nothing decided): ``read_failure``'s answer for it.
    ``operator``: the command line's own decision (``act_failure``)."""
    return act_failure(
        exc,
        f"the approval of {invocation_id}",
        f"the decision on {invocation_id}",
        f"`affidavit approvals show {invocation_id}`",
        operator=operator,
    )


async def decide(
    engine: Engine,
    policy: OperatorPolicy,
    operator: Operator,
    invocation_id: str,
    *,
    approve: bool,
    note: str | None = None,
    blind: bool = False,
) -> dict[str, Any]:
    """Record ``operator``'s decision on a pending request; return the approval's view.

    Refused (``OperatorError``): not an operator (403); the requester's own uid while
    ``allow_self_approval`` is off (403); no such approval (404); not pending any more --
    decided, or expired, which is recorded now as APPROVAL_EXPIRED (409); an approval of a
    request whose sealed content this broker cannot read (the view's ``request`` is None:
    its row altered, the key file unusable, sealed to another key) without ``blind``
    (409 REQUEST_UNREADABLE, field ``blind``): approving what nobody could read is approving
    blind, so it is only done when the operator says so, and the grant records ``blind`` and
    why (``unreadable``).  Blind or not, the grant names the fingerprint APPROVAL_REQUESTED
    recorded in the clear -- computed from the request as accepted, before it was sealed --
    and the dispatch gate sends only a request with that fingerprint.  A journal that cannot
    be read or written raises its ``JournalError`` (``decision_failure`` answers it)."""
    policy.require(operator, "approve or deny")
    note = check_note(note)
    journal = engine.journal
    record = await expire_if_due(engine.recorder, _approval_record(journal, invocation_id))
    if record.state != "awaiting_approval":
        expired = record.code is Code.APPROVAL_EXPIRED
        raise OperatorError(
            "APPROVAL_EXPIRED" if expired else "NOT_PENDING",
            f"{invocation_id} is not waiting for a decision (it is {record.state}"
            + (", its approval window ran out" if expired else "")
            + ")",
            409,
        )
    approval = record.evidence["approval"]
    requested = next(e for e in journal.events(invocation_id) if e.kind is E.APPROVAL_REQUESTED)
    policy.require_not_requester(operator, (requested.attrs.get("requester") or {}).get("uid"))
    who = operator.attrs()
    if approve:
        # What admitted the operator, re-checked at the dispatch gate (``Grant.disowned``).
        who["admitted"] = policy.admitted_by(operator)
        attrs = {"fingerprint": approval["fingerprint"], "operator": who, "note": note}
        attrs.update(_blindness(journal, record, invocation_id, blind))
        event = Event(E.APPROVAL_GRANTED, invocation_id, attrs)
    else:
        event = Event(
            E.APPROVAL_DENIED,
            invocation_id,
            {"code": Code.APPROVAL_DENIED.value, "operator": who, "note": note},
        )
    try:
        # A grant only within the window, by the clock it is recorded in, read in the writing
        # transaction: the write may wait (a shared journal's chain head) past the check above.
        until = float(approval["expires_at"]) if approve else None
        await engine.recorder.append(event, barrier=True, valid_until=until)
    except ImpossibleEvent:
        raise OperatorError(
            "NOT_PENDING", f"{invocation_id} was decided or expired meanwhile", 409
        ) from None
    except ApprovalLapsed:
        await expire_if_due(engine.recorder, _approval_record(journal, invocation_id))
        raise OperatorError(
            "APPROVAL_EXPIRED",
            f"{invocation_id} is not waiting for a decision (its approval window ran out)",
            409,
        ) from None
    if approve:
        # The daemon's dispatcher sends it if nobody else does -- also a request asked through
        # another daemon on a shared journal, which may have stopped since (``ready``).
        engine.approvals.learn(invocation_id, granted=True)
    engine.approvals.changed()  # the waiting caller or the daemon's dispatcher, at once
    return approval_view(journal, await engine.recorder.record(invocation_id))


async def revoke(
    engine: Engine,
    policy: OperatorPolicy,
    operator: Operator,
    invocation_id: str,
    *,
    note: str | None,
) -> dict[str, Any]:
    """Take back a grant before its request is sent: APPROVAL_REVOKED with the operator and the
    note (required: why), appended as a barrier only while the invocation is ``approved`` and
    no live dispatch lease holds it -- both checked in the writing transaction, so a revoke and
    a dispatch never both happen: whichever the journal took first wins, and its record shows
    which.  The invocation then ends as a denied one: APPROVAL_DENIED (credential_injection,
    not_attempted, retry ``never``), what a caller waiting on it, or coming back with its key,
    is answered.  Refused (``OperatorError``): not an operator (403); no such approval (404);
    not approved and undispatched -- pending (deny it instead), decided otherwise, expired or
    dispatched (409 NOT_APPROVED); held by a dispatcher now (409 DISPATCHING: it may be being
    sent -- its record says what became of it).  Revoking one already revoked answers that
    revoke (its view: ``revoked``, the revoker and note recorded), writing nothing."""
    policy.require(operator, "revoke an approval")
    checked = check_note(note, required=True)
    journal = engine.journal
    record = await expire_if_due(engine.recorder, _approval_record(journal, invocation_id))
    if _revoked(record):
        # Already taken back (a repeat, an operator's retry after a lost answer): what was
        # asked holds -- the recorded revoke is the answer, nothing written again.
        return approval_view(journal, record)
    if record.state != "approved":
        raise OperatorError(
            "NOT_APPROVED",
            f"{invocation_id} is not approved and waiting for its dispatch (it is "
            f"{record.state}): only a grant not yet sent can be revoked"
            + (" -- deny a pending one" if record.state == "awaiting_approval" else ""),
            409,
        )
    event = Event(
        E.APPROVAL_REVOKED,
        invocation_id,
        {"code": Code.APPROVAL_DENIED.value, "operator": operator.attrs(), "note": checked},
    )
    try:
        await engine.recorder.append(event, barrier=True, unleased=True)
    except ImpossibleEvent:
        record = await engine.recorder.record(invocation_id)
        if _revoked(record):  # revoked meanwhile, by this operator or another: it holds
            return approval_view(journal, record)
        raise OperatorError(
            "NOT_APPROVED", f"{invocation_id} was dispatched, decided or expired meanwhile", 409
        ) from None
    except LeaseBusy:
        raise OperatorError(
            "DISPATCHING",
            f"{invocation_id} is held by its dispatcher (a live dispatch lease): not revoked -- "
            f"it may be being sent; `affidavit approvals show {invocation_id}` tells what "
            "became of it",
            409,
        ) from None
    engine.approvals.changed()  # a caller waiting on it reads the record at once
    return approval_view(journal, await engine.recorder.record(invocation_id))
