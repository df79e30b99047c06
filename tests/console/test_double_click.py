"""The double-click attack on the console (audit51b item 1, /tmp/audit-audit51b/doubleclick.py):
a page an agent serves on another port of 127.0.0.1 -- the same *site* as the console, a site
ignores ports -- sends the operator's tab to /approvals on the first click's mousedown, and the
second click lands on the approve button.  Two layers stop it (docs/console.md, "Security
model"): the server renders a page another page navigated to (``Sec-Fetch-Site`` ``same-site``
or ``cross-site``) with its decision buttons disabled and a token that decides nothing; the
console's script arms the buttons of any page only once it has been visible ~1 s and the
pointer has moved over it.  The operator's own flow -- the console opened directly, a moment,
a click -- still decides."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import trio

from tests.daemon.kit import wait_until

from .kit import CHARGE, Browser, World, console_world, csrf_of, get, log_in, post, refusal

SAME_SITE = {
    "Sec-Fetch-Site": "same-site",
    "Sec-Fetch-Mode": "navigate",
    "Sec-Fetch-Dest": "document",
}


@contextmanager
def _hostile(page: Callable[[], str]) -> Iterator[str]:
    """The agent's page, served on another loopback port: its origin."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def _pending(world: World, iid: str) -> bool:
    return any(r["invocation_id"] == iid for r in await world.pending())


async def test_the_double_click_from_a_same_site_page_approves_nothing(
    tmp_path: Path, token: str, chrome: Browser
) -> None:
    from selenium.webdriver.common.actions.action_builder import ActionBuilder
    from selenium.webdriver.common.by import By

    async with console_world(tmp_path, token, wait="60s") as world:
        await chrome.log_in(await world.login_url())
        await wait_until(lambda: chrome.count("#operator"), "logged in")
        caller = await world.caller(CHARGE)
        iid = await world.one_pending()
        button = f"#approval-{iid} button.approve"
        await chrome.get(f"{world.origin}/approvals")
        rect = await chrome.run(lambda d: d.find_element(By.CSS_SELECTOR, button).rect)
        x, y = int(rect["x"] + rect["width"] / 2), int(rect["y"] + rect["height"] / 2)
        decoy = (
            '<!doctype html><html><body style="margin:0"><h1>Verify you are human</h1>'
            f'<button id="decoy" style="position:absolute;left:{x - 80}px;top:{y - 20}px;'
            'width:160px;height:40px">double-click here</button><script>'
            "document.getElementById('decoy').addEventListener('mousedown',"
            f"() => {{ location = '{world.origin}/approvals'; }});</script></body></html>"
        )

        def click_at(d: object) -> None:
            actions = ActionBuilder(d)
            actions.pointer_action.move_to_location(x, y).click()
            actions.perform()

        with _hostile(lambda: decoy) as hostile:
            await chrome.get(f"{hostile}/")
            await chrome.run(click_at)  # the first click: the tab goes to /approvals
            await wait_until(lambda: chrome.count(button), "the console page is loaded")
            assert await chrome.count("#opened-elsewhere") == 1
            assert "reload this page to decide" in await chrome.text("#opened-elsewhere")
            await chrome.run(click_at)  # the second: on a disabled button
            await trio.sleep(1)  # (a submitted form would be answered well within it)
            assert await chrome.count("#decided") == 0
            assert (
                await chrome.run(lambda d: d.find_element(By.CSS_SELECTOR, button).is_enabled())
                is False
            )
            assert await _pending(world, iid) and world.pay.requests == []

        # Reloaded (the page's link: the console's own navigation), the operator decides.
        await chrome.click("#reload")
        await wait_until(lambda: chrome.count(button), "the page reloaded")
        assert await chrome.count("#opened-elsewhere") == 0
        await chrome.decide(button)
        await wait_until(lambda: chrome.count("#decided"), "the decision is confirmed")
        with trio.fail_after(60):
            assert await caller.wait() == 0
        assert len(world.pay.requests) == 1


async def test_a_held_page_s_links_keep_it_held_and_its_reload_waits_for_the_operator(
    tmp_path: Path, token: str, chrome: Browser
) -> None:
    """The triple click (review confix51 item 1): another page sends the tab to /approvals,
    the second click follows a link of that held page -- the console's own navigation -- and
    the third lands on approve.  The page the link opens is still held by the server (its
    buttons rendered disabled, its token deciding nothing), and the held page's reload link has
    no address until the script arms it; a browser reload keeps it held too.  The operator at
    the page reloads it with the link and decides."""
    from selenium.webdriver.common.by import By

    async with console_world(tmp_path, token, wait="60s") as world:
        await chrome.log_in(await world.login_url())
        await wait_until(lambda: chrome.count("#operator"), "logged in")
        caller = await world.caller(CHARGE)
        iid = await world.one_pending()
        button = f"#approval-{iid} button.approve"
        decoy = f'<!doctype html><a id="go" href="{world.origin}/approvals">prize</a>'

        async def follow(step: Callable[[Any], object]) -> None:
            await chrome.run(lambda d: d.execute_script("window.before = 1"))
            await chrome.run(step)

            async def loaded() -> bool:
                fresh = await chrome.run(lambda d: d.execute_script("return !window.before"))
                return bool(fresh) and await chrome.count(button) == 1

            await wait_until(loaded, "the next page is loaded")

        def token_of(d: Any) -> str:
            return str(d.find_element(By.CSS_SELECTOR, 'input[name="csrf"]').get_attribute("value"))

        def reload_address(d: Any) -> str | None:
            return d.find_element(By.CSS_SELECTOR, "#reload").get_attribute("href")

        with _hostile(lambda: decoy) as hostile:
            await chrome.get(f"{hostile}/")
            await follow(lambda d: d.find_element(By.CSS_SELECTOR, "#go").click())
        assert await chrome.count("#opened-elsewhere") == 1
        assert await chrome.run(reload_address) is None  # (no pointer move yet: not armed)
        # The second click: the page's own nav link.  What it opens is held by the server.
        await follow(lambda d: d.find_element(By.CSS_SELECTOR, 'nav a[href="/approvals"]').click())
        assert await chrome.count("#opened-elsewhere") == 1
        assert await chrome.run(reload_address) is None
        held_token = await chrome.run(token_of)
        await chrome.run(lambda d: d.find_element(By.CSS_SELECTOR, button).click())  # the third
        await trio.sleep(1)  # (a submitted form would be answered well within it)
        assert await chrome.count("#decided") == 0
        assert await _pending(world, iid) and world.pay.requests == []
        # A reload by the browser (chromium sends it same-site again) keeps it held.
        await follow(lambda d: d.refresh())
        assert await chrome.count("#opened-elsewhere") == 1

        # The operator at the page: the pointer moves, the reload link gets its address.
        def armed(d: Any) -> bool:
            from selenium.webdriver.common.action_chains import ActionChains

            link = d.find_element(By.CSS_SELECTOR, "#reload")
            ActionChains(d).move_to_element_with_offset(link, 1, 0).move_to_element(link).perform()
            return reload_address(d) is not None

        await wait_until(lambda: chrome.run(armed), "the reload link is armed")
        await follow(lambda d: d.find_element(By.CSS_SELECTOR, "#reload").click())
        assert await chrome.count("#opened-elsewhere") == 0
        assert await chrome.run(token_of) != held_token  # (the held page's decided nothing)
        await chrome.decide(button)
        await wait_until(lambda: chrome.count("#decided"), "the decision is confirmed")
        with trio.fail_after(60):
            assert await caller.wait() == 0


async def test_the_buttons_wait_for_the_page_to_be_seen_and_the_pointer_to_move(
    tmp_path: Path, token: str, chrome: Browser
) -> None:
    """The script's layer: a page the operator opened directly is rendered enabled, and its
    buttons are still held until a real pointer move after ~1 s visible -- a still pointer
    arms nothing, however long the page is shown."""
    from selenium.webdriver.common.by import By

    async with console_world(tmp_path, token, wait="60s") as world:
        await chrome.log_in(await world.login_url())
        await wait_until(lambda: chrome.count("#operator"), "logged in")
        caller = await world.caller(CHARGE)
        iid = await world.one_pending()
        button = f"#approval-{iid} button.approve"
        await chrome.get(f"{world.origin}/approvals")
        source = await chrome.source()
        assert "opened-elsewhere" not in source  # the server rendered it enabled
        await trio.sleep(1.5)
        enabled = await chrome.run(lambda d: d.find_element(By.CSS_SELECTOR, button).is_enabled())
        assert enabled is False  # held by the script: the pointer has not moved
        await chrome.decide(button)
        await wait_until(lambda: chrome.count("#decided"), "the decision is confirmed")
        with trio.fail_after(60):
            assert await caller.wait() == 0


async def test_a_page_another_page_opened_renders_a_token_that_decides_nothing(
    tmp_path: Path, token: str
) -> None:
    """The server's layer, over plain HTTP: the page of a same-site navigation has its decision
    buttons disabled, says to reload, and its forms' token is refused for a decision
    (``RELOAD_TO_DECIDE``, nothing done) though it still logs out; the page the operator
    opened (``Sec-Fetch-Site: none``) carries the token that decides."""
    async with console_world(tmp_path, token, wait="60s") as world:
        cookie, csrf = await log_in(world)
        caller = await world.caller(CHARGE)
        iid = await world.one_pending()
        status, _, page = await get(f"{world.origin}/approvals", cookie=cookie, headers=SAME_SITE)
        assert status == 200 and b'id="opened-elsewhere"' in page
        assert b"reload this page to decide" in page
        assert page.count(b" data-decide disabled>") == 2  # approve, deny
        import re

        m = re.search(rb'name="csrf" value="([^"]+)"', page)
        assert m is not None
        shown_disabled = m.group(1).decode()
        assert shown_disabled != csrf
        same = {"Origin": world.origin, "Cookie": cookie, "Sec-Fetch-Site": "same-origin"}
        url = f"{world.origin}/approvals/{iid}/approve"
        status, _, page = await post(url, {"csrf": shown_disabled}, same)
        assert (status, refusal(page)) == (403, ("RELOAD_TO_DECIDE", "csrf"))
        assert await _pending(world, iid) and world.pay.requests == []
        for where in ("/journal", f"/invocations/{iid}"):
            _, _, page = await get(world.origin + where, cookie=cookie, headers=SAME_SITE)
            assert b'id="opened-elsewhere"' in page, where
        _, _, page = await get(f"{world.origin}/actions", cookie=cookie, headers=SAME_SITE)
        assert b'id="opened-elsewhere"' not in page  # nothing to decide there
        assert shown_disabled.encode() in page and csrf.encode() not in page

        # A held page's links (its nav, an entry, its reload's plain address) open pages held
        # too: the console's own navigation does not undo it (review confix51 item 1).
        own = {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "navigate"}
        for where in ("/approvals", f"/invocations/{iid}", "/journal"):
            _, _, page = await get(world.origin + where, cookie=cookie, headers=own)
            assert b'id="opened-elsewhere"' in page and csrf.encode() not in page, where
        # The reload link: its address is the script's to give (no href rendered); asked for
        # by another page, it holds; by the console's page, the page comes back enabled.
        assert b'data-reload="/reload?to=%2Fjournal" id="reload"' in page
        assert b'href="/reload' not in page
        # ... and names the page as it was asked for, its query kept (review rv51c2 item 1).
        _, _, page = await get(
            f"{world.origin}/invocations/{iid}?from=0", cookie=cookie, headers=own
        )
        assert f'data-reload="/reload?to=%2Finvocations%2F{iid}%3Ffrom%3D0"'.encode() in page
        for site, held in ((SAME_SITE, True), (own, False)):
            status, head, _ = await get(
                f"{world.origin}/reload?to=%2Fapprovals", cookie=cookie, headers=site
            )
            assert (status, head.get("location")) == (303, "/approvals")
            _, _, page = await get(f"{world.origin}/approvals", cookie=cookie, headers=own)
            assert (b'id="opened-elsewhere"' in page) is held
            assert (csrf.encode() in page) is not held
        for to in ("//elsewhere.example/x", "https://elsewhere.example/", "/\\x", ""):
            status, head, _ = await get(
                f"{world.origin}/reload?to={quote(to, safe='')}", cookie=cookie, headers=own
            )
            assert (status, head.get("location")) == (303, "/approvals"), to
        _, _, page = await get(f"{world.origin}/approvals", cookie=cookie, headers=SAME_SITE)
        assert b'id="opened-elsewhere"' in page  # held again
        # Held, even the address bar's (or a back to a page first opened so: ``none``) is.
        opened = {"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate"}
        _, _, page = await get(f"{world.origin}/approvals", cookie=cookie, headers=opened)
        assert b'id="opened-elsewhere"' in page and csrf.encode() not in page
        await get(f"{world.origin}/reload?to=%2Fapprovals", cookie=cookie, headers=own)

        _, _, page = await get(f"{world.origin}/approvals", cookie=cookie, headers=opened)
        assert b'id="opened-elsewhere"' not in page and b"disabled" not in page
        assert await csrf_of(world.origin, cookie) == csrf
        status, _, _ = await post(url, {"csrf": csrf}, same)
        assert status == 303
        with trio.fail_after(60):
            assert await caller.wait() == 0
        status, _, _ = await post(f"{world.origin}/logout", {"csrf": shown_disabled}, same)
        assert status == 303  # logging out decides nothing: either token
