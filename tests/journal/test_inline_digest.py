"""``Txn.insert`` hashes a row inline (``row_digest``'s direct path without the call, issue 15):
for every row ``row_digest`` accepts, the hash the writer stores must be the one ``verify``
recomputes from the stored columns (``chain.check_row``), byte for byte -- and a row
``row_digest`` cannot hash (a lone surrogate) must fail the same way, with nothing queued.

Fuzzed with hypothesis over every column the writer takes from an event: ids, sessions and
observers with quotes, controls, non-ASCII, lone surrogates; times that are floats, ints, signed
zeros, infinities, NaN; observer sequence numbers past 64 bits; payloads and audit copies.  A
time that is not finite or an observer sequence number no backend can store is refused before
hashing (it must fail alone, not its batch), with nothing queued.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.journal import JournalError
from affidavit.journal.chain import GENESIS, check_row, row_digest
from affidavit.journal.txn import Txn
from affidavit.statemachine import Event, EventKind, EvidenceSource

TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
"""Any text a row can hold (NUL is refused before hashing: PostgreSQL's text holds none)."""
SURROGATE = st.one_of(
    st.none(), st.none(), st.none(), st.sampled_from(["iid", "session", "observer", "attrs"])
)
"""Which column gets a lone surrogate (as argv bytes that are not UTF-8 decode), if any: one
column, now and then, so that most examples reach the hash."""
TIMES = st.one_of(
    st.none(),
    st.floats(),  # NaN and the infinities: refused before hashing
    st.integers(min_value=-(2**60), max_value=2**60),
    st.sampled_from([0.0, -0.0, 1e22, 5e-324, 1733362537.123456, float("inf"), -float("inf")]),
    st.just(float("nan")),
)


class _Str(str):
    """A str subclass (an id someone built so): row_digest's own path, not the direct one."""


class _Projector:
    def apply(self, stored: Event, writing: bool = False) -> None:
        pass


class _Writer:
    def __init__(self, iid: str, session: str | None, clock: Any) -> None:
        self.projectors = {iid: _Projector()}
        self.sessions = {iid: session}
        self.clock = lambda: clock


class _Tables:
    NULL = None


@settings(max_examples=600, deadline=None)
@given(
    kind=st.sampled_from(list(EventKind)),
    source=st.sampled_from(list(EvidenceSource)),
    iid=st.one_of(TEXT, TEXT.map(_Str)),
    session=st.one_of(st.none(), TEXT),
    accepted_session=st.one_of(st.none(), TEXT, st.integers(), st.booleans()),
    observer=st.one_of(st.none(), TEXT, TEXT.map(_Str)),
    observer_seq=st.one_of(
        st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70)
    ),
    at=TIMES,
    clock=st.one_of(TIMES.filter(lambda t: t is not None)),
    attrs_text=TEXT,
    payload=st.one_of(st.none(), st.binary(max_size=8)),
    audit=st.one_of(st.none(), st.binary(max_size=8)),
    seq=st.integers(min_value=0, max_value=2**62),
    prev=st.one_of(st.just(GENESIS), st.binary(min_size=32, max_size=32).map(bytes.hex)),
    surrogate=SURROGATE,
)
def test_the_inline_row_hash_is_the_one_verify_recomputes(
    kind: EventKind,
    source: EvidenceSource,
    iid: str,
    session: str | None,
    accepted_session: object,
    observer: str | None,
    observer_seq: int | None,
    at: float | None,
    clock: float,
    attrs_text: str,
    payload: bytes | None,
    audit: bytes | None,
    seq: int,
    prev: str,
    surrogate: str | None,
) -> None:
    lone = "\udc80"
    if surrogate == "iid":
        iid += lone
    elif surrogate == "session":
        session = (session or "") + lone
        accepted_session = f"{accepted_session}{lone}"
    elif surrogate == "observer":
        observer = (observer or "") + lone
    elif surrogate == "attrs":
        attrs_text += lone
    attrs = {} if accepted_session is None else {"session": accepted_session}
    if kind is EventKind.ACTION_ACCEPTED:
        session = None if accepted_session is None else str(accepted_session)
    if (session is not None and "\x00" in session) or (observer is not None and "\x00" in observer):
        return  # refused before hashing, as the id with NUL
    ev = Event(kind, iid, attrs, source, None, at, observer, observer_seq)
    txn = Txn(_Writer(iid, session, clock), _Tables(), seq, prev)  # type: ignore[arg-type]
    stored_at = float(at) if at is not None else clock
    if (
        observer_seq is not None and not (type(observer_seq) is int and 0 <= observer_seq < 2**63)
    ) or not math.isfinite(stored_at):
        # Neither backend can store it: refused before hashing, so it fails alone, not the
        # batch it rides in (tests/journal/conformance/test_store.py).
        with pytest.raises(JournalError):
            txn.insert(ev, attrs_text, payload, audit, attrs)
        assert txn.rows == [] and txn.seq == seq and txn.hash == prev
        return
    try:
        expected: bytes | BaseException = row_digest(
            bytes.fromhex(prev),
            seq + 1,
            stored_at,
            iid,
            session,
            kind.value,
            source.value,
            observer,
            observer_seq,
            attrs_text,
            payload,
            audit,
        )
    except Exception as exc:  # a lone surrogate: the row cannot be hashed
        expected = exc
    try:
        txn.insert(ev, attrs_text, payload, audit, attrs)
    except Exception as exc:
        assert isinstance(expected, BaseException), f"insert raised {exc!r}, row_digest did not"
        assert type(exc) is type(expected)
        assert txn.rows == [] and txn.seq == seq and txn.hash == prev
        return
    assert not isinstance(expected, BaseException), f"row_digest raised {expected!r}, insert not"
    (row,) = txn.rows
    assert row[12] == expected.hex()
    # What verify does with the stored columns (the writer's NULL is None here).
    digest, why = check_row(row, seq + 1, prev)
    assert why is None and digest == expected
    assert txn.seq == seq + 1 and txn.hash == expected.hex() and txn.digest == expected
