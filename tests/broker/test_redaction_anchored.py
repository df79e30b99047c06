"""A long body is searched for anchors before it is scanned (issue 15,
``affidavit/secrets/redaction_scan.py``): every escape byte and one rare byte of each needle, a
letter in either case, found at ``memchr`` speed.  A body holding none has no candidate -- no
lower-cased copy of it, no copy without line breaks, no ``find`` pass per needle -- and where a
few occur only the windows around them are scanned.  None of that may change what is redacted:
the output stays exactly one ``re.sub`` of the pattern over the whole input, however it is fed
(docs/redaction.md's forms, tested in test_redaction*.py, all hold on this path).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import os
from collections.abc import Iterator
from unittest import mock

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from affidavit.secrets import redaction_scan
from affidavit.secrets.redaction import REDACTED, Redactor, secret_forms

from .encoders import ENCODERS, SECRETS

FILLER = st.binary(max_size=12) | st.sampled_from([b"%", b"\\", b"\\u00", b"+", b"%2", b"=", b"/"])
LINES = b"".join(b"%07d line of a large loopback response.......\n" % i for i in range(5000))
"""What ``tests/benchmarks/large_result.py`` answers: digits and a few lower-case words, no
escape byte."""
LONG = st.binary(min_size=129, max_size=400)
"""A value matched as written (longer than ``LONG_VALUE``): its needles are its whole raw and
base64 forms, as wide as its matches -- a window must reach across one from its anchor."""
TOKEN = b"tok-6YgyY0Jc8EKXC0/JVUPImH2T+mksDrTk"
CUTS = [0, 65536, 131072]
BREAKS = [b"\n", b"\r\n", b"\\n", b"\\r\\n", b"%0A", b"%0d%0a"]


@contextlib.contextmanager
def _windows_everywhere() -> Iterator[None]:
    """Every input, however short, takes the anchored path, and every hit gets its window."""
    with (
        mock.patch.object(redaction_scan, "_ANCHORED_MIN", 0),
        mock.patch.object(redaction_scan, "_HITS_FLOOR", 1 << 40),
    ):
        yield


def _fed(redactor: Redactor, stream: bytes, cuts: list[int]) -> bytes:
    bounds = [0, *sorted(cuts), len(stream)]
    out = b"".join(redactor.feed(stream[a:b]) for a, b in itertools.pairwise(bounds))
    return out + redactor.flush()


def _whole(redactor: Redactor, stream: bytes) -> bytes:
    plan = redactor._plan
    assert plan is not None
    return plan.pattern.sub(REDACTED, stream)


def _wrapped(encoder: str, shown: bytes, data: st.DataObject) -> bytes:
    """A base64 echo maybe wrapped at any width, with a raw or an escaped line break."""
    if encoder.startswith("base64") and "percent" not in encoder and data.draw(st.booleans()):
        width, brk = data.draw(st.integers(1, 20)), data.draw(st.sampled_from(BREAKS))
        shown = brk.join(shown[i : i + width] for i in range(0, len(shown), width))
    return shown


def _anchorless(redactor: Redactor) -> bytes:
    """The printable bytes no needle holds in either case, neither an escape byte nor a line
    break: filler no anchor is found in (``_anchor_hits``), that no match can hold."""
    plan = redactor._plan
    assert plan is not None
    held = b"".join((*plan.needles_lower, *plan.joined_lower, *(e for e, _ in plan.escapes)))
    held += held.upper() + b"\r\n"
    out = bytes(b for b in range(32, 127) if b not in held)
    # Values drawn to hold every printable byte between them (hypothesis found one) leave
    # none: then any byte no needle holds, and an example with none at all is not this test's.
    out = out or bytes(b for b in range(256) if b not in held)
    assume(out)
    return out


@settings(max_examples=150, deadline=None)
@given(
    secret=SECRETS,
    values=st.lists(st.binary(min_size=1, max_size=10) | SECRETS | LONG, max_size=2),
    data=st.data(),
)
def test_windows_around_anchors_give_exactly_one_substitution_over_the_whole_input(
    secret: bytes, values: list[bytes], data: st.DataObject
) -> None:
    """Forced onto every input: the candidates of the windows around the anchors find every
    match a whole scan would -- each form, case-changed, in any encoding, beside escape
    bytes."""
    values = [secret, b"Bearer " + secret, *values]
    redactor = Redactor(values)
    forms = sorted(set().union(*(secret_forms(v) for v in values)))
    folded = sorted({f.swapcase() for f in forms} | {f.upper() for f in forms})
    encoder = data.draw(st.sampled_from(sorted(ENCODERS)))
    shown = _wrapped(encoder, ENCODERS[encoder](data.draw(st.sampled_from(values[:2])), data), data)
    pieces = st.sampled_from(forms) | st.sampled_from(folded) | FILLER | st.just(shown)
    # Each piece maybe followed by 2-8 KiB holding no anchor: the windows stay apart, each as
    # wide as the scan makes it (``_around``'s reach), not one window over the whole stream.
    gaps = st.just(0) | st.integers(2048, 8192)
    pad = _anchorless(redactor)
    stream = b"".join(
        piece + (pad * (gap // len(pad) + 1))[:gap]
        for piece, gap in data.draw(st.lists(st.tuples(pieces, gaps), max_size=10))
    )
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=6))
    expected = _whole(redactor, stream)
    with _windows_everywhere():
        assert _fed(redactor.fresh(), stream, cuts) == expected
        assert redactor.sub(stream) == expected


def test_an_echo_in_a_long_body_is_redacted_wherever_the_reads_cut_it() -> None:
    """As the sink feeds a long answer (reads of 64 KiB to 1 MiB): an echo in any encoding,
    wrapped or case-changed, anywhere in a read, near its end or across it, is redacted as a
    whole scan would redact it -- and many such reads are scanned only around their anchors
    (an eighth to two fifths of them measured; the rest are scanned whole)."""
    windowed: list[bool] = []

    @settings(max_examples=60, deadline=None)
    @given(secret=SECRETS, data=st.data())
    def echoed(secret: bytes, data: st.DataObject) -> None:
        injected = b"Bearer " + secret
        encoder = data.draw(st.sampled_from(sorted(ENCODERS)))
        shown = ENCODERS[encoder](data.draw(st.sampled_from([secret, injected])), data)
        if len(secret) >= 8 and encoder in ("raw", "base64", "hex") and data.draw(st.booleans()):
            shown = shown.swapcase()  # (an escape's own letters are not either case: \U, %2f)
        shown = _wrapped(encoder, shown, data)
        near_a_cut = st.integers(0, 300).map(lambda i: i + data.draw(st.sampled_from(CUTS)))
        past_a_head = st.integers(8192, 65535).map(lambda i: i + data.draw(st.sampled_from(CUTS)))
        at = data.draw(past_a_head | near_a_cut)
        at -= data.draw(st.integers(0, min(at, len(shown) + 2)))
        stream = LINES[:at] + shown + LINES[at:]
        read = data.draw(st.sampled_from([65536, 1 << 20]))
        cuts = list(range(read, len(stream), read))
        redactor = Redactor([secret, injected])
        expected = _whole(redactor, stream)
        assert REDACTED in expected
        with mock.patch.object(redaction_scan, "_around", wraps=redaction_scan._around) as around:
            assert _fed(redactor.fresh(), stream, cuts) == expected
        windowed.append(around.called)

    echoed()
    # Measured: 7 to 24 of 60 examples windowed.  The rest are scanned whole: an escaped echo
    # holds more escape bytes than a read's cap (8 for 64 KiB), a hex one's needles hold only
    # bytes LINES is full of (three misses), some echoes lie in a read's first eighth.
    assert any(windowed), len(windowed)


DIGITS = b"".join(b"%07d\n" % i for i in range(30_000))
"""Filler holding digits and line feeds only: none of the echoes' rare bytes."""
_Z = b"z" + (b"0123456789" * 42)[:415]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (base64.b64decode(_Z), _Z),
        (base64.b64decode(_Z[:170] + b"0="), b"\r\n".join(bytes([c]) for c in _Z[:170] + b"0=")),
    ],
    ids=["long_value_base64", "base64_of_128_bytes_each_char_on_a_crlf_line"],
)
def test_a_window_reaches_across_a_needle_from_an_anchor_at_its_end(
    value: bytes, shown: bytes
) -> None:
    """The widest echoes one anchor finds, its only anchor byte (``z``) at one end: a 312-byte
    value's base64, matched as written (its one needle the whole form, as wide as the widest
    match: 416 bytes); a 128-byte value's base64 with each character on a raw CRLF line (514
    bytes; its escaped forms, hits at every escape byte, are wider).  The window around that
    byte must hold the whole needle, as far as the widest match reaches."""
    plan = Redactor([value])._plan
    assert plan is not None and plan.anchors is not None
    body = DIGITS[:100_000] + shown + DIGITS[100_000:140_000]
    redactor = Redactor([value])
    expected = _whole(redactor, body)
    assert expected.count(REDACTED) == 1
    with mock.patch.object(redaction_scan, "_around", wraps=redaction_scan._around) as around:
        assert _fed(redactor.fresh(), body, [65_536, 131_072]) == expected
        assert redactor.sub(body) == expected
    assert around.call_count == 2
    read = body[65_536:131_072]
    assert redaction_scan._anchor_hits(plan, plan.anchors, read, 8) == [100_000 - 65_536]


def _scanned_whole(values: list[bytes], body: bytes) -> list[int]:
    """The lengths of the inputs scanned whole (lower-cased, every needle's ``find`` pass)
    while ``body`` is fed in reads of 1 MiB and the rest flushed (the bytes held back, short,
    are always scanned so)."""
    redactor = Redactor(values)
    with mock.patch.object(
        redaction_scan, "_everywhere", wraps=redaction_scan._everywhere
    ) as everywhere:
        out = _fed(redactor, body, list(range(1 << 20, len(body), 1 << 20)))
    assert out == _whole(redactor, body)
    return [len(c.args[1]) for c in everywhere.call_args_list]


@pytest.mark.parametrize("secret", [TOKEN, b"bench-" + b"5f902c5ff300298a0ec737d0"])
def test_a_clean_long_body_without_the_needles_rare_bytes_is_not_scanned_whole(
    secret: bytes,
) -> None:
    body = (LINES * 30)[: 3 << 20]
    scanned = _scanned_whole([secret, b"Bearer " + secret], body)
    assert max(scanned) < redaction_scan._ANCHORED_MIN


def test_a_long_body_with_a_few_echoes_is_scanned_only_around_them() -> None:
    body = bytearray((LINES * 30)[: 3 << 20])  # whole reads: the rest flushed is short
    echoes = [TOKEN.upper(), base64.b64encode(b"\0" + TOKEN), b'"' + TOKEN.replace(b"/", b"\\/")]
    for at, echo in zip((1000, 300_000, (1 << 20) - 5), echoes, strict=True):
        body[at : at + len(echo)] = echo  # the last across the first read's end
    plan = Redactor([TOKEN])._plan
    assert plan is not None
    scanned = _scanned_whole([TOKEN], bytes(body))
    # About a window per echo (one across the read's end held back into the next read), and
    # the rest flushed: some KiB of 3 MiB.
    window = 2 * (plan.widest + redaction_scan._MARGIN) + 64
    assert 3 <= len(scanned) <= 5 and sum(scanned) <= 5 * window


def test_a_body_holding_every_byte_is_scanned_whole_as_before() -> None:
    body = os.urandom(1 << 20)
    assert _scanned_whole([TOKEN], body + body[:1000])[0] == (1 << 20)


@pytest.mark.parametrize(
    "escape", [b"%%%02X", b"%%%02x", b"\\u%04x", b"\\u%04X"], ids=["pct", "pct_lower", "u", "U"]
)
def test_an_echo_whose_needle_bytes_are_escaped_is_found_by_its_escape_bytes(
    escape: bytes,
) -> None:
    """An echo with every needle's chosen anchor escaped (``TOKEN``'s ``+`` and ``D``; its
    other bytes are ``LINES``' own or not any needle's first choice) holds no needle byte to
    find it by: its two escape bytes are, fewer than a 73 KB read's cap of 8, past the read's
    first eighth -- so it is redacted from the windows around them, not by a whole scan."""
    plan = Redactor([TOKEN, b"Bearer " + TOKEN])._plan
    assert plan is not None and plan.anchors is not None
    shown = b"".join(escape % c if c in b"+D" else bytes([c]) for c in TOKEN)
    body = LINES[:70_000] + shown + LINES[70_000:73_000]
    redactor = Redactor([TOKEN, b"Bearer " + TOKEN])
    expected = _whole(redactor, body)
    assert expected.count(REDACTED) == 1
    with mock.patch.object(redaction_scan, "_around", wraps=redaction_scan._around) as around:
        assert _fed(redactor.fresh(), body, []) == expected
        assert redactor.sub(body) == expected
    assert around.call_count == 2
    hits = redaction_scan._anchor_hits(plan, plan.anchors, body, len(body) // 16384 + 4)
    assert hits is not None and len(hits) == 2 and min(hits) > len(body) // 8


def test_each_escape_byte_and_a_needle_s_rare_byte_in_either_case_is_a_hit() -> None:
    """What the windows are built around: every escape byte, and one byte of each needle
    (here its base64 needles' rarest, ``z``, which ``LINES`` lacks) in either case."""
    plan = Redactor([TOKEN])._plan
    assert plan is not None and plan.anchors is not None
    assert all(choices[0] == (b"Z", b"z") for choices in plan.anchors[2:])
    body = bytearray(LINES[:200_000])
    for at, byte in ((1_000, b"%"), (50_000, b"\\"), (100_000, b"z"), (150_000, b"Z")):
        body[at : at + 1] = byte
    hits = redaction_scan._anchor_hits(plan, plan.anchors, bytes(body), 64)
    assert hits is not None and {1_000, 50_000, 100_000, 150_000} <= set(hits)
