"""Which records a caller sees with their hashes withheld (``statemachine/withheld.py``): only a
keyed ``config_hash`` proves the fingerprints beside it keyed."""

from __future__ import annotations

from typing import Any

from affidavit.statemachine import (
    HOLDER_WITHHELD,
    WITHHELD,
    Event,
    EventKind,
    Projector,
    Record,
    caller_event,
    caller_record,
    hashes_withheld,
    render_envelope,
)

IID = "act_withheld"
FP = "sha256:" + "ab" * 32


def _record(fingerprint: str | None, config_hash: str | None) -> tuple[Record, list[Event]]:
    op: dict[str, Any] = {"target": "api", "protocol": "http", "fingerprint": fingerprint}
    op["idempotency"] = {"key": "k", "scope": "s", "fingerprint": fingerprint}
    events = [Event(EventKind.ACTION_ACCEPTED, IID, {"operation": op}, seq=1)]
    if config_hash is not None:
        events.append(
            Event(EventKind.PREFLIGHT_VALIDATED, IID, {"config_hash": config_hash}, seq=2)
        )
    p = Projector(IID)
    for e in events:
        p.apply(e)
    return p.record(), events


def test_a_keyed_config_hash_shows_every_hash_as_recorded() -> None:
    rec, events = _record(FP, "hmac-sha256:" + "cd" * 32)
    assert not hashes_withheld(rec)
    assert caller_record(rec) is rec
    assert [caller_event(e, False) for e in events] == events
    assert render_envelope(rec)["evidence"]["idempotency"]["fingerprint"] == FP


def test_a_plain_or_missing_config_hash_withholds_the_fingerprints() -> None:
    """Plain: written before the upgrade.  Missing (the broker stopped between ACTION_ACCEPTED
    and PREFLIGHT_VALIDATED): nothing proves the fingerprint keyed, so it is withheld too."""
    for config_hash in ("sha256:" + "cd" * 32, None):
        rec, events = _record(FP, config_hash)
        assert hashes_withheld(rec)
        shown = caller_record(rec)
        assert shown.fingerprint == WITHHELD
        assert shown.idempotency is not None and shown.idempotency["fingerprint"] == WITHHELD
        assert shown.idempotency["key"] == "k"  # only the hashes are withheld
        env = render_envelope(rec)
        assert FP not in repr(env) and env["evidence"]["fingerprint"] == WITHHELD
        if config_hash is not None:
            assert env["evidence"]["config_hash"] == WITHHELD
            assert caller_event(events[1], True).attrs == {"config_hash": WITHHELD}
        accepted = caller_event(events[0], True)
        assert FP not in repr(accepted.attrs)
        assert accepted.attrs["operation"]["idempotency"]["key"] == "k"
        assert events[0].attrs["operation"]["fingerprint"] == FP  # the event itself untouched
        assert rec.fingerprint == FP


def test_a_record_refused_before_its_fingerprint_has_nothing_withheld() -> None:
    rec, _events = _record(None, None)
    assert not hashes_withheld(rec)
    assert caller_record(rec) is rec


def test_a_caller_is_shown_the_holder_as_tagged_and_withheld_without_a_tag() -> None:
    """The recorded holder (``hostname:pid:hex``) reaches no caller-facing rendering: the
    envelope, the record and each event show the tag it is given -- of this invocation and
    holder -- and, given none, ``HOLDER_WITHHELD``, never the recorded value."""
    recorded = "broker-host:4242:1f2e3d4c"
    op = {"target": "api", "protocol": "http", "fingerprint": None}
    accepted = Event(
        EventKind.ACTION_ACCEPTED,
        IID,
        {"operation": op, "holder": recorded, "lease_expires_at": 2e9},
        seq=1,
    )
    stopped = "other-host:7:5a6b"  # a stale worker of generation 0 (a take-over's binder)
    lost = Event(EventKind.LEASE_LOST, IID, {"generation": 0, "holder": stopped}, seq=2)
    p = Projector(IID)
    p.apply(accepted)
    p.apply(lost)
    rec = p.record()
    assert rec.evidence["lease"]["holder"] == recorded  # the record, as the operator reads it
    assert rec.evidence["stale_workers"] == [{"generation": 0, "seq": 2, "holder": stopped}]

    def tag(iid: str, holder: str) -> str:
        return f"tag({iid},{len(holder)})"

    shown = tag(IID, recorded)
    assert render_envelope(rec, holder=tag)["evidence"]["lease"]["holder"] == shown
    (worker,) = render_envelope(rec, holder=tag)["evidence"]["stale_workers"]
    assert worker == {"generation": 0, "seq": 2, "holder": tag(IID, stopped)}
    (worker,) = render_envelope(rec)["evidence"]["stale_workers"]
    assert worker["holder"] == HOLDER_WITHHELD
    assert caller_record(rec).evidence["stale_workers"][0]["holder"] == HOLDER_WITHHELD
    assert caller_record(rec, tag).evidence["lease"]["holder"] == shown
    assert caller_event(accepted, False, tag).attrs["holder"] == shown
    assert render_envelope(rec)["evidence"]["lease"]["holder"] == HOLDER_WITHHELD
    assert caller_record(rec).evidence["lease"]["holder"] == HOLDER_WITHHELD
    assert caller_event(accepted, False).attrs["holder"] == HOLDER_WITHHELD
    assert accepted.attrs["holder"] == recorded and rec.evidence["lease"]["holder"] == recorded
    assert rec.evidence["stale_workers"][0]["holder"] == stopped


def _variants() -> list[Record]:
    """A record in every lifecycle state, its config hash plain (withheld) and keyed, with and
    without a lease (holder, deadline) in its evidence."""
    from dataclasses import replace

    from affidavit.statemachine.lifecycle import STATES

    from .lifecycle_helpers import projector_in

    lease = {"generation": 2, "holder": "host:9:ab", "expires_at": 2e9, "seq": 3}
    out = []
    for state in sorted(STATES):
        rec = projector_in(state).record()
        keyed = {**rec.evidence, "config_hash": "hmac-sha256:" + "cd" * 32}
        for evidence in (rec.evidence, keyed):
            out.append(replace(rec, evidence=evidence))
            out.append(replace(rec, evidence={**evidence, "lease": lease}))
    return out


def test_an_envelope_renders_as_from_the_caller_record() -> None:
    """``render_envelope`` tags the holder in the evidence alone (no copy of the record): its
    output, byte for byte, is the envelope of ``caller_record`` -- the record rebuilt with the
    holder tagged and the plain hashes withheld, as it rendered before."""
    import json

    def tag(iid: str, holder: str) -> str:
        return f"tag({iid},{holder[::-1]})"

    def kept(iid: str, holder: str) -> str:
        return holder  # already tagged by caller_record

    records = _variants()
    assert any(not hashes_withheld(r) and "lease" in r.evidence and r.final for r in records)
    for rec in records:
        for holder in (None, tag):
            new = render_envelope(rec, {"status": 200}, holder=holder)
            old = render_envelope(caller_record(rec, holder), {"status": 200}, holder=kept)
            assert json.dumps(new) == json.dumps(old), rec.state
            assert "host:9:ab" not in json.dumps(new)


def test_an_envelope_of_a_keyed_record_copies_no_record(monkeypatch: Any) -> None:
    """Tagging the holder rebuilds no ``Record`` (``dataclasses.replace``: every field read and
    passed again, once per envelope); only a record with hashes to withhold is rebuilt."""
    import affidavit.statemachine.withheld as withheld

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the record was rebuilt")

    monkeypatch.setattr(withheld, "replace", refuse)
    records = [r for r in _variants() if not hashes_withheld(r) and "lease" in r.evidence]
    assert records
    for rec in records:
        assert render_envelope(rec)["evidence"]["lease"]["holder"] == HOLDER_WITHHELD
