"""The redaction promise (docs/redaction.md), unit by unit: every listed form of a secret and of
the whole injected value is removed, however the stream is chunked.

Seed: "Exclude secrets, full authorization headers, private keys, and unfiltered remote bodies"
from the envelope.  The end-to-end property test (every encoder x every surface, through a real
``Broker.call``) is tests/broker/test_redaction_e2e.py.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import urllib.parse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.secrets.redaction import (
    LONG_VALUE,
    MIN_ANY_CASE,
    REDACTED,
    Redactor,
    _escape_hits,
    _plan,
    _plan_for,
    secret_forms,
    tail_window,
)

from .encoders import ENCODERS, SECRETS

FILLER = st.binary(max_size=12) | st.sampled_from([b"%", b"\\", b"\\u00", b"+", b"%2", b"=", b"/"])


def _pieces(out: bytes) -> list[bytes]:
    return out.split(REDACTED)


def _chunked(r: Redactor, data: bytes, cuts: list[int]) -> bytes:
    bounds = [0, *sorted(cuts), len(data)]
    return b"".join(r.feed(data[a:b]) for a, b in itertools.pairwise(bounds)) + r.flush()


@settings(max_examples=150, deadline=None)
@given(
    secret=SECRETS,
    whole=st.booleans(),
    encoder=st.sampled_from(sorted(ENCODERS)),
    before=FILLER,
    after=FILLER,
    data=st.data(),
)
def test_every_listed_form_of_the_secret_and_of_the_injected_value_is_redacted(
    secret: bytes, whole: bool, encoder: str, before: bytes, after: bytes, data: st.DataObject
) -> None:
    # The binding lists the secret and the whole injected value (here ``Bearer <secret>``).
    injected = b"Bearer " + secret
    shown = ENCODERS[encoder](injected if whole else secret, data)
    stream = before + shown + after
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=4))
    out = _chunked(Redactor([secret, injected]), stream, cuts)
    for piece in _pieces(out):
        assert shown not in piece
        assert secret not in piece


@settings(max_examples=60, deadline=None)
@given(
    secret=SECRETS.filter(lambda s: len(s) >= 8),
    prefix=st.binary(max_size=5),
    suffix=st.binary(max_size=5),
)
def test_base64_of_a_longer_blob_holding_the_secret_is_redacted(
    secret: bytes, prefix: bytes, suffix: bytes
) -> None:
    """A server that base64s a whole echo: the secret sits at any alignment of a 3-byte group.
    (A secret under 8 bytes has no core long enough to tell from other base64: documented.)"""
    for enc in (base64.b64encode, base64.urlsafe_b64encode):
        blob = enc(prefix + secret + suffix)
        out = Redactor([secret]).sub(b"x" + blob + b"y")
        for piece in _pieces(out):
            for start in range(4):
                run = piece[start:].strip(b"xy=")
                decoded = base64.b64decode(run[: len(run) // 4 * 4], altchars=enc(b"\xfb\xff")[:2])
                assert secret not in decoded


_VALUES = st.lists(st.binary(min_size=1, max_size=10) | SECRETS, min_size=1, max_size=3)


@settings(max_examples=100, deadline=None)
@given(values=_VALUES, data=st.data())
def test_streaming_gives_exactly_one_substitution_over_the_whole_input(
    values: list[bytes], data: st.DataObject
) -> None:
    """``feed``/``flush`` in any chunking equal one ``re.sub`` of the compiled pattern over the
    whole input, and no concrete form survives between the markers."""
    forms = sorted(set().union(*(secret_forms(v) for v in values)))
    folded = sorted({f.swapcase() for f in forms} | {f.upper() for f in forms})
    pieces = data.draw(
        st.lists(
            st.sampled_from(forms) | st.sampled_from(folded) | FILLER | st.just(b"[REDACTED]"),
            max_size=10,
        )
    )
    stream = b"".join(pieces)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=6))
    whole = Redactor(values)
    expected = whole._plan.pattern.sub(REDACTED, stream) if whole._plan else stream
    assert _chunked(Redactor(values), stream, cuts) == expected
    assert whole.sub(stream) == expected
    any_case = [f.lower() for v in values if len(v) >= MIN_ANY_CASE for f in secret_forms(v)]
    for piece in _pieces(expected):
        assert not any(f in piece for f in forms)
        assert not any(f in piece.lower() for f in any_case)


@settings(max_examples=100, deadline=None)
@given(values=_VALUES, data=st.data())
def test_escape_candidates_are_exactly_the_regex_scan_s(
    values: list[bytes], data: st.DataObject
) -> None:
    """Escape bytes are located with ``find`` and the pattern tried only there, until a regex
    scan takes over a body dense with them (issue 15): either way the candidates are exactly
    the starts ``finditer`` reports, so the windows redacted stay the same."""
    plan = _plan(tuple(sorted(set(values))))
    assert plan is not None
    forms = sorted(set().union(*(secret_forms(v) for v in values)))
    body = b"".join(data.draw(st.lists(FILLER | st.sampled_from(forms), max_size=40)))
    for first, escape in plan.escapes:
        out: list[int] = []
        assert _escape_hits(body, first, escape, out, len(body) + 1)
        assert out == [m.start() for m in escape.finditer(body)]


@settings(max_examples=150, deadline=None)
@given(
    secret=SECRETS,
    encoder=st.sampled_from(sorted(ENCODERS)),
    before=FILLER,
    after=FILLER,
    data=st.data(),
)
def test_the_any_case_prefilter_never_skips_a_match(
    secret: bytes, encoder: str, before: bytes, after: bytes, data: st.DataObject
) -> None:
    """``scrub_text`` runs the any-case pattern only where ``may_hold_any_case`` says it can
    match: that must hold for every listed form, with its letters' case changed at random."""
    plan = _plan((secret,))
    assert plan is not None
    shown = ENCODERS[encoder](secret, data)
    flips = data.draw(st.lists(st.booleans(), min_size=len(shown), max_size=len(shown)))
    changed = bytes(c ^ 0x20 if f and chr(c).isalpha() and c < 0x80 else c
                    for c, f in zip(shown, flips, strict=True))  # fmt: skip
    text = before + changed + after
    if plan.pattern_any_case.search(text):
        assert plan.may_hold_any_case(text)


def test_the_longest_form_at_a_position_wins() -> None:
    r = Redactor([b"abc1", b"abc1def2"])
    assert r.sub(b"_abc1def2_abc1_ab") == b"_[REDACTED]_[REDACTED]_ab"


def test_no_secret_is_the_identity() -> None:
    r = Redactor([b""])
    assert not r.active
    assert r.feed(b"data") == b"data" and r.flush() == b""
    assert r.scrub({"a": ["b"]}) == {"a": ["b"]}


def test_the_bytes_held_back_are_the_tail_window_a_cut_stream_withholds() -> None:
    """``feed`` holds back ``tail_window`` bytes -- more than a match needs (``widest - 1``),
    a power of two of at least 256 -- and a complete stream's ``flush`` gives them back."""
    r = Redactor([b"secret"])
    assert r._plan is not None
    tail = tail_window(r._plan)
    assert tail >= max(256, r._plan.widest) and tail & (tail - 1) == 0
    data = os.urandom(4 * tail).replace(b"%", b"_").replace(b"\\", b"_")
    out = r.feed(data)
    assert out == data[: len(data) - tail]
    assert out + r.flush() == data and not r.changed


def test_scrub_redacts_header_names_values_the_reason_and_mapping_keys() -> None:
    tok = b"tok-Ab3/Xy9+Zq"
    b64 = base64.b64encode(tok).decode()
    r = Redactor([tok])
    summary = {
        "reason": f"OK {tok.decode()}",
        "headers": [[f"X-{b64}", "1"], ["X-B64", b64], ["X-Hex", tok.hex()]],
        tok.decode(): 1,
        "status": 200,
    }
    scrubbed = json.dumps(r.scrub(summary))
    assert "[REDACTED]" in scrubbed
    for form in secret_forms(tok):
        assert form.decode() not in scrubbed
    assert r.scrub(summary)["status"] == 200


def test_a_remote_s_short_text_and_a_body_lose_each_form_in_either_case() -> None:
    """Header text and a redirect's origin (a URL parser lower-cases a host), and a body: a
    case-changed echo of a form is the form (docs/redaction.md; tests/broker/
    test_redaction_case.py for bodies)."""
    tok = b"Tok-Ab3Xy9Zq-Cd7"
    r = Redactor([tok])
    for form in (
        tok.lower(),
        tok.upper(),
        base64.b64encode(tok).swapcase(),
        tok.hex().upper().encode(),
    ):
        assert r.scrub_text(f"x {form.decode()} y") == "x [REDACTED] y"
        assert r.scrub({"origin": f"http://{form.decode()}.example"}) == {
            "origin": "http://[REDACTED].example"
        }
    assert r.sub(b"x " + tok.lower() + b" y") == b"x [REDACTED] y"


def test_a_hex_or_uuid_value_is_redacted_from_a_body_in_either_case() -> None:
    """A value whose letters are all hex digits is the same credential in either case: its raw
    form is matched lower- and upper-cased in bodies too, streamed or not, with its escapes,
    however short.  A short value with any other letter keeps its case in bodies."""
    for tok in (b"9f86d081884c7d65", b"3F2504E0-4F89-11D3-9A0C-0305E82C3301"):
        for echo in (tok.lower(), tok.upper(), tok.swapcase()):
            body = b'{"t": "' + echo.replace(b"-", b"\\u002D") + b'"} ' + echo + b" x"
            assert Redactor([tok]).sub(body) == b'{"t": "[REDACTED]"} [REDACTED] x'
            assert _chunked(Redactor([tok]), body, [3, 17, 30]) == Redactor([tok]).sub(body)
    assert Redactor([b"1234567890"]).sub(b"1234567890") == b"[REDACTED]"  # no letter, no case
    assert Redactor([b"dead"]).sub(b"DeAd") == b"[REDACTED]"
    alnum = b"9f86d0z"  # a "z", and short: case is part of the value
    assert Redactor([alnum]).sub(alnum.upper()) == alnum.upper()


def test_a_url_holds_the_secret_in_any_form_case_or_percent_encoding_depth() -> None:
    tok = b"Tok-Ab3Xy9Zq-Cd7"
    r = Redactor([tok])
    b64 = base64.urlsafe_b64encode(b'{"t":"' + tok + b'"}').decode().rstrip("=")
    twice = urllib.parse.quote(urllib.parse.quote(tok.decode().lower(), safe=""), safe="")
    for url in (f"http://h/?s={b64}", f"http://h/?n={twice}", f"http://{tok.hex()}.h/"):
        assert r.holds(url)
    assert not r.holds("http://h/?s=Tok-Ab3Xy9Zq")
    assert not Redactor([]).holds(f"http://h/?s={tok.decode()}")


_UMLAUT = "p\u00e4sswort-geheim-9"
_HEAD_LINES = (
    # The echo as a header field arrives (UTF-8 bytes read as latin-1), one "-" as %252D.
    "x: " + _UMLAUT.encode().decode("latin-1").replace("-", "%252D", 1),
    # Percent-encoded UTF-8, the same "-": decoded as bytes, %C3%A4 is the secret's two bytes.
    "x: " + urllib.parse.quote(_UMLAUT).replace("-", "%252D", 1),
    "y: %E2%82%AC",  # decodes past U+00FF
    "w: \u20ac caf\u00e9",  # past U+00FF as it stands
    "x: " + _UMLAUT,  # the secret's characters, not its bytes: no form
    "z: a+b%2Bc",
    "v: " + base64.b64encode(_UMLAUT.encode()).decode(),
)


def test_a_heads_lines_asked_at_once_answer_as_each_asked_alone() -> None:
    """``holds_any`` (a response head's lines, one search) answers what ``holds`` of each line
    does: a line past U+00FF (decoded or as it stands) changes no other line's bytes."""
    r = Redactor([_UMLAUT.encode()])
    alone = [r.holds(line) for line in _HEAD_LINES]
    assert alone == [True, True, False, False, False, False, True]
    for n in (1, 2, 3):
        for lines in itertools.permutations(_HEAD_LINES, n):
            assert r.holds_any(lines) == any(map(r.holds, lines)), lines


def test_text_holding_a_form_only_once_percent_decoded_is_replaced_whole() -> None:
    slashed = Redactor([b"Tok/Ab3+Xy9Zq"])
    inner = urllib.parse.quote("/a?t=Tok/Ab3+Xy9Zq", safe="")
    assert slashed.scrub_text(f"https://o/l?r={urllib.parse.quote(inner)}") == "[REDACTED]"
    assert slashed.scrub_text("https://o/l?r=%2Fa%3Ft%3DTok") == "https://o/l?r=%2Fa%3Ft%3DTok"


def test_scrubbing_the_same_strings_again_gives_the_same_answer_and_keeps_no_secret() -> None:
    """Clean short strings are remembered per credential (every call scrubs the same header
    names); a string holding the secret is redacted every time and never remembered."""
    tok = b"tok-memo-5e3f1a"
    leaky = f"Bearer {tok.decode()}"
    for _ in range(3):
        r = Redactor([tok])  # a new redactor per call, as the engine makes, same plan
        assert r.scrub_text(leaky) == "Bearer [REDACTED]"
        assert r.scrub({"content-type": "text/plain", leaky: leaky}) == {
            "content-type": "text/plain",
            "Bearer [REDACTED]": "Bearer [REDACTED]",
        }
    plan = r._plan
    assert plan is not None
    assert "text/plain" in plan.clean
    assert not any(tok.decode() in text for text in plan.clean)


class _Label(str):
    """A ``str`` subclass (as a ``StrEnum`` member is): scrubbed as text, never taken as clean."""


def _reference_scrub(r: Redactor, value: object) -> object:
    """What ``scrub`` must give: every string (keys too) through ``scrub_text``, containers
    rebuilt (tuples as lists), anything else as it is."""
    if isinstance(value, str):
        return r.scrub_text(value)
    if isinstance(value, dict):
        return {_reference_scrub(r, k): _reference_scrub(r, v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_reference_scrub(r, v) for v in value]
    return value


_TOK = "tok-walk-9c1e77"
_TEXTS = st.sampled_from(["content-type", "OK", "", _TOK, f"Bearer {_TOK}", "x" * 300]) | st.text(
    max_size=8
)
_LEAF = (
    _TEXTS
    | _TEXTS.map(_Label)
    | st.integers()
    | st.floats(allow_nan=False)
    | st.booleans()
    | st.none()
)
_JSONISH = st.recursive(
    _LEAF,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(_TEXTS | _TEXTS.map(_Label), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=_JSONISH)
def test_scrub_walks_every_string_of_a_value_as_scrub_text_does(value: object) -> None:
    """The walk answers remembered clean strings and numbers inline (issue 15): it must give
    what scrubbing every string one by one gives -- twice, so the second walk meets the
    strings the first remembered -- and a string subclass is scrubbed, not taken as clean."""
    r = Redactor([_TOK.encode()])
    want = _reference_scrub(Redactor([_TOK.encode()]), value)
    for _ in range(2):
        got = r.scrub(value)
        assert got == want
        assert _TOK not in json.dumps(got)


def test_a_string_subclass_holding_the_secret_is_redacted_where_plain_text_is_clean() -> None:
    r = Redactor([_TOK.encode()])
    assert r.scrub({"k": "clean"}) == {"k": "clean"}  # "clean" is now remembered
    leaky = _Label(f"clean {_TOK}")
    assert r.scrub({"k": [leaky], leaky: 1}) == {
        "k": ["clean [REDACTED]"],
        "clean [REDACTED]": 1,
    }


def test_header_text_is_matched_as_the_bytes_it_arrived_as() -> None:
    """Header values arrive as bytes decoded latin-1: a UTF-8 secret echoed in one is mojibake
    text whose latin-1 bytes are the secret's UTF-8 bytes."""
    tok = "pässwörd-1234".encode()
    arrived = (b"x " + tok).decode("latin-1")
    assert Redactor([tok]).scrub_text(arrived) == "x [REDACTED]"


def test_a_pem_key_is_redacted_whole_and_line_by_line() -> None:
    body = base64.b64encode(os.urandom(300)).decode()
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    key = (
        "-----BEGIN OPENSSH PRIVATE KEY-----\n" + "\n".join(lines) + "\n-----END OPENSSH "
        "PRIVATE KEY-----\n"
    ).encode()
    r = Redactor([key])
    assert r.sub(b"<" + key + b">") == b"<[REDACTED]>"
    # `head -3 key`: the first lines alone are secret too.
    partial = "\n".join(lines[1:3]).encode()
    out = r.sub(partial)
    assert all(line.encode() not in out for line in lines[1:3])


def test_a_long_value_is_redacted_raw_and_as_whole_base64() -> None:
    jwt = base64.urlsafe_b64encode(os.urandom(LONG_VALUE)).rstrip(b"=")
    r = Redactor([jwt])
    for shown in (jwt, base64.b64encode(jwt), base64.urlsafe_b64encode(jwt).rstrip(b"=")):
        assert r.sub(b"a " + shown + b" b") == b"a [REDACTED] b"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([b"", b"tok3n-abcdef", b"Bearer tok3n-abcdef", b"s3cret!!"])))
def test_a_tuple_of_values_gets_the_plan_of_its_sorted_nonempty_set(values: list[bytes]) -> None:
    """``Redactor`` looks a tuple's plan up by the tuple as given (``_plan_for``): the same
    plan as the sorted set of its non-empty values, whatever the order, duplicates or empties
    -- and the same plan object as any other iterable of those values gets."""
    want = _plan(tuple(sorted({v for v in values if v})))
    assert _plan_for(tuple(values)) is want
    assert _plan_for(list(values)) is want
    assert _plan_for(iter(values)) is want
    assert _plan_for(tuple(reversed(values))) is want
    assert Redactor(tuple(values))._plan is want


def test_a_tuple_that_cannot_be_a_key_is_refused_as_any_iterable_is() -> None:
    values = (bytearray(b"tok3n-abcdef"), b"tok3n-abcdef")  # unhashable member
    with pytest.raises(TypeError):
        _plan_for(values)
    with pytest.raises(TypeError):
        _plan_for(list(values))


def test_a_number_bool_or_none_is_scrubbed_without_the_walk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 15: a value that holds no text cannot hold a secret -- ``scrub`` returns it as
    is, without entering the walk (a dozen such facts per call); anything else is walked."""
    r = Redactor([_TOK.encode()])

    def no_walk(value: object, clean: object) -> object:
        raise AssertionError("walked a value that holds no text")

    monkeypatch.setattr(r, "_walk", no_walk)
    for leaf in (0, 7, 2.5, True, False, None):
        assert r.scrub(leaf) is leaf
    with pytest.raises(AssertionError, match="walked"):
        r.scrub([1])


def test_fresh_shares_the_plan_without_looking_one_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 15: ``fresh`` (once per stream of every call) copies the plan it shares; it does
    not build a redactor of no values first (a lookup in the plan cache, under its lock)."""
    import affidavit.secrets.redaction as redaction

    r = Redactor([_TOK.encode()])

    def no_lookup(secrets: object) -> object:
        raise AssertionError("fresh looked a plan up")

    monkeypatch.setattr(redaction, "_plan_for", no_lookup)
    other = r.fresh()
    assert other._plan is r._plan and other.pending == b"" and not other.changed
    assert other.feed(b"x " + _TOK.encode() + b" y") + other.flush() == b"x [REDACTED] y"
    assert other.changed and not r.changed


def test_the_patterns_built_from_a_credential_are_not_left_in_re_s_cache() -> None:
    """A plan's patterns spell the credential out in every form (docs/redaction.md); ``re``
    keeps the sources of the patterns compiled through it in a module-wide cache, which would
    hold them past the plan (docs/security.md, "Credential lifetime": until the credential
    rotates or the broker closes).  Read directly (there is no public view of the cache)."""
    import re

    caches = [getattr(re, name) for name in ("_cache", "_cache2") if hasattr(re, name)]
    # Every CPython the broker supports (3.11+) has one; a Python without it fails here, for
    # this test to be rewritten against what that Python keeps -- never skipped silently.
    assert caches, "this Python's re keeps no pattern cache where this test looks"

    def cached() -> set[object]:
        return {key[1] for cache in caches for key in list(cache) if isinstance(key, tuple)}

    probe = rb"probe-" + os.urandom(6).hex().encode()
    re.compile(probe)
    assert probe in cached()  # the probe sees what re's cache holds
    tok = b"Cache-" + base64.b32encode(os.urandom(10))  # long: every form, any case
    short = b"sh" + os.urandom(3).hex().encode()  # short: exact case; its own text pattern
    r = Redactor([tok, short])
    assert r.sub(b"x " + base64.b64encode(tok) + b" %s y" % short) == b"x [REDACTED] [REDACTED] y"
    assert r.scrub_text(f"x {short.decode().upper()} {tok.decode().lower()} y") == (
        "x [REDACTED] [REDACTED] y"
    )
    plan = r._plan
    assert plan is not None
    built = [plan.pattern, plan.pattern_any_case, *(p for _, p in plan.escapes)]
    assert len(built) >= 3
    assert cached().isdisjoint(p.pattern for p in built)
