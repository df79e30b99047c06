"""A daemon serving the operator console, the scripted remotes it calls, and a real headless
chromium (selenium) for the console tests and the screenshot script.

    async with console_world(tmp_path, token) as world:
        world.daemon, world.pay (approval-gated POSTs, answered 200), world.flaky (applies a
        request and hangs up: the outcome is unknown), world.ledger (target ``ledger``: the
        payments API with a reconciliation query), world.origin (http://127.0.0.1:PORT)
        url = await world.login_url()          # affidavit console-url --socket ...

The browser is driven from a worker thread (``Browser.run``): selenium blocks, and the scripted
remotes run on this test's trio loop.  Chromium runs as root here, so without its sandbox
(``--no-sandbox``), headless, with a fresh profile and no background networking (this machine's
closed network refuses those connections many at a time).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import trio

from affidavit.journal import JournalReader
from tests.broker.approvalkit import PaymentsApi, reconcile_target
from tests.broker.helpers import TOKEN_ENV, http_target, write_config
from tests.daemon.kit import WAIT, DaemonProc, cli, running_daemon, start_caller, wait_until
from tests.external import CHROMEDRIVER, CHROMIUM, on_free_port_async
from tests.http.hostile import HostileServer, Reply, scripts

__all__ = [
    "CHARGE",
    "DROPPED",
    "LEDGER_DROPPED",
    "Browser",
    "World",
    "browser",
    "console_world",
    "csrf_of",
    "get",
    "log_in",
    "log_in_to",
    "post",
    "served",
]

T = TypeVar("T")
CHARGE = {"target": "pay", "method": "POST", "path": "/v1/charges", "body": '{"amount": 5}'}
DROPPED = {"target": "flaky", "method": "POST", "path": "/v1/transfers", "body": '{"to": "x"}'}
LEDGER_DROPPED = {
    "target": "ledger",
    "method": "POST",
    "path": "/v1/charges",
    "body": '{"drop": true}',
    "idempotency_key": "k-console-1",
}
"""Applied by the payments API, which then hangs up: unknown, and its query finds it."""


@dataclass
class World:
    daemon: DaemonProc
    pay: HostileServer
    flaky: HostileServer
    ledger: HostileServer
    origin: str

    async def login_url(self) -> str:
        done = await cli(self.daemon, "console-url")
        assert done.returncode == 0, done.stderr
        url = done.stdout.decode().strip()
        assert url.startswith(f"{self.origin}/login?token="), url
        return url

    async def call(self, action: dict[str, Any]) -> dict[str, Any]:
        done = await cli(self.daemon, "call", "-", stdin=json.dumps(action).encode())
        envelope: dict[str, Any] = json.loads(done.stdout)
        return envelope

    async def caller(self, action: dict[str, Any]) -> trio.Process:
        """A caller that waits for the decision (the target's approval ``wait``)."""
        return await start_caller(self.daemon, json.dumps(action).encode())

    async def pending(self) -> list[dict[str, Any]]:
        done = await cli(self.daemon, "approvals", "--json")
        rows: list[dict[str, Any]] = json.loads(done.stdout)
        return rows

    async def record(self, iid: str) -> dict[str, Any]:
        done = await cli(self.daemon, "record", iid, "--json")
        assert done.returncode == 0, done.stderr
        rec: dict[str, Any] = json.loads(done.stdout)
        return rec

    async def one_pending(self) -> str:
        rows = await wait_until(self.pending, "a request waits for a decision")
        return str(rows[-1]["invocation_id"])


@contextlib.asynccontextmanager
async def console_world(
    tmp: Path,
    token: str,
    *,
    pay_reply: Reply | None = None,
    service: dict[str, Any] | None = None,
    wait: str = "20s",
) -> AsyncIterator[World]:
    """Two remotes and a daemon with the console on a free loopback port; this test's uid is
    an operator and may decide on its own requests (the agent is played by the same uid).
    ``wait``: how long a caller of ``pay`` waits for the decision; ``service`` overrides
    ``[service]`` settings (None removes one)."""
    reply = pay_reply or Reply(200, body=b'{"charged": true}')
    async with (
        HostileServer.running(scripts.serve(reply)) as pay,
        HostileServer.running(scripts.apply_then_close()) as flaky,
        HostileServer.running(PaymentsApi().script) as ledger,
        contextlib.AsyncExitStack() as stack,
    ):
        targets = {
            "pay": http_target(pay.url, approval={"methods": ["POST"], "wait": wait}),
            "flaky": http_target(flaky.url),
            "ledger": reconcile_target(ledger.url)["api"],
        }

        # The port is picked once the servers above listen (an ephemeral port they are given
        # may be the one free_port just released), and picked again if another process takes
        # it before the daemon binds it (on_free_port_async): a free port is only free when
        # asked.
        def daemon_on(port: int) -> Awaitable[DaemonProc]:
            settings = {
                "operator_uids": [os.geteuid()],
                "allow_self_approval": True,
                "console": f"127.0.0.1:{port}",
                **(service or {}),
            }
            settings = {k: v for k, v in settings.items() if v is not None}
            return stack.enter_async_context(
                running_daemon(tmp, targets, token=token, service=settings)
            )

        daemon, port = await on_free_port_async(daemon_on)
        yield World(daemon, pay, flaky, ledger, f"http://127.0.0.1:{port}")


def operator_config(
    tmp: Path, monkeypatch: Any, targets: dict[str, Any], service: str = ""
) -> Path:
    """A config in ``tmp`` with ``targets`` and this process's user as the operator (plus any
    ``[service]`` lines in ``service``); the credential the targets name is a canary that must
    never be shown (set through ``monkeypatch``, so the test's end restores it)."""
    monkeypatch.setenv(TOKEN_ENV, "canary-never-shown")
    path = write_config(tmp, targets)
    with path.open("a") as f:
        f.write(f"[service]\noperator_uids = [{os.geteuid()}]\n{service}")
    return path


@contextlib.asynccontextmanager
async def served(
    broker: Any,
    tmp: Path,
    *,
    threads: bool = False,
    bound: str | None = None,
    capped: bool = False,
    **console: Any,
) -> AsyncIterator[tuple[str, Any]]:
    """``broker``'s console served in this process on a free loopback port, as the daemon
    serves it (``server.serve_console_stream``: its connection class and settings, over a trio
    listener): (its origin, the ``Console``); ``console``:
    more of its settings (``public_origin=``); ``bound``: the origin it is told it is bound
    to, when not that loopback port's (a remote console's, reached here over loopback).  Its
    reads are made on the event loop, on the broker's own journal -- or, with ``threads``, as
    the daemon makes them (``Broker.view``: a reader of their own, in worker threads); with
    ``capped``, each connection admitted as the daemon admits one (``ConsoleCap``: its owner
    looked up once, at admission, and handed to its requests)."""
    from hypercorn.trio.worker_context import WorkerContext

    from affidavit.console import Console, TokenStore
    from affidavit.daemon.admission import ConsoleCap
    from affidavit.daemon.server import (
        console_http_config,
        serve_admitted_console,
        serve_console_stream,
    )

    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    origin = f"http://127.0.0.1:{listener.socket.getsockname()[1]}"

    limiter = trio.CapacityLimiter(2)

    async def read(view: Callable[[Any], T]) -> T:
        if threads:
            return await broker.view(view, limiter)  # type: ignore[no-any-return]
        return view(broker.journal)

    tokens = TokenStore(tmp / "console-tokens")
    console = Console(broker, read, tokens, origin=bound or origin, **console)
    config, context = console_http_config(), WorkerContext(None)

    cap = ConsoleCap() if capped else None

    async def connection(stream: trio.SocketStream) -> None:
        if cap is not None:
            await serve_admitted_console(console, cap, config, context, stream)
        else:
            await serve_console_stream(console, config, context, stream)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, connection, [listener])
        try:
            yield origin, console
        finally:
            nursery.cancel_scope.cancel()


def read_in_threads(
    console: Any,
    db: Path,
    *,
    limiter: trio.CapacityLimiter | None = None,
    gate: list[trio.Event] | None = None,
) -> None:
    """The in-process console (``served``) reads in worker threads, as the daemon serves it:
    each view opens ``db`` in its own thread (``limiter``: the daemon's, ``VIEW_THREADS``;
    None: trio's default threads).  A read begun while ``gate`` holds an event waits for it
    first (before its thread and the journal)."""

    async def threaded(view: Any) -> Any:
        if gate:
            await gate.pop().wait()

        def run() -> Any:
            with JournalReader.open(db) as reader:
                return view(reader)

        return await trio.to_thread.run_sync(run, limiter=limiter)

    console.read = console.read_summarized = threaded


async def pending_approval(b: Any, **action: Any) -> str:
    """A POST to ``/v1/x`` of target ``pay`` answered APPROVAL_PENDING; its invocation id."""
    envelope = await b.call({"target": "pay", "method": "POST", "path": "/v1/x", **action})
    assert envelope["error"]["code"] == "APPROVAL_PENDING", envelope
    return str(envelope["invocation_id"])


def approval_card(page: bytes, iid: str) -> str:
    """The approvals page's card (``<section>``) of invocation ``iid``, as HTML text."""
    text = page.decode()
    card = text[text.index(f'id="approval-{iid}"') :]
    return card[: card.index("</section>")]


def refusal(page: bytes | str) -> tuple[str, str | None] | None:
    """The stable code of an error page, and the field it names (None: not an error page)."""
    text = page.decode("utf-8", "replace") if isinstance(page, bytes) else page
    m = re.search(r'id="problem" data-code="([A-Z_]*)"(?: data-field="([^"]*)")?>', text)
    return None if m is None else (m.group(1), m.group(2))


def page_line(page: bytes, id: str) -> str | None:
    """The text of the element ``id`` of a console page, its whitespace folded (None: not
    there)."""
    m = re.search(rf'id="{id}">([^<]*)<'.encode(), page)
    return None if m is None else " ".join(m.group(1).decode().split())


async def settled(console: Any, bound: float = 20.0) -> None:
    """Until the whole verify a press began in the background has ended (bounded: a guard
    against a hang, never a speed asserted)."""
    with trio.fail_after(bound):
        while console.verified.running is not None:
            await trio.sleep(0.01)


async def log_in_to(console: Any, origin: str) -> tuple[str, str]:
    """Log in to an in-process console (``served``) as this process's user: (Cookie, CSRF)."""
    from affidavit.approvals import Operator

    token, _ = console.tokens.mint(Operator.current())
    status, headers, _ = await post(f"{origin}/login", {"token": token}, {"Origin": origin})
    assert status == 200, status
    cookie = headers["set-cookie"].split(";")[0]
    return cookie, await csrf_of(origin, cookie)


async def csrf_of(origin: str, cookie: str) -> str:
    _, _, page = await get(f"{origin}/approvals", cookie=cookie)
    m = re.search(rb'name="csrf" value="([^"]+)"', page)
    assert m is not None
    return m.group(1).decode()


async def get(
    url: str, *, cookie: str | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """A plain GET (no redirect followed): (status, headers lower-cased, body)."""
    return await _request(
        "GET", url, None, {**({"Cookie": cookie} if cookie else {}), **(headers or {})}
    )


async def post(
    url: str, form: dict[str, str] | list[tuple[str, str]], headers: dict[str, str]
) -> tuple[int, dict[str, str], bytes]:
    """A form POST as a script would send it (no redirect followed); a list of pairs may give
    a field twice."""
    from urllib.parse import urlencode

    head = {"Content-Type": "application/x-www-form-urlencoded", **headers}
    return await _request("POST", url, urlencode(form).encode(), head)


async def log_in(world: World) -> tuple[str, str]:
    """Log in over HTTP as this test's uid: (the Cookie header, the session's CSRF token)."""
    url = await world.login_url()
    status, _, page = await get(url)  # the confirm page: the token is not used yet
    assert status == 200 and b'id="login-confirm"' in page
    status, headers, _ = await post(
        f"{world.origin}/login", {"token": url.split("=", 1)[1]}, {"Origin": world.origin}
    )
    assert status == 200, status
    assert "Secure" not in headers["set-cookie"]  # plain HTTP on loopback: it must be sent
    cookie = headers["set-cookie"].split(";")[0]
    return cookie, await csrf_of(world.origin, cookie)


async def _request(
    method: str, url: str, body: bytes | None, headers: dict[str, str]
) -> tuple[int, dict[str, str], bytes]:
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)

    def run() -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(parts.netloc, timeout=WAIT)
        try:
            target = parts.path + (f"?{parts.query}" if parts.query else "")
            conn.request(method, target, body=body, headers=headers)
            response = conn.getresponse()
            got = {k.lower(): v for k, v in response.getheaders()}
            return response.status, got, response.read()
        finally:
            conn.close()

    return await trio.to_thread.run_sync(run)


class Browser:
    """A selenium Chrome session over the system chromium; every method blocks."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    async def run(self, step: Callable[[Any], T]) -> T:
        """``step(driver)`` in a worker thread, so the trio loop (the remotes) keeps going."""
        return await trio.to_thread.run_sync(step, self.driver)

    async def get(self, url: str) -> None:
        await self.run(lambda d: d.get(url))

    async def text(self, css: str) -> str:
        from selenium.webdriver.common.by import By

        return str(await self.run(lambda d: d.find_element(By.CSS_SELECTOR, css).text))

    async def count(self, css: str) -> int:
        from selenium.webdriver.common.by import By

        return len(await self.run(lambda d: d.find_elements(By.CSS_SELECTOR, css)))

    async def click(self, css: str) -> None:
        from selenium.webdriver.common.by import By

        await self.run(lambda d: d.find_element(By.CSS_SELECTOR, css).click())

    async def decide(self, css: str) -> None:
        """Press a decision button as an operator does: the pointer over the page until the
        console's script arms the button (visible ~1 s, then a move: console.js), then a
        click -- a click before that lands on a disabled button and does nothing."""
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.by import By

        def armed(d: Any) -> bool:
            button = d.find_element(By.CSS_SELECTOR, css)
            ActionChains(d).move_to_element_with_offset(button, 1, 0).move_to_element(
                button
            ).perform()
            return bool(button.is_enabled())

        async def ready() -> bool:
            return await self.run(armed)

        await wait_until(ready, f"{css} is armed")
        await self.click(css)

    async def type(self, css: str, text: str) -> None:
        from selenium.webdriver.common.by import By

        await self.run(lambda d: d.find_element(By.CSS_SELECTOR, css).send_keys(text))

    async def source(self) -> str:
        return str(await self.run(lambda d: d.page_source))

    async def log_in(self, url: str) -> None:
        """Open a login link and press its one button (opening it alone redeems nothing)."""
        await self.get(url)
        await self.click("#login-confirm")

        async def answered() -> int:
            return await self.count("#operator") + await self.count("#login-failed")

        await wait_until(answered, "the login is answered")


@contextlib.contextmanager
def browser(width: int = 1280, height: int = 900) -> Iterator[Browser]:
    """A headless chromium; skipped ("chromium not installed") on a machine without it."""
    chromium, chromedriver = CHROMIUM.require(), CHROMEDRIVER.require()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="affidavit-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        f"--window-size={width},{height}",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield Browser(driver)
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
