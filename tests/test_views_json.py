"""``record_json_encoder`` (what ``affidavit actions --json`` writes per record) gives the very
text of encoding ``record_to_json`` with sorted keys, for a record in every lifecycle state; and
the array writer keeps every record written before a failure."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from affidavit.journal import JournalError
from affidavit.statemachine import STATES, Event, EventKind, Projector
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
    assert json.loads(want)["state"] == state


def test_the_encoder_refuses_what_json_cannot_hold() -> None:
    p = Projector(IID)
    *before, (kind, _dest) = path_to("validated")
    for seq, (k, dest) in enumerate(before, start=1):
        p.apply(make_event(p, k, dest, seq))
    p.apply(Event(kind, IID, {"config_hash": b"raw"}, seq=50))
    with pytest.raises(TypeError, match="bytes is not JSON serializable"):
        record_json_encoder()(p.record())


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
