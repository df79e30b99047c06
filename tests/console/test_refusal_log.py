"""A cookie replayed by another uid is refused every time, but logged once per run (audit51b
item 4, /tmp/audit-audit51b/refused_flood.py: 2000 requests over one keep-alive connection made
2000 WARNING lines in 30 s): the first refusal of a (peer uid, session) run is a warning saying
further ones are counted, the count is logged when the run is over; and the connection is
closed after each ``PEER_REFUSED`` answer, so a refused peer keeps no place open."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
import trio

from tests.broker.helpers import http_target, open_broker
from tests.daemon.kit import as_user, client_env, run

from .kit import console_world, log_in, operator_config, served

NOBODY = 65534
REQUESTS = 40

_AGENT = r"""
import http.client, json, sys
host, cookie, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
conn = http.client.HTTPConnection(host, timeout=20)
out = {"status": {}, "close": 0}
for _ in range(n):
    conn.request("GET", "/approvals", headers={"Cookie": cookie})
    r = conn.getresponse()
    r.read()
    out["status"][r.status] = out["status"].get(r.status, 0) + 1
    out["close"] += (r.getheader("connection") or "").lower() == "close"
print(json.dumps(out))
"""


async def test_a_replayed_cookie_is_refused_each_time_and_logged_once(
    tmp_path: Path, token: str
) -> None:
    tmp_path.chmod(0o755)
    async with console_world(tmp_path, token) as world:
        cookie, _ = await log_in(world)
        before = world.daemon.log_text().count("presented by uid")
        host = world.origin.removeprefix("http://")
        done = await run(
            as_user(NOBODY, "-c", _AGENT, host, cookie, str(REQUESTS)), env=client_env()
        )
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        lines = [
            line for line in world.daemon.log_text().splitlines() if "presented by uid" in line
        ]
    assert out == {"status": {"403": REQUESTS}, "close": REQUESTS}
    assert len(lines) - before == 1, lines
    assert f"presented by uid {NOBODY}" in lines[-1] and "counted" in lines[-1]


def test_a_run_of_refusals_ends_when_quiet_with_its_count() -> None:
    """``UidSpells`` keyed by (peer, session) as the console keys them: a run starts with its
    first refusal, is counted, and is over -- its count given back once -- after ``quiet``."""
    from affidavit.spells import UidSpells

    spells = UidSpells()
    key = ("uid 65534", "a session cookie", 0, "sid")
    assert spells.turned_away(key, 0.0) is True
    assert spells.turned_away(key, 1.0) is False
    other = ("uid 1", "a login token", 0, "")
    assert spells.turned_away(other, 30.0) is True
    assert spells.over(60.5, 60.0) == []
    assert spells.over(61.0, 60.0) == [(key, 2)]  # (the other's last was at 30)
    assert spells.over(90.0, 60.0) == [(other, 1)]
    assert spells.turned_away(key, 62.0) is True  # a new run


async def test_a_run_over_is_logged_with_no_later_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The run's count is logged by the console's upkeep once the run is over, though no later
    refusal comes (it was logged only at the next one: review confix51 item 2)."""
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (_, console):
        console._refusals_quiet = 0.2
        key = ("uid 65534", "a session cookie", 0, "sid")
        for _ in range(3):
            console._refusals.turned_away(key, time.monotonic())
        caplog.set_level(logging.INFO, logger="affidavit")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(console.keep_refusal_log)
            for _ in range(100):  # (bounded: 10 s at most; the run is over after 0.2 s)
                if "2 more requests of uid 65534" in caplog.text:
                    break
                await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
    assert "2 more requests of uid 65534 with a session cookie of uid 0" in caplog.text
