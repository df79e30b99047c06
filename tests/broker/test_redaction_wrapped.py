"""Base64 wrapped into lines at any width -- 76 columns (MIME, RFC 2045 §6.8; ``base64(1)``;
Python's ``encodebytes``), 64 (PEM, RFC 7468) or another -- loses the secret wherever its
encoding crosses a line break (docs/redaction.md, "The forms").  Each base64 form and core
takes a line break (raw, JSON- or percent-escaped: ``BREAK``) between any two characters; the
scan finds it by its needles in the input without raw line breaks (``joined``) and by escaped
breaks between base64 characters as escape candidates.  The optional break is never ambiguous
with a character's ways of being written, so the pattern's work per start stays bounded.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import urllib.parse
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.secrets.redaction import REDACTED, Redactor
from affidavit.secrets.redaction_forms import (
    BREAK,
    _alts,
    _chars,
    _slot_regex,
    _value_slots,
    base64_forms,
    secret_forms,
)

SECRETS = [b"sk_live_Ab3De9Fg9xHi7Qz", b"tok-6YgyY0Jc8EKXC0/JVUPImH2T+mksDrTk\xfe\xff"]
ENCODINGS = {"standard": base64.b64encode, "urlsafe": base64.urlsafe_b64encode}


def _wrap(text: bytes, width: int, eol: bytes) -> bytes:
    return b"".join(text[i : i + width] + eol for i in range(0, len(text), width))


def _decodes_to(piece: bytes, secret: bytes, altchars: bytes) -> bool:
    """Whether the base64 characters of ``piece``, joined across its line breaks, decode at any
    of the four alignments to bytes holding ``secret``."""
    run = re.sub(rb"[^A-Za-z0-9" + re.escape(altchars) + rb"]", b"", piece)
    for start in range(4):
        part = run[start:]
        if secret in base64.b64decode(part[: len(part) // 4 * 4], altchars=altchars):
            return True
    return False


@pytest.mark.parametrize("secret", SECRETS, ids=["23_bytes", "38_bytes"])
@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
@pytest.mark.parametrize(("width", "eol"), [(76, b"\n"), (76, b"\r\n"), (64, b"\n")])
def test_no_shift_of_wrapped_base64_leaves_the_secret_decodable(
    secret: bytes, encoding: str, width: int, eol: bytes
) -> None:
    """The review's test: the secret at every byte offset 0..76 of a blob base64-wrapped at
    76 (LF and CRLF) or 64 columns; no piece of the output decodes to it."""
    encode = ENCODINGS[encoding]
    altchars = encode(b"\xfb\xff")[:2]
    redactor = Redactor([secret])
    for pad in range(77):
        blob = _wrap(encode(b"A" * pad + secret + b"B" * 40), width, eol)
        out = redactor.fresh().sub(blob)
        for piece in out.split(REDACTED):
            assert not _decodes_to(piece, secret, altchars), (pad, out)


ESCAPED: dict[str, Callable[[bytes], bytes]] = {
    "json": lambda text: json.dumps(text.decode()).encode(),
    "percent": lambda text: urllib.parse.quote_from_bytes(text, safe="").encode(),
    "percent_lower": lambda text: urllib.parse.quote_from_bytes(text, safe="").lower().encode(),
}


@pytest.mark.parametrize("escape", sorted(ESCAPED))
def test_wrapped_base64_inside_json_or_a_url_is_redacted(escape: str) -> None:
    """A PEM or MIME blob echoed inside a JSON string (``\\n``, a PHP ``\\/``) or percent-
    encoded (``%0A``, ``%2F``): the line breaks are written escaped too."""
    secret = SECRETS[1]
    redactor = Redactor([secret])
    for pad in range(0, 77, 7):
        blob = _wrap(base64.b64encode(b"A" * pad + secret + b"B" * 40), 64, b"\r\n")
        shown = ESCAPED[escape](blob)
        out = redactor.fresh().sub(shown)
        assert REDACTED in out, pad
        plain = urllib.parse.unquote_to_bytes(out.replace(b"\\r\\n", b"\n").replace(b"\\/", b"/"))
        for piece in plain.split(REDACTED):
            assert not _decodes_to(piece, secret, b"+/"), (pad, out)


BREAKS = [b"\n", b"\r\n", b"\\n", b"\\r\\n", b"%0A", b"%0d%0a"]
WRITE = [lambda c: c, lambda c: b"%%%02X" % c[0], lambda c: b"\\u%04x" % c[0]]


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_form_broken_anywhere_gives_exactly_one_substitution_over_the_whole_input(
    data: st.DataObject,
) -> None:
    """The scan's candidates (raw breaks dropped before the base64 needles are looked for,
    escaped breaks between base64 characters as escapes) find every wrapped match, at any
    width: ``feed``/``sub`` equal one ``re.sub`` of the pattern over the whole input, whatever
    breaks cut a form, however its characters are written, however the stream is chunked."""
    secret = data.draw(st.sampled_from(SECRETS))
    redactor = Redactor([secret, b"Bearer " + secret])
    form = data.draw(st.sampled_from(sorted(base64_forms(secret))))
    cuts = data.draw(st.lists(st.integers(1, len(form) - 1), max_size=4, unique=True))
    parts = [form[a:b] for a, b in itertools.pairwise([0, *sorted(cuts), len(form)])]
    writers = data.draw(st.sampled_from([WRITE[:1], WRITE]))  # all literal, or mixed
    shown = b""
    for part in parts:
        chars = [data.draw(st.sampled_from(writers))(part[i : i + 1]) for i in range(len(part))]
        shown += (data.draw(st.sampled_from(BREAKS)) if shown else b"") + b"".join(chars)
    # Raw breaks before it, more than a window wide: the joined text's positions are not the
    # input's.
    before = data.draw(st.sampled_from([b"", b"x", b"A", b"\\n", b"%0A", b"a\r\n" * 400]))
    stream = before + shown + data.draw(st.sampled_from([b"", b"=", b"\n", b"\r\n", b"}"]))
    plan = redactor._plan
    assert plan is not None
    expected = plan.pattern.sub(REDACTED, stream)
    assert REDACTED in expected
    assert redactor.fresh().sub(stream) == expected
    chunks = data.draw(st.lists(st.integers(0, len(stream)), max_size=4))
    r = redactor.fresh()
    bounds = [0, *sorted(chunks), len(stream)]
    got = b"".join(r.feed(stream[a:b]) for a, b in itertools.pairwise(bounds)) + r.flush()
    assert got == expected


def test_the_any_case_prefilter_sees_a_form_wrapped_with_raw_breaks() -> None:
    """``may_hold_any_case`` (a remote's short text: the any-case pattern runs only where it
    says a match may be) looks for the base64 needles with the raw breaks dropped too."""
    secret = SECRETS[1]
    plan = Redactor([secret])._plan
    assert plan is not None
    form = base64.b64encode(secret)
    for cut in range(1, len(form)):
        for eol in (b"\n", b"\r\n"):
            text = b"x " + (form[:cut] + eol + form[cut:]).swapcase() + b" y"
            assert plan.pattern_any_case.search(text), (cut, eol)
            assert plan.may_hold_any_case(text), (cut, eol)


def _ways(char: bytes) -> list[bytes]:
    """Every way of writing the base64 character ``char`` a slot matches: literal, ``%XX`` in
    either hex case, JSON escapes."""
    pattern = [re.compile(re.escape(bytes([f])) + rest) for f, rest, _ in _alts(_chars(char)[0])]
    candidates = [char, b"%%%02X" % char[0], b"%%%02x" % char[0], b"\\/", b"\\u%04x" % char[0]]
    candidates.append(b"\\u%04X" % char[0])
    return [c for c in candidates if any(p.fullmatch(c) for p in pattern)]


def test_an_optional_line_break_never_competes_with_a_character() -> None:
    """The work bound: the only repetitions in a plan's pattern are ``?`` (no ``*``, ``+`` or
    ``{m,n}`` to backtrack through), and a break before a slot is decided by the text: no way
    of writing a base64 character starts like a break, no break like a character, and no slot
    matches a break alone -- an optional slot takes its break only with a character after it,
    so across an empty optional slot two breaks never compete for one.  So a start position
    costs at most one pass over the form."""
    for alphabet in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_":
        for way in _ways(bytes([alphabet])):
            assert re.match(BREAK, way) is None, way
            for brk in [*BREAKS, b"%0a", b"%0D%0A"]:
                assert re.fullmatch(BREAK, brk)
                assert not brk.startswith(way) and not way.startswith(brk[:3]), (way, brk)
    for secret in [*SECRETS, b"secretvalue12", b"x"]:
        for form in _value_slots(secret):
            for slot in form:
                for any_case in (False, True):
                    slot_re = re.compile(_slot_regex(slot, any_case)[0])
                    for brk in BREAKS:
                        assert slot_re.fullmatch(brk) is None, (slot, brk)
    plan = Redactor(SECRETS)._plan
    assert plan is not None
    repeats = re.findall(rb"(?<!\\)(?:[*+]|\{\d*,?\d*\})", plan._source())
    assert repeats == []


def test_a_line_break_after_a_form_is_the_texts() -> None:
    """A break after a form's last character, with no base64 character after it, is not the
    secret's: it stays (the review's ``c2VjcmV0dmFsdWUxMg\n{"b":1}`` had two NDJSON records
    joined).  Every form of values of 1..20 bytes (so with each padding), every kind of break,
    whole and streamed."""
    base = b"Kq7zJ9W2mR5vY8sH3pL6"  # no letter of ``next`` in either case
    for size in range(1, len(base) + 1):
        value = base[:size]
        redactor = Redactor([value])
        for form in sorted(secret_forms(value)):
            for brk in BREAKS:
                body = b"<" + form + brk + b"next"
                want = b"<" + REDACTED + brk + b"next"
                assert redactor.fresh().sub(body) == want, (value, form, brk)
                r = redactor.fresh()
                got = b"".join(r.feed(body[i : i + 3]) for i in range(0, len(body), 3))
                assert got + r.flush() == want, (value, form, brk)
                whole = {base64.b64encode(value), base64.urlsafe_b64encode(value)}
                if form in {w.rstrip(b"=") for w in whole} - whole:  # the form, unpadded
                    padded = b"<" + form + brk + b"=" + brk + b"next"  # its padding, wrapped
                    want = b"<" + REDACTED + brk + b"next"
                    assert redactor.fresh().sub(padded) == want, (value, form, brk)


@pytest.mark.parametrize(
    ("secret", "body"),
    [
        (b"ab/\ncdefghijkl", b"<ab%2F\ncdefghijkl>"),
        (b"abcdefg/\nhij", b"<abcdefg\\/\nhij>"),
        (b"abcdefg/\nhij", b"<abcdefg%2F\nhij>"),
        (b"abcdefg/\r\nhij", b"<abcdefg%2F\r\nhij>"),
        (b"abcdefg \nhij", b"<abcdefg+\nhij>"),
    ],
)
def test_an_escape_before_the_values_own_raw_break_is_a_candidate(
    secret: bytes, body: bytes
) -> None:
    """The scan looks for escapes in the input without raw breaks (``joined``), so an escape
    whose next character is the value's own CR or LF needs no follower there: the match is
    found as ``pattern.sub`` finds it, whole and streamed in chunks of every size."""
    redactor = Redactor([secret])
    plan = redactor._plan
    assert plan is not None
    want = b"<" + REDACTED + b">"
    assert plan.pattern.sub(REDACTED, body) == want
    assert redactor.fresh().sub(body) == want
    for size in range(1, len(body) + 1):
        r = redactor.fresh()
        got = b"".join(r.feed(body[i : i + size]) for i in range(0, len(body), size))
        assert got + r.flush() == want, size


@pytest.mark.parametrize("brk", BREAKS)
def test_wrapping_at_any_width_is_redacted(brk: bytes) -> None:
    """One break between any two characters: the secret at offsets 0..5 of a blob (every
    alignment, and the lines cut at every place) wrapped at every width from 1 column to the
    blob's, in both alphabets; no piece of the output, its breaks dropped, decodes to it."""
    secret = SECRETS[1]
    redactor = Redactor([secret])
    for encoding, encode in sorted(ENCODINGS.items()):
        altchars = encode(b"\xfb\xff")[:2]
        for pad in range(6):
            blob = encode(b"A" * pad + secret + b"B" * 4)
            for width in range(1, len(blob) + 1):
                shown = brk.join(blob[i : i + width] for i in range(0, len(blob), width))
                out = redactor.fresh().sub(b"<" + shown + b">")
                assert REDACTED in out, (encoding, pad, width)
                for piece in out.split(REDACTED):
                    piece = piece.replace(brk, b"")
                    assert not _decodes_to(piece, secret, altchars), (encoding, pad, width, out)
