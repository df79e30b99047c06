"""Idempotency bindings proven by the chain (journal/bindings.py), on each backend.

The binding rows are not chained; the ACTION_ACCEPTED of the invocation a key names is, and it
names the key's scope, the key and the fingerprint.  Someone who can write the database points a
binding at another invocation, changes its fingerprint or removes it: the lookup
(``bound_record``) refuses the first two with ``AlteredRow``, and ``verify`` reports all three at
the chained event's seq.  A binding whose invocation has no event yet is legitimate (the key is
bound before the first event) and verifies.
"""

from __future__ import annotations

from typing import Any

import pytest

from affidavit.journal import IdempotencyRecord, SigningKey, VerifyReport
from affidavit.journal.rows import AlteredRow
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E

from .conftest import Place

SCOPE = "payments.create"


def _accepted(iid: str, key: str, fp: str) -> Event:
    idem = {"key": key, "scope": SCOPE, "header": "Idempotency-Key", "retention_s": 3600.0,
            "expires_at": 2e9}  # fmt: skip
    op: dict[str, Any] = {"target": "api", "protocol": "http", "fingerprint": fp, "budget": 3,
                          "idempotent": False, "idempotency": idem}  # fmt: skip
    return Event(E.ACTION_ACCEPTED, iid, {"operation": op, "session": None})


async def _fill(place: Place) -> dict[str, int]:
    """inv-a and inv-b bound and accepted (as the engine does: bind, then ACTION_ACCEPTED);
    inv-c bound with no event yet.  Returns each accepted event's seq."""
    seqs = {}
    async with place.open() as j:
        for iid, key, fp in (("inv-a", "key-a", "sha256:aa"), ("inv-b", "key-b", "sha256:bb")):
            await j.bind_idempotency(SCOPE, key, fp, iid, 2e9)
            seqs[iid] = (await j.append(_accepted(iid, key, fp), barrier=True)).seq
        await j.bind_idempotency(SCOPE, "key-c", "sha256:cc", "inv-c", 2e9)
    return seqs


def _verify(place: Place) -> VerifyReport:
    public = SigningKey.load(place.signing_key).public_raw
    with place.reader() as r:
        return r.verify(public_key=public)


def _binding(place: Place, key: str) -> IdempotencyRecord:
    with place.reader() as r:
        rec = r.find_idempotency(SCOPE, key)
    assert rec is not None
    return rec


async def test_intact_bindings_are_proven(place: Place) -> None:
    await _fill(place)
    report = _verify(place)
    assert report.ok and report.bindings == 2  # inv-c: no event yet, nothing to prove it by
    with place.reader() as r:
        rec = r.bound_record(_binding(place, "key-a"))
        assert rec is not None and rec.invocation_id == "inv-a"
        assert r.bound_record(_binding(place, "key-c")) is None
    async with place.open() as j:
        assert j.bound_record(_binding(place, "key-b")) is not None


@pytest.mark.parametrize(
    "change",
    [
        "invocation_id = 'inv-b'",  # the same fingerprint, another invocation
        "invocation_id = 'inv-b', fingerprint = 'sha256:bb'",  # and that one's fingerprint
        "fingerprint = 'sha256:ff'",  # another request under the same invocation
    ],
)
async def test_an_altered_binding_is_refused_at_lookup_and_by_verify(
    place: Place, change: str
) -> None:
    seqs = await _fill(place)
    place.tamper(f"UPDATE idempotency SET {change} WHERE key = 'key-a'")
    altered = _binding(place, "key-a")
    with place.reader() as r, pytest.raises(AlteredRow, match="binding was altered"):
        r.bound_record(altered)
    async with place.open() as j:  # the writer's own projection answers the same way
        with pytest.raises(AlteredRow, match="binding was altered"):
            j.bound_record(altered)
    report = _verify(place)
    assert not report.ok and "binding" in report.reason and "altered" in report.reason
    assert report.first_bad_seq in (seqs["inv-a"], seqs["inv-b"])


async def test_a_removed_binding_is_found_by_verify(place: Place) -> None:
    seqs = await _fill(place)
    place.tamper("DELETE FROM idempotency WHERE key = 'key-b'")
    report = _verify(place)
    assert (report.ok, report.first_bad_seq) == (False, seqs["inv-b"])
    assert "no binding row" in report.reason


async def test_a_binding_pointed_at_an_unbound_invocation_is_found_by_verify(
    place: Place,
) -> None:
    """inv-n was accepted with no key; a binding row made to name it (key-c's, whose own
    invocation has no event yet) is not one the broker wrote."""
    seqs = await _fill(place)
    async with place.open() as j:
        ev = _accepted("inv-n", "unused", "sha256:aa")
        ev.attrs["operation"].pop("idempotency")
        seqs["inv-n"] = (await j.append(ev, barrier=True)).seq
    place.tamper("UPDATE idempotency SET invocation_id = 'inv-n' WHERE key = 'key-c'")
    report = _verify(place)
    assert (report.ok, report.first_bad_seq) == (False, seqs["inv-n"])
    assert "names another key: the binding was altered" in report.reason
    with place.reader() as r, pytest.raises(AlteredRow, match="binding was altered"):
        r.bound_record(_binding(place, "key-c"))


async def test_two_invocations_naming_one_key_are_found_by_verify(place: Place) -> None:
    """The broker binds a key to one invocation before its ACTION_ACCEPTED: a second chained
    event naming the same key (forged, and re-signed by whoever holds the key) is reported."""
    seqs = await _fill(place)
    async with place.open() as j:
        seqs["inv-d"] = (await j.append(_accepted("inv-d", "key-a", "sha256:aa"))).seq
    report = _verify(place)
    assert (report.ok, report.first_bad_seq) == (False, seqs["inv-d"])
    assert "both name one idempotency key" in report.reason
