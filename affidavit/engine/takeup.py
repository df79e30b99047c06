"""Taking up a linked call that is still open -- a reconciliation query (``reconcile/approved``),
an operation's poll (``operations``) -- instead of asking for another: one question at a time.

A linked call the target's approval covers is named on the record it serves with ``open`` (a
claim: a row the projection refuses while another call of that record is open, in the writing
transaction, so in any process).  The claim heads the call's first journal write, its
preamble (``Engine.call``'s ``claim``; ACTION_ACCEPTED, PREFLIGHT_VALIDATED after it): one
submission, ``joined`` (``Journal.post_many``: all of it written, or none) -- the claim
refused, every row of the call is refused with it (and a row of the call refused, the claim is
not written either), and the journal write the call goes on to (its APPROVAL_REQUESTED, its
CREDENTIAL_AUTHORIZED) presupposes them: nothing of the call is written or asked, and
``ClaimRefused`` is raised for its asker to answer QUERY_PENDING / POLL_PENDING (or what the
record shows now).  So a claim exists exactly when its call does, and no stall of the asker's
journal write can separate them: before, the claim was a transaction of its own, and an asker
whose next write stalled past the claim's deadline still asked after another had closed its
claim and asked -- two calls waiting for an operator.  The claim stays open until a row naming
it without ``open`` reads its answer or gives it up.  ``take_up`` says what the open call is now:

* still being asked (accepted, its approval not requested yet: its asker may have stopped --
  then until its lease runs out and recovery closes it), awaiting a decision, being sent, or
  approved and not sent here (another process, the
  daemon's dispatcher, may hold it): ``pending(doing)`` is raised -- nothing asked or sent;
* approved and not yet sent: sent now, through the gate that re-checks the grant
  (``dispatch_approved``), within the caller's ``timeout``, and its answer returned;
* sent after its asker stopped waiting: its recorded answer is returned -- an approved call is
  never sent for nothing, nor twice;
* left mid-send by a broker that stopped: closed first by what its evidence proves
  (``recover_stale``), then read like any other;
* denied, expired, cancelled before it was sent, or never accepted, or not linked to the
  record: ``close(code)`` and None -- ask anew.

A claim with no call is one a broker from before claims headed the call's first write wrote
in a transaction of its own (on a journal it shared, or left behind): it proves only that it is
being asked until its deadline (``claim_expiry``: the target's lease from when it was named,
plus ``lease_margin``), closed after it.  That deadline is recorded in, and judged by, the clock
leases are: the database's on a shared journal (the journal moves ``expires_at``,
``Txn._expiry``), so a broker whose clock runs ahead cannot close another's live claim.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from affidavit.statemachine import Code, Event, EventKind, ImpossibleEvent

from .approval import approval_now
from .delivery import STORE_ONLY
from .recovery import recover_stale

if TYPE_CHECKING:
    from .control import CallControl
    from .engine import Engine

__all__ = [
    "ClaimInvalid",
    "ClaimRefused",
    "Close",
    "check_claim",
    "claim_expiry",
    "claimed_since",
    "claimed_until",
    "closed_by",
    "still_open",
    "superseded",
    "take_up",
]

E = EventKind
Close = Callable[[str | None], Awaitable[None]]


class ClaimRefused(Exception):
    """The claim heading a linked call's first journal write was refused -- another call of
    the record it serves is open, or the record moved since its asker read it -- and every row
    of the call with it: nothing of the call is on record, nothing was asked.  ``refusal``:
    the projection's (its ``event`` the claim); the message is its own, naming rows and
    states, never a request's content."""

    def __init__(self, refusal: ImpossibleEvent) -> None:
        self.refusal = refusal
        super().__init__(str(refusal))


class ClaimInvalid(ValueError):
    """A claim handed to ``Engine.call`` that would not head a new invocation it names -- it
    names another call, or the call's idempotency key resolves to an invocation already bound
    (to resume, to take over, to fetch), whose first rows are written, or will be, without
    it: a call asked for approval with no claim naming it, a card no claim accounts for.  A
    caller's bug, refused before anything is written; ``code`` is stable, the message names
    ids and fields, never a request's content."""

    code = "CLAIM_INVALID"
    field = "claim"


_NAMES = ("query_invocation", "poll_invocation")
"""The attribute by which a claim names its call: a reconciliation query's, a poll's."""


def _served(claim: Event, link: Mapping[str, Any]) -> tuple[str, object] | None:
    """The attribute a claim for a call under ``link`` names it by, and the record it is on;
    None when the claim does not match the link: a query's (``reconciles``) is a
    RECONCILE_INCONCLUSIVE naming ``query_invocation``; a poll's (``operation``,
    ``invocation``) an OPERATION_POLL_FAILED naming ``poll_invocation`` of that operation."""
    if "reconciles" in link and claim.kind is E.RECONCILE_INCONCLUSIVE:
        return "query_invocation", link["reconciles"]
    if (
        "operation" in link
        and claim.kind is E.OPERATION_POLL_FAILED
        and claim.attrs.get("operation_id") == link["operation"]
    ):
        return "poll_invocation", link.get("invocation")
    return None


def check_claim(claim: Event, invocation_id: str | None, link: Mapping[str, Any] | None) -> None:
    """Refuse (``ClaimInvalid``) a claim that is not an open row, of the kind ``link`` calls
    for (a query's, a poll's of that operation), on the record it names, naming by that
    kind's attribute the new invocation ``invocation_id`` (chosen by the caller: a claim
    cannot name an id not yet drawn)."""
    named = [claim.attrs.get(name) for name in _NAMES if name in claim.attrs]
    served = _served(claim, link or {})
    if served is None:
        why = "is not the row the call's link calls for"
    elif invocation_id is None or named != [invocation_id] or served[0] not in claim.attrs:
        why = "does not name the invocation_id of the call"
    elif claim.attrs.get("open") is not True:
        why = "is not an open row"
    elif claim.invocation_id == invocation_id or served[1] != claim.invocation_id:
        why = "is not on the record the call's link serves"
    else:
        return
    raise ClaimInvalid(f"the claim ({claim.kind.value} of {claim.invocation_id}) {why}")


def still_open(answer: Mapping[str, Any]) -> bool:
    """Whether a linked call's answer leaves it open: it awaits an operator, or its asker
    stopped waiting while it was sent (its answer to be read by the next asker)."""
    error = answer.get("error")
    if error is None:
        return False
    return bool(
        error.get("code") == Code.APPROVAL_PENDING.value or error.get("retry") == "fetch_result"
    )


def claim_expiry(engine: Engine, target: Any) -> float:
    """When a claim named now lapses, its call not accepted: the target's lease plus
    ``lease_margin`` from now, by this broker's clock -- the journal records it in the clock
    leases are judged by (the module's last paragraph)."""
    ttl = engine.lease_ttl(target, None) if target is not None else 0.0
    return time.time() + ttl + engine.settings.lease_margin


def claimed_until(engine: Engine, target: Any, claim: Event | None) -> float | None:
    """The deadline of the claim row ``claim`` (``expires_at``); a row written before claims
    recorded one: its writer's time label plus the lease, as it was judged then."""
    if claim is None:
        return None
    expires = claim.attrs.get("expires_at")
    if isinstance(expires, (int, float)) and not isinstance(expires, bool):
        return float(expires)
    if claim.at is None:
        return None
    ttl = engine.lease_ttl(target, None) if target is not None else 0.0
    return claim.at + ttl + engine.settings.lease_margin


def closed_by(engine: Engine, iid: str, name: str, call_id: object) -> Event | None:
    """The row that closed the linked call ``call_id`` on ``iid``'s record: the last naming it
    (by ``name``: ``query_invocation``, ``poll_invocation``) that leaves it not open -- no
    ``open``, nor (a row from before ``open``) APPROVAL_PENDING; None when there is none."""
    found = None
    for event in engine.journal.events(iid):
        attrs = event.attrs
        opened = attrs.get("open", attrs.get("code") == Code.APPROVAL_PENDING.value)
        if attrs.get(name) == call_id and not opened:
            found = event
    return found


def claimed_since(engine: Engine, iid: str, name: str, call_id: object) -> bool:
    """Whether ``iid``'s record shows a claim (``open``, no code) naming a linked call other
    than ``call_id`` (by ``name``) after the last row naming ``call_id``: another call was
    opened since that one was."""
    claimed = False
    for event in engine.journal.events(iid):
        attrs = event.attrs
        named = attrs.get(name)
        if named == call_id:
            claimed = False
        elif named is not None and attrs.get("open") is True and attrs.get("code") is None:
            claimed = True
    return claimed


def superseded(
    what: str,
    refused: Event,
    call_id: object,
    closer: Event | None,
    now: object,
    ended: Event | None = None,
    *,
    claimed: bool = False,
) -> str:
    """Why the row ``refused`` leaving the linked call ``call_id`` open (its answer returned to
    its asker) was not recorded: ``closer`` (``closed_by``) closed the call meanwhile, and
    another ``what`` (query, poll) was opened -- ``now``, when it is still open; ``claimed``
    (``claimed_since``), when the record shows one opened since and none is open now -- or
    none is open now, or the row ``ended`` ended what the call serves (a poll's job).  It
    claims no more than the record shows: the call stays on record as asked, and what
    ``closer`` says of it stands; only this answer was not recorded."""
    if closer is None:
        closed = f"the {what} {call_id} is no longer open"
    else:
        closed = f"the {what} {call_id} was closed since by {_named(closer)}"
    other = f"no {what} is open now"
    if claimed:
        other = f"another {what} was opened meanwhile and has closed since"
    if isinstance(now, str):
        other = f"another {what} {now} is open"
    if ended is not None:
        other = f"the job ended since by {_named(ended)}"
        closed = closed if closer is not None else f"the {what} {call_id} was not closed"
    code = refused.attrs.get("code")
    answer = f"this answer of it ({code})" if isinstance(code, str) else "this answer of it"
    return f"{closed}; {other}. Only {answer} was not recorded. {what.capitalize()} again"


def _named(row: Event) -> str:
    """A row as a message names it: its seq and kind, and what it says -- the state it read,
    its code, its reason."""
    attrs = row.attrs
    said = [f"state {attrs['state']}"] if isinstance(attrs.get("state"), str) else []
    said += [str(attrs[k]) for k in ("code", "reason") if attrs.get(k)]
    text = f"seq {row.seq}: {row.kind.value}"
    return text + (f" ({': '.join(said)})" if said else "")


async def take_up(
    engine: Engine,
    call_id: str,
    *,
    linked: Callable[[Mapping[str, Any]], bool],
    deadline: float | None,
    control: CallControl | None,
    timeout: float | None,
    pending: Callable[[str], Exception],
    close: Close,
) -> dict[str, Any] | None:
    """The answer (envelope) of the open linked call ``call_id``, as the module says; None
    when it was closed (ask anew).  ``linked(link)``: whether its ACTION_ACCEPTED's ``link``
    is the record's; ``deadline``: its claim's (``claimed_until``), None if unknown."""
    recorder = engine.recorder
    found = await recorder.read(lambda: engine.journal.record(call_id))
    if found is None:
        if deadline is not None and await approval_now(recorder) < deadline:
            raise pending("is being asked")
        await close(None)  # an older broker's claim whose asker stopped before asking
        return None
    if not linked(_link(engine, call_id)):
        await close(None)  # not the record's: never read for it
        return None
    call = await recover_stale(recorder, found)
    if call.state == "approved":
        answer = await engine.dispatch_approved(call_id, STORE_ONLY, control, timeout)
        if answer is not None and not still_open(answer):
            return answer
        call = await recorder.record(call_id)  # another holds it (its lease), or it moved on
    if call.state == "awaiting_approval":
        raise pending("awaits an operator's decision")
    if call.state == "approved":
        raise pending(
            "was approved and is not sent yet (another process, the daemon's dispatcher, may "
            "hold it to send, or its request can be read back only by its asker)"
        )
    if not call.final:
        # Claim no more than the records prove: accepted and not yet asked, its asker may have
        # stopped before asking -- "being sent" only once its DISPATCH_STARTED is on record.
        raise pending(
            "is being sent" if call.evidence.get("dispatch_started") else "is being asked"
        )
    if not call.evidence.get("dispatch_started"):
        await close(call.code.value if call.code is not None else None)  # nothing was sent
        return None
    return recorder.envelope(call)


def _link(engine: Engine, call_id: str) -> Mapping[str, Any]:
    for event in engine.journal.events(call_id):
        if event.kind is E.ACTION_ACCEPTED:
            link = event.attrs.get("link")
            return link if isinstance(link, Mapping) else {}
    return {}
