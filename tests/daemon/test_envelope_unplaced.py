"""Through the daemon: a call whose key file fails (CREDENTIAL_FAILED) and a call that succeeds,
the journal, its broker key files and the credential's file all in canary-named directories --
neither the envelope (``affidavit call --socket``) nor the record view (``affidavit record
--socket``, human and JSON) names any of them.  The operator's detail (the reference, the path
it was read as) is sealed with the event and logged, never rendered for the caller
(tests/broker/test_envelope_unplaced.py runs the journal's failure paths embedded)."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from tests.http.hostile import HostileServer, Reply, scripts

from .kit import WAIT, action_bytes, api_target, cli, start_daemon, stop, write_daemon_config

JOURNAL_DIR = "canary-journal-dir-61fa"
KEY_DIR = "canary-key-dir-0b7e"


async def test_no_envelope_or_record_view_names_the_journal_or_a_key_file(
    tmp_path: Path, token: str
) -> None:
    home, keys = tmp_path / JOURNAL_DIR, tmp_path / KEY_DIR
    home.mkdir()
    keys.mkdir()
    journal = {
        "path": str(home / "journal.db"),
        "key_file": str(keys / "broker.key"),
        "signing_key": str(keys / "signing.key"),
    }
    socket = tmp_path / "affidavit.sock"
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        targets = {
            **api_target(srv.url),
            "keyed": api_target(srv.url, credential=f"file:{keys / 'gone.token'}")["api"],
        }
        config = write_daemon_config(tmp_path, targets, socket=socket, journal=journal)
        log = tmp_path / "daemon.log"
        daemon = await start_daemon(config, socket, log, token, journal=home / "journal.db")
        shown: list[bytes] = []
        try:
            with trio.fail_after(WAIT):
                for target in ("keyed", "api"):
                    call = await cli(daemon, "call", "-", stdin=action_bytes(target=target))
                    shown += [call.stdout, call.stderr]
                    env = call.json()
                    if target == "keyed":
                        assert env["error"]["code"] == "CREDENTIAL_MISSING", env
                        assert env["error"]["field"] == "targets.keyed.credential", env
                    else:
                        assert "error" not in env, env
                    iid = env["invocation_id"]
                    for extra in ((), ("--json",)):
                        view = await cli(daemon, "record", iid, *extra)
                        assert view.returncode == 0, view
                        shown += [view.stdout, view.stderr]
                    assert json.loads(shown[-2])["record"]["invocation_id"] == iid
        finally:
            stop(daemon)
    assert b"gone.token" in log.read_bytes()  # the operator's log names the file
    for text in shown:
        for canary in (JOURNAL_DIR, KEY_DIR, "gone.token", str(tmp_path)):
            assert canary.encode() not in text, (canary, text)
