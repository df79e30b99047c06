"""Invocation ids: ``act_`` + 26 Crockford base32 characters of (48-bit ms time, 80 random
bits), so they sort by creation time (and the journal's ``(invocation_id, seq)`` index sees
appends in order)."""

from __future__ import annotations

import re
import time

from affidavit.journal import random_bytes

__all__ = ["encode_invocation_id", "is_invocation_id", "new_invocation_id"]

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = tuple(a + b for a in _CROCKFORD for b in _CROCKFORD)
"""The two Crockford characters of each 10-bit value."""
_ID = re.compile("act_[" + _CROCKFORD + "]{26}")


def is_invocation_id(text: str) -> bool:
    """Whether ``text`` has the form ``new_invocation_id`` gives every id: what a page may
    echo of an id it was asked for and has no record of (anything else an agent wrote into a
    link is not shown back)."""
    return _ID.fullmatch(text) is not None


def new_invocation_id() -> str:
    """``act_`` + 26 Crockford base32 characters: 48-bit ms time + 80 random bits (sortable)."""
    value = (int(time.time() * 1000) << 80) | int.from_bytes(random_bytes(10), "big")
    return encode_invocation_id(value)


def encode_invocation_id(value: int) -> str:
    """``act_`` + the 26 Crockford base32 characters of ``value`` (< 2**130), most significant
    first: thirteen 10-bit groups, each looked up as its two characters (``_PAIRS``) -- about a
    third of the cost of ``base64.b32encode``, whose 3.11 implementation is a Python loop
    (issue 15: once per invocation)."""
    p = _PAIRS
    return (
        "act_" + p[value >> 120 & 1023] + p[value >> 110 & 1023] + p[value >> 100 & 1023]
        + p[value >> 90 & 1023] + p[value >> 80 & 1023] + p[value >> 70 & 1023]
        + p[value >> 60 & 1023] + p[value >> 50 & 1023] + p[value >> 40 & 1023]
        + p[value >> 30 & 1023] + p[value >> 20 & 1023] + p[value >> 10 & 1023]
        + p[value & 1023]
    )  # fmt: skip
