"""What a remote, a caller or an operator's name put in the journal renders inert on an
invocation's page (docs/console.md, "What it shows"): the response's header names and values
and its reason phrase (the result's ``meta_text``), the timeline's attributes, a RECONCILED
event's observer and the operator's name in the page's header -- HTML escaped, controls and
bidi overrides shown as escapes, never as markup or as characters that reorder what the
operator reads.

The console is served in this process as the daemon serves it (a real loopback socket)."""

from __future__ import annotations

import dataclasses
import html
import re
from pathlib import Path

import pytest
import trio

from affidavit.approvals import Operator
from tests.broker.helpers import http_target, open_broker
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import WAIT, csrf_of, get, operator_config, post, served

SCRIPT = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


def _inert(page: str) -> None:
    """No markup but the console's own: nothing a stranger wrote opens a tag."""
    assert SCRIPT not in page and "<b>OK" not in page and "<i>" not in page
    assert "\u202e" not in page and "\x01" not in page and "\x1b" not in page


async def test_a_remote_s_headers_and_reason_phrase_render_inert(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reply = Reply(
        200,
        headers=[("X-Evil'&", SCRIPT + "\x01"), ("X-Two", SCRIPT)],
        body=b"ok",
        reason=b"<b>OK</b> \xe2\x80\xae",  # UTF-8 of U+202E, read as latin-1 by HTTP
    )
    async with HostileServer.running(scripts.serve(reply)) as srv:
        path = operator_config(tmp_path, monkeypatch, {"api": http_target(srv.url)})
        with trio.fail_after(WAIT):
            async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
                env = await b.call({"target": "api", "method": "GET", "path": "/r"})
                iid = env["invocation_id"]
                assert env["result"]["status"] == 200, env
                token, _ = console.tokens.mint(Operator.current())
                _, headers, _ = await post(f"{origin}/login", {"token": token}, {"Origin": origin})
                cookie = headers["set-cookie"].split(";")[0]
                status, _, body = await get(f"{origin}/invocations/{iid}", cookie=cookie)
    assert status == 200
    page = body.decode()
    _inert(page)
    meta = page[page.index("<h2>Stored result") :]
    # The header name (its quote and ampersand), the value with its control, the reason.
    assert "&#34;X-Evil&#39;&amp;&#34;" in meta
    assert f"&#34;{ESCAPED}\\u0001&#34;" in meta and f"&#34;{ESCAPED}&#34;" in meta
    assert "&#34;reason&#34;: &#34;&lt;b&gt;OK&lt;/b&gt; \\u00e2\\u0080\\u00ae&#34;" in meta
    # The timeline's attributes hold the response's header names too: escaped there as well.
    timeline = page[page.index('id="timeline"') : page.index("<h2>Evidence")]
    assert "x-evil&#39;&amp;" in timeline.lower()


async def test_an_observer_and_a_note_render_inert_in_the_timeline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator whose name (``RECONCILED``'s observer, ``operator:uid=N(name)``) and note
    are hostile attests an unknown call's outcome: both render as text."""
    name = "<i>ops</i>\u202e\x1b[31m"
    note = f'{SCRIPT} & "checked"'  # (a note with a control or an override is refused)
    async with HostileServer.running(scripts.apply_then_close()) as srv:
        path = operator_config(tmp_path, monkeypatch, {"api": http_target(srv.url)})
        with trio.fail_after(WAIT):
            async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
                env = await b.call({"target": "api", "method": "POST", "path": "/r"})
                iid = env["invocation_id"]
                assert env["error"]["outcome"] == "unknown", env
                me = dataclasses.replace(Operator.current(), name=name)
                token, _ = console.tokens.mint(me)
                _, headers, _ = await post(f"{origin}/login", {"token": token}, {"Origin": origin})
                cookie = headers["set-cookie"].split(";")[0]
                csrf = await csrf_of(origin, cookie)
                form = {"csrf": csrf, "how": "committed", "note": note}
                status, _, _ = await post(
                    f"{origin}/invocations/{iid}/reconcile",
                    form,
                    {"Origin": origin, "Cookie": cookie},
                )
                assert status == 303
                status, _, body = await get(f"{origin}/invocations/{iid}", cookie=cookie)
    assert status == 200
    page = body.decode()
    _inert(page)
    [row] = [r for r in page.split('<tr class="event"') if 'data-kind="RECONCILED"' in r]
    # The observer: escaped, each control and override a marked escape.
    observer = re.findall(r"<td>(operator:uid=[^\n]*?)</td>", row)
    assert observer, row
    assert observer[0].startswith(f"operator:uid={me.uid}(&lt;i&gt;ops&lt;/i&gt;")
    assert '<span class="ctl" title="U+202E">\\u202e</span>' in observer[0]
    assert '<span class="ctl" title="U+001B">\\u001b</span>' in observer[0]
    # The attributes: the note as JSON text, escaped.
    assert f"{ESCAPED} &amp; \\&#34;checked\\&#34;" in row
    assert SCRIPT in html.unescape(row)  # as text, not as markup (``_inert``)
    # The name the page's header shows for the operator logged in: the same escapes.
    who = re.search(r'<span id="operator">(.*?)</span>\n', page)
    assert who is not None and '&lt;i&gt;ops&lt;/i&gt;<span class="ctl"' in who.group(1)
