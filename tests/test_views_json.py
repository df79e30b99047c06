"""``record_json_encoder`` (what ``affidavit actions --json`` writes per record) gives the very
text of encoding ``record_to_json`` with sorted keys, for a record in every lifecycle state; and
the array writer keeps every record written before a failure."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from types import MappingProxyType
from typing import Any

import pytest

from affidavit.journal import JournalError
from affidavit.statemachine import STATES, Budget, Event, EventKind, Projector, Record
from affidavit.views import record_json_encoder, record_to_json
from tests.statemachine.lifecycle_helpers import IID, make_event, path_to


def _record_in(state: str, seq_from: int = 1) -> Projector:
    p = Projector(IID)
    for seq, (kind, dest) in enumerate(path_to(state), start=seq_from):
        p.apply(make_event(p, kind, dest, seq))
    return p


@pytest.mark.parametrize("state", sorted(STATES))
def test_the_encoder_writes_what_record_to_json_encodes(state: str) -> None:
    p = _record_in(state)
    if state != "new" and "dispatched" in state:
        attrs = {"protocol": "http", "state": "s", "facts": {"b": (1, 2), "a": {"z": None}}}
        p.apply(Event(EventKind.PROTOCOL_OBSERVED, IID, attrs, seq=999))
    rec = p.record(now=5.0)
    want = json.JSONEncoder(sort_keys=True).encode(record_to_json(rec))
    assert record_json_encoder()(rec) == want
    mine = json.JSONEncoder(sort_keys=True).encode(record_to_json(rec, operator=True))
    assert record_json_encoder(operator=True)(rec) == mine
    assert json.loads(want)["state"] == state
    tagged = json.JSONEncoder(sort_keys=True).encode(record_to_json(rec, holder=_tag))
    assert record_json_encoder(holder=_tag)(rec) == tagged


def _tag(iid: str, holder: str) -> str:
    return f"tag:{iid}:{holder[::-1]}"


@pytest.mark.parametrize("final", [False, True])
def test_a_callers_encoder_tags_the_holder_of_a_keyed_record_as_record_to_json_does(
    final: bool,
) -> None:
    """A record whose hashes are keyed takes the encoder's own path for a caller (its lease
    holder tagged without a copy of the record): the same bytes as ``record_to_json``."""
    op = {"target": "api", "protocol": "http", "fingerprint": None}
    p = Projector(IID)
    accepted = {"operation": op, "holder": "host:42:ab", "lease_expires_at": 2e9}
    p.apply(Event(EventKind.ACTION_ACCEPTED, IID, accepted, seq=1))
    p.apply(Event(EventKind.PREFLIGHT_VALIDATED, IID, {"config_hash": "hmac-sha256:c0"}, seq=2))
    if final:
        failed = {"code": "CONNECTION_REFUSED", "stage": "tcp"}
        p.apply(Event(EventKind.SETUP_FAILED, IID, failed, seq=3))
    rec = p.record(now=5.0)
    assert rec.final is final and rec.evidence["lease"]["holder"] == "host:42:ab"
    tagged = json.JSONEncoder(sort_keys=True).encode(record_to_json(rec, holder=_tag))
    assert record_json_encoder(holder=_tag)(rec) == tagged
    assert json.loads(tagged)["evidence"]["lease"]["holder"] == "tag:act_test:ba:24:tsoh"
    assert "host:42" not in tagged


def test_the_encoder_refuses_what_json_cannot_hold() -> None:
    p = Projector(IID)
    *before, (kind, _dest) = path_to("validated")
    for seq, (k, dest) in enumerate(before, start=1):
        p.apply(make_event(p, k, dest, seq))
    p.apply(Event(kind, IID, {"config_hash": b"raw"}, seq=50))
    # (An operator's encoder: a caller's withholds a config hash that is not keyed.)
    with pytest.raises(TypeError, match="bytes is not JSON serializable"):
        record_json_encoder(operator=True)(p.record())


def test_actions_json_output_keeps_every_record_before_a_failure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``affidavit actions --json`` writes in blocks: a record that fails part-way (a journal
    error) must not hold back the records folded before it."""
    from affidavit.cli.actions_json import write_array as _write_array

    def items() -> Iterator[str]:
        yield from (f'{{"n": {i}}}' for i in range(3))
        raise JournalError("row 4 fails verification")

    with pytest.raises(JournalError):
        _write_array(items())
    out = capsys.readouterr().out
    assert out == '[\n{"n": 0},\n{"n": 1},\n{"n": 2}'
    _write_array(iter(()))
    assert capsys.readouterr().out == "[]\n"
    _write_array(iter(['{"n": 0}']))
    assert capsys.readouterr().out == '[\n{"n": 0}\n]\n'


def _expected(rec: Record) -> str:
    return json.JSONEncoder(sort_keys=True).encode(record_to_json(rec))


def _attempt(**changed: Any) -> MappingProxyType[str, Any]:
    """An attempt as the fold makes it (``rules_attempt``), read-only, with ``changed``."""
    made = {"n": 1, "generation": 0, "stage": "dispatch", "outcome": "unknown", "code": None}
    return MappingProxyType({**made, "seq": 7, **changed})


_ODD: list[dict[str, Any]] = [
    # What a fold may hold where a field's usual type is not: values taken from attrs as they
    # are (message, field, session), numbers of every JSON kind, text needing escapes.
    {"message": {"b": [1, 2.5], "a": None}, "field": 7, "session": ["s", 1]},
    {"message": 3, "field": True, "session": False, "retry_after": float("inf")},
    {"message": 'caf\u00e9 \u2603 "q" \\ \n\t\x01', "session": "\u00e9", "retry_after": 0.1},
    {"target": None, "protocol": None, "fingerprint": None, "last_seq": None, "code": None},
    {"idempotent": True, "generation": 2**70, "events": 0, "retry_after": float("nan")},
    {"idempotency": MappingProxyType({"key": "k", "expires_at": 1.5e300}), "idempotent": 1},
    {"budget": Budget(5, 7), "last_seq": 2**63, "invocation_id": "act_\u00ff"},
    # Attempts: the fold's six keys holding what attrs may hold, a key more or fewer, several,
    # none, a plain dict, a list (``attempt_json`` writes the fold's own, the encoder the rest).
    {"attempts": (_attempt(code="E_X", generation=None, n=True, outcome=None, seq=1.5),)},
    {"attempts": (_attempt(code=["c", {"b": 1, "a": 2}], outcome={"x": 1}, stage=2**64),)},
    {"attempts": (_attempt(stage='caf\u00e9 "q"\n', generation=False, n=-3, seq=None),)},
    {"attempts": (_attempt(extra=1),), "events": 2},
    {"attempts": (MappingProxyType({"n": 1, "seq": 2}),)},
    {"attempts": (_attempt(), _attempt(n=2, code="E"), MappingProxyType({"z": 0}))},
    {"attempts": ()},
    {
        "attempts": (
            {"stage": "dispatch", "code": None, "seq": 4, "n": 1, "generation": 0, "outcome": "u"},
        )
    },
    {"attempts": [_attempt(), _attempt(n=2)]},
]


@pytest.mark.parametrize("odd", _ODD)
def test_the_encoder_writes_odd_values_as_json_does(odd: dict[str, Any]) -> None:
    """The encoder writes each value itself when it has an exact type it knows (str, None,
    int) and hands every other one to the general encoder: the text is still exactly what
    encoding ``record_to_json`` gives, whatever a field holds."""
    p = _record_in("completed_committed")
    base = p.record(now=5.0)
    rec = dataclasses.replace(base, **odd)
    assert record_json_encoder()(rec) == _expected(rec)


def test_the_encoder_writes_batches_operations_and_unknown_outcomes() -> None:
    """Nested views of every kind (items, operation, idempotency, several attempts) through
    the encoder, against ``record_to_json``."""
    recs: list[Record] = []
    for state in sorted(STATES):
        rec = _record_in(state).record(now=5.0)
        recs.append(
            dataclasses.replace(
                rec,
                items=(MappingProxyType({"id": 1, "outcome": "unknown", "code": None}),),
                operation=MappingProxyType({"id": "op", "state": "pending", "polls": 0}),
                attempts=(*rec.attempts, MappingProxyType({"n": 9, "outcome": "unknown"})),
            )
        )
    encode = record_json_encoder()
    for rec in recs:
        assert encode(rec) == _expected(rec)


def test_a_failed_write_of_a_block_is_not_written_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A block whose ``write`` fails (stdout a non-blocking pipe: ``BlockingIOError`` after the
    buffer took the text) propagates the error; the ``finally`` that writes what an iterator
    failure left pending must not write that block a second time -- the output would hold its
    records twice."""
    import errno
    import sys

    from affidavit.cli.actions_json import write_array as _write_array

    class Flaky:
        def __init__(self) -> None:
            self.text: list[str] = []
            self.failed = False

        def write(self, s: str) -> int:
            self.text.append(s)
            if not self.failed and s:
                self.failed = True
                raise BlockingIOError(errno.EAGAIN, "write would block", len(s))
            return len(s)

    out = Flaky()
    monkeypatch.setattr(sys, "stdout", out)
    with pytest.raises(BlockingIOError):
        _write_array(f'{{"n": {i}}}' for i in range(600))
    written = "".join(out.text)
    assert written.count('{"n": 0}') == 1
    assert written == "[\n" + ",\n".join(f'{{"n": {i}}}' for i in range(512))


def test_the_encoder_writes_printable_ascii_only_which_actions_json_writes_unescaped() -> None:
    """``actions --json`` writes past the command line's escaping (``ascii_json_stdout``: its
    passes cost ~10% of the command for nothing).  That holds only while every record's text
    is printable ASCII: a control character, DEL, C1, a bidi or line separator in a field (a
    message from a remote, a fold's odd value) leaves as a JSON escape, never raw."""
    from affidavit.text import printable

    hostile = "a\x1b[2J\x07\x7f\x9b\u202e\u2028\u2066\ufeff\U0001f600z"
    rec = dataclasses.replace(
        _record_in("completed_committed").record(now=5.0),
        message=hostile,
        session=hostile,
        field={"k" + hostile: [hostile]},
    )
    text = record_json_encoder()(rec)
    assert text.isascii() and printable(text) == text
    assert json.loads(text)["message"] == hostile


@pytest.mark.parametrize("state", ["completed_committed", "interrupted", "awaiting_approval"])
def test_without_the_c_accelerator_the_encoder_writes_the_same_text(
    state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interpreter without ``_json``'s encoder: the pure-Python one, the same bytes."""
    p = _record_in(state)
    rec = p.record(now=5.0)
    want = record_json_encoder(operator=True)(rec)
    monkeypatch.setattr(json.encoder, "c_make_encoder", None)
    assert record_json_encoder(operator=True)(rec) == want
    assert want == json.JSONEncoder(sort_keys=True).encode(record_to_json(rec, operator=True))
