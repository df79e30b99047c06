"""``verify``'s check of the ``leases`` table against the chained lease events.

A lease row -- (invocation, holder, generation, expires_at, seq) -- is not chained, and the
writer decides from it alone whether an invocation is busy (``leases.acquire_op``: a live lease
keeps every other attempt out, and the next generation counts from it).  The broker writes it
in the transaction of the lease event it names (``put_lease``), with the event's ``holder``,
``generation`` and ``expires_at``, and never deletes one.  So a row is believed only as far as
that chained event agrees with it: each row must name its invocation's last lease event, with
the same three values, and each invocation with a lease event must have its row -- as
``bindings.check`` holds the idempotency rows to their ACTION_ACCEPTED.

The writer's acquire does not repeat this check -- it decides from the row alone -- so an edited
row misleads the next acquire until ``verify`` runs: keep it running from cron
(docs/journal.md).

Messages name the invocation, the seq and the columns that differ, never their values.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .rows import AlteredRow, lease_from_row
from .verify_codes import LEASE_ALTERED, LEASE_MISSING

__all__ = ["check"]

_FIELDS = ("holder", "generation", "expires_at")


def check(
    rows: Iterable[tuple[Any, ...]],
    leased: Mapping[str, tuple[int, str]],
    limit: int,
    end: int | None,
    add: Callable[[int | None, str, str], None],
) -> int:
    """Each lease row (``rows``: invocation_id, holder, generation, expires_at, seq) against
    ``leased`` (invocation -> (seq, attrs JSON) of its last chained lease event the walk read),
    and each of those against its row; ``add(seq, reason, code)`` for every mismatch
    (``verify_codes``).  Nothing whose
    event is at ``limit`` (the first bad row) or after is judged -- except a row whose
    invocation has no lease event at all once the walk read every row (``end``: the last seq,
    None when the walk stopped early): no later row can be its event, whatever seq it names
    (past the journal's head included), so it is reported (``_eventless``).  Returns the rows
    proven."""
    proven = 0
    seen: set[str] = set()
    for row in rows:
        iid = row[0]
        try:
            lease = lease_from_row(iid, tuple(row[1:]))
        except AlteredRow:
            add(
                None,
                f"the lease row of invocation {iid} was altered: a column is not of its type",
                LEASE_ALTERED,
            )
            continue
        assert lease is not None and lease.seq is not None  # (a row's seq is an int)
        seen.add(iid)
        chained = leased.get(iid)
        if chained is None:
            _eventless(iid, lease.seq, limit, end, add)
            continue
        seq, attrs = chained
        if seq >= limit:
            continue
        if lease.seq != seq:
            add(seq, f"the lease row of invocation {iid} names seq {lease.seq}, not its last "
                f"lease event (seq {seq}): the row was altered", LEASE_ALTERED)  # fmt: skip
            continue
        differ = _differ(attrs, (lease.holder, lease.generation, lease.expires_at))
        if differ:
            add(seq, f"the lease row of invocation {iid} differs from its lease event at seq "
                f"{seq} ({', '.join(differ)}): the row was altered", LEASE_ALTERED)  # fmt: skip
            continue
        proven += 1
    for iid, (seq, _) in leased.items():
        if iid not in seen and seq < limit:
            add(seq, f"invocation {iid} has a lease event at seq {seq} but no lease row: the "
                "row was removed", LEASE_MISSING)  # fmt: skip
    return proven


def _eventless(
    iid: str, seq: int, limit: int, end: int | None, add: Callable[[int | None, str, str], None]
) -> None:
    """A lease row whose invocation has no chained lease event: at the seq it names if the walk
    judged that row, at journal level if no row can have it (0 or less), and past the rows read
    once the walk read them all, at the journal's end (``end + 1``, as verify reports a results
    row past the end) -- never at a seq the journal does not have.  A forged row there would
    otherwise keep every acquire of that invocation out (LeaseBusy) while verify said intact."""
    why = f"the lease row of invocation {iid} names seq {seq}, but the invocation has no lease "
    why += "event"
    if seq < 1:
        add(None, why + ", and no row has that seq: the row was altered", LEASE_ALTERED)
    elif end is not None and seq > end:
        add(end + 1, why + f", and the journal ends at seq {end}: rows from {end + 1} on were "
            "removed, or the row was altered", LEASE_ALTERED)  # fmt: skip
    elif seq < limit:
        add(seq, why + ": the row was altered", LEASE_ALTERED)


def _differ(attrs_json: str, row: tuple[str, int, float]) -> list[str]:
    """The columns of ``row`` (holder, generation, expires_at) the event's attrs do not hold."""
    try:
        attrs = json.loads(attrs_json)
        got = [attrs.get(name) for name in _FIELDS]
    except (TypeError, ValueError, AttributeError):  # the walk's check_row reports the row
        return list(_FIELDS)
    return [name for name, want, have in zip(_FIELDS, got, row, strict=True) if want != have]
