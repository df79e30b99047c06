"""What an agent writes into a console link is not shown back as it wrote it (audit51b item
3): an invocation id of the path that is no id's form is answered "no such invocation", no echo
(one of an id's form is named: 30 characters of its alphabet); a ``session`` filter that is no
session name's length (over-long) is refused with its code and field, never put
back into the filter's box.

The console is served in this process as the daemon serves it (a real loopback socket)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest

from affidavit.engine import new_invocation_id
from tests.broker.helpers import http_target, open_broker

from .kit import get, log_in_to, operator_config, refusal, served

MARK = "PLANTED" + "x" * 3000


async def test_a_path_id_or_a_filter_an_agent_wrote_is_not_shown_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, _ = await log_in_to(console, origin)
        for sub in ("", "/result.json"):
            status, _, page = await get(f"{origin}/invocations/{quote(MARK)}{sub}", cookie=cookie)
            assert (status, refusal(page)) == (404, ("NO_SUCH_INVOCATION", None))
            assert b"PLANTED" not in page and b"no such invocation" in page
        # An id of the form the broker gives, with no record: named, as it is bounded.
        iid = new_invocation_id()
        status, _, page = await get(f"{origin}/invocations/{iid}", cookie=cookie)
        assert (status, refusal(page)) == (404, ("NO_SUCH_INVOCATION", None))
        assert f"no invocation {iid} in the journal".encode() in page
        for value in (MARK, "x" * 256):
            url = f"{origin}/actions?session={quote(value)}"
            status, _, page = await get(url, cookie=cookie)
            assert (status, refusal(page)) == (400, ("INVALID_FIELD", "session")), value
            assert b"PLANTED" not in page and b"x" * 256 not in page
        # A session name is still a filter, shown back in its box.
        status, _, page = await get(f"{origin}/actions?session=run%201", cookie=cookie)
        assert status == 200 and b'value="run 1"' in page
        # One of other characters matches nothing and is kept, but its box shows a bidi
        # override or a control escaped, never the character (review confix51 item 4).
        planted = quote("run\u202e\x1b[2J")
        status, _, page = await get(f"{origin}/actions?session={planted}", cookie=cookie)
        assert status == 200 and b'value="run\\u202e\\u001b[2J"' in page
        assert "\u202e".encode() not in page and b"\x1b" not in page
