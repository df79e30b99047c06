"""The console's pieces without a daemon: login tokens (and the directory they wait in),
sessions, the lifecycle drawing."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest

from affidavit.approvals import Operator
from affidavit.console import Sessions, TokenDirError, TokenStore, lifecycle_svg
from affidavit.statemachine import STATES

OPS = Operator(4242, 4242, (10,), "ops", "socket")


def test_a_token_is_stored_hashed_redeemed_once_and_only_in_time(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "tokens")
    token, _ = store.mint(OPS)
    [stored] = list((tmp_path / "tokens").iterdir())
    assert stored.name == hashlib.sha256(token.encode()).hexdigest()
    assert token not in stored.read_text()
    who = store.redeem(token)
    assert who == Operator(4242, 4242, (10,), "ops", "console")  # the channel is the console
    assert store.redeem(token) is None

    late, _ = store.mint(OPS, ttl=-1)
    assert store.redeem(late) is None
    for junk in ("", "x", "a" * 500, "../../etc/passwd" * 3):
        assert store.redeem(junk) is None


def test_minting_sweeps_expired_tokens(tmp_path: Path) -> None:
    store = TokenStore(tmp_path)
    store.mint(OPS, ttl=-1)
    kept, _ = store.mint(OPS)
    assert len(list(tmp_path.iterdir())) == 1
    assert store.redeem(kept) is not None


def test_sessions_expire_and_check_their_csrf_token() -> None:
    sessions = Sessions()
    s = sessions.start(OPS)
    assert sessions.get(s.id) is s and sessions.get("other") is None and sessions.get(None) is None
    assert s.csrf_ok(s.csrf) and not s.csrf_ok(s.csrf + "x") and not s.csrf_ok(None)
    sessions.end(s.id)
    assert sessions.get(s.id) is None
    stale = Sessions(ttl=-1).start(OPS)
    assert Sessions(ttl=-1).get(stale.id) is None


def test_the_drawing_shows_every_state_and_marks_the_path() -> None:
    path = ["new", "accepted", "validated", "authorized", "dispatched", "interrupted"]
    svg = lifecycle_svg(path)
    drawn = re.findall(r'data-state="([a-z_]+)"', svg)
    assert sorted(drawn) == sorted(STATES)
    assert re.findall(r'class="state [a-z_]+ visited current" data-state="([a-z_]+)"', svg) == [
        "interrupted"
    ]
    assert svg.count('class="edge on"') == len(path) - 1
    assert "<script" not in svg


def test_a_session_left_idle_ends_before_its_expiry() -> None:
    sessions = Sessions(ttl=8 * 3600, idle=1800)
    session = sessions.start(OPS)
    session.last_seen -= 1700
    assert sessions.get(session.id) is session  # used: its idle clock restarts
    session.last_seen -= 1801
    assert sessions.get(session.id) is None


def test_the_token_directory_must_be_this_user_s_alone(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "tokens")
    token, _ = store.mint(OPS)
    directory = tmp_path / "tokens"
    directory.chmod(0o755)  # open to others: nothing in it is trusted
    with pytest.raises(TokenDirError, match="mode 0700"):
        store.mint(OPS)
    with pytest.raises(TokenDirError):
        store.redeem(token)
    directory.chmod(0o700)
    os.chown(directory, 65534, 65534)  # another user's directory (this test runs as root)
    with pytest.raises(TokenDirError, match="owned by uid"):
        store.mint(OPS)
    os.chown(directory, os.geteuid(), os.getegid())
    assert store.redeem(token) == Operator(4242, 4242, (10,), "ops", "console")

    # A symlink in place of the directory is refused, not followed.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "linked").symlink_to(elsewhere)
    with pytest.raises(TokenDirError, match="not a directory"):
        TokenStore(tmp_path / "linked").mint(OPS)


def test_a_token_file_is_trusted_only_when_it_is_this_user_s_own_file(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "tokens")
    theirs, _ = store.mint(OPS)
    path = tmp_path / "tokens" / hashlib.sha256(theirs.encode()).hexdigest()
    os.chown(path, 65534, 65534)  # a file another user put there
    assert store.redeem(theirs) is None
    linked, _ = store.mint(OPS)
    path = tmp_path / "tokens" / hashlib.sha256(linked.encode()).hexdigest()
    target = tmp_path / "forged"
    os.replace(path, target)
    path.symlink_to(target)  # a symlink to a file elsewhere: not followed
    assert store.redeem(linked) is None


@pytest.mark.parametrize("netlink", [True, False], ids=["netlink", "proc"])
def test_only_an_established_client_socket_names_its_owner(
    monkeypatch: pytest.MonkeyPatch, netlink: bool
) -> None:
    """The console's owner check asks the kernel of the client's end (netlink ``sock_diag``,
    or /proc/net/tcp where that does not work).  Once the client has closed it (an agent
    sending a request and closing at once), the socket that remains is an orphan's --
    FIN_WAIT, then TIME_WAIT, which the kernel reports with uid 0 -- and must name no one:
    before, a request from any local user could pass as root's."""
    import socket
    import time

    from affidavit.console import peer
    from affidavit.console.peer import socket_owner

    if not netlink:
        monkeypatch.setattr(peer, "_works", False)  # as on a kernel without sock_diag
    assert peer._netlink_works() is netlink  # (this one answers it)

    listener = socket.create_server(("127.0.0.1", 0))
    with listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        with server:
            local, remote = client.getsockname(), server.getsockname()
            assert socket_owner(local, remote) == os.getuid()
            client.close()  # the client's end: FIN_WAIT2 until the server closes
            deadline = time.monotonic() + 5
            while socket_owner(local, remote) is not None and time.monotonic() < deadline:
                time.sleep(0.01)
            assert socket_owner(local, remote) is None
            server.close()  # now the client's end is TIME_WAIT (uid 0 in the table)
            time.sleep(0.05)
            rows = [r for r in _proc_rows() if r[0] == local[1] and r[1] == remote[1]]
            assert socket_owner(local, remote) is None, rows


def _proc_rows() -> list[tuple[int, int, str, int]]:
    """(local port, remote port, state, uid) of /proc/net/tcp's rows, for the message."""
    from pathlib import Path

    out = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        out.append((int(f[1].split(":")[1], 16), int(f[2].split(":")[1], 16), f[3], int(f[7])))
    return out


def test_a_token_refused_by_the_check_is_not_used_up(tmp_path: Path) -> None:
    """The console checks who owns the connection before a login token is spent: a stranger
    presenting an operator's stolen link is refused and the link still works for its owner
    (before, the refusal came after the redemption and burnt it)."""
    store = TokenStore(tmp_path / "tokens")
    token, _ = store.mint(OPS)

    class Stranger(Exception):
        pass

    def refuse(who: object) -> None:
        raise Stranger(who)

    with pytest.raises(Stranger):
        store.redeem(token, refuse)
    seen: list[object] = []
    assert store.redeem(token, seen.append) == Operator(4242, 4242, (10,), "ops", "console")
    assert seen == [Operator(4242, 4242, (10,), "ops", "console")]
    assert store.redeem(token) is None  # once
    late, _ = store.mint(OPS, ttl=-1)
    assert store.redeem(late, refuse) is None  # expired: never reaches the check
    assert list((tmp_path / "tokens").iterdir()) == []


def test_a_journal_refusal_logs_the_journal_s_words_escaped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The journal's words name what it could not read -- ``the record of ID``, the id decoded
    from the page's path -- so a ``%0A`` in it would start a line of the caller's own."""
    import logging

    from affidavit.console.request import _journal_refusal
    from affidavit.engine import read_failure
    from affidavit.journal import JournalUnavailable

    what = "the record of act_x\n2026-01-01 forged\x1b[2J"
    exc = JournalUnavailable(f"{what} cannot be read: cannot connect")
    caplog.set_level(logging.WARNING, logger="affidavit.console")
    refused = _journal_refusal(exc, read_failure(exc, what))
    assert refused.code == "JOURNAL_UNAVAILABLE"
    [line] = [r.getMessage() for r in caplog.records]
    assert "\n" not in line and "\x1b" not in line, line
    assert line.count("act_x\\n2026-01-01 forged\\u001b[2J") == 2, line
