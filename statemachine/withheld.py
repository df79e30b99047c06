"""What a caller is not shown as recorded: the hashes recorded before the config hash was
keyed, and a lease's holder.

``config_hash`` (PREFLIGHT_VALIDATED, APPROVAL_REQUESTED) is ``hmac-sha256:``, keyed by the
journal's key, and the request fingerprint (ACTION_ACCEPTED, ``"v": 2``) and the approval
fingerprint (``"v": 3``) are built on it.  A record written before that holds the plain
``sha256:`` config hash and the v1 / v2 fingerprints over it: each lets a caller confirm a
guessed credential reference (``env:NAME``, ``file:/path``) offline -- the snapshot they hash
holds it.  The journal is never rewritten; every caller-facing rendering (the envelope, the
record and events views the daemon and MCP answer) shows ``WITHHELD`` in their place.  Operator
views (the console, embedded CLI commands reading the journal) show what was recorded.

Which record is such a one is told by its ``config_hash``: only a keyed one proves the
fingerprints beside it keyed (ACTION_ACCEPTED and PREFLIGHT_VALIDATED are written together, and
the approval comes after them).  A record holding a fingerprint but no keyed ``config_hash``
(a plain one, or none: stopped between the two events) is withheld too -- never more shown than
the record proves safe.

A lease's holder is recorded as ``hostname:pid:hex`` (``evidence.lease.holder``; the ``holder``
attr of ACTION_ACCEPTED, the lease events and LEASE_LOST): on a shared journal, other brokers'
host names and pids, which a caller has no need of.  A caller is shown a ``HolderTag`` of it
instead -- the journal's keyed digest of the invocation and the recorded holder
(``JournalReader.holder_tag``; docs/contract.md, "The lease holder"): the same for every answer
under the same holder of that invocation, another for another holder, and neither reversible
nor checkable against a guessed host name without the journal's key.  A rendering given no
tag shows ``HOLDER_WITHHELD``: never the recorded value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from .events import Event, EventKind
from .record import Record

__all__ = [
    "HOLDER_WITHHELD",
    "KEYED_PREFIX",
    "WITHHELD",
    "HolderTag",
    "caller_event",
    "caller_evidence",
    "caller_record",
    "hashes_withheld",
]

KEYED_PREFIX = "hmac-sha256:"
"""How a keyed config hash begins (``affidavit.engine.snapshot`` writes it): not ``sha256:``, so
a keyed hash is told apart from the plain one records written before it hold."""
WITHHELD = "withheld: recorded before keyed hashes"

HolderTag = Callable[[str, str], str]
"""(invocation id, recorded holder) -> the holder as a caller is shown it."""
HOLDER_WITHHELD = "withheld"
"""The holder a rendering given no ``HolderTag`` shows."""


def hashes_withheld(record: Record) -> bool:
    """Whether ``record`` holds a hash recorded before hashes were keyed, to withhold."""
    evidence = record.evidence
    config_hash = evidence.get("config_hash")
    if type(config_hash) is str and config_hash.startswith(KEYED_PREFIX):
        return False
    if config_hash is not None or record.fingerprint is not None:
        return True
    approval = evidence.get("approval")
    return isinstance(approval, Mapping) and approval.get("fingerprint") is not None


def _masked(value: Any) -> Any:
    return None if value is None else WITHHELD


def _without(mapping: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    out = dict(mapping)
    for key in keys:
        if key in out:
            out[key] = _masked(out[key])
    return out


def _shown_holder(iid: str, holder: object, tag: HolderTag | None) -> object:
    if type(holder) is not str:
        return holder  # none recorded (None): nothing to hide
    return HOLDER_WITHHELD if tag is None else tag(iid, holder)


def caller_evidence(
    iid: str, evidence: Mapping[str, Any], holder: HolderTag | None
) -> Mapping[str, Any]:
    """``evidence`` (of invocation ``iid``) with every holder it names -- its lease's, its
    stale workers' -- as ``holder`` tags it; itself when it names none."""
    lease = evidence.get("lease")
    # A dict (as every record's evidence holds it) is told by its type: no ABC check.
    if (type(lease) is dict or isinstance(lease, Mapping)) and "holder" in lease:
        shown = _shown_holder(iid, lease["holder"], holder)
        evidence = {**evidence, "lease": {**lease, "holder": shown}}
    stale = evidence.get("stale_workers")
    if isinstance(stale, (list, tuple)) and any(_names_holder(w) for w in stale):
        workers = [
            {**w, "holder": _shown_holder(iid, w["holder"], holder)} if _names_holder(w) else w
            for w in stale
        ]
        evidence = {**evidence, "stale_workers": workers}
    return evidence


def _names_holder(worker: object) -> bool:
    return isinstance(worker, Mapping) and "holder" in worker


def caller_record(record: Record, holder: HolderTag | None = None) -> Record:
    """``record`` as a caller may see it: its lease's holder as ``holder`` tags it (see
    above), and a plain hash withheld."""
    evidence = caller_evidence(record.invocation_id, record.evidence, holder)
    if evidence is not record.evidence:
        record = replace(record, evidence=evidence)
    if not hashes_withheld(record):
        return record
    evidence = _without(record.evidence, "config_hash", "fingerprint")
    for key in ("idempotency", "approval"):
        part = evidence.get(key)
        if isinstance(part, Mapping):
            evidence[key] = _without(part, "fingerprint")
    idem = record.idempotency
    return replace(
        record,
        fingerprint=_masked(record.fingerprint),
        idempotency=None if idem is None else _without(idem, "fingerprint"),
        evidence=evidence,
    )


def caller_event(event: Event, withheld: bool, holder: HolderTag | None = None) -> Event:
    """``event`` as a caller may see it, ``withheld`` being ``hashes_withheld`` of its record:
    a ``holder`` attr (ACTION_ACCEPTED, the lease events, LEASE_LOST) as ``holder`` tags it,
    and the hashes ACTION_ACCEPTED, PREFLIGHT_VALIDATED and the approval events name, masked."""
    if "holder" in event.attrs:
        shown = _shown_holder(event.invocation_id, event.attrs["holder"], holder)
        event = replace(event, attrs={**event.attrs, "holder": shown})
    if not withheld:
        return event
    attrs = event.attrs
    kind = event.kind
    if kind is EventKind.ACTION_ACCEPTED:
        op = attrs.get("operation")
        if not isinstance(op, Mapping):
            return event
        op = _without(op, "fingerprint")
        idem = op.get("idempotency")
        if isinstance(idem, Mapping):
            op["idempotency"] = _without(idem, "fingerprint")
        return replace(event, attrs={**attrs, "operation": op})
    if kind in _HASHED:
        return replace(event, attrs=_without(attrs, "config_hash", "fingerprint"))
    return event


_HASHED = frozenset(
    {
        EventKind.PREFLIGHT_VALIDATED,
        EventKind.APPROVAL_REQUESTED,
        EventKind.APPROVAL_GRANTED,
        EventKind.APPROVAL_DENIED,
    }
)
