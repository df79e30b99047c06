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
  upper-cased itself (``_case_free``).  The base64 forms and cores also with a line break
  between any two characters (``BREAK``): a blob wrapped at any width, one break
  between two characters.  The binding
  lists the values: the secret and the whole injected value (``Bearer <token>``,
  ``user:password``, the password alone).
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
would find (see ``_scan``; a wrapped base64 form's needle is looked for with the raw line
breaks dropped, ``joined``, and an escaped break between base64 characters is an escape
candidate), so a clean 50 MiB body costs a ``lower`` pass (case-changed needles are found in
the lower-cased input), a copy without raw line breaks where there are any, and a few
``find`` passes -- or, in a read without any of the needles' rare bytes nor an escape byte,
only a few ``memchr`` runs (``_anchor_hits``: anchors).

A remote's short text (header fields, the reason phrase, a redirect's origin: ``scrub_text``)
and a redirect's Location (``holds``) are matched with ``pattern_any_case``: the same forms, ASCII
letters in either case however short the value (a URL parser lower-cases a host name).

A value longer than ``LONG_VALUE`` (a private key, a JWT) and each base64 line of a PEM value
are matched as written only, in their raw and whole-base64 forms (letters in either case): with
unit encodings, hex and shifted base64, a 3 KiB key would be megabytes of regex for forms
nobody echoes a key in.

The modules: ``redaction_forms`` (the forms and their regex), ``redaction_plan`` (a set of
values' needles and patterns, and the plan cache), ``redaction_scan`` (the windowed scan);
this one is the ``Redactor`` that streams, substitutes and scrubs with them.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable
from typing import Any

from .redaction_forms import LONG_VALUE, MIN_ANY_CASE, secret_forms
from .redaction_plan import _plan as _plan
from .redaction_plan import _plan_for as _plan_for
from .redaction_plan import _plans as _plans
from .redaction_plan import clear_plans, release, retain
from .redaction_scan import REDACTED, _scan
from .redaction_scan import _escape_hits as _escape_hits

__all__ = [
    "CUT_FORM",
    "CUT_FORM_MIN",
    "LEAVES",
    "LONG_VALUE",
    "MIN_ANY_CASE",
    "REDACTED",
    "Redactor",
    "clear_plans",
    "cut_floor",
    "redactor",
    "release",
    "retain",
    "secret_forms",
]

_LEAVES = frozenset({int, float, bool, type(None)})
"""Types ``scrub`` returns as they are, without a call (exact types: no string subclass)."""
LEAVES = _LEAVES
"""``_LEAVES`` for a caller that skips the ``scrub`` call itself for such a value: a number,
bool or None is returned as it is (the engine's gate and result facts, issue 15)."""
_new = object.__new__

_MEMO_TEXTS = 4096
_MEMO_CHARS = 256


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
        self.echoed = False
        """True once they replaced a whole form: the stream echoed a secret; or once
        ``scrub_text`` did (or replaced a text whole: ``holds``) -- a remote's short text
        echoed one (the sink's ``head_echoed``).  An end replaced alone is not an echo."""
        self.tail_redacted = False
        """True once ``flush`` replaced the stream's end as the beginning of a form
        (``cut_floor``): a secret's first bytes, or ordinary text that ends like them."""

    def fresh(self) -> Redactor:
        """A new redactor (no input held) of the same values, sharing this one's plan: a
        stream that starts late in a call redacts with the plan its call began with, never
        one rebuilt into the cache after its credential rotated.  Made without ``__init__``:
        its plan lookup (the cache's lock, for the empty tuple) was thrown away at once, once
        per stream of every call (issue 15)."""
        other: Redactor = _new(Redactor)
        other._plan = self._plan
        other._buf = b""
        other.changed = other.echoed = other.tail_redacted = False
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
        if not self.echoed and any(piece is REDACTED for piece in out):
            self.changed = self.echoed = True

    def flush(self) -> bytes:
        plan = self._plan
        if plan is None:
            return b""
        buf, self._buf = self._buf, b""
        out = b"".join(_scan(plan, buf, len(buf))[0])
        if out != buf:
            self.changed = self.echoed = True
        cut = _form_begun(plan, out)
        if cut < len(out):
            self.changed = self.tail_redacted = True
            return out[:cut] + REDACTED
        return out

    def ending(self) -> tuple[bool, bool]:
        """(``echoed``, ``tail_redacted``) as they would be after ``flush``, which is not
        done: what an answer cut now, its held-back bytes never flushed, would have had
        replaced."""
        plan, buf = self._plan, self._buf
        if plan is None or not buf:
            return self.echoed, self.tail_redacted
        out = b"".join(_scan(plan, buf, len(buf))[0])
        return self.echoed or out != buf, self.tail_redacted or _form_begun(plan, out) < len(out)

    def sub(self, data: bytes) -> bytes:
        """``data`` with every form replaced (not streaming; ``feed``'s state is untouched)."""
        plan = self._plan
        return data if plan is None else b"".join(_scan(plan, data, len(data))[0])

    def scrub_text(self, text: str) -> str:
        """``text`` with every form replaced, its letters in either case (``pattern_any_case``:
        this is a remote's short text, never a body), and its end where it is a form's
        beginning (``cut_floor`` secret-derived bytes or more, as at a stream's end: a header
        value, a reason phrase cut inside an echo); replaced whole when a form shows only
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
        if out != raw:
            self.echoed = True  # a whole form: an echo (the sink's ``head_echoed``)
        cut = _form_begun(plan, out, True)
        if cut < len(out):
            # A value cut inside an echo (a header that shows the first 20 bytes of the
            # request's Authorization): its end goes as a stream's does (``flush``).
            out = out[:cut] + REDACTED
        if b"%" in out and _decoded_hold(plan, {out}):
            # A form only percent-decoding shows (a URL quoted inside a quoted parameter: a
            # token's "/" as %252F): no span of the text is the form, so the text goes whole.
            out = REDACTED
            self.echoed = True
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
        return self.holds_any((text,))

    def holds_any(self, texts: Iterable[str]) -> bool:
        """Whether any of ``texts`` (a response head's lines) ``holds`` a form: the answer of
        asking each alone.  Each is taken as the bytes it was received as, alone
        (``_text_bytes``: one line's character past U+00FF changes no other line's bytes), and
        decoded as bytes (``%C3%A4`` is those two bytes, whatever the rest of the text); one
        search a round over them all, joined by NUL, which no form spans.  A text once found
        holding none (``_Plan.unheld``: the answer depends on the plan and the text alone) is
        not searched again: a response's head lines are mostly the same each call (issue 15)."""
        plan = self._plan
        if plan is None:
            return False
        unheld = plan.unheld
        fresh = [t for t in texts if t not in unheld]
        if not fresh:
            return False
        if _decoded_hold(plan, {_text_bytes(t)[0] for t in fresh}):
            return True
        # None of them holds a form: each alone holds none (the NUL-joined search is the
        # answer of asking each alone).
        if len(unheld) >= _MEMO_TEXTS:
            unheld.clear()  # a bound, not an LRU, as ``clean``
        unheld.update(t for t in fresh if type(t) is str and len(t) <= _MEMO_CHARS)
        return False

    def scrub(self, value: Any) -> Any:
        """A JSON-able ``value`` with every string (mapping keys included) scrubbed.  A number,
        bool or None holds no text, so no secret: returned as is, without the walk (half the
        facts a call scrubs are such: a hop, a status, ``reused_connection``; issue 15)."""
        plan = self._plan
        if plan is None or type(value) in _LEAVES:
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


CUT_FORM = 8
"""A stream that ends with this many or more secret-derived bytes of a form's beginning ends
with them redacted (``flush``): an answer that ends inside an echo -- closed mid-echo, or
nothing but the echo's first bytes -- would otherwise hand out the credential's first bytes,
and, cut at other places, the rest.  Only the very end: an echo cut short and then followed by
other bytes (a closing quote, a newline, a preview's ``...``) is not redacted
(docs/security.md, "What this does not protect").
Eight, not fewer, because an ordinary ending must not match by chance: eight hex digits of a
random secret are 32 bits (one ending in four billion), eight base64 characters 48; four hex
digits were one in 65536.  A shorter form lowers it (``cut_floor``): eight of an 8-byte
password would leave seven of them to a cut end.  A vendor's fixed prefix on
``redaction_plan.VENDOR_PREFIXES`` (``sk_live_``, ``ghp_``) counts as public, like the OpenSSH
format's first characters; any other public prefix is secret-derived to the redactor, which
cannot tell it apart: an ending of the floor's worth of such bytes is redacted, and the record
says so for what it is (``tail_redacted``), never as an echo."""
CUT_FORM_MIN = 2
"""The floor of ``cut_floor``: one byte at an end is any text's last byte.  A short form's floor
is low (two of a 4-byte password), so ordinary text ends like it by chance more often: such an
end goes as ``tail_redacted`` ("may be ordinary text"), never called an echo."""


def cut_floor(derived: int) -> int:
    """How many secret-derived bytes of the beginning of a form of ``derived`` such bytes (past
    its public ones) end a stream redacted: ``min(CUT_FORM, max(CUT_FORM_MIN, ceil(derived /
    2)))``.  A cut end shows at most one byte fewer: ``min(7, max(1, ceil(derived / 2) - 1))``
    of them, fewer than half for 3 or more (an 8-byte password's raw form: three of eight; of
    4, 5, 6 bytes: one, two, two; a 32-byte token's: seven of 32), one of a 2-byte form: half."""
    return min(CUT_FORM, max(CUT_FORM_MIN, -(-derived // 2)))


def _form_begun(plan: Any, data: bytes, any_case_all: bool = False) -> int:
    """Where ``data``'s tail that is the beginning of a form written without escapes (letters
    in either case where the form's count so; ``any_case_all``: every form's, for a remote's
    short text, as ``pattern_any_case``) starts, with ``cut_floor`` or more of the form's
    secret-derived bytes (``_Plan.starts``: past its public ones); ``len(data)`` if none.  The
    held-back bytes cover it: a form is at most ``widest`` bytes long.  A text whose last byte
    no cut could end on (``_end_bytes``) is answered at once: most bodies and header values end
    with a byte no form holds (a JSON body's ``}``, a newline; issue 15)."""
    if not data:
        return 0
    ends = plan.ends
    if ends is None:
        ends = _end_bytes(plan)
    if data[-1] not in ends:
        return len(data)
    return _form_begun_scan(plan, data, any_case_all)


def _end_bytes(plan: Any) -> frozenset[int]:
    """``_Plan.ends``: every byte a cut text can end with.  A cut at ``i`` needs the text's
    tail from ``i`` -- as written or lower-cased -- to be the first ``need`` (public bytes and
    ``cut_floor``) or more bytes of a form in ``starts``, so its last byte is, or lower-cases
    to, one of a form's bytes from its ``need``-th on: those bytes, and the upper case of
    each lower-case letter among them."""
    found: set[int] = set()
    for form, _, public in plan.starts:
        found.update(form[public + cut_floor(len(form) - public) - 1 :])
    found |= {b - 32 for b in found if 0x61 <= b <= 0x7A}
    plan.ends = ends = frozenset(found)
    return ends


def _form_begun_scan(plan: Any, data: bytes, any_case_all: bool = False) -> int:
    """``_form_begun`` without its first-look answer: every form's beginning looked for."""
    tail = data[-plan.widest :]
    low = tail.lower()
    best = len(tail)
    for form, any_case, public in plan.starts:
        # Each form not counted in either case is there lower-cased too (hex's two cases; a
        # base64 one is whole once ``cut_floor`` bytes of it are: its core): ``low`` finds it.
        text = low if any_case or any_case_all else tail
        # A strict beginning (a whole form was replaced already, in the case it counts in) of
        # at least its public bytes and the floor: found by those bytes (``find``, no copy per
        # candidate), the rest of the text compared with the form's next bytes.
        need = public + cut_floor(len(form) - public)
        i = text.find(form[:need], max(0, len(text) - len(form) + 1), len(text))
        while 0 <= i < best:
            if text.startswith(form[need : len(text) - i], i + need):
                best = i
                break
            i = text.find(form[:need], i + 1)
    return len(data) - len(tail) + best


def _decoded_hold(plan: Any, round_: set[bytes]) -> bool:
    """Whether any of ``round_`` (texts' bytes) holds a form of ``plan``'s, letters in either
    case, as they are or after up to three rounds of percent-decoding (``+`` read as ``+`` and
    as a space), each decoded as bytes."""
    seen: set[bytes] = set()
    for _ in range(4):
        round_ -= seen
        if not round_:
            return False
        raw = b"\0".join(round_)
        if plan.may_hold_any_case(raw) and plan.pattern_any_case.search(raw):
            return True
        seen |= round_
        # Only a text holding '%' or '+' decodes to anything new (most header lines: none).
        unquote = urllib.parse.unquote_to_bytes
        round_ = {
            d
            for t in round_
            if b"%" in t or b"+" in t
            for d in (unquote(t), unquote(t.replace(b"+", b" ")))
        }
    return False


def _text_bytes(text: str) -> tuple[bytes, str]:
    """(bytes, codec) of ``text`` as received: latin-1 when it fits, else UTF-8."""
    try:
        return text.encode("latin-1"), "latin-1"
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass"), "utf-8"


def redactor(secret_values: Iterable[bytes]) -> Redactor:
    return Redactor(secret_values)
