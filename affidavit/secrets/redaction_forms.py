"""Redaction's forms: which byte strings are an injected value's echoes, and their regex.

``secret_forms`` lists a value's whole-value forms (raw, base64 at each alignment, hex, case);
``_value_slots`` merges them into few patterns of *slots*, and ``_alts``/``_slot_regex`` write
each slot's character in every unit encoding (literal, ``%XX``, ``+``, JSON escapes).
``_escapes`` derives the escape patterns that locate candidates.  How the pieces fit:
``redaction.py``'s docstring; the plan that compiles them: ``redaction_plan.py``.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Sequence

LONG_VALUE = 128
"""Values longer than this are matched raw and whole base64, only their bytes other than
letters and digits also escaped (``long_alts``): compiling the pattern of a 128-byte value
with every encoding takes a few hundred ms."""
MIN_CORE = 8
"""A shifted base64 core shorter than this would match unrelated base64 text."""
BREAK = rb"(?:\n|\r\n|\\n|\\r\\n|%0[aA]|%0[dD]%0[aA])"
"""A line break inside a wrapped base64 form, written as the unit encodings write one: raw
(LF or CR LF), JSON-escaped (``\\n``, ``\\r\\n``), percent-encoded (``%0A``, ``%0D%0A``).  It
and every way of writing a base64 character (literal, ``%2B``, ``\\/``, a ``\\u`` escape)
differ by their third byte at the latest, so before a slot the break is taken or not at once:
an optional break never leaves two ways to match the same text.  Each alternative starts with
a literal byte, which ``re`` tests before trying it (a ``\r?`` first would be tried at every
slot of every attempt)."""
BREAK_WIDTH = 6
"""The widest ``BREAK`` (``%0D%0A``)."""
RAW_BREAK = b"\r\n"
"""The bytes of a raw ``BREAK``: ``joined`` drops them, so a base64 form wrapped with raw
breaks is whole again."""
_B64_WRITTEN = rb"[A-Za-z0-9+/=_-]"
"""The last byte of any way of writing a base64 character (literal; ``%XX`` and ``\\uXXXX``
end in a hex digit, ``\\/`` in ``/``)."""
_B64_NEXT = rb"(?=[A-Za-z0-9+/=_%\\-])"
"""The first byte of any way of writing a base64 character (literal, ``%``, ``\\``)."""
MIN_ANY_CASE = MIN_CORE
"""A value at least this long is matched in every form with its ASCII letters in either case,
bodies included: a case-changed echo of it (an error page that upper-cases the request line)
still carries nearly all its entropy, and even folded it is no plausible chance match.  A
shorter value is matched in bodies in each form's own case (short text: in any case)."""


def compile_secret(source: bytes, flags: int = 0) -> re.Pattern[bytes]:
    """``re.compile(source, flags)`` for a source that spells out a credential, then
    ``re.purge()``: ``re`` keeps the patterns compiled through it (their sources included) in
    a module-wide cache of hundreds, which would hold the credential after its plan is dropped
    (docs/security.md, "Credential lifetime": until it rotates or the broker closes).  Every
    module's cached patterns go with it and compile again on their next use -- rare: a plan
    is built once per credential value."""
    try:
        return re.compile(source, flags)
    finally:
        re.purge()


# JSON's two-character escapes (RFC 8259 §7), by code point.
_JSON_SHORT = {0x22: b'"', 0x5C: b"\\", 0x2F: b"/", 0x08: b"b", 0x0C: b"f", 0x0A: b"n"}
_JSON_SHORT |= {0x0D: b"r", 0x09: b"t"}
_HEX = b"0123456789abcdef"
_B64 = (base64.b64encode, base64.urlsafe_b64encode)
_UNRESERVED = frozenset(
    bytes([c]) for c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~"
)
"""RFC 3986 unreserved characters: no encoder escapes them unasked, so an escape of one is a
rare sight in a body and needs no follower to be a good candidate."""


def _cores(value: bytes, shift: int) -> list[bytes]:
    """The base64 characters (both alphabets) of ``value`` placed ``shift`` bytes into a 3-byte
    group, without the characters that carry bits of the neighbouring bytes."""
    padded = bytes(shift) + value
    whole = len(padded) // 3 * 3
    skip = (shift * 4 + 2) // 3
    return [enc(padded[:whole])[skip:] for enc in _B64]


def _pem_lines(value: bytes) -> set[bytes]:
    """The base64 body lines of a PEM value (an OpenSSH or PKCS#8 private key), and the body as
    one string: a command that prints part of a key file would otherwise leak it line by line
    past the whole-value forms."""
    lines = value.strip().splitlines()
    if len(lines) < 3 or not lines[0].startswith(b"-----BEGIN "):
        return set()
    body = [ln.strip() for ln in lines[1:-1] if len(ln.strip()) >= 24]
    return {*body, b"".join(ln.strip() for ln in lines[1:-1])}


def _literal_forms(value: bytes) -> set[bytes]:
    """The value and its whole base64 (both alphabets, padded or not)."""
    if not value:
        return set()
    forms = {value}
    for enc in _B64:
        forms |= {enc(value), enc(value).rstrip(b"=")}
    return forms


_HEX_LETTERS = frozenset(b"abcdefABCDEF")


def _any_case(value: bytes) -> bool:
    """Whether bodies match ``value``'s forms with their letters written in either case."""
    return len(value) >= MIN_ANY_CASE


def _case_free(value: bytes) -> bool:
    """Whether ``value``'s case carries nothing: its ASCII letters, at least one, are all hex
    digits (a hex token, a UUID).  A remote may print such a value in either case (a ``%X``
    format, a UUID type that upper-cases) and the echo is still the credential, so its raw
    form is matched in lower and upper case in bodies too, however short (``_any_case``: a
    longer value's every form is)."""
    letters = [b for b in value if 0x41 <= b <= 0x5A or 0x61 <= b <= 0x7A]
    return bool(letters) and all(b in _HEX_LETTERS for b in letters)


def base64_forms(value: bytes) -> set[bytes]:
    """``value``'s base64 forms among ``secret_forms``: whole (both alphabets, padded or not)
    and, for a value of at most ``LONG_VALUE`` bytes, its cores at the other two alignments --
    the forms matched with a line break between any two characters (``BREAK``)."""
    forms = _literal_forms(value) - {value}
    if value and len(value) <= LONG_VALUE:
        for shift in (1, 2):
            forms |= {c for c in _cores(value, shift) if len(c) >= MIN_CORE}
    return forms


def joined(data: bytes) -> bytes:
    """``data`` without its raw line breaks' bytes (``RAW_BREAK``): a base64 form wrapped with
    raw breaks, at any width, is whole in it (a lone CR dropped too: only more candidates)."""
    return data.replace(b"\r", b"").replace(b"\n", b"")  # each ``data`` itself if absent


def mojibake(value: bytes) -> bytes | None:
    """``value``'s UTF-8 bytes read as latin-1 and written as UTF-8 again, if it has non-ASCII
    bytes: how Python's http.server and WSGI servers hand a Basic password (header bytes decoded
    as latin-1, RFC 7617 leaving the charset unset) to an application that echoes it -- ``ä``
    comes back ``Ã¤``, or in JSON ``\\u00c3\\u00a4``.  Matched in every unit encoding like the
    value itself (``_value_slots``)."""
    if value.isascii():
        return None
    return value.decode("latin-1").encode("utf-8")


def secret_forms(value: bytes) -> set[bytes]:
    """The whole-value forms of ``value`` as concrete byte strings; each is matched in every
    unit encoding (and the base64 alphabets and hex cases may mix: see ``_value_slots``)."""
    forms = _literal_forms(value)
    if value and len(value) <= LONG_VALUE:
        misread = mojibake(value)
        if misread is not None:
            forms.add(misread)
        if _case_free(value):
            forms |= {value.lower(), value.upper()}
        for shift in (0, 1, 2):
            forms |= {c for c in _cores(value, shift) if len(c) >= MIN_CORE}
        hexed = value.hex().encode("ascii")
        forms |= {hexed, hexed.upper()}
    forms.discard(b"")
    return forms


# --- the pattern ------------------------------------------------------------------------------

Char = tuple[bytes, int | None]
"""A character of a form: its bytes, and its code point (None: a byte of a non-UTF-8 value)."""
Slot = tuple[tuple[Char, ...], bool, bool]
"""One position of a form: the characters it may be (base64 alphabets, hex cases), optional?,
and may a line break (``BREAK``) come before it (a wrapped base64 form)?"""


def _chars(data: bytes) -> list[Char]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return [(bytes([b]), b if b < 0x80 else None) for b in data]
    return [(ch.encode("utf-8"), ord(ch)) for ch in text]


def _merge(
    variants: Sequence[bytes], optional_from: int | None = None, wrapped: bool = False
) -> list[Slot]:
    """Equal-length variants of one form as slots of alternative characters; every position
    from ``optional_from`` on optional (``optional_from`` is only given for base64, where it
    makes the padding optional as well); ``wrapped``: a line break may come before any slot but
    the first (base64)."""
    cols = zip(*(_chars(v) for v in variants), strict=True)
    slots: list[Slot] = []
    for i, col in enumerate(cols):
        chars = tuple(dict.fromkeys(col))
        optional = optional_from is not None and (i >= optional_from or chars == ((b"=", 0x3D),))
        slots.append((chars, optional, wrapped and i > 0))
    return slots


def _value_slots(value: bytes) -> list[list[Slot]]:
    """``secret_forms(value)`` as few patterns: the base64 alphabets merged position by position
    (one pattern, padding and the last, neighbour-dependent character optional), the hex cases
    merged likewise.  Fewer, shorter patterns compile faster; each concrete form still matches."""
    case_free = len(value) <= LONG_VALUE and _case_free(value)
    forms = [_merge([value, value.lower(), value.upper()] if case_free else [value])]
    plain = [enc(value) for enc in _B64]
    core0 = len(_cores(value, 0)[0])
    optional_from = core0 if core0 >= MIN_CORE else len(plain[0])
    forms.append(_merge(plain, optional_from, wrapped=True))
    if len(value) <= LONG_VALUE:
        misread = mojibake(value)
        if misread is not None:
            forms.append(_merge([misread]))
        for shift in (1, 2):
            cores = _cores(value, shift)
            if len(cores[0]) >= MIN_CORE:
                forms.append(_merge(cores, wrapped=True))
        hexed = value.hex().encode("ascii")
        forms.append(_merge([hexed, hexed.upper()]))
    return forms


Alt = tuple[int, bytes, int]
"""One way to write a character: (its literal first byte, regex for the rest, width)."""


def _hex_digit(d: int) -> bytes:
    c = _HEX[d]
    return bytes([c]) if c < 0x61 else b"[" + bytes([c, c - 32]) + b"]"


def _hex2(b: int, either: bool = False) -> bytes:
    """``b``'s two hex digits (either case); ``either``: the first one of ``b ^ 0x20`` too (an
    ASCII letter's escape in either case: ``%4B`` or ``%6B``)."""
    high = _hex_digit(b >> 4)
    if either:
        high = b"[" + bytes([_HEX[b >> 4], _HEX[(b ^ 0x20) >> 4]]) + b"]"
    return high + _hex_digit(b & 15)


def _hex4(n: int, either: bool = False) -> bytes:
    return _hex2(n >> 8) + _hex2(n & 0xFF, either)


def _surrogates(cp: int) -> tuple[int, int]:
    return 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF)


def _alts(char: Char, any_case: bool = False) -> list[Alt]:
    """The ways to write ``char``; ``any_case``: an ASCII letter's escapes in either case too
    (``%4B`` and ``\\u004b`` are a ``K`` where the form has ``k``: a case-changed echo written
    escaped).  Its literal in the other case is the caller's to add (``_slot_regex``)."""
    raw, cp = char
    either = any_case and raw.isalpha()
    tail = b"".join(b"(?:" + re.escape(bytes([b])) + b"|%" + _hex2(b) + b")" for b in raw[1:])
    tail_w = 3 * (len(raw) - 1)
    alts: list[Alt] = [(raw[0], tail, 1 + tail_w)]
    alts.append((0x25, _hex2(raw[0], either) + tail, 3 + tail_w))
    if raw == b" ":
        alts.append((0x2B, b"", 1))  # application/x-www-form-urlencoded
    if cp is not None:
        short = _JSON_SHORT.get(cp)
        if short is not None:
            alts.append((0x5C, re.escape(short), 2))
        if cp < 0x10000:
            alts.append((0x5C, b"u" + _hex4(cp, either), 6))
        else:
            hi, lo = _surrogates(cp)
            alts.append((0x5C, b"u" + _hex4(hi) + rb"\\u" + _hex4(lo), 12))
    return alts


def _either_case(chars: tuple[Char, ...]) -> tuple[Char, ...]:
    """``chars`` and each ASCII letter among them in the other case (``_escapes``: the
    escapes of a letter whose case changed locate candidates too)."""
    other = [(bytes([r[0] ^ 0x20]), cp ^ 0x20) for r, cp in chars if r.isalpha() and cp]
    return tuple(dict.fromkeys((*chars, *other)))


def _slot_regex(slot: Slot, any_case: bool) -> tuple[bytes, int]:
    """The slot's regex (each letter in either case if ``any_case``, literally or escaped,
    after an optional line break if the slot may have one), and its widest match.  An optional
    slot takes its break only with a character after it: a break after a form's last character
    is the text's, not the secret's (two NDJSON records stay two), and two optional slots in a
    row never both offer to take one break."""
    chars, optional, wrap = slot
    alts = {(-w, re.escape(bytes([f])) + rest) for c in chars for f, rest, w in _alts(c, any_case)}
    if any_case:
        alts |= {(-1, bytes([c[0][0] ^ 0x20])) for c in chars if c[0].isalpha()}
    body = b"(?:" + b"|".join(p for _, p in sorted(alts)) + b")"
    if wrap:
        body = BREAK + b"?" + body
    return (b"(?:" + body + b")?" if optional else body), -min(alts)[0] + wrap * BREAK_WIDTH


def _alternation(items: Iterable[bytes]) -> bytes:
    """``(?:a|b|...)`` in the given order (leftmost-first tries them in it), duplicates dropped."""
    return b"(?:" + b"|".join(dict.fromkeys(items)) + b")"


def _fold(byte: int) -> int:
    """An ASCII upper-case letter lower-cased, like ``bytes.lower``."""
    return byte | 0x20 if 0x41 <= byte <= 0x5A else byte


def _any_case_literal(data: bytes) -> bytes:
    """A regex for ``data`` with each ASCII letter in either case."""
    return b"".join(
        b"[" + bytes([c, c ^ 0x20]) + b"]" if bytes([c]).isalpha() else re.escape(bytes([c]))
        for c in data
    )


def _long_byte(b: int) -> bytes:
    """A long value's byte (``long_alts``): a letter in either case, a digit as written, any
    other ASCII byte also as ``%XX`` (either hex case), its JSON escapes (``\\/`` from PHP's
    ``json_encode``, ``\\uXXXX``) and, a space, ``+``."""
    one = bytes([b])
    if one.isalnum() or b >= 0x80:
        return _any_case_literal(one)
    alts = [re.escape(one), b"%" + _hex2(b), rb"\\u00" + _hex2(b)]
    short = _JSON_SHORT.get(b)
    if short is not None:
        alts.append(rb"\\" + re.escape(short))
    if one == b" ":
        alts.append(rb"\+")
    return b"(?:" + b"|".join(alts) + b")"


def long_alts(form: bytes) -> list[tuple[int, bytes]]:
    """A long value's literal ``form`` (``LONG_VALUE``) as (first byte, regex for the rest)
    alternatives: its letters in either case, each other ASCII byte literal or escaped
    (``_long_byte``) -- an AWS session token is ~800 base64 characters, echoed URL-encoded
    (``%2F %2B %3D``) or by PHP's ``json_encode`` (``\\/``).  No unit encoding of its letters
    and digits (no encoder escapes those unasked), nor hex or shifted base64: the pattern of a
    3 KiB key stays a few KiB.  A first byte that may be escaped gives one alternative per
    way of writing it."""
    rest = b"".join(_long_byte(b) for b in form[1:])
    first = form[0]
    if bytes([first]).isalnum() or first >= 0x80:
        return [(_fold(first), rest)]
    out = [(first, rest), (0x25, _hex2(first) + rest), (0x5C, b"u00" + _hex2(first) + rest)]
    short = _JSON_SHORT.get(first)
    if short is not None:
        out.append((0x5C, re.escape(short) + rest))
    if first == 0x20:
        out.append((0x2B, rest))
    return out


def long_width(form: bytes) -> int:
    """The widest match of ``long_alts(form)``: six bytes (``\\u00XX``) per escapable byte."""
    return sum(1 if bytes([b]).isalnum() or b >= 0x80 else 6 for b in form)


def long_needle(form: bytes) -> bytes:
    """The longest run of ``form``'s letters, digits and non-ASCII bytes: every match of
    ``long_alts(form)`` holds it as written (in either case), so it is the form's needle."""
    runs = re.split(rb"[\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f]", form)
    best = max(runs, key=len)
    return best or form


def _width(form: list[Slot]) -> int:
    return sum(
        max(w for c in chars for *_, w in _alts(c)) + (BREAK_WIDTH if wrap else 0)
        for chars, _, wrap in form
    )


def _minimal(forms: set[bytes]) -> tuple[bytes, ...]:
    """The forms that hold no other form: finding those finds every form."""
    return tuple(sorted(f for f in forms if not any(g != f and g in f for g in forms)))


Escape = tuple[bytes, re.Pattern[bytes]]
"""An escape pattern and the literal byte it starts with."""


def _escapes(
    needles: Iterable[bytes], wrapped: bool = False
) -> tuple[set[bytes], tuple[Escape, ...]]:
    """(extra needles, escape patterns) such that every match of a needle written with at least
    one escape holds a candidate.  Take the needle's first character written escaped: if it is
    the last one, everything before it is literal, so the needle less its last character is an
    extra needle; otherwise the escape is followed by the next character, written some way, and
    an escape pattern matches it there (with that follower as a lookahead, so a run of escapes
    reports each one).  Requiring the follower keeps a body full of escaped slashes (PHP's
    ``\\/``) from making every slash a candidate.  Escapes inside a non-ASCII character are
    candidates whatever follows them.  ``wrapped`` (the needles hold base64 forms, which
    ``BREAK`` may cut): an escaped break (JSON ``\\n``, ``\\r\\n``; ``%0A``, ``%0D%0A``)
    between two base64 characters, each written some way, is a candidate as well -- no
    needle crosses it.  (A raw break needs none: the scan drops raw breaks before it looks for
    the base64 needles and the escapes, ``joined`` -- which is also why an escape followed by
    the needle's own raw CR or LF takes no follower.)"""
    extra: set[bytes] = set()
    percent: dict[int, set[bytes]] = {}
    uescape: dict[int, set[bytes]] = {}
    short: dict[int, set[bytes]] = {}
    plus: set[bytes] = set()
    for needle in needles:
        chars = _chars(needle)
        if len(chars) > 1:
            extra.add(needle[: -len(chars[-1][0])])
        for i, char in enumerate(chars):
            raw, cp = char
            if len(raw) > 1 or raw in _UNRESERVED:
                follower = b""
            elif i + 1 < len(chars) and chars[i + 1][0] in (b"\r", b"\n"):
                # The scan looks for escapes in ``joined`` text, where a raw CR or LF that
                # follows is gone: any follower (only more candidates).
                follower = b""
            elif i + 1 < len(chars):
                # In either case (a superset for a short value: only more candidates).
                follower = _slot_regex(((chars[i + 1],), False, False), True)[0]
            elif i == 0:
                follower = b""
            else:
                continue  # the last character: covered by the extra needle
            # A letter in either case (a superset for a short value: only more candidates).
            for raw, cp in _either_case((char,)):
                for b in raw:
                    percent.setdefault(b, set()).add(follower)
                if raw == b" ":
                    plus.add(follower)
                if cp is not None:
                    if cp in _JSON_SHORT:
                        short.setdefault(_JSON_SHORT[cp][0], set()).add(follower)
                    unit = cp if cp < 0x10000 else _surrogates(cp)[0]
                    uescape.setdefault(unit, set()).add(follower)
    patterns = []
    if percent or wrapped:
        # ``%0A`` or ``%0D%0A``, among the codes' first digits (a literal: ``re`` passes it by
        # at a glance)
        brk = [b"0(?<=" + _B64_WRITTEN + b"%0)(?:[dD]%0[aA]|[aA])" + _B64_NEXT] if wrapped else []
        patterns.append((b"%", _digits({b"%02x" % b: f for b, f in percent.items()}, brk)))
    if uescape or short or wrapped:
        alts = [b"u" + _digits({b"%04x" % u: f for u, f in uescape.items()})] if uescape else []
        alts += [re.escape(bytes([c])) + _lookahead(f) for c, f in sorted(short.items())]
        if wrapped:
            # ``\\n`` or ``\\r\\n`` (each starting with a literal)
            alts.append(b"n(?<=" + _B64_WRITTEN + rb"\\n)" + _B64_NEXT)
            alts.append(b"r(?<=" + _B64_WRITTEN + rb"\\r)\\n" + _B64_NEXT)
        patterns.append((b"\\", _alternation(alts)))
    if plus:
        patterns.append((b"+", _lookahead(plus)))
    return extra, tuple((b, compile_secret(re.escape(b) + rest)) for b, rest in patterns)


def _lookahead(followers: set[bytes]) -> bytes:
    return b"" if b"" in followers else b"(?=" + _alternation(sorted(followers)) + b")"


def _digits(codes: dict[bytes, set[bytes]], more: Sequence[bytes] = ()) -> bytes:
    """A prefix tree over hex codes (either case), each leaf followed by its lookahead: a flat
    alternation of ``\\uXXXX`` codes made ``re`` try every one at every backslash."""
    heads: dict[int, dict[bytes, set[bytes]]] = {}
    for code, followers in codes.items():
        heads.setdefault(code[0], {})[code[1:]] = followers
    alts = []
    for head, rest in sorted(heads.items()):
        digit = _hex_digit(_HEX.index(head))
        if b"" in rest:
            alts.append(digit + _lookahead(rest[b""]))
        else:
            alts.append(digit + _digits(rest))
    return _alternation([*alts, *more])
