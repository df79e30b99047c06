"""``strictjson.members`` -- nesting counted by ``str.count`` and runs (``_closing``), strings
stepped over by a regex in windows (``_string_end``) -- agrees with a reading one character at
a time, on text made to break it: escaped quotes and brackets, runs of backslashes, ``\\u005d``,
astral characters, a stray backslash or quote, groups deeper than ``_RUN``'s 4 levels, windows
of 2 to 7 characters cutting strings, escapes and runs anywhere, the string budget and
``until`` cutting the scan."""

from __future__ import annotations

import contextlib
import json
import random

import pytest

from affidavit import strictjson

SPACE = " \t\n\r"


def string_end(text: str, quote: int) -> int:
    """Just after the string opening at ``quote``, as ``strictjson._string_end`` says it: past
    the end (``len + 1``) when it never closes, at the end after a trailing lone backslash."""
    i = quote + 1
    while i < len(text):
        if text[i] == "\\":
            if i + 1 == len(text):
                return len(text)
            i += 2
        elif text[i] == '"':
            return i + 1
        else:
            i += 1
    return len(text) + 1


def reference(text: str, until: int | None) -> strictjson.Members:
    i = 0
    while i < len(text) and text[i] in SPACE + ",:":
        i += 1
    if i >= len(text) or text[i] != "{":
        return strictjson.Members([], "none")
    stop = len(text) if until is None else until
    found: list[tuple[str | None, int]] = []
    depth, i, strings = 1, i + 1, 0
    while i < stop:
        char = text[i]
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
            if depth == 0:
                whole = text[i + 1 :].strip(SPACE) == ""
                return strictjson.Members(found, "closed" if whole else "more")
        elif char == '"':
            end = string_end(text, i)
            j = end
            while j < len(text) and text[j] in SPACE:
                j += 1
            if depth == 1 and j < len(text) and text[j] == ":":
                j += 1
                while j < len(text) and text[j] in SPACE:
                    j += 1
                name = None
                if end - i <= strictjson.MEMBER_NAME:
                    with contextlib.suppress(ValueError):
                        name = json.loads(text[i:end])
                found.append((name if isinstance(name, str) else None, j))
            strings += 1
            if strings == strictjson.MEMBER_STRINGS:
                return strictjson.Members(found, "cut")
            i = end
            continue
        i += 1
    return strictjson.Members(found, "more" if until is None else "cut")


PARTS = [
    '"', '\\"', "\\\\", "\\", "\\\\\\", '"a\\"]"', '"\\\\"', '"\\u005d"', "\\u005d", '"\U0001f600"',
    "\U0001f600", "[", "]", "{", "}", ":", ",", " ", "\n", "1", "a", '"id"', '"id":', ' "x" : ',
    '{"a":', "[[[[[[", "]]]]]]", "[[[[[[]]]]]]", "[{}]", "[],[]", '"[{"', '"}]"',
]  # fmt: skip


TAILS = ["", "}", "} ", "}\n", "]}", "]]}}", "]]]]]]}", '"}', "}}", "} x", '} {"id":1}']
"""What may close the object, or not, or leave something after it."""


def balance(text: str) -> str:
    """What closes the string ``text`` ends in, if any, and every bracket left open."""
    depth, i, tail = 0, 0, ""
    while i < len(text):
        if text[i] == '"':
            i = string_end(text, i)
            tail = {len(text): 'a"', len(text) + 1: '"'}.get(i, "")
            continue
        depth += (text[i] in "[{") - (text[i] in "]}")
        i += 1
    return tail + "}" * max(depth, 0)


def test_members_agree_with_a_reading_one_character_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = random.Random(20261207)
    for case in range(20_000):  # bounded: about a second
        monkeypatch.setattr(strictjson, "SCAN_CHUNK", 2 + case % 6)
        monkeypatch.setattr(strictjson, "MEMBER_STRINGS", rng.choice([2, 3, 8, 50_000, 50_000]))
        monkeypatch.setattr(strictjson, "MEMBER_NAME", rng.choice([4, 8, 256]))
        head = rng.choice(["{", "{", "{", "{", " ,{", "[", ""])
        body = "".join(rng.choice(PARTS) for _ in range(rng.randrange(0, 40)))
        text = head + body
        text += balance(text) if rng.random() < 0.5 else rng.choice(TAILS)
        until = rng.choice([None, None, rng.randrange(0, len(text) + 1)])
        expected = reference(text, until)
        assert strictjson.members(text, 0, until) == expected, (text, until)
