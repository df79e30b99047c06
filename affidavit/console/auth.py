"""Who is logged in to the console: one-time login tokens, sessions, CSRF tokens.

* A login token is minted for an operator (``affidavit console-url``: embedded, the OS user;
  through the daemon, the socket peer -- either way the operator check of
  ``affidavit.approvals`` runs first).  It is random (256 bits), single use and short-lived,
  and stored hashed: a file named by its SHA-256 in a directory beside the journal, mode 0600
  in a 0700 directory, holding the operator's identity and the expiry, never the token.  The
  daemon redeems it by unlinking that file -- only one unlink can succeed, so a token logs in
  once even if two requests race.  The directory is trusted only when it is this user's own
  and closed to everyone else (checked with lstat: not a symlink), and a token file only when
  this user owns it (opened with O_NOFOLLOW): a directory another user made or can write into
  could otherwise hand the daemon a forged login.
* A session lives in the daemon's memory (a restart logs everyone out): a random id in a cookie
  (HttpOnly, SameSite=Strict), the operator the token named, and a CSRF token every
  state-changing form carries back.  It expires ``SESSION_TTL`` after login, or ``IDLE_TTL``
  after its last request, whichever comes first.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from affidavit.approvals import Operator

__all__ = [
    "IDLE_TTL",
    "SESSION_TTL",
    "TOKEN_TTL",
    "Session",
    "Sessions",
    "TokenDirError",
    "TokenStore",
    "login_url",
    "token_dir",
]

TOKEN_TTL = 300.0
"""A login link is for now: five minutes."""
SESSION_TTL = 8 * 3600.0
"""A working day; then ``affidavit console-url`` again."""
IDLE_TTL = 30 * 60.0
"""A session nobody used for half an hour ends (a browser left open is not a login)."""
_HASHED = 64  # hex SHA-256: the file name of a stored token


def token_dir(journal_path: Path) -> Path:
    """Where login tokens wait: ``<journal>.console-tokens/`` (the daemon's user's alone),
    beside the file a link names (``journal.names``: the daemon and ``console-url`` agree
    whatever name each was given)."""
    from affidavit.journal.names import beside

    return beside(journal_path, ".console-tokens")


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class TokenDirError(OSError):
    """The token directory is not this user's private directory: nothing in it is trusted."""


class TokenStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _checked(self, *, create: bool) -> bool:
        """Whether the directory exists and is ours alone; ``TokenDirError`` when it exists and
        is not (a symlink, another owner, or open to group or others)."""
        if create:
            with contextlib.suppress(FileExistsError):
                self.directory.mkdir(mode=0o700)
        try:
            st = os.lstat(self.directory)
        except FileNotFoundError:
            return False
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise TokenDirError(
                f"{self.directory} must be a directory owned by uid {os.geteuid()} with mode "
                f"0700 (it is {'a directory' if stat.S_ISDIR(st.st_mode) else 'not a directory'}"
                f" of uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}): remove it or fix it"
            )
        return True

    def mint(self, operator: Operator, *, ttl: float = TOKEN_TTL) -> tuple[str, float]:
        """A new one-time token for ``operator`` and its expiry (wall clock)."""
        self._checked(create=True)
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

    def redeem(
        self, token: str, check: Callable[[Operator], None] | None = None
    ) -> Operator | None:
        """The operator a valid, unused, unexpired token names -- once; else None.  ``check``
        runs on that operator before the token is used up: whatever it raises leaves the token
        as it was (a stranger presenting a stolen link cannot burn it)."""
        if not 20 <= len(token) <= 100:
            return None
        path = self.directory / _digest(token)
        try:
            if not self._checked(create=False):
                return None
            text = _read_own(path)
        except TokenDirError:
            raise
        except OSError:
            return None
        who = _entry(text)
        if who is None:  # expired or unreadable: used up all the same
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        if check is not None:
            check(who)
        try:
            path.unlink()  # the one redemption: a second unlink finds nothing
        except OSError:
            return None
        return who

    def _sweep(self) -> None:
        """Expired tokens go when a new one is minted (nothing else lists the directory)."""
        now = time.time()
        for path in self.directory.iterdir():
            if len(path.name) != _HASHED:
                continue
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                if float(json.loads(_read_own(path))["expires_at"]) < now:
                    path.unlink()


def _entry(text: str) -> Operator | None:
    """The operator an unexpired token file names, or None."""
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


def _read_own(path: Path) -> str:
    """A token file's text: never through a symlink, and only a file this user owns."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise PermissionError(f"{path.name} is not this user's file")
        return f.read(4096).decode("utf-8")


@dataclass
class Session:
    id: str
    operator: Operator
    csrf: str
    expires_at: float
    last_seen: float
    csrf_shown_disabled: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    """The CSRF token of a page rendered with its decision buttons disabled (a navigation
    another page started: ``app._decidable``): it logs out, and decides nothing -- a decision's
    form must carry ``csrf``, which only a page rendered enabled holds (the double-click
    defence, docs/console.md)."""
    held: bool = False
    """Whether its pages render held (decision buttons disabled, ``csrf_shown_disabled``):
    set by a navigation another page started, and kept by every page the console's own links
    open -- a disabled page's link (its nav, an entry, its own reload) would otherwise open one
    rendered enabled, and a third click placed in advance would decide.  Cleared only by what a
    click placed in advance cannot land: the page's reload link, which the console's script
    holds back until the operator is at the page (``/reload``; or a new session: logging in
    again).  Only ever stricter; it spans the session's tabs."""
    notice: tuple[str, str, str] | None = None
    """What the operator's last decision did -- (kind, invocation id, how) -- shown once by the
    page the decision redirects to; kept here, never in the URL, where any link could claim a
    decision nobody made."""

    def take_notice(self, kind: str, invocation_id: str | None = None) -> str | None:
        """The notice's ``how`` (or its id, for ``decided``) when it is of ``kind`` (and, with
        an id, that invocation's), used up; else None (any notice is used up all the same)."""
        notice, self.notice = self.notice, None
        if notice is None or notice[0] != kind:
            return None
        if invocation_id is not None and notice[1] != invocation_id:
            return None
        return notice[2] or notice[1]

    def csrf_ok(self, given: str | None, *, decision: bool = True) -> bool:
        """Whether ``given`` is this session's CSRF token: the one a page rendered with its
        decision buttons enabled holds, or (``decision`` False: logging out) either."""
        tokens = (self.csrf,) if decision else (self.csrf, self.csrf_shown_disabled)
        return given is not None and any(
            hmac.compare_digest(given.encode("utf-8", "surrogatepass"), t.encode("ascii"))
            for t in tokens
        )


class Sessions:
    def __init__(self, ttl: float = SESSION_TTL, idle: float = IDLE_TTL) -> None:
        self.ttl, self.idle = ttl, idle
        self._by_id: dict[str, Session] = {}

    def _over(self, session: Session, now: float) -> bool:
        return session.expires_at < now or session.last_seen + self.idle < now

    def start(self, operator: Operator) -> Session:
        now = time.time()
        for sid in [s.id for s in self._by_id.values() if self._over(s, now)]:
            del self._by_id[sid]
        session = Session(
            secrets.token_urlsafe(32), operator, secrets.token_urlsafe(32), now + self.ttl, now
        )
        self._by_id[session.id] = session
        return session

    def get(self, sid: str | None, *, used: bool = True) -> Session | None:
        """The live session of this id; None when there is none.  Its idle clock restarts only
        when ``used``: a page reloading itself (the actions view's live refresh) is nobody's
        use, and must not keep a browser left open logged in; nor is a request the console
        then refuses (``used=False``, then ``touch`` once it is the operator's)."""
        session = self._by_id.get(sid) if sid else None
        now = time.time()
        if session is None or self._over(session, now):
            return None
        if used:
            session.last_seen = now
        return session

    def touch(self, session: Session) -> None:
        """The operator used ``session``: its idle clock restarts."""
        session.last_seen = time.time()

    def end(self, sid: str) -> None:
        self._by_id.pop(sid, None)


def login_url(base: str, token: str) -> str:
    """The link ``affidavit console-url`` prints."""
    return f"{base}/login?token={token}"
