"""The console shows an action without a session as markup no session name can produce: ``-``
was shown for none and for a session named ``-`` (a valid name: printable ASCII) alike.

The console is served in this process as the daemon serves it (a real loopback socket)."""

from __future__ import annotations

from pathlib import Path

import pytest

from affidavit.console.text import NO_SESSION
from tests.broker.helpers import http_target, open_broker

from .kit import get, log_in_to, operator_config, served


async def test_no_session_is_not_shown_as_a_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    refused = {"target": "nope", "method": "GET", "path": "/"}
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, _ = await log_in_to(console, origin)
        none = (await b.call(refused))["invocation_id"]
        dash = (await b.call({**refused, "session": "-"}))["invocation_id"]
        _, _, actions = await get(f"{origin}/actions", cookie=cookie)
        _, _, journal = await get(f"{origin}/journal", cookie=cookie)
        _, _, of_none = await get(f"{origin}/invocations/{none}", cookie=cookie)
        _, _, of_dash = await get(f"{origin}/invocations/{dash}", cookie=cookie)
    shown = str(NO_SESSION).encode()
    assert shown == b'<em class="muted">no session</em>'
    for page in (actions, journal):
        assert page.count(shown) == 1, page[-3000:]  # of two: the one without
    assert b"<th>session</th><td>" + shown + b"</td>" in of_none
    assert shown not in of_dash and b"<th>session</th><td>-</td>" in of_dash
