"""Invocation ids: ``act_`` + 26 Crockford base32 characters of (48-bit ms time, 80 random bits),
so they sort by creation time.  The encoder is table-driven (two characters per 10 bits);
these tests pin it to the plain 5-bits-at-a-time definition."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from affidavit.engine.ids import encode_invocation_id, new_invocation_id

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def reference(value: int) -> str:
    chars = []
    for _ in range(26):
        chars.append(CROCKFORD[value & 31])
        value >>= 5
    return "act_" + "".join(reversed(chars))


@given(st.integers(min_value=0, max_value=(1 << 130) - 1))
def test_the_id_is_the_crockford_encoding_of_the_value(value: int) -> None:
    assert encode_invocation_id(value) == reference(value)


def test_extremes_encode_like_the_reference() -> None:
    for value in (0, 1, (1 << 80) - 1, 1 << 80, (1 << 128) - 1, (1 << 130) - 1):
        assert encode_invocation_id(value) == reference(value)


def test_ids_sort_by_creation_time_and_do_not_repeat() -> None:
    ids = []
    for _ in range(3):
        ids.append(new_invocation_id())
        time.sleep(0.002)  # ids carry wall-clock milliseconds: a real tick between them
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(len(i) == 30 and set(i[4:]) <= set(CROCKFORD) for i in ids)
