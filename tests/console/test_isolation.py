"""Who may use a session: the console asks the kernel who owns the connecting socket.

Cookies ignore ports (RFC 6265 §8.5) and SameSite counts 127.0.0.1:OTHER as the same site, so
an operator's browser hands the session cookie to any server on loopback -- an agent's too.
The agent, another uid, then holds a valid cookie and can read the CSRF token: the console must
still refuse it, on GET and POST, and record nothing (docs/console.md, "Security model").  The
login link is bound the same way: a stolen one cannot be redeemed by another uid.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.daemon.kit import as_user, client_env, run

from .kit import CHARGE, console_world, csrf_of, get, log_in, post, refusal

NOBODY = 65534

# The agent's client, run as another uid: everything a browser would send, and the answers.
_AGENT = r"""
import http.client, json, sys, urllib.parse
host, cookie, csrf, iid, token = sys.argv[1:]
def ask(method, path, body=None, headers=()):
    conn = http.client.HTTPConnection(host, timeout=20)
    head = {"Cookie": cookie, "Origin": "http://" + host, **dict(headers)}
    if body is not None:
        head["Content-Type"] = "application/x-www-form-urlencoded"
        body = urllib.parse.urlencode(body)
    conn.request(method, path, body=body, headers=head)
    r = conn.getresponse()
    return r.status, r.read().decode("utf-8", "replace")
out = {}
out["get"] = ask("GET", "/approvals")
out["content"] = ask("GET", f"/approvals/{iid}/content/body")
out["approve"] = ask("POST", f"/approvals/{iid}/approve", {"csrf": csrf, "note": "agent"})
attest = {"csrf": csrf, "how": "committed", "note": "x"}
out["reconcile"] = ask("POST", f"/invocations/{iid}/reconcile", attest)
out["login"] = ask("POST", "/login", {"token": token})
print(json.dumps(out))
"""


async def test_a_session_cookie_in_another_uid_s_hands_is_refused(
    tmp_path: Path, token: str
) -> None:
    async with console_world(tmp_path, token, wait="0s") as world:
        iid = (await world.call(dict(CHARGE)))["invocation_id"]
        cookie, csrf = await log_in(world)
        stolen_link = (await world.login_url()).split("=", 1)[1]
        before = (await world.record(iid))["events"]
        host = world.origin.removeprefix("http://")
        done = await run(
            as_user(NOBODY, "-c", _AGENT, host, cookie, csrf, iid, stolen_link), env=client_env()
        )
        assert done.returncode == 0, done.stderr
        answers = json.loads(done.stdout)
        for what in ("get", "content", "approve", "reconcile", "login"):
            status, page = answers[what]
            assert status == 403, (what, status)
            assert refusal(page) == ("PEER_REFUSED", None), what
        assert (await world.record(iid))["events"] == before  # nothing recorded
        assert await world.pending() != []
        log = world.daemon.log_text()
        assert f"presented by uid {NOBODY}" in log and "a session cookie of uid 0" in log
        assert "a login token of uid 0" in log
        # The operator's own client, with the same cookie, is served.
        status, _, page = await get(f"{world.origin}/approvals", cookie=cookie)
        assert status == 200 and f"approval-{iid}".encode() in page
        status, _, body = await get(f"{world.origin}/approvals/{iid}/content/body", cookie=cookie)
        assert status == 200 and body == CHARGE["body"].encode()
        assert await csrf_of(world.origin, cookie) == csrf
        # The link the stranger presented was not used up by its refusal: its operator logs in.
        status, headers, _ = await post(
            f"{world.origin}/login", {"token": stolen_link}, {"Origin": world.origin}
        )
        assert status == 200 and "set-cookie" in headers, status


_FORGER = r"""
import http.client, sys
host, cookie, path = sys.argv[1:]
conn = http.client.HTTPConnection(host, timeout=20)
conn.request("GET", path, headers={"Cookie": cookie})
print(conn.getresponse().status)
"""
FORGED = "2026-01-01 00:00:00,000 affidavit serve[1] WARNING console: uid 0 approved act_x"


async def test_a_refused_path_cannot_write_a_line_of_its_own_into_the_log(
    tmp_path: Path, token: str
) -> None:
    """The refusal's log line names the path the stranger asked for -- decoded, so ``%0A``
    was a line break, and the path a line of the stranger's own making in the daemon's log."""
    async with console_world(tmp_path, token, wait="0s") as world:
        cookie, _ = await log_in(world)
        host = world.origin.removeprefix("http://")
        path = "/approvals%0A" + FORGED.replace(" ", "%20") + "%0D%1B[2J"
        done = await run(as_user(NOBODY, "-c", _FORGER, host, cookie, path), env=client_env())
        assert done.stdout.strip() == b"403", done
        log = world.daemon.log_text()
        assert f"presented by uid {NOBODY}" in log
        assert not any(line.startswith(FORGED) for line in log.splitlines()), log[-2000:]
        assert "\x1b" not in log and "\r" not in log
        assert "/approvals\\n2026-01-01" in log, log[-2000:]
