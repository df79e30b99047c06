"""``affidavit actions|sessions --socket`` print the daemon's page in the embedded shape (a bare
array, the table): when the daemon cut it, the exit status says so (3, ``TRUNCATED``) -- a
script reading stdout alone took the newest 10,000 for all of them (the count was on stderr
only).  The page's largest size is made 2 here, in this process, where the command runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

import affidavit.api.wire as wire
from affidavit.api.client import Client
from affidavit.cli import main as cli_main
from affidavit.cli.journal import TRUNCATED
from tests.http.hostile import Reply, scripts

from .kit import action, serving

OK = Reply(200, headers=[("Content-Type", "application/json")], body=b"{}")


async def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = await trio.to_thread.run_sync(cli_main, list(argv))
    got = capsys.readouterr()
    return code, got.out, got.err


async def test_a_page_the_daemon_cut_exits_3_in_the_embedded_shape(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async with serving(tmp_path, scripts.serve(OK), token=token) as (_srv, daemon):
        async with Client.open(daemon.socket) as client:
            for session in ("s1", "s2", "s3"):
                await client.call(action(session=session))
        sock = ("--socket", str(daemon.socket))
        whole = {
            view: await _run(capsys, view, "--json", *sock) for view in ("actions", "sessions")
        }
        monkeypatch.setattr(wire, "MAX_ACTIONS_LIMIT", 2)
        monkeypatch.setattr(wire, "MAX_SESSIONS_LIMIT", 2)
        for view, noun in (("actions", "records"), ("sessions", "sessions")):
            for form in (("--json",), ()):
                code, out, err = await _run(capsys, view, *form, *sock)
                assert code == TRUNCATED == 3, (view, form, err)
                assert f"of 3 {noun}" in err
                if form:  # the same shape as the whole: a bare array, of the page
                    page = json.loads(out)
                    assert isinstance(page, list) and len(page) == 2
                    assert page == json.loads(whole[view][1])[-2:]
            # Not cut: 0, as before.
            assert whole[view][0] == 0 and len(json.loads(whole[view][1])) == 3
