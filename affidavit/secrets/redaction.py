"""Redaction: every form of an injected secret the broker removes, as one compiled matcher.

Seed: "Exclude secrets, full authorization headers, private keys, and unfiltered remote bodies"
from the envelope, and "Do not put credential contents into either the error or the action
record".  A server that echoes the credential rarely echoes it byte for byte: it re-encodes a
query value with its own safe set, escapes it inside JSON, base64s a header, hex-dumps a body.
docs/redaction.md states the promise; this module keeps it.

One mechanism, two layers:

* **Whole-value forms** (``secret_forms``): the value itself, its base64 (standard and URL-safe,
  padded or not), the base64 *cores* of the value at the two other alignments inside a longer
  base64 blob (the characters that depend on the value's bytes alone), and its hex in lower and
  upper case; a value whose letters are all hex digits (a hex token, a UUID) also lower- and
  upper-cased itself (``_case_free``).  The binding lists the values: the secret and the
  whole injected value (``Bearer <token>``, ``user:password``, the password alone).
* **Case**: a value of ``MIN_ANY_CASE`` bytes or more is matched in every form with each ASCII
  letter written in either case (``BEARER SK_LIVE_...`` from a page that upper-cases the
  request line); a shorter one in each form's own case, where a folded match could be chance.
* **Unit encodings**: every whole-value form is matched with each of its characters written in any
  of the ways a server may write it -- literally; as ``%XX`` with either hex case (percent
  encoding with *any* safe set is then one pattern); ``+`` for a space (form encoding); or as a
  JSON string escape (``\\"``, ``\\\\``, ``\\/``, ``\\b\\f\\n\\r\\t``, ``\\uXXXX`` of any code
  point in either hex case, a surrogate pair beyond the BMP).  A non-ASCII character is its UTF-8
  bytes (each literal or ``%XX``) or its JSON escape.

Speed (tests/benchmarks/redaction.py): ``re`` scans any pattern that does not start with one
literal string at roughly 150 MB/s, ``bytes.find`` at several GB/s.  So the regex never scans a
whole body.  Every match of a form contains either a literal *needle* (a form written without
escapes) or an escape sequence of one of the needles' characters; ``bytes.find`` locates those
candidates, and the regex runs only in the windows around them, each as wide as the widest match
on either side.  Matches found that way are exactly those one ``re.sub`` over the whole input
would find (see ``_scan``), so a clean 50 MiB body costs a ``lower`` pass (case-changed needles
are found in the lower-cased input) and a few ``find`` passes.

A remote's short text (header fields, the reason phrase, a redirect's origin: ``scrub_text``)
and a redirect's Location (``holds``) are matched with ``pattern_any_case``: the same forms, ASCII
letters in either case however short the value (a URL parser lower-cases a host name).

A value longer than ``LONG_VALUE`` (a private key, a JWT) and each base64 line of a PEM value
are matched as written only, in their raw and whole-base64 forms: with unit encodings, hex and
shifted base64, a 3 KiB key would be megabytes of regex for forms nobody echoes a key in.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import threading
import urllib.parse
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "LONG_VALUE",
    "REDACTED",
    "Redactor",
    "clear_plans",
    "redactor",
    "release",
    "retain",
    "secret_forms",
]

REDACTED = b"[REDACTED]"
LONG_VALUE = 128
"""Values longer than this are matched as written, raw and whole base64 (module docstring):
compiling the pattern of a 128-byte value with every encoding takes a few hundred ms."""
MIN_CORE = 8
"""A shifted base64 core shorter than this would match unrelated base64 text."""
MIN_ANY_CASE = MIN_CORE
"""A value at least this long is matched in every form with its ASCII letters in either case,
bodies included: a case-changed echo of it (an error page that upper-cases the request line)
still carries nearly all its entropy, and even folded it is no plausible chance match.  A
shorter value is matched in bodies in each form's own case (short text: in any case)."""

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


def secret_forms(value: bytes) -> set[bytes]:
    """The whole-value forms of ``value`` as concrete byte strings; each is matched in every
    unit encoding (and the base64 alphabets and hex cases may mix: see ``_value_slots``)."""
    forms = _literal_forms(value)
    if value and len(value) <= LONG_VALUE:
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
Slot = tuple[tuple[Char, ...], bool]
"""One position of a form: the characters it may be (base64 alphabets, hex cases), optional?"""


def _chars(data: bytes) -> list[Char]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return [(bytes([b]), b if b < 0x80 else None) for b in data]
    return [(ch.encode("utf-8"), ord(ch)) for ch in text]


def _merge(variants: Sequence[bytes], optional_from: int | None = None) -> list[Slot]:
    """Equal-length variants of one form as slots of alternative characters; every position
    from ``optional_from`` on optional (``optional_from`` is only given for base64, where it
    makes the padding optional as well)."""
    cols = zip(*(_chars(v) for v in variants), strict=True)
    slots: list[Slot] = []
    for i, col in enumerate(cols):
        chars = tuple(dict.fromkeys(col))
        optional = optional_from is not None and (i >= optional_from or chars == ((b"=", 0x3D),))
        slots.append((chars, optional))
    return slots


def _value_slots(value: bytes) -> list[list[Slot]]:
    """``secret_forms(value)`` as few patterns: the base64 alphabets merged position by position
    (one pattern, padding and the last, neighbour-dependent character optional), the hex cases
    merged likewise.  Fewer, shorter patterns compile faster; each concrete form still matches."""
    case_free = len(value) <= LONG_VALUE and _case_free(value)
    forms = [_merge([value, value.lower(), value.upper()] if case_free else [value])]
    plain = [enc(value) for enc in _B64]
    core0 = len(_cores(value, 0)[0])
    forms.append(_merge(plain, optional_from=core0 if core0 >= MIN_CORE else len(plain[0])))
    if len(value) <= LONG_VALUE:
        for shift in (1, 2):
            cores = _cores(value, shift)
            if len(cores[0]) >= MIN_CORE:
                forms.append(_merge(cores))
        hexed = value.hex().encode("ascii")
        forms.append(_merge([hexed, hexed.upper()]))
    return forms


Alt = tuple[int, bytes, int]
"""One way to write a character: (its literal first byte, regex for the rest, width)."""


def _hex_digit(d: int) -> bytes:
    c = _HEX[d]
    return bytes([c]) if c < 0x61 else b"[" + bytes([c, c - 32]) + b"]"


def _hex2(b: int) -> bytes:
    return _hex_digit(b >> 4) + _hex_digit(b & 15)


def _hex4(n: int) -> bytes:
    return _hex2(n >> 8) + _hex2(n & 0xFF)


def _surrogates(cp: int) -> tuple[int, int]:
    return 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF)


def _alts(char: Char) -> list[Alt]:
    raw, cp = char
    tail = b"".join(b"(?:" + re.escape(bytes([b])) + b"|%" + _hex2(b) + b")" for b in raw[1:])
    tail_w = 3 * (len(raw) - 1)
    alts: list[Alt] = [(raw[0], tail, 1 + tail_w), (0x25, _hex2(raw[0]) + tail, 3 + tail_w)]
    if raw == b" ":
        alts.append((0x2B, b"", 1))  # application/x-www-form-urlencoded
    if cp is not None:
        short = _JSON_SHORT.get(cp)
        if short is not None:
            alts.append((0x5C, re.escape(short), 2))
        if cp < 0x10000:
            alts.append((0x5C, b"u" + _hex4(cp), 6))
        else:
            hi, lo = _surrogates(cp)
            alts.append((0x5C, b"u" + _hex4(hi) + rb"\\u" + _hex4(lo), 12))
    return alts


def _slot_regex(slot: Slot, any_case: bool) -> tuple[bytes, int]:
    """The slot's regex (each letter written literally in either case if ``any_case``: its
    escapes stay those of its own case), and its widest match."""
    chars, optional = slot
    alts = {(-w, re.escape(bytes([f])) + rest) for c in chars for f, rest, w in _alts(c)}
    if any_case:
        alts |= {(-1, bytes([c[0][0] ^ 0x20])) for c in chars if c[0].isalpha()}
    body = b"(?:" + b"|".join(p for _, p in sorted(alts)) + (b")?" if optional else b")")
    return body, -min(alts)[0]


def _alternation(items: Iterable[bytes]) -> bytes:
    """``(?:a|b|...)`` in the given order (leftmost-first tries them in it), duplicates dropped."""
    return b"(?:" + b"|".join(dict.fromkeys(items)) + b")"


class _Plan:
    """What a ``Redactor`` needs for one set of values (built once per set, cached)."""

    def __init__(self, values: tuple[bytes, ...]) -> None:
        self.values = values
        """The sorted values (``_plan``'s key)."""
        # A long value (a private key) and the body lines of a PEM value are matched as written,
        # in their raw and whole-base64 forms: their patterns with unit encodings would take
        # seconds to compile, for encodings nobody echoes a key in.
        literal = {v for v in values if len(v) > LONG_VALUE}
        for v in values:
            literal |= _pem_lines(v)
        forms: set[bytes] = set()
        groups: dict[int, dict[bytes, int]] = {}
        widest = 0
        for v in sorted(literal):  # longer than MIN_ANY_CASE: matched in any case
            for form in _literal_forms(v):
                branch = groups.setdefault(_fold(form[0]), {})
                branch[_any_case_literal(form[1:])] = len(form)
                forms.add(form)
                widest = max(widest, len(form))
        encoded = sorted(set(values) - literal)
        encoded_forms = set().union(*map(secret_forms, encoded))
        forms |= encoded_forms
        self._literal_groups = groups
        self._encoded = [(slots, _any_case(v)) for v in encoded for slots in _value_slots(v)]
        self._exact = not all(map(_any_case, encoded))
        """Whether a value is short enough for bodies to match it in its forms' case only."""
        self._pattern: re.Pattern[bytes] | None = None
        self._pattern_any_case: re.Pattern[bytes] | None = None
        self.widest = max([widest, *(_width(slots) for slots, _ in self._encoded)])
        """The widest match: a window this wide on each side of a candidate holds every match."""
        needles, escapes = _escapes(_minimal(encoded_forms))
        self.needles = _minimal(forms | needles)
        """Byte strings to ``find``: every concrete form, written without escapes, holds one."""
        self.needles_lower = _minimal({n.lower() for n in self.needles})
        """``needles`` lower-cased: a match of ``pattern`` or ``pattern_any_case`` written
        without escapes holds one once lower-cased (``_candidates``, ``may_hold_any_case``)."""
        self.escapes = escapes
        """(escape byte, pattern) per escape character: the escapes that may start a match's
        escaped part (each pattern starts with its byte; see ``_escape_hits``)."""
        self.owners: dict[Owner, str] = {}
        """Owner -> version, of the credentials this plan's values are (``retain``): a plan
        whose every owner rotated is dropped from the cache."""
        self.clean: set[str] = set()
        """Short strings already scrubbed that hold no form of the values
        (``Redactor.scrub_text``): every call scrubs the same header names and values, reason
        phrases and fact keys, and a scan costs ~4 us each where a lookup costs ~0.1 (issue
        15's profile: a tenth of the event loop).  Only clean strings are kept -- one holding a
        value is scanned again, never kept alive here.  Bounded: ``_MEMO_TEXTS`` strings of at
        most ``_MEMO_CHARS``."""

    @property
    def pattern(self) -> re.Pattern[bytes]:
        """Every form; a value of ``MIN_ANY_CASE`` bytes or more with each literal letter in
        either case (a class: ``re.IGNORECASE`` would slow the windows' scan down, and merging
        both cases into the slots would triple the compile time).  Built on first use: most
        bodies hold no candidate, and compiling the pattern of a credential costs more than
        scanning megabytes."""
        if self._pattern is None:
            self._pattern = re.compile(self._source())
        return self._pattern

    def may_hold_any_case(self, raw: bytes) -> bool:
        """False only if ``pattern_any_case`` cannot match ``raw``: a match holds an escape
        (``%``, ``\\`` or ``+``) or, lower-cased, a lower-cased needle.  Most header text holds
        neither, and then the pattern is neither run nor compiled."""
        if b"%" in raw or b"\\" in raw or b"+" in raw:
            return True
        low = raw.lower()
        return any(n in low for n in self.needles_lower)

    @property
    def pattern_any_case(self) -> re.Pattern[bytes]:
        """``pattern`` with ASCII letters matched in either case, a short value's too: for a
        remote's short text (header names and values, the reason phrase, a redirect's origin),
        where a server or a URL parser may have changed the case of an echoed form -- a host
        name is lower-cased by every parser.  ``pattern`` itself when no value is short."""
        if self._pattern_any_case is None:
            if self._exact:
                self._pattern_any_case = re.compile(self._source(), re.IGNORECASE)
            else:
                self._pattern_any_case = self.pattern
        return self._pattern_any_case

    def _source(self) -> bytes:
        groups = {first: dict(alts) for first, alts in self._literal_groups.items()}
        for form, any_case in self._encoded:
            rest = [_slot_regex(s, any_case) for s in form[1:]]
            rest_re = b"".join(r for r, _ in rest)
            rest_w = sum(w for _, w in rest)
            chars, optional = form[0]
            assert not optional
            for f, frag, w in (a for c in chars for a in _alts(c)):
                # The branch of a letter takes either case; a short value's exact first letter
                # is checked behind it.
                exact = not any_case and bytes([f]).isalpha()
                alt = (b"(?<=" + bytes([f]) + b")" if exact else b"") + frag + rest_re
                branch = groups.setdefault(_fold(f), {})
                branch[alt] = max(branch.get(alt, 0), w + rest_w)
        # One top-level branch per first byte (a letter in either case), each starting with that
        # byte; within a branch the widest alternatives first, so leftmost-first picks the
        # longest form.
        parts = []
        for first in sorted(groups):
            alts = sorted(groups[first].items(), key=lambda kv: (-kv[1], kv[0]))
            parts.append(_any_case_literal(bytes([first])) + _alternation(a for a, _ in alts))
        return b"|".join(parts)


def _fold(byte: int) -> int:
    """An ASCII upper-case letter lower-cased, like ``bytes.lower``."""
    return byte | 0x20 if 0x41 <= byte <= 0x5A else byte


def _any_case_literal(data: bytes) -> bytes:
    """A regex for ``data`` with each ASCII letter in either case."""
    return b"".join(
        b"[" + bytes([c, c ^ 0x20]) + b"]" if bytes([c]).isalpha() else re.escape(bytes([c]))
        for c in data
    )


def _width(form: list[Slot]) -> int:
    return sum(max(w for c in chars for *_, w in _alts(c)) for chars, _ in form)


def _minimal(forms: set[bytes]) -> tuple[bytes, ...]:
    """The forms that hold no other form: finding those finds every form."""
    return tuple(sorted(f for f in forms if not any(g != f and g in f for g in forms)))


Escape = tuple[bytes, re.Pattern[bytes]]
"""An escape pattern and the literal byte it starts with."""


def _escapes(needles: Iterable[bytes]) -> tuple[set[bytes], tuple[Escape, ...]]:
    """(extra needles, escape patterns) such that every match of a needle written with at least
    one escape holds a candidate.  Take the needle's first character written escaped: if it is
    the last one, everything before it is literal, so the needle less its last character is an
    extra needle; otherwise the escape is followed by the next character, written some way, and
    an escape pattern matches it there (with that follower as a lookahead, so a run of escapes
    reports each one).  Requiring the follower keeps a body full of escaped slashes (PHP's
    ``\\/``) from making every slash a candidate.  Escapes inside a non-ASCII character are
    candidates whatever follows them."""
    extra: set[bytes] = set()
    percent: dict[int, set[bytes]] = {}
    uescape: dict[int, set[bytes]] = {}
    short: dict[int, set[bytes]] = {}
    plus: set[bytes] = set()
    for needle in needles:
        chars = _chars(needle)
        if len(chars) > 1:
            extra.add(needle[: -len(chars[-1][0])])
        for i, (raw, cp) in enumerate(chars):
            if len(raw) > 1 or raw in _UNRESERVED:
                follower = b""
            elif i + 1 < len(chars):
                # In either case (a superset for a short value: only more candidates).
                follower = _slot_regex(((chars[i + 1],), False), True)[0]
            elif i == 0:
                follower = b""
            else:
                continue  # the last character: covered by the extra needle
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
    if percent:
        patterns.append((b"%", _digits({b"%02x" % b: f for b, f in percent.items()})))
    if uescape or short:
        alts = [b"u" + _digits({b"%04x" % u: f for u, f in uescape.items()})] if uescape else []
        alts += [re.escape(bytes([c])) + _lookahead(f) for c, f in sorted(short.items())]
        patterns.append((b"\\", _alternation(alts)))
    if plus:
        patterns.append((b"+", _lookahead(plus)))
    return extra, tuple((b, re.compile(re.escape(b) + rest)) for b, rest in patterns)


def _lookahead(followers: set[bytes]) -> bytes:
    return b"" if b"" in followers else b"(?=" + _alternation(sorted(followers)) + b")"


def _digits(codes: dict[bytes, set[bytes]]) -> bytes:
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
    return _alternation(alts)


_LEAVES = frozenset({int, float, bool, type(None)})
"""Types ``scrub`` returns as they are, without a call (exact types: no string subclass)."""

_MEMO_TEXTS = 4096
_MEMO_CHARS = 256


_PLANS = 64
"""Plans the cache keeps (least recently used first out)."""
_plans: OrderedDict[tuple[bytes, ...], _Plan] = OrderedDict()
"""The plan cache: each plan under its sorted key and under each tuple it was asked for as
given (``_plan_for``).  Its keys and plans hold credential values, so a rotated credential's
entries are dropped as soon as its new version is used (``retain``), not left to age out."""
Owner = tuple[object, str]
"""Who a plan's values are the credential of: (a scope -- the engine's id --, the reference)."""
_versions: dict[Owner, str] = {}
"""The version each owner's credential was last used at (``retain``): non-secret."""
_retired: dict[bytes, None] = {}
"""Keyed digests (``_digest``) of the sorted values of plans a rotation dropped, oldest first
(at most ``_PLANS``): a call still under way with the old value may ask for its plan again (a
result stream starting late), and gets one that is not put back into the cache."""
_DIGEST_KEY = os.urandom(32)
_lock = threading.Lock()


def _digest(values: tuple[bytes, ...]) -> bytes:
    """A per-process keyed digest of sorted ``values``: names them without holding them."""
    mac = hmac.new(_DIGEST_KEY, digestmod=hashlib.sha256)
    for v in values:
        mac.update(len(v).to_bytes(8, "big") + v)
    return mac.digest()


def _plan(values: tuple[bytes, ...]) -> _Plan | None:
    """The cached plan of sorted, non-empty ``values``: the engine builds a redactor per result
    stream, and the same credential's plan is the same plan."""
    if not values:
        return None
    with _lock:
        plan = _plans.get(values)
        if plan is not None:
            _plans.move_to_end(values)
            return plan
    plan = _Plan(values)  # outside the lock: only the pattern is costly, and it is lazy
    if _retired and _digest(values) in _retired:
        return plan  # a rotated credential's old value: for its caller only, never cached
    with _lock:
        plan = _plans.setdefault(values, plan)
        _plans.move_to_end(values)
        _trim()
    return plan


def _trim() -> None:
    keys = {id(p) for p in _plans.values()}
    while len(keys) > _PLANS:
        _, old = _plans.popitem(last=False)
        if old not in _plans.values():
            keys.discard(id(old))


def _plan_for(secrets: Iterable[bytes]) -> _Plan | None:
    """``_plan`` of the non-empty values, sorted: for a tuple, looked up by the tuple as given
    -- a call makes three redactors of its credential's one tuple (the sink, each stream, the
    redirect check), and sorting it into ``_plan``'s key each time cost more than the lookup
    (issue 15).  Anything else (or a tuple that cannot be a key) takes the sorted key."""
    if type(secrets) is tuple:
        try:
            with _lock:
                plan = _plans.get(secrets)
                if plan is not None:
                    _plans.move_to_end(secrets)
                    return plan
        except TypeError:
            pass
        else:
            plan = _plan(tuple(sorted({s for s in secrets if s})))
            if plan is not None:
                with _lock:
                    if plan in _plans.values():  # not dropped by a rotation meanwhile
                        _plans[secrets] = plan
                        _trim()
            return plan
    return _plan(tuple(sorted({s for s in secrets if s})))


def retain(owner: Owner, version: str, values: Iterable[bytes]) -> None:
    """Note that ``owner``'s credential is now at ``version`` and injects ``values``.  If it was
    last noted at another version (the credential rotated), every cached plan of its old values
    is dropped: the old secret is then held only by the redactors of calls still using it, and
    no longer than they live.  A plan another owner still uses (the same value under another
    reference) stays, and so does one of ``values`` (a version that moved, a value that did
    not: a touched file).  Versions are non-secret (``Credential.version``); the engine calls
    this once per resolved credential, its id as the scope (an ``env:`` version is keyed per
    journal: two engines in one process must not see each other's as a rotation)."""
    key = tuple(sorted({v for v in values if v}))
    with _lock:
        previous = _versions.get(owner)
        _versions[owner] = version
        if previous is not None and previous != version:
            for plan in {id(p): p for p in _plans.values()}.values():
                if plan.values == key or plan.owners.pop(owner, None) is None or plan.owners:
                    continue
                _drop(plan)
                _retired[_digest(plan.values)] = None
            while len(_retired) > _PLANS:
                del _retired[next(iter(_retired))]
        if len(_versions) > 4 * _PLANS:
            owning = {o for p in _plans.values() for o in p.owners}
            for o in [o for o in _versions if o not in owning and o != owner]:
                del _versions[o]
        if _retired and key:
            # Rotated back to a value dropped before: its plan is cached again from here on.
            _retired.pop(_digest(key), None)
    current = _plan(key)
    if current is not None:
        with _lock:
            current.owners[owner] = version


def release(scope: object) -> None:
    """Forget ``scope``'s credentials (an engine closing: its config is done with): a plan no
    other scope's credential uses is dropped, its values no longer held by the cache."""
    with _lock:
        for plan in {id(p): p for p in _plans.values()}.values():
            mine = [o for o in plan.owners if o[0] == scope]
            for o in mine:
                del plan.owners[o]
            if mine and not plan.owners:
                _drop(plan)
        for o in [o for o in _versions if o[0] == scope]:
            del _versions[o]


def _drop(plan: _Plan) -> None:
    for key in [k for k, p in _plans.items() if p is plan]:
        del _plans[key]


def clear_plans() -> None:
    """Drop every cached plan (the benchmark times a new credential's)."""
    with _lock:
        _plans.clear()
        _versions.clear()
        _retired.clear()


def _candidates(plan: _Plan, buf: bytes, limit: int) -> list[int] | None:
    """Positions every match holds one of: a lower-cased needle's start in the lower-cased
    input, or an escape of a needle's character.  (A match written without escapes is a
    concrete form, its letters' case maybe changed, and every concrete form contains a needle;
    a match with an escape holds the needle's span, and an escape of one of its characters,
    followed by the next in either case, in it.)  None once there are more than ``limit``:
    their windows would cover the buffer anyway.  Lower-casing costs a pass at about 1 GB/s
    and keeps every position."""
    out: list[int] = []
    find = buf.lower().find
    for needle in plan.needles_lower:
        i = find(needle)
        while i >= 0:
            out.append(i)
            if len(out) > limit:
                return None
            i = find(needle, i + 1)
    for first, escape in plan.escapes:
        if not _escape_hits(buf, first, escape, out, limit):
            return None
    out.sort()
    return out


_FIND_EACH = 4
"""Escape bytes located one ``find`` at a time before one regex scan takes over the rest."""


def _escape_hits(
    buf: bytes, first: bytes, escape: re.Pattern[bytes], out: list[int], limit: int
) -> bool:
    """Append the start of every ``escape.finditer(buf)`` match to ``out`` (False once it holds
    more than ``limit``).  ``re`` scans for even a literal first byte at ~1 ms per MiB here,
    ``find`` at ~0.04 (issue 15: two such scans were most of a clean 50 MiB body's
    redaction), so the escape byte is found first and the pattern tried only there -- the
    same matches, as a match can start nowhere else and the next one is looked for from the
    end of the last, as ``finditer`` does.  Past ``_FIND_EACH`` escape bytes (a body dense with
    them) one ``finditer`` scans the rest."""
    find, match = buf.find, escape.match
    pos = tries = 0
    while (i := find(first, pos)) >= 0:
        tries += 1
        if tries > _FIND_EACH:
            for found in escape.finditer(buf, i):  # nothing can match in [pos, i)
                out.append(found.start())
                if len(out) > limit:
                    return False
            return True
        m = match(buf, i)
        if m is None:
            pos = i + 1
            continue
        out.append(i)
        if len(out) > limit:
            return False
        pos = m.end()
    return True


def _scan(
    plan: _Plan, buf: bytes, decided: int, view: bytes | memoryview | None = None
) -> tuple[list[bytes | memoryview], int]:
    """Redact ``buf`` up to ``decided`` (matches starting before it): (output pieces, where the
    undecided rest starts).  Bytes from ``decided`` on may be the start of a match that needs
    more input, unless ``decided == len(buf)``.  The pieces kept are slices of ``view`` (by
    default ``buf`` itself): given ``memoryview(buf)``, views rather than copies, so that whoever
    joins or appends them copies each byte once (issue 15: a clean 50 MiB body was copied twice
    here).

    Why this equals ``pattern.sub`` over the whole input: every match starting at ``p`` has a
    candidate in ``[p, p + widest)``, so windows ``[c - widest + 1, c + widest]`` around the
    candidates (merged when they overlap) hold every match start, and a match starting at or
    before a window's last candidate lies wholly inside the window (it is at most ``widest``
    long).  Within a window ``finditer`` scans exactly as a whole-input scan would; a match it
    finds beyond the last candidate may be cut by the window's end, so it is left to a later
    window, which also holds its start."""
    widest = plan.widest
    cands = _candidates(plan, buf, len(buf) // (2 * widest) + 8)
    windows = [(0, len(buf), len(buf))] if cands is None else _windows(cands, widest, len(buf))
    if view is None:
        view = buf
    out: list[bytes | memoryview] = []
    pos = 0
    for start, last, end in windows:
        if last < pos:
            continue
        for m in plan.pattern.finditer(buf, max(pos, start), end):
            if m.start() > last or m.start() >= decided:
                break
            out.append(view[pos : m.start()])
            out.append(REDACTED)
            pos = m.end()
    if decided > pos:
        out.append(view[pos:decided])
        pos = decided
    return out, pos


def _windows(cands: list[int], widest: int, size: int) -> list[tuple[int, int, int]]:
    """(start, last candidate, end) of the merged windows around sorted ``cands``."""
    out: list[tuple[int, int, int]] = []
    for c in cands:
        if out and c - widest + 1 <= out[-1][1] + widest:
            out[-1] = (out[-1][0], c, min(size, c + widest))
        else:
            out.append((max(0, c - widest + 1), c, min(size, c + widest)))
    return out


class Redactor:
    """Streaming replacement of every form of the secret values with ``[REDACTED]``.

    ``feed``/``flush`` stream bytes (the result sink); ``sub`` does one whole byte string;
    ``scrub`` walks a JSON-able value (header names and values, the reason phrase, facts) and
    redacts inside every string and mapping key.  Output is the same however the input is
    chunked: a position is decided only once the widest match could fit after it."""

    def __init__(self, secrets: Iterable[bytes]) -> None:
        self._plan = _plan_for(secrets)
        self._buf = b""
        self.changed = False
        """True once ``feed``/``flush`` replaced anything: until then their output is their
        input, only held back by ``pending``."""

    def fresh(self) -> Redactor:
        """A new redactor (no input held) of the same values, sharing this one's plan: a
        stream that starts late in a call redacts with the plan its call began with, never
        one rebuilt into the cache after its credential rotated."""
        other = Redactor(())
        other._plan = self._plan
        return other

    @property
    def pending(self) -> bytes:
        """The input ``feed`` holds back (a match may still start there): unless ``changed``,
        the output so far plus these bytes is exactly the input so far."""
        return self._buf

    @property
    def active(self) -> bool:
        """False when there is nothing to redact (every method is then the identity)."""
        return self._plan is not None

    def feed(self, data: bytes) -> bytes:
        plan = self._plan
        if plan is None:
            return data
        return b"".join(self.feed_pieces(data))

    def feed_pieces(self, data: bytes) -> list[bytes | memoryview]:
        """``feed``'s output as pieces, without joining them: what the result sink copies
        into stored chunks, each byte once."""
        plan = self._plan
        if plan is None:
            return [data]
        buf = self._buf + data if self._buf else bytes(data)
        out, pos = _scan(plan, buf, max(0, len(buf) - plan.widest + 1), memoryview(buf))
        self._buf = buf[pos:]
        self._note(out)
        return out

    def _note(self, out: list[bytes | memoryview]) -> None:
        if not self.changed and any(piece is REDACTED for piece in out):
            self.changed = True

    def flush(self) -> bytes:
        plan = self._plan
        if plan is None:
            return b""
        buf, self._buf = self._buf, b""
        out = _scan(plan, buf, len(buf))[0]
        self._note(out)
        return b"".join(out)

    def sub(self, data: bytes) -> bytes:
        """``data`` with every form replaced (not streaming; ``feed``'s state is untouched)."""
        plan = self._plan
        return data if plan is None else b"".join(_scan(plan, data, len(data))[0])

    def scrub_text(self, text: str) -> str:
        """``text`` with every form replaced, its letters in either case (``pattern_any_case``:
        this is a remote's short text, never a body); replaced whole when a form shows only
        after percent-decoding it up to three times (``holds``).  Text is matched as the bytes
        it was received as: latin-1 when it fits (header fields arrive as bytes decoded
        latin-1), else UTF-8."""
        plan = self._plan
        if plan is None:
            return text
        clean = plan.clean
        if text in clean:
            return text
        raw, codec = _text_bytes(text)
        out = plan.pattern_any_case.sub(REDACTED, raw) if plan.may_hold_any_case(raw) else raw
        if b"%" in out and self.holds(out.decode(codec, "surrogatepass")):
            # A form only percent-decoding shows (a URL quoted inside a quoted parameter: a
            # token's "/" as %252F): no span of the text is the form, so the text goes whole.
            out = REDACTED
        if out != raw:
            return out.decode(codec, "surrogatepass")
        if len(text) <= _MEMO_CHARS:
            if len(clean) >= _MEMO_TEXTS:
                clean.clear()  # a bound, not an LRU: the same few strings come back each call
            clean.add(text)
        return text

    def holds(self, text: str) -> bool:
        """Whether ``text`` (a URL a remote wrote) holds any form of the values, letters in
        either case, as written or after up to three rounds of percent-decoding (with ``+``
        read as ``+`` and as a space): a Location quoting the request URL inside a query
        parameter, maybe twice.  The redirect check (adapters/http/redirects.py): a Location
        that holds one is a credential echo and is not followed."""
        plan = self._plan
        if plan is None:
            return False
        seen: set[str] = set()
        round_ = {text}
        for _ in range(4):
            round_ -= seen
            if not round_:
                return False
            for t in round_:
                raw = _text_bytes(t)[0]
                if plan.may_hold_any_case(raw) and plan.pattern_any_case.search(raw):
                    return True
            seen |= round_
            unquote = (urllib.parse.unquote, urllib.parse.unquote_plus)
            round_ = {f(t) for t in round_ for f in unquote}
        return False

    def scrub(self, value: Any) -> Any:
        """A JSON-able ``value`` with every string (mapping keys included) scrubbed."""
        plan = self._plan
        if plan is None:
            return value
        return self._walk(value, plan.clean)

    def _walk(self, value: Any, clean: set[str]) -> Any:
        # A call scrubs a few hundred values, most of them remembered clean strings and
        # numbers: those are answered inline, without a call each (issue 15).  Anything but
        # the exact built-in types takes the general path below.
        kind = type(value)
        if kind is str:
            return value if value in clean else self.scrub_text(value)
        if kind is dict:
            out = {}
            for k, v in value.items():
                if type(k) is not str or k not in clean:
                    k = self._walk(k, clean)
                kv = type(v)
                if kv not in _LEAVES and (kv is not str or v not in clean):
                    v = self._walk(v, clean)
                out[k] = v
            return out
        if kind is list or kind is tuple:
            return [
                v
                if (kv := type(v)) in _LEAVES or (kv is str and v in clean)
                else self._walk(v, clean)
                for v in value
            ]
        if kind in _LEAVES:
            return value
        if isinstance(value, str):
            return self.scrub_text(value)
        if isinstance(value, dict):
            return {self._walk(k, clean): self._walk(v, clean) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._walk(v, clean) for v in value]
        return value


def _text_bytes(text: str) -> tuple[bytes, str]:
    """(bytes, codec) of ``text`` as received: latin-1 when it fits, else UTF-8."""
    try:
        return text.encode("latin-1"), "latin-1"
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass"), "utf-8"


def redactor(secret_values: Iterable[bytes]) -> Redactor:
    return Redactor(secret_values)
