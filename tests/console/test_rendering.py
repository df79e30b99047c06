"""What the Approvals page shows of a request (docs/console.md, "What it shows"): everything the
approval view holds -- headers unmasked, bodies whole (in the page's flow: test_whole_view.py),
withheld content said to be withheld with its size and hash -- and every control, bidi or
zero-width character as a visible escape; one request that cannot be rendered is its own row's
error, never the page's.

The console is served in this process as the daemon serves it (a real loopback socket)."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from affidavit.api.broker import Broker
from affidavit.approvals import Operator, OperatorPolicy
from affidavit.console import pages, visible
from tests.broker.helpers import http_target, open_broker

from .kit import (
    Browser,
    approval_card,
    get,
    log_in_to,
    operator_config,
    pending_approval,
    post,
    served,
)


@pytest.fixture
async def world(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Broker, str, Any, str]]:
    """A broker whose ``pay`` asks approval for POSTs (answered pending at once), its console
    served here, and this process's user logged in: (broker, origin, console, cookie)."""
    target = http_target("http://127.0.0.1:9", approval={"methods": ["POST"], "wait": "0s"})
    path = operator_config(tmp_path, monkeypatch, {"pay": target})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, _ = await log_in_to(console, origin)
        yield b, origin, console, cookie


async def test_headers_are_shown_unmasked_and_bodies_whole(
    world: tuple[Broker, str, Any, str],
) -> None:
    b, origin, _, cookie = world
    body = "".join(f"line {i:05d}\n" for i in range(1000)) + "THE END"  # 11,007 characters
    headers = {"X-Session-Token": "agent-chose-this", "X-Api-Secret-Note": "pay twice"}
    text_id = await pending_approval(b, headers=headers, body=body)
    blob = bytes(range(256)) * 4
    binary_id = await pending_approval(b, body_base64=base64.b64encode(blob).decode())
    huge = "y" * 20_000  # more than the approval view keeps (16 KiB)
    huge_id = await pending_approval(b, body=huge)
    status, _, page = await get(f"{origin}/approvals", cookie=cookie)
    assert status == 200
    card = approval_card(page, text_id)
    assert "x-session-token: agent-chose-this" in card  # no "(hidden)"
    assert "x-api-secret-note: pay twice" in card and "(hidden)" not in card
    assert "line 00000" in card and "line 00999" in card and "THE END" in card
    assert f"{len(body)} bytes" in card
    card = approval_card(page, binary_id)
    assert "binary: not shown" in card and f"{len(blob)} bytes" in card
    assert hashlib.sha256(blob).hexdigest() in card
    card = approval_card(page, huge_id)
    assert "larger than the approval view keeps: not shown" in card and "yyyy" not in card
    assert hashlib.sha256(huge.encode()).hexdigest() in card
    assert b"canary-never-shown" not in page


async def test_bidi_control_and_zero_width_characters_are_shown_as_escapes(
    world: tuple[Broker, str, Any, str],
) -> None:
    b, origin, _, cookie = world
    body = "pay \u202eEVIL\u202c to \u200bbob\x1b[2J\u2066x\u2069"
    iid = await pending_approval(b, body=body)
    status, _, page = await get(f"{origin}/approvals", cookie=cookie)
    assert status == 200
    card = approval_card(page, iid)
    for char in ("\u202e", "\u202c", "\u200b", "\x1b", "\u2066", "\u2069"):
        assert char not in card, repr(char)
    for escape in (r"\u202e", r"\u202c", r"\u200b", r"\u001b", r"\u2066", r"\u2069"):
        assert f'<span class="ctl" title="U+{escape[2:].upper()}">{escape}</span>' in card
    assert "EVIL" in card and "bob" in card


async def test_two_bodies_differing_by_an_invisible_character_look_different(
    world: tuple[Broker, str, Any, str],
) -> None:
    b, origin, _, cookie = world
    benign = await pending_approval(b, body='{"amount": 5000, "dry_run": true}')
    for mark in ("\u034f", "\ufe0f", "\u3164", "\u2800", "\u00a0"):
        iid = await pending_approval(b, body=f'{{"amount": 5000, "dry_run{mark}": true}}')
        status, _, page = await get(f"{origin}/approvals", cookie=cookie)
        assert status == 200
        card, plain = approval_card(page, iid), approval_card(page, benign)
        assert mark not in card, hex(ord(mark))
        shown = f'<span class="ctl" title="U+{ord(mark):04X}">\\u{ord(mark):04x}</span>'
        assert f"dry_run{shown}" in card and "dry_run&#34;: true" in plain


TAIL_BOX = """
const [card, field, tail] = arguments;
const cell = document.querySelector(`#approval-${card} tr.field[data-field=${field}] td`);
const walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
for (let node = walk.nextNode(); node; node = walk.nextNode()) {
  const at = node.textContent.indexOf(tail);
  if (at < 0) continue;
  const range = document.createRange();
  range.setStart(node, at); range.setEnd(node, at + tail.length);
  const box = range.getBoundingClientRect();
  return {right: box.right, inner: innerWidth, page: document.documentElement.scrollWidth};
}
return null;
"""
"""Where on screen the text ``tail`` of card ``card``'s field ``field`` is drawn."""


async def test_the_tail_of_a_long_url_and_header_is_within_the_window(
    world: tuple[Broker, str, Any, str], chrome: Browser
) -> None:
    """A URL padded with 6000 unbreakable characters laid its tail 50,910 px right of a
    1280 px window, the approve button in view: it wraps now, marked with its length."""
    b, origin, console, _ = world
    path = f"/v1/reports?view=summary&pad={'a' * 6000}&then=DELETE_ALL_ACCOUNTS"
    header = "x" * 3000 + "-override-DELETE"
    iid = await pending_approval(b, path=path, headers={"X-Mode": header}, body="{}")
    status, _, page = await get(f"{origin}/approvals", cookie=world[3])
    assert status == 200
    card = approval_card(page, iid)
    url = f"http://127.0.0.1:9{path}"
    assert f'<span class="long">({len(url)} characters)</span>' in card
    assert f'<span class="long">({len(header)} characters)</span>' in card
    token, _ = console.tokens.mint(Operator.current())
    await chrome.log_in(f"{origin}/login?token={token}")
    await chrome.get(f"{origin}/approvals")
    for field, tail in (("url", "&then=DELETE_ALL_ACCOUNTS"), ("headers", "-override-DELETE")):
        box = await chrome.run(lambda d, f=field, t=tail: d.execute_script(TAIL_BOX, iid, f, t))
        assert box is not None, field
        assert box["right"] <= box["inner"] and box["page"] <= box["inner"], (field, box)


CELL_TEXT = """
const [card, field] = arguments;
const cell = document.querySelector(`#approval-${card} tr.field[data-field=${field}] td`);
const range = document.createRange();
range.selectNodeContents(cell);
const selection = getSelection();
selection.removeAllRanges();
selection.addRange(range);
return {shown: cell.innerText, copied: selection.toString()};
"""
"""What card ``card``'s field ``field`` shows (``innerText``: spaces as laid out) and what
selecting the whole cell copies."""


async def test_a_value_s_spaces_show_and_its_length_mark_is_not_part_of_it(
    world: tuple[Broker, str, Any, str], chrome: Browser
) -> None:
    """Two spaces in a row showed as one (white-space: normal), and the length mark sat inside
    the header value's <code>: copying the value took "(3016 characters) " with it, text an
    agent can write into a value itself."""
    b, origin, console, cookie = world
    spaced = "keep  two   spaces"
    header = "x" * 3000 + "-override"
    iid = await pending_approval(
        b, path="/v1/a", headers={"X-Spaced": spaced, "X-Long": header}, body="{}"
    )
    status, _, page = await get(f"{origin}/approvals", cookie=cookie)
    assert status == 200
    card = approval_card(page, iid)
    mark = f'<span class="long">({len(header)} characters)</span>'
    assert mark in card and f"{mark}<code>" in card  # before the value's <code>, not in it
    token, _ = console.tokens.mint(Operator.current())
    await chrome.log_in(f"{origin}/login?token={token}")
    await chrome.get(f"{origin}/approvals")
    cell = await chrome.run(lambda d: d.execute_script(CELL_TEXT, iid, "headers"))
    assert f"x-spaced: {spaced}" in cell["shown"], cell["shown"].replace("x" * 2990, "")
    assert f"x-long: {header}" in cell["copied"]
    assert "characters)" not in cell["copied"], cell["copied"][:80]


def test_visible_escapes_what_reorders_and_keeps_what_is_plain() -> None:
    assert visible("plain <b>text</b> é ü 中") == "plain &lt;b&gt;text&lt;/b&gt; é ü 中"
    assert str(visible("a\nb\tc", multiline=True)) == "a\nb\tc"
    assert "\\n" in visible("a\nb") and "\\t" in visible("a\tb")  # one-line fields
    assert "\\u202e" in visible("\u202e") and "\\u00ad" in visible("\u00ad")
    assert "\\U000e0001" in visible("\U000e0001")  # a language tag (Cf), outside the BMP
    assert "\\U000e0100" in visible("\U000e0100")  # a variation selector (Mn), invisible
    # A mark that changes its letter (an overlay, an enclosing one), or stacks past two.
    assert str(visible("0\u0338")) == '0<span class="ctl" title="U+0338">\\u0338</span>'
    assert "\\u20dd" in visible("1\u20dd") and "e\u0301\u0302" in visible("e\u0301\u0302")
    assert visible("a" + "\u0301" * 300).count('class="ctl"') == 298


async def test_a_request_that_cannot_be_rendered_is_its_own_row_s_error(
    world: tuple[Broker, str, Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    b, origin, _, cookie = world
    good = await pending_approval(b, body="fine")
    real = pages.approvals_page

    def with_a_broken_row(reader: Any) -> dict[str, Any]:
        found = real(reader)
        rows = [{"invocation_id": "act_BROKEN", "expires_at": 0}, *found["rows"]]  # no view
        return {"rows": rows, "total": found["total"] + 1}

    monkeypatch.setattr(pages, "approvals_page", with_a_broken_row)
    status, _, page = await get(f"{origin}/approvals", cookie=cookie)
    assert status == 200
    broken = approval_card(page, "act_BROKEN")
    assert "could not be shown here" in broken and "UndefinedError" in broken
    assert 'class="approve"' not in broken and 'class="deny"' in broken
    assert 'class="approve"' in approval_card(page, good)


async def test_an_operator_removed_from_the_policy_loses_the_session_at_once(
    world: tuple[Broker, str, Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    b, origin, _, cookie = world
    iid = await pending_approval(b, body="x")
    csrf = re.search(
        rb'name="csrf" value="([^"]+)"', (await get(f"{origin}/approvals", cookie=cookie))[2]
    )
    assert csrf is not None
    nobody = OperatorPolicy(frozenset(), frozenset())
    monkeypatch.setattr(Broker, "operator_policy", property(lambda self: nobody))
    status, headers, _ = await get(f"{origin}/approvals", cookie=cookie)
    assert (status, headers["location"]) == (303, "/login")
    status, _, _ = await post(
        f"{origin}/approvals/{iid}/approve",
        {"csrf": csrf.group(1).decode()},
        {"Origin": origin, "Cookie": cookie},
    )
    assert status == 403
    assert [e.kind.value for e in b.events(iid)][-1] == "APPROVAL_REQUESTED"
    monkeypatch.undo()
    status, _, _ = await get(f"{origin}/approvals", cookie=cookie)
    assert status == 303  # the session ended; it does not come back


async def test_the_page_shows_the_oldest_pending_and_how_many_wait(
    world: tuple[Broker, str, Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page of the oldest (the closest to expiring unseen), never every request a caller
    could have made to bury a real one, and the count of all that wait."""
    b, origin, _, cookie = world
    monkeypatch.setattr(pages, "MAX_APPROVALS", 2)
    action = {"target": "pay", "method": "POST", "path": "/v1/x"}
    ids = [(await b.call({**action, "body": str(n)}, requester=5001)) for n in range(3)]
    first, second, third = (str(e["invocation_id"]) for e in ids)
    status, _, page = await get(f"{origin}/approvals", cookie=cookie)
    assert status == 200
    text = page.decode()
    assert f'id="approval-{first}"' in text and f'id="approval-{second}"' in text
    assert f'id="approval-{third}"' not in text
    assert "3 requests are waiting" in text and "the 2 oldest are shown" in text
    await b.deny(first, note="no")  # this process's user is the operator here (5001 asked)
    status, _, page = await get(f"{origin}/approvals", cookie=cookie)
    assert f'id="approval-{third}"' in page.decode() and "2 waiting, oldest first" in page.decode()
