"""A sealed event payload is bound to its event, not only to its invocation and kind.

Two DISPATCH_STARTED events of one invocation (attempt 1, then attempt 2 under a retry lease)
each carry a payload.  Someone who can write the database moves one's sealed blob into the
other's row: ``payload`` (what ``affidavit journal open-sealed`` and the approval dispatcher
read) refuses it -- the blob's associated data names its seq -- and so does the CLI, with a
stable code, printing nothing.  A payload sealed before this binding (the invocation and kind
alone: ``payload_aad``, version byte 0x01) still opens; one sealed to its event and relabelled
as that old form does not.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from affidavit.cli import main as cli_main
from affidavit.journal import JournalError
from affidavit.journal.sealing import BrokerKey, payload_aad
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E
from tests.postgres import argv_url

from ..helpers import interrupted
from .conftest import Place

LIMIT = 20


async def _two_dispatches(place: Place) -> tuple[int, int]:
    """inv-1 dispatched twice, each DISPATCH_STARTED with a payload: their seqs."""
    first, second = {"attempt": "one"}, {"attempt": "two"}
    with trio.fail_after(LIMIT):
        async with place.open() as j:
            seqs = []
            for ev in interrupted("inv-1"):
                dispatch = ev.kind is E.DISPATCH_STARTED
                stored = await j.append(ev, payload=first if dispatch else None)
                if dispatch:
                    seqs.append(stored.seq)
            lease = await j.acquire_lease("inv-1", "w1", ttl=10)
            again = Event(E.DISPATCH_STARTED, "inv-1", {"attempt": 2})
            stored = await j.append(again, payload=second, lease=(lease.holder, lease.generation))
            seqs.append(stored.seq)
            assert [j.payload(s) for s in seqs] == [first, second]
    return seqs[0], seqs[1]


def _blob(place: Place, seq: int) -> bytes:
    ((blob,),) = place.rows(f"SELECT payload FROM events WHERE seq = {seq}")
    return bytes(blob)


def _put(place: Place, seq: int, blob: bytes) -> None:
    place.tamper(f"UPDATE events SET payload = {place.blob(blob)} WHERE seq = {seq}")


def _open_sealed(place: Place, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.MonkeyPatch.context() as env:
        location = place.location
        if location.startswith("postgresql://"):
            location = argv_url(location, env)  # (a password in argv is refused)
        where = ["--journal", location, "--key-file", str(place.key_file), "--json"]
        code = cli_main(["journal", "open-sealed", "inv-1", *where])
    done = capsys.readouterr()
    return code, done.out, done.err


def _refused(place: Place, seq: int, capsys: pytest.CaptureFixture[str]) -> None:
    with place.reader() as r, pytest.raises(JournalError, match="the row was altered"):
        r.payload(seq)
    code, out, err = _open_sealed(place, capsys)
    # Under --json the refusal is also one object on stdout (the CLI's ``api_error``), and no
    # opened payload: the code and the words the stderr line says.
    assert code == 2, out
    answer = json.loads(out)
    assert list(answer) == ["api_error"], out
    refusal = answer["api_error"]
    assert refusal["code"] == "JOURNAL_UNREADABLE", out
    assert refusal["message"] in err, (out, err)
    assert err.startswith("affidavit: JOURNAL_UNREADABLE: "), err
    assert f"the payload of seq {seq} cannot be read" in err and "Traceback" not in err, err


async def test_a_payload_moved_to_another_event_of_its_kind_is_refused(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    one, two = await _two_dispatches(place)
    code, out, err = _open_sealed(place, capsys)
    assert code == 0, err
    shown = {s["seq"]: s["payload"] for s in json.loads(out)["sealed"]}
    assert (shown[one], shown[two]) == ({"attempt": "one"}, {"attempt": "two"})
    _put(place, two, _blob(place, one))  # attempt 1's payload, shown as attempt 2's
    _refused(place, two, capsys)


async def test_an_old_form_payload_opens_and_a_new_one_relabelled_old_does_not(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    one, two = await _two_dispatches(place)
    key = BrokerKey.load(place.key_file)
    assert _blob(place, one)[:1] == b"\x03"  # sealed to its event
    # A journal written before the binding: bound to the invocation and kind alone.
    old: dict[str, Any] = {"attempt": "from an old journal"}
    sealed = key.seal(json.dumps(old).encode(), payload_aad("inv-1", "DISPATCH_STARTED"))
    assert sealed[:1] == b"\x01"
    _put(place, one, sealed)
    with place.reader() as r:
        assert r.payload(one) == old
    # Attempt 2's, sealed to its seq, relabelled as the old form: never opened as one.
    relabelled = b"\x01" + _blob(place, two)[1:]
    _put(place, two, relabelled)
    _refused(place, two, capsys)
