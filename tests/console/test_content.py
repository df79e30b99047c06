"""An approval's content whole (docs/console.md, "What it shows"): the approval view keeps a body
or stdin only up to 16 KiB and only as text, so a hostile agent could pad its payload past the
limit, or send bytes, to hide what it sends.  The card then links to
``/approvals/{id}/content/{name}``: the exact bytes the broker accepted (ACTION_ACCEPTED's sealed
action, what the dispatcher sends), served only when their SHA-256 is the one the card shows --
never something else, and only to whoever may see the console's pages.

Against a real daemon and its console (tests/console/kit.py)."""

from __future__ import annotations

import base64
import hashlib
import re
import sqlite3
from pathlib import Path
from typing import Any

from affidavit.journal.chain import canonical_json
from affidavit.journal.sealing import BrokerKey, payload_aad
from affidavit.protocols import get as protocol
from affidavit.protocols.http.action import BODY_SHOWN
from affidavit.protocols.ssh.action import STDIN_SHOWN
from tests.broker.approvalkit import reseal_accepted
from tests.daemon.kit import cli, embedded

from .kit import CHARGE, World, approval_card, console_world, get, log_in, post

# Past the view's limit, with the part that matters at the end, out of the card's sight.
PADDED = "x" * (BODY_SHOWN + 1000) + '\n{"amount": 5000000, "to": "mallory"}'
BLOB = bytes(range(256)) * 8  # binary: never shown as text


def _link(card: str, name: str) -> tuple[str, str]:
    """The card's download link for ``name`` and the SHA-256 it shows beside it."""
    m = re.search(
        rf'href="(/approvals/[^"]+/content/{name})" download>[^<]*sha256 <code>([0-9a-f]{{64}})',
        card,
    )
    assert m is not None, card
    return m.group(1), m.group(2)


async def _pending(world: World, **body: Any) -> str:
    action = {k: v for k, v in CHARGE.items() if k != "body"}
    envelope = await world.call({**action, **body})
    assert envelope["error"]["code"] == "APPROVAL_PENDING", envelope
    return str(envelope["invocation_id"])


async def test_a_withheld_body_downloads_whole_with_the_hash_the_card_shows(
    tmp_path: Path, token: str
) -> None:
    async with console_world(tmp_path, token, wait="0s") as world:
        padded = await _pending(world, body=PADDED)
        binary = await _pending(world, body_base64=base64.b64encode(BLOB).decode())
        cookie, _ = await log_in(world)
        status, _, page = await get(f"{world.origin}/approvals", cookie=cookie)
        assert status == 200
        for iid, sent, why in (
            (padded, PADDED.encode(), "larger than the approval view keeps: not shown"),
            (binary, BLOB, "binary: not shown"),
        ):
            card = approval_card(page, iid)
            assert why in card and "mallory" not in card
            href, shown = _link(card, "body")
            assert href == f"/approvals/{iid}/content/body"
            assert shown == hashlib.sha256(sent).hexdigest()
            assert f"{len(sent)} bytes" in card
            status, headers, data = await get(world.origin + href, cookie=cookie)
            assert status == 200
            assert data == sent and hashlib.sha256(data).hexdigest() == shown
            assert headers["content-type"] == "application/octet-stream"
            assert headers["content-disposition"] == f'attachment; filename="{iid}.body.bin"'
            assert headers["x-content-type-options"] == "nosniff"
            assert headers["cache-control"] == "no-store"
            assert headers["content-length"] == str(len(sent))
        # A content the request does not have, an invocation that asked no approval: 404.
        for path, code in (
            (f"/approvals/{padded}/content/stdin", b"NO_SUCH_CONTENT"),
            ("/approvals/act_nothing/content/body", b"NO_SUCH_APPROVAL"),
        ):
            status, headers, data = await get(world.origin + path, cookie=cookie)
            assert status == 404 and code in data, path
            assert headers["content-type"].startswith("text/html")
        assert token.encode() not in page
        assert world.pay.requests == []  # looking sends nothing


async def test_a_content_download_needs_a_session(tmp_path: Path, token: str) -> None:
    async with console_world(tmp_path, token, wait="0s") as world:
        iid = await _pending(world, body=PADDED)
        url = f"{world.origin}/approvals/{iid}/content/body"
        status, headers, data = await get(url)
        assert (status, headers["location"]) == (303, "/login")
        assert b"mallory" not in data
        cookie, _ = await log_in(world)
        status, _, data = await get(url, cookie=cookie)
        assert status == 200 and data == PADDED.encode()


async def test_a_sealed_action_that_differs_from_the_view_is_refused_not_served(
    tmp_path: Path, token: str
) -> None:
    async with console_world(tmp_path, token, wait="0s") as world:
        iid = await _pending(world, body=PADDED)
        journal = world.daemon.journal
        key = BrokerKey.load(Path(f"{journal}.key"))
        reseal_accepted(journal, iid, {**CHARGE, "body": "something else"}, key)
        cookie, _ = await log_in(world)
        status, headers, data = await get(
            f"{world.origin}/approvals/{iid}/content/body", cookie=cookie
        )
        assert status == 409 and b"CONTENT_MISMATCH" in data
        assert b"does not match" in data
        assert hashlib.sha256(PADDED.encode()).hexdigest().encode() in data
        assert b"something else" not in data and b"mallory" not in data
        assert headers["content-type"].startswith("text/html")
        assert "content-disposition" not in headers
        assert f"refused the body of {iid}" in world.daemon.log_text()


async def test_an_action_sealed_beyond_the_broker_s_key_is_said_to_be_unreadable(
    tmp_path: Path, token: str
) -> None:
    async with console_world(tmp_path, token, wait="0s") as world:
        iid = await _pending(world, body=PADDED)
        other = BrokerKey.create(tmp_path / "another.key")
        reseal_accepted(world.daemon.journal, iid, {**CHARGE, "body": PADDED}, other)
        cookie, _ = await log_in(world)
        status, _, data = await get(f"{world.origin}/approvals/{iid}/content/body", cookie=cookie)
        assert status == 409 and b"REQUEST_SEALED" in data
        assert b"auditor" in data and b"cannot be read by this broker" in data
        assert b"mallory" not in data


async def test_a_request_the_broker_cannot_read_is_not_approved_from_the_console(
    tmp_path: Path, token: str
) -> None:
    """No approve button for it, and an approval posted anyway is refused REQUEST_UNREADABLE:
    the console grants nothing blind (``affidavit approvals approve --blind`` does)."""
    async with console_world(tmp_path, token, wait="0s") as world:
        iid = await _pending(world, body=PADDED)
        other = BrokerKey.create(tmp_path / "another.key")
        _seal_view(world.daemon.journal, iid, other)
        cookie, csrf = await log_in(world)
        status, _, page = await get(f"{world.origin}/approvals", cookie=cookie)
        assert status == 200 and f"/approvals/{iid}/approve".encode() not in page
        status, _, page = await post(
            f"{world.origin}/approvals/{iid}/approve",
            {"csrf": csrf, "note": "looks fine"},
            {"Origin": world.origin, "Cookie": cookie},
        )
        assert status == 409 and b"REQUEST_UNREADABLE" in page, page
        # It names no field the console lacks (``blind``), and says where one is.
        assert b"affidavit approvals approve ID --blind" in page, page
        assert b'data-field="blind"' not in page, page
        kinds = [e["kind"] for e in (await world.record(iid))["events"]]
        assert "APPROVAL_GRANTED" not in kinds, kinds
    assert world.pay.requests == []


def _seal_view(journal: Path, iid: str, key: BrokerKey) -> None:
    """APPROVAL_REQUESTED's payload (the operator's view) sealed with ``key`` instead, in
    place (the append-only trigger dropped: the daemon reopening the journal puts it back)."""
    conn = sqlite3.connect(journal)
    try:
        (seq,) = conn.execute(
            "SELECT seq FROM events WHERE invocation_id = ? AND kind = 'APPROVAL_REQUESTED'",
            (iid,),
        ).fetchone()
        conn.execute("DROP TRIGGER IF EXISTS events_no_update")
        view = canonical_json({"request": {}}).encode()
        sealed = key.seal(view, payload_aad(iid, "APPROVAL_REQUESTED"))
        conn.execute("UPDATE events SET payload = ? WHERE seq = ?", (sealed, seq))
        conn.commit()
    finally:
        conn.close()


async def test_the_command_line_writes_the_same_bytes_through_the_daemon_and_embedded(
    tmp_path: Path, token: str
) -> None:
    """``affidavit approvals show ID --content body``: the bytes raw on stdout, checked the
    same way (``approvals.content``); a mismatch is exit 2 with nothing written."""
    async with console_world(tmp_path, token, wait="0s") as world:
        binary = await _pending(world, body_base64=base64.b64encode(BLOB).decode())
        padded = await _pending(world, body=PADDED)
        config = str(world.daemon.config)
        for iid, sent in ((binary, BLOB), (padded, PADDED.encode())):
            through = await cli(world.daemon, "approvals", "show", iid, "--content", "body")
            assert through.returncode == 0, through.stderr
            assert through.stdout == sent
            here = await embedded("approvals", "show", iid, "--content", "body", "--config", config)
            assert here.returncode == 0, here.stderr
            assert here.stdout == sent
        missing = await cli(world.daemon, "approvals", "show", padded, "--content", "stdin")
        assert missing.returncode == 2 and b"has no content 'stdin'" in missing.stderr
        key = BrokerKey.load(Path(f"{world.daemon.journal}.key"))
        reseal_accepted(world.daemon.journal, padded, {**CHARGE, "body": "other"}, key)
        for refused in (
            await cli(world.daemon, "approvals", "show", padded, "--content", "body"),
            await embedded("approvals", "show", padded, "--content", "body", "--config", config),
        ):
            assert refused.returncode == 2 and b"does not match" in refused.stderr
            assert refused.stdout == b""


def test_each_protocol_names_its_contents_as_its_view_hashes_them() -> None:
    """``operator_contents`` (beside each protocol's ``operator_view``) gives back, from the
    accepted action's JSON, the bytes whose size and hash the view recorded."""
    http, ssh = protocol("http"), protocol("ssh")
    assert http is not None and ssh is not None
    pick_http, pick_ssh = http.action.operator_contents, ssh.action.operator_contents
    assert pick_http is not None and pick_ssh is not None
    assert pick_http({"body": "é" * 3}) == {"body": "é".encode() * 3}
    assert pick_http({"body_base64": base64.b64encode(BLOB).decode()}) == {"body": BLOB}
    assert pick_http({}) == {"body": b""}
    big = "s" * (STDIN_SHOWN + 1)
    assert pick_ssh({"command": "sh -s", "stdin": big}) == {"stdin": big.encode()}
    assert pick_ssh({"command": "true"}) == {}
