"""The console's pieces without a daemon: login tokens, sessions, the lifecycle drawing."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from affidavit.approvals import Operator
from affidavit.console import Sessions, TokenStore, lifecycle_svg
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
