"""The end-of-text rule's first look (``redaction._form_begun``, issue 15): a text whose last byte
no cut could end on (``_Plan.ends``) is answered without looking for any form's beginning.  That
may change no answer: the rule with the first look must say exactly what the full search
(``_form_begun_scan``) says, for any values and any text -- ends made of every form the plan
derives (raw, base64 and its cores, hex, case variants, a vendor prefix's public bytes), cut
anywhere, in any case, and random bytes.
"""

from __future__ import annotations

import base64
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.secrets import redaction
from affidavit.secrets.redaction import REDACTED, Redactor, secret_forms

from .encoders import SECRETS

VALUES = st.lists(
    SECRETS
    | st.binary(min_size=1, max_size=40)
    | st.builds(lambda b: b.hex().encode(), st.binary(min_size=2, max_size=20))
    | st.builds(lambda p, s: p + s, st.sampled_from([b"ghp_", b"sk_live_", b"xoxb-"]), SECRETS)
    | st.binary(min_size=129, max_size=200),  # longer than LONG_VALUE: literal forms only
    min_size=1,
    max_size=3,
)
CASES = [bytes, bytes.lower, bytes.upper, bytes.swapcase]


def _forms(values: list[bytes]) -> list[bytes]:
    """Every form the plan cuts ends of, and every whole-value form of the values."""
    plan = Redactor(values)._plan
    assert plan is not None
    forms = {form for form, _, _ in plan.starts}
    for v in values:
        forms |= secret_forms(v) | {base64.b64encode(b"Bearer " + v)}
    return sorted(forms)


@settings(max_examples=400, deadline=None)
@given(values=VALUES, data=st.data())
def test_the_first_look_answers_as_the_full_search(
    values: list[bytes], data: st.DataObject
) -> None:
    plan = Redactor(values)._plan
    assert plan is not None
    form = data.draw(st.sampled_from(_forms(values)))
    cut = data.draw(st.integers(0, len(form)))
    case = data.draw(st.sampled_from(CASES))
    head = data.draw(st.binary(max_size=24))
    tail = data.draw(st.sampled_from([b"", b"}", b"\n", b'"', b"..."]) | st.binary(max_size=2))
    for text in (head + case(form[:cut]) + tail, head + case(form[:cut]), head):
        for any_case_all in (False, True):
            fast = redaction._form_begun(plan, text, any_case_all)
            assert fast == redaction._form_begun_scan(plan, text, any_case_all), text


@settings(max_examples=200, deadline=None)
@given(values=VALUES, text=st.binary(max_size=64))
def test_the_first_look_answers_as_the_full_search_on_random_text(
    values: list[bytes], text: bytes
) -> None:
    plan = Redactor(values)._plan
    assert plan is not None
    for any_case_all in (False, True):
        fast = redaction._form_begun(plan, text, any_case_all)
        assert fast == redaction._form_begun_scan(plan, text, any_case_all)


def test_an_end_no_form_holds_is_not_searched() -> None:
    """A JSON body's ``}`` is no byte of any form: ``flush`` answers it without the search; an
    end that is a form's beginning is still searched, cut and recorded ``tail_redacted``."""
    token = b"tok-6YgyY0Jc8EKXC0JVUPImH2Tmks"
    scan = mock.Mock(wraps=redaction._form_begun_scan)
    with mock.patch.object(redaction, "_form_begun_scan", scan):
        r = Redactor([token])
        assert r.feed(b'{"ok":true}') + r.flush() == b'{"ok":true}'
        assert not r.tail_redacted
        assert scan.call_count == 0
        r = Redactor([token])
        assert r.feed(b'{"ok":"' + token[:12]) + r.flush() == b'{"ok":"' + REDACTED
        assert r.tail_redacted
        assert scan.call_count == 1
