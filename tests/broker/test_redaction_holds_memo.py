"""``Redactor.holds_any`` remembers the texts it found holding no form (``_Plan.unheld``, issue
15: every response's head lines are asked each call, mostly the same few).  A remembered text
is not searched again, and no answer changes: warmed by any earlier questions, ``holds_any``
says what the full search (``_decoded_hold`` of the texts' bytes) says.
"""

from __future__ import annotations

import base64
import urllib.parse
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.secrets import redaction
from affidavit.secrets.redaction import Redactor, clear_plans

from .encoders import SECRETS

TOKEN = b"tok-6YgyY0Jc8EKXC0JVUPImH2Tmks"


def _full(r: Redactor, texts: list[str]) -> bool:
    plan = r._plan
    assert plan is not None
    return redaction._decoded_hold(plan, {redaction._text_bytes(t)[0] for t in texts})


def _lines(secret: bytes) -> st.SearchStrategy[str]:
    s = secret.decode("latin-1")
    echo = st.sampled_from(
        [
            s,
            s.upper(),
            base64.b64encode(secret).decode(),
            urllib.parse.quote(urllib.parse.quote(s, safe=""), safe=""),
            secret.hex(),
        ]
    )
    plain = st.sampled_from(["OK", "content-type: application/json", "content-length: 13"])
    return plain | st.text(max_size=20) | echo | st.tuples(st.text(max_size=6), echo).map("".join)


@settings(max_examples=150, deadline=None)
@given(secret=SECRETS, data=st.data())
def test_a_warmed_memo_answers_as_the_full_search(secret: bytes, data: st.DataObject) -> None:
    clear_plans()
    r = Redactor([secret])
    for _ in range(data.draw(st.integers(1, 5))):
        texts = data.draw(st.lists(_lines(secret), min_size=1, max_size=4))
        assert r.holds_any(texts) == _full(r, texts), texts
        assert r.holds_any(texts) == _full(r, texts), texts  # the second time, from the memo


def test_clean_head_lines_are_searched_once() -> None:
    clear_plans()
    r = Redactor([TOKEN])
    lines = ["OK", "content-type: application/json", "content-length: 13"]
    search = mock.Mock(wraps=redaction._decoded_hold)
    with mock.patch.object(redaction, "_decoded_hold", search):
        assert not r.holds_any(lines)
        assert not r.holds_any(lines)
        assert not Redactor([TOKEN]).holds_any(lines)  # the plan's memo: another call's redactor
        assert search.call_count == 1
        echoed = [*lines, "x-echo: " + base64.b64encode(TOKEN).decode()]
        assert r.holds_any(echoed) and r.holds_any(echoed)  # a holding text is never remembered
        assert search.call_count == 3
