"""The operator approval routes through the daemon's socket name neither the journal nor its key
files, the journal and both key files in canary-named directories.  The approval's sealed
request altered in place (its chain re-made, as a forger with write access and no key would):
``GET /v1/approvals/{id}`` answers the approval with ``request_unreadable`` in fixed words (as
it does for a key file grown readable by others),
``GET /v1/approvals/{id}/content/body`` answers JOURNAL_UNREADABLE without the journal's or
the key's path -- the daemon's log keeps them.  A guess of the key's path sent as the id is
echoed as sent, right or wrong."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

import trio

from affidavit.api.wire import blocking_request
from affidavit.approvals.service import ALTERED, UNOPENED
from affidavit.text import echoed
from tests.http.hostile import HostileServer, Reply, scripts
from tests.journal.test_tamper import _rechain_from, _sql

from .kit import WAIT, api_target, start_daemon, stop, write_daemon_config

JOURNAL_DIR = "CANARY-journal-dir-4d2e"
KEY_DIR = "CANARY-key-dir-91b0"
CHARGE = {"target": "api", "method": "POST", "path": "/v1/charges", "body": '{"amount": 5}'}


async def _ask(socket: Path, method: str, target: str, body: bytes | None = None) -> bytes:
    answer = await trio.to_thread.run_sync(blocking_request, str(socket), method, target, body)
    return bytes(answer.body)


def _alter_sealed_request(db: Path, iid: str, signing_key: Path) -> None:
    """Flip a byte of the APPROVAL_REQUESTED event's sealed payload and re-chain the rows; the
    signatures go and the schema is set back to 1, from before signing (the daemon adopts the
    journal anew, as ``test_key_file_unplaced``)."""
    conn = sqlite3.connect(db)
    seq, payload = conn.execute(
        "SELECT seq, payload FROM events WHERE invocation_id = ? AND kind = 'APPROVAL_REQUESTED'",
        (iid,),
    ).fetchone()
    conn.close()
    altered = bytearray(payload)
    altered[40] ^= 1
    _sql(
        db,
        ("UPDATE events SET payload = ? WHERE seq = ?", (bytes(altered), seq)),
        ("DELETE FROM checkpoints", ()),
        ("DELETE FROM meta WHERE name IN ('signing_key_id', 'signing_public_key')", ()),
        ("UPDATE meta SET value = '1' WHERE name = 'schema'", ()),  # passed off as pre-signing
    )
    _rechain_from(db, 1)
    os.unlink(signing_key)


async def test_no_approval_route_names_the_journal_or_a_key_file(
    tmp_path: Path, token: str
) -> None:
    home, keys = tmp_path / JOURNAL_DIR, tmp_path / KEY_DIR
    home.mkdir()
    keys.mkdir()
    db, key, signing = home / "journal.db", keys / "broker.key", keys / "signing.key"
    journal = {"path": str(db), "key_file": str(key), "signing_key": str(signing)}
    socket, log = tmp_path / "affidavit.sock", tmp_path / "daemon.log"
    service = {"operator_uids": [os.getuid()], "allow_self_approval": True}
    shown: list[str] = []
    async with HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv:
        targets = api_target(srv.url, approval="always")
        config = write_daemon_config(
            tmp_path, targets, socket=socket, service=service, journal=journal
        )
        daemon = await start_daemon(config, socket, log, token)
        try:
            with trio.fail_after(WAIT):
                env = json.loads(
                    await _ask(socket, "POST", "/v1/calls", json.dumps(CHARGE).encode())
                )
                assert env["error"]["code"] == "APPROVAL_PENDING", env
                iid = env["invocation_id"]
        finally:
            stop(daemon)
        _alter_sealed_request(db, iid, signing)
        daemon = await start_daemon(config, socket, log, token)
        try:
            with trio.fail_after(WAIT):
                view = json.loads(await _ask(socket, "GET", f"/v1/approvals/{iid}"))
                assert view["invocation_id"] == iid and view["request"] is None, view
                assert view["request_unreadable"] == ALTERED, view
                shown.append(json.dumps(view))
                key.chmod(0o644)  # the journal's words: "... (mode 0644) ... chmod 600 <path>"
                view = json.loads(await _ask(socket, "GET", f"/v1/approvals/{iid}"))
                assert view["request_unreadable"] == UNOPENED, view
                shown.append(json.dumps(view))
                key.chmod(0o600)
                body = await _ask(socket, "GET", f"/v1/approvals/{iid}/content/body")
                error = json.loads(body)["api_error"]
                assert error["code"] == "REQUEST_SEALED" and ALTERED in error["message"], error
                shown.append(body.decode())
                approve = f"/v1/approvals/{iid}/approve"
                refused = await _ask(socket, "POST", approve, b"{}")  # not blind: refused
                assert json.loads(refused)["api_error"]["code"] == "REQUEST_UNREADABLE", refused
                shown.append(refused.decode())
                decided = await _ask(socket, "POST", approve, b'{"blind": true}')
                assert json.loads(decided)["request_unreadable"] == ALTERED, decided
                shown.append(decided.decode())
                listed = await _ask(socket, "GET", "/v1/approvals")
                shown.append(listed.decode())
                for guess in (str(key), str(key) + "x"):  # echoed as sent, either way
                    said = await _ask(socket, "GET", f"/v1/approvals/{quote(guess, safe='')}")
                    assert echoed(guess) in json.loads(said)["api_error"]["message"], said
        finally:
            stop(daemon)
    assert KEY_DIR.encode() in log.read_bytes()  # the operator's log names it
    for text in shown:
        for canary in (JOURNAL_DIR, KEY_DIR, str(tmp_path)):
            assert canary not in text, (canary, text)
