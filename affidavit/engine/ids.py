"""Invocation ids: ``act_`` + 26 Crockford base32 characters of (48-bit ms time, 80 random
bits), so they sort by creation time (and the journal's ``(invocation_id, seq)`` index sees
appends in order)."""

from __future__ import annotations

import base64
import time

from affidavit.journal import random_bytes

__all__ = ["encode_invocation_id", "new_invocation_id"]

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_TO_CROCKFORD = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", _CROCKFORD.encode("ascii"))


def new_invocation_id() -> str:
    """``act_`` + 26 Crockford base32 characters: 48-bit ms time + 80 random bits (sortable)."""
    value = (int(time.time() * 1000) << 80) | int.from_bytes(random_bytes(10), "big")
    return encode_invocation_id(value)


def encode_invocation_id(value: int) -> str:
    """``act_`` + the 26 Crockford base32 characters of ``value`` (< 2**130), most significant
    first.  Shifted left by 30, the value fills 20 bytes whose first 26 base32 characters are
    exactly those 130 bits (RFC 4648 alphabet, translated to Crockford's) -- one C call instead
    of a 26-step loop on every invocation."""
    raw = base64.b32encode((value << 30).to_bytes(20, "big"))[:26]
    return "act_" + raw.translate(_TO_CROCKFORD).decode("ascii")
