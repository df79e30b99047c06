"""No answer on the socket names where the journal's key files live (``engine.unplaced``), even
away from the journal: the journal's words name the broker key file a sealed chunk does not open
with -- here an old result's (from before per-chunk hashes: only its whole stream is hashed, so
the key meets an altered chunk first), answered RESULT_UNVERIFIED.  A guess of the key's path
sent as the id is echoed as sent, right or wrong: no oracle."""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
import trio

from affidavit.acl import GROUP_OBJ, MASK, OTHER, USER, USER_OBJ
from affidavit.api.wire import blocking_request
from affidavit.engine.location import unplaced, withheld
from affidavit.text import echoed
from tests.broker.helpers import TOKEN_ENV
from tests.external import require_posix_acl, require_root
from tests.http.hostile import HostileServer, Reply, scripts
from tests.journal.test_tamper import _rechain_from, _sql
from tests.mcp.kit import connected, structured

from .kit import WAIT, api_target, client_env, start_daemon, stop, write_daemon_config

CANARY = "CANARY-keydir-7c21"
CANARY_UID = 48213
"""A uid an ACL entry names: the operator's words say it, a caller's never."""


async def _ask(socket: Path, method: str, target: str, body: bytes | None = None) -> bytes:
    answer = await trio.to_thread.run_sync(blocking_request, str(socket), method, target, body)
    return bytes(answer.body)


def _old_and_altered(db: Path, iid: str, signing_key: Path, part: str = "chunk") -> None:
    """Make ``iid``'s result one from before signing and per-chunk hashes (as
    ``test_tamper._legacy_unsigned``), then flip a byte of its sealed chunk (``part``
    ``"chunk"``) or of its sealed summary (``"summary"``)."""
    conn = sqlite3.connect(db)
    seq, attrs = conn.execute(
        "SELECT seq, attrs FROM events WHERE invocation_id = ? AND kind = 'RESULT_COMMITTED'",
        (iid,),
    ).fetchone()
    (streams,) = conn.execute(
        "SELECT streams FROM results WHERE invocation_id = ?", (iid,)
    ).fetchone()
    conn.close()
    drop = ("marker_sha256", "sealed_summary_sha256")
    old = {k: v for k, v in json.loads(attrs).items() if k not in drop}
    kept = ("chunks", "bytes", "sha256")
    bare = {s: {k: v for k, v in i.items() if k in kept} for s, i in json.loads(streams).items()}
    _sql(
        db,
        ("UPDATE events SET attrs = ? WHERE seq = ?", (json.dumps(old), seq)),
        ("UPDATE results SET streams = ? WHERE invocation_id = ?", (json.dumps(bare), iid)),
        ("DELETE FROM checkpoints", ()),
        ("DELETE FROM meta WHERE name IN ('signing_key_id', 'signing_public_key')", ()),
        ("UPDATE meta SET value = '1' WHERE name = 'schema'", ()),  # as such a broker left it
        (
            "UPDATE result_chunks SET data = substr(data, 1, 20) || "
            "CASE WHEN substr(data, 21, 1) = X'00' THEN X'01' ELSE X'00' END || substr(data, 22) "
            "WHERE invocation_id = ? AND idx = 0"
            if part == "chunk"
            else "UPDATE results SET summary = substr(summary, 1, 20) || "
            "CASE WHEN substr(summary, 21, 1) = X'00' THEN X'01' ELSE X'00' END || "
            "substr(summary, 22) WHERE invocation_id = ?",
            (iid,),
        ),
    )
    _rechain_from(db, 1)
    os.unlink(signing_key)


@dataclass
class Old:
    config: Path
    socket: Path
    log: Path
    key: Path
    iid: str


async def _old_result(tmp: Path, token: str, url: str) -> Old:
    """A daemon's call to ``url`` stored, its key files in a canary-named directory away from
    the journal's; the daemon stopped, its result made old and altered (``_old_and_altered``)."""
    keys = tmp / CANARY
    keys.mkdir()
    key, signing = keys / "broker.key", keys / "signing.key"
    (tmp / "j").mkdir()
    db = tmp / "j" / "journal.db"
    journal = {"path": str(db), "key_file": str(key), "signing_key": str(signing)}
    socket = tmp / "affidavit.sock"
    config = write_daemon_config(tmp, api_target(url), socket=socket, journal=journal)
    old = Old(config, socket, tmp / "daemon.log", key, "")
    daemon = await start_daemon(config, socket, old.log, token)
    try:
        with trio.fail_after(WAIT):
            call = json.dumps({"target": "api", "method": "GET", "path": "/"}).encode()
            old.iid = json.loads(await _ask(socket, "POST", "/v1/calls", call))["invocation_id"]
    finally:
        stop(daemon)
    _old_and_altered(db, old.iid, signing)
    return old


UNVERIFIED = "sealed data does not open with broker key file (wrong key, or the row was altered)"


def _unverified(iid: str) -> str:
    """The answer's words for ``iid``'s old result whose chunk 0 does not open."""
    return (
        f"stored result of invocation {iid} (seq 9) fails verification: stream 'body' chunk 0 "
        f"does not open: {UNVERIFIED}"
    )


async def test_no_socket_answer_names_a_key_file_kept_away_from_the_journal(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"x" * 64))) as srv:
        old = await _old_result(tmp_path, token, srv.url)
        daemon = await start_daemon(old.config, old.socket, old.log, token)  # adopts the journal
        try:
            with trio.fail_after(WAIT):
                body = await _ask(old.socket, "GET", f"/v1/invocations/{old.iid}/result")
                shown = [body.decode()]
                error = json.loads(body)["api_error"]
                assert error == {"code": "RESULT_UNVERIFIED", "message": _unverified(old.iid)}, (
                    error
                )
                for guess in (str(old.key), str(old.key) + "x"):  # echoed as sent, either way
                    target = f"/v1/invocations/{quote(guess, safe='')}/result"
                    said = json.loads(await _ask(old.socket, "GET", target))["api_error"]
                    assert echoed(guess) in said["message"], said
        finally:
            stop(daemon)
    assert all(CANARY not in text for text in shown), shown


async def test_no_embedded_mcp_answer_names_a_key_file_kept_away_from_the_journal(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"x" * 64))) as srv:
        old = await _old_result(tmp_path, token, srv.url)
        env = {**client_env(), TOKEN_ENV: token}
        async with connected(["--config", str(old.config)], env, tmp_path / "mcp.log") as mcp:
            answer = await mcp.call("fetch_result", {"invocation_id": old.iid})
            guessed = [
                await mcp.call("fetch_result", {"invocation_id": guess})
                for guess in (str(old.key), str(old.key) + "x")
            ]
    got = structured(answer)
    assert answer.is_error is True, got
    assert got["api_error"] == {
        "code": "RESULT_UNVERIFIED",
        "message": _unverified(old.iid),
        "outcome": "not_attempted",  # a read: nothing to send, nothing sent
        "retry": "never",  # the stored result fails verification: asking again cannot help
    }, got
    shown = json.dumps(got) + "".join(getattr(c, "text", "") for c in answer.content)
    assert CANARY not in shown, shown
    right, wrong = (structured(said) for said in guessed)  # the same, right or wrong
    assert right == wrong and "error" in json.dumps(right), (right, wrong)


def test_every_key_file_goes_as_configured_absolute_and_resolved(tmp_path: Path) -> None:
    """``unplaced`` on the journal's words naming each key file: as configured (not normal:
    ``<dir>/../<dir>/k``), its absolute and its resolved path (through a symlink), the one
    beside the journal; a caller's guess that is no id's is withheld, never stripped."""
    real = tmp_path / CANARY
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    given = tmp_path / "link" / ".." / "link" / "broker.key"
    signing, auditor = real / "signing.key", tmp_path / "link" / "auditor.pub"
    db = tmp_path / "j.db"
    keys = (given, signing, auditor, Path(f"{db}.key"))
    words = [
        f"broker key file {given} does not match this journal",
        f"broker key file {real / 'broker.key'} is accessible by group or others (mode 0644); "
        f"it must be 0600: chmod 600 {real / 'broker.key'}",
        f"signing key file {signing} does not match journal {db}",
        f"audit copy does not open with auditor key file {real / 'auditor.pub'} (wrong key)",
        f"broker key file {db}.key does not match this journal",
    ]
    for message in words:
        said = unplaced("JOURNAL_UNREADABLE", message, db, (), keys)
        assert CANARY not in said and str(tmp_path) not in said, said
        assert "key file" in said, said
    said = unplaced("JOURNAL_UNREADABLE", words[0], db, ("act_1",), keys)
    assert said == "broker key file does not match this journal", said
    assert "chmod 600 the key file" in unplaced("RESULT_UNVERIFIED", words[1], db, (), keys)
    for guess in (str(given), str(given) + "x"):  # withheld alike: no oracle
        said = unplaced("JOURNAL_UNREADABLE", f"{words[0]} ({guess})", db, (guess,), keys)
        assert said == withheld(guess), said
    # Not the journal's words: an answer echoing the caller is left as it is.
    assert unplaced("NOT_FOUND", words[0], db, (), keys) == words[0]


def test_a_key_files_path_quoted_for_the_shell_goes_too(tmp_path: Path) -> None:
    """The words that refuse a key file quote its path in the command that mends it (``chmod
    600 '<path>'``, ``setfacl``): a path with a quote in it, quoted, is not the path as
    configured -- it went as well, or it reached the caller."""
    from affidavit.journal import JournalError
    from affidavit.journal.sealing import read_secret_file

    keydir = tmp_path / f"{CANARY} it's"
    keydir.mkdir()
    key = keydir / "broker.key"
    key.write_bytes(b"x")
    key.chmod(0o644)
    db = tmp_path / "j.db"
    with pytest.raises(JournalError) as refused:
        read_secret_file(key, "broker key file")
    message = str(refused.value)
    assert "chmod 600 '" in message and CANARY in message, message
    said = unplaced("JOURNAL_UNREADABLE", message, db, (), (key,))
    assert CANARY not in said and "it's" not in said, said
    assert said == (
        "broker key file is accessible by group or others (mode 0644); it must be 0600: "
        "chmod 600 the key file"
    ), said


@pytest.mark.parametrize("how", ["acl", "owner"])
def test_a_key_file_refused_tells_the_caller_no_uid_nor_path(tmp_path: Path, how: str) -> None:
    """A view reader loads the broker key when first asked for a payload, after start: a key
    file refused then reached the caller with the operator's words, which name the uid of an
    ACL entry or of the owner, and the command that mends it.  The caller is told the public
    words (``JournalError.public``, ``told``) -- as a credential's refusal says them; the
    operator's (``str()``, the daemon's log) keep uid, path and fix."""
    from affidavit.engine import read_failure, result_failure
    from affidavit.journal import JournalError
    from affidavit.journal.sealing import BrokerKey

    keys = tmp_path / CANARY
    keys.mkdir()
    key = keys / "broker.key"
    BrokerKey.create(key)
    if how == "acl":
        base = [(USER_OBJ, 6, 0), (GROUP_OBJ, 0, 0), (OTHER, 0, 0)]
        require_posix_acl(key, *base, (USER, 4, CANARY_UID), (MASK, 4, 0))
        public = (
            "broker key file is reachable through its access ACL by another user or group; "
            "only the broker's user may read it"
        )
    else:
        require_root()  # to chown the key to another user
        os.chown(key, CANARY_UID, CANARY_UID)
        public = (
            "broker key file is owned by another user, who can rewrite it; run the broker as "
            "its owner, not as root"
        )
    with pytest.raises(JournalError) as refused:
        BrokerKey.load(key)
    operator = str(refused.value)
    assert str(CANARY_UID) in operator and CANARY in operator, operator
    db = tmp_path / "j.db"
    for _status, code, message in (
        read_failure(refused.value, "the record of act_1"),
        result_failure(refused.value, "act_1"),
    ):
        said = unplaced(code, message, db, ("act_1",), (key,))
        assert said == public, said
