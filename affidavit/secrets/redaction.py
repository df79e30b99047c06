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

A value longer than ``LONG_VALUE`` (a private key, a JWT, an AWS session token) and each base64
line of a PEM value are matched in their raw and whole-base64 forms (letters in either case),
each byte but a letter or digit literal or escaped (``long_alts``: ``%2F``, PHP's ``\\/``):
with every unit encoding, hex and shifted base64, a 3 KiB key would be megabytes of regex.

A non-ASCII value is also matched read as latin-1 (``mojibake``: a WSGI server's view of a
Basic password), and a match of a value under ``MIN_ANY_CASE`` bytes alone is told apart
(``SHORT_REDACTED``, ``short_echoed``): ordinary text may be one.

A stream's end is never cut for what it holds (``flush``): a complete stream keeps it, one cut
short withholds its last ``tail_window`` bytes whatever they are -- a cut decided by whether an
end begins a form was a prefix oracle on text a caller can make a remote echo (audit 54b, F1).

The modules: ``redaction_forms`` (the forms and their regex), ``redaction_plan`` (a set of
values' needles and patterns, and the plan cache), ``redaction_scan`` (the windowed scan);
this one is the ``Redactor`` that streams, substitutes and scrubs with them.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable
from typing import Any

from .redaction_forms import LONG_VALUE, MIN_ANY_CASE, secret_forms
from .redaction_plan import _plan as _plan
from .redaction_plan import _plan_for as _plan_for
from .redaction_plan import _plans as _plans
from .redaction_plan import clear_plans, release, retain
from .redaction_scan import REDACTED, SHORT_REDACTED, _scan
from .redaction_scan import _escape_hits as _escape_hits

__all__ = [
    "LEAVES",
    "LONG_VALUE",
    "MIN_ANY_CASE",
    "REDACTED",
    "TAIL_MIN",
    "Redactor",
    "clear_plans",
    "redactor",
    "release",
    "retain",
    "secret_forms",
    "tail_window",
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
        """True once they replaced a whole form of a value of ``MIN_ANY_CASE`` bytes or more:
        the stream echoed a secret; or once ``scrub_text`` did (or replaced a text whole:
        ``holds``) -- a remote's short text echoed one (the sink's ``head_echoed``).  An end
        withheld alone (``tail_redacted``) is not an echo."""
        self.short_echoed = False
        """True once they replaced a whole form of a value under ``MIN_ANY_CASE`` bytes (a
        short password, a PIN): ordinary text (``2024`` in a date) may be one, so it is no
        proof of an echo -- the record says ``short_redacted``."""
        self.tail_redacted = False
        """True once ``flush`` withheld the end of a stream that ended cut short (``complete``
        False): its last ``tail_window`` bytes, whatever they were."""

    def fresh(self) -> Redactor:
        """A new redactor (no input held) of the same values, sharing this one's plan: a
        stream that starts late in a call redacts with the plan its call began with, never
        one rebuilt into the cache after its credential rotated.  Made without ``__init__``:
        its plan lookup (the cache's lock, for the empty tuple) was thrown away at once, once
        per stream of every call (issue 15)."""
        other: Redactor = _new(Redactor)
        other._plan = self._plan
        other._buf = b""
        other.changed = other.echoed = other.tail_redacted = other.short_echoed = False
        return other

    @property
    def pending(self) -> bytes:
        """The input ``feed`` holds back (``tail_window`` bytes: a match may still start
        there, and a stream cut short withholds them): unless ``changed``, the output so far
        plus these bytes is exactly the input so far."""
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
        # ``tail_window`` bytes held back (at least ``widest - 1``, where a match may still
        # start): a stream cut short withholds them (``flush``), whatever they are.
        out, pos = _scan(plan, buf, max(0, len(buf) - tail_window(plan)), memoryview(buf))
        self._buf = buf[pos:]
        self._note(out)
        return out

    def _note(self, out: list[bytes | memoryview]) -> None:
        if not self.echoed and any(piece is REDACTED for piece in out):
            self.changed = self.echoed = True
        if not self.short_echoed and any(piece is SHORT_REDACTED for piece in out):
            self.changed = self.short_echoed = True

    def flush(self, complete: bool = True) -> bytes:
        """The held-back bytes, every whole form in them replaced.  ``complete`` False: the
        stream was cut short (closed or stalled mid-answer, cut at ``max_result``, a decoding
        that failed, an attempt abandoned), so it may end inside an echo -- its last
        ``tail_window`` bytes (all of it if shorter) are withheld, replaced by one
        ``[REDACTED]``, whatever they were.  The decision never depends on the bytes: whether
        an end looked like a secret's beginning would tell a caller who wrote that end itself
        (a path a 404 page echoes) whether its guess is a prefix of the secret (the prefix
        oracle, docs/redaction.md).  A complete stream has no end cut at all."""
        plan = self._plan
        if plan is None:
            return b""
        buf, self._buf = self._buf, b""
        whole = _scan(plan, buf, len(buf))[0]
        self._note(whole)
        if complete or not buf:
            return b"".join(whole)
        # Cut short: everything held back is the tail -- ``feed`` keeps at most
        # ``tail_window`` bytes (fewer only where a whole form's match ran into them) --
        # withheld whatever it is; a whole form in it is still an echo (``_note`` above).
        self.changed = self.tail_redacted = True
        return REDACTED

    def ending(self) -> tuple[bool, bool, bool]:
        """(``echoed``, ``tail_redacted``, ``short_echoed``) as they would be after
        ``flush(complete=False)``, which is not done: an answer cut now, its held-back bytes
        never flushed -- every one of them scanned for whole forms, and any held back at all
        withheld."""
        plan, buf = self._plan, self._buf
        if plan is None or not buf:
            return self.echoed, self.tail_redacted, self.short_echoed
        whole = _scan(plan, buf, len(buf))[0]
        return (
            self.echoed or any(piece is REDACTED for piece in whole),
            True,
            self.short_echoed or any(piece is SHORT_REDACTED for piece in whole),
        )

    def sub(self, data: bytes) -> bytes:
        """``data`` with every form replaced (not streaming; ``feed``'s state is untouched)."""
        plan = self._plan
        return data if plan is None else b"".join(_scan(plan, data, len(data))[0])

    def scrub_text(self, text: str) -> str:
        """``text`` with every form replaced, its letters in either case (``pattern_any_case``:
        this is a remote's short text, never a body); replaced whole when a form shows only
        after percent-decoding it up to three times (``holds``).  Its end is never cut: a
        header value or reason phrase that ends inside an echo keeps that end, as a complete
        stream does (``flush``) -- a cut decided by whether the end is a secret's beginning
        is a prefix oracle on a text the caller can have written (a ``Location`` echoing the
        request path).  Text is matched as the bytes it was received as: latin-1 when it fits
        (header fields arrive as bytes decoded latin-1), else UTF-8."""
        plan = self._plan
        if plan is None:
            return text
        clean = plan.clean
        if text in clean:
            return text
        raw, codec = _text_bytes(text)
        out = raw
        if plan.may_hold_any_case(raw):
            # A short value's form (``m.lastindex``: its alternatives end in an empty group) may
            # be ordinary text -- a password ``2026`` in every answer's ``Date`` -- so it is no
            # proof of an echo: ``short_echoed`` (the sink's ``head_short``), not ``echoed``.
            kinds: set[bool] = set()
            out = plan.pattern_any_case.sub(lambda m: _replaced(m, kinds), raw)
            if False in kinds:
                self.echoed = True  # a long value's whole form: an echo (``head_echoed``)
            elif kinds:
                self.short_echoed = True
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


TAIL_MIN = 256
"""The fewest bytes ``tail_window`` withholds at the end of a stream cut short."""


def tail_window(plan: Any) -> int:
    """The bytes a stream cut short withholds at its end (``Redactor.flush``): ``plan``'s
    widest match rounded up to a power of two, ``TAIL_MIN`` at least -- from the plan alone,
    so a caller learns at most the size class of the longest form configured, never anything
    of the bytes withheld.  Cached on the plan (``_Plan.tail``)."""
    tail: int | None = plan.tail
    if tail is None:
        tail = plan.tail = max(TAIL_MIN, 1 << (plan.widest - 1).bit_length())
    return tail


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


def _replaced(m: re.Match[bytes], kinds: set[bool]) -> bytes:
    """``scrub_text``'s replacement of one match, noting in ``kinds`` whether it was a short
    value's form (True: ``m.lastindex`` set by the short alternatives' empty group)."""
    kinds.add(m.lastindex is not None)
    return REDACTED
