"""Who is logged in to the console: one-time login tokens, sessions, CSRF tokens.

* A login token is minted for an operator (``affidavit console-url``: embedded, the OS user;
  through the daemon, the socket peer -- either way the operator check of
  ``affidavit.approvals`` runs first).  It is random (256 bits), single use and short-lived,
  and stored hashed: a file named by its SHA-256 in a directory beside the journal, mode 0600
  in a 0700 directory, holding the operator's identity and the expiry, never the token.  The
  daemon redeems it by unlinking that file -- only one unlink can succeed, so a token logs in
  once even if two requests race.
* A session lives in the daemon's memory (a restart logs everyone out): a random id in a cookie
  (HttpOnly, SameSite=Strict), the operator the token named, and a CSRF token every
  state-changing form carries back.  It expires ``SESSION_TTL`` after login.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from affidavit.approvals import Operator

__all__ = [
    "SESSION_TTL",
    "TOKEN_TTL",
    "Session",
    "Sessions",
    "TokenStore",
    "login_url",
    "token_dir",
]

TOKEN_TTL = 300.0
"""A login link is for now: five minutes."""
SESSION_TTL = 8 * 3600.0
"""A working day; then ``affidavit console-url`` again."""
_HASHED = 64  # hex SHA-256: the file name of a stored token


def token_dir(journal_path: Path) -> Path:
    """Where login tokens wait: ``<journal>.console-tokens/`` (the daemon's user's alone)."""
    return journal_path.with_name(journal_path.name + ".console-tokens")


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class TokenStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def mint(self, operator: Operator, *, ttl: float = TOKEN_TTL) -> tuple[str, float]:
        """A new one-time token for ``operator`` and its expiry (wall clock)."""
        self.directory.mkdir(mode=0o700, exist_ok=True)
        self._sweep()
        token = secrets.token_urlsafe(32)
        expires = time.time() + ttl
        entry = {
            "uid": operator.uid,
            "gid": operator.gid,
            "groups": list(operator.groups),
            "name": operator.name,
            "expires_at": expires,
        }
        final = self.directory / _digest(token)
        temp = final.with_suffix(".tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(entry, f)
        os.replace(temp, final)
        return token, expires

    def redeem(self, token: str) -> Operator | None:
        """The operator a valid, unused, unexpired token names -- once; else None."""
        if not 20 <= len(token) <= 100:
            return None
        path = self.directory / _digest(token)
        try:
            text = path.read_text(encoding="utf-8")
            path.unlink()  # the one redemption: a second unlink finds nothing
        except OSError:
            return None
        try:
            entry = json.loads(text)
            if float(entry["expires_at"]) < time.time():
                return None
            return Operator(
                int(entry["uid"]),
                int(entry["gid"]),
                tuple(int(g) for g in entry["groups"]),
                entry.get("name"),
                "console",
            )
        except (ValueError, KeyError, TypeError):
            return None

    def _sweep(self) -> None:
        """Expired tokens go when a new one is minted (nothing else lists the directory)."""
        now = time.time()
        for path in self.directory.iterdir():
            if len(path.name) != _HASHED:
                continue
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                if float(json.loads(path.read_text("utf-8"))["expires_at"]) < now:
                    path.unlink()


@dataclass(frozen=True)
class Session:
    id: str
    operator: Operator
    csrf: str
    expires_at: float

    def csrf_ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(
            given.encode("utf-8", "surrogatepass"), self.csrf.encode("ascii")
        )


class Sessions:
    def __init__(self, ttl: float = SESSION_TTL) -> None:
        self.ttl = ttl
        self._by_id: dict[str, Session] = {}

    def start(self, operator: Operator) -> Session:
        now = time.time()
        for sid in [s.id for s in self._by_id.values() if s.expires_at < now]:
            del self._by_id[sid]
        session = Session(
            secrets.token_urlsafe(32), operator, secrets.token_urlsafe(32), now + self.ttl
        )
        self._by_id[session.id] = session
        return session

    def get(self, sid: str | None) -> Session | None:
        session = self._by_id.get(sid) if sid else None
        if session is None or session.expires_at < time.time():
            return None
        return session

    def end(self, sid: str) -> None:
        self._by_id.pop(sid, None)


def login_url(base: str, token: str) -> str:
    """The link ``affidavit console-url`` prints."""
    return f"{base}/login?token={token}"
