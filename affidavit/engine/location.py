"""Where the journal lives, kept out of what a caller is told (``unplaced``).

The journal's own words name its file or its database's URL (``journal /var/lib/x.db: ...``,
``cannot connect to journal postgresql://broker@db/affidavit: ...``).  A caller -- an agent,
through the daemon's socket or an MCP server embedded in the config owner's process -- has no
business knowing it: every surface answering one takes it out with this one function, and the
operator's log keeps it."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
from collections.abc import Iterable
from urllib.parse import parse_qsl, unquote

from affidavit.journal import JournalReplaced
from affidavit.journal.backend import is_url, split_url
from affidavit.journal.backend import where as journal_where
from affidavit.journal.names import journal_file

from .recovery import READ_DECLINED, UNREADABLE, CallNotRecorded

__all__ = ["JOURNAL_WORDS", "unplaced", "withheld"]

JOURNAL_WORDS = frozenset(
    {
        UNREADABLE,
        READ_DECLINED,
        CallNotRecorded.code,
        JournalReplaced.code,
        "RESULT_UNVERIFIED",
        "CONSOLE_TOKENS",
    }
)
"""The codes of answers whose message may hold the journal's (or its files') own words, and so
its location.  Not ``OPERATION_ERROR``: its message names the operation id the caller sent
(``no operation <id> in the journal``), or the target's configuration -- never the journal's
words (a journal that fails the poll is ``poll_failure``'s, under these codes)."""


def unplaced(
    code: str,
    message: str,
    location: str | os.PathLike[str],
    echoed: Iterable[str] = (),
    keys: Iterable[str | os.PathLike[str] | None] = (),
    opened: str | os.PathLike[str] | None = None,
) -> str:
    """``message`` (an answer coded ``code``) without where the journal at ``location`` lives:
    ``the journal`` stands for it -- for the file's path, for the URL as messages name it
    (``journal_where``: without its password) and for the URL as configured, password and all.
    ``opened``: the file the journal's backend opened (``Journal.path``: the name resolved once,
    at its open), whose segments' words name it -- a link re-pointed since resolves elsewhere.
    Nor where its key files (``keys``: ``JournalConfig.key_files``) live, wherever that is:
    the journal's words name them (``broker key file <path> does not match this journal``);
    each path as configured and resolved goes (``_keyless``), before the journal's -- a key
    file beside the journal has its path for a prefix.
    Only answers that carry the journal's words (``JOURNAL_WORDS``) are changed: another echoes
    what the caller sent (a path, an id), and a guess of the location echoed back as ``the
    journal`` would tell the caller it guessed right.

    A PostgreSQL driver's own words name the server and the database apart from the URL
    (``connection to server at "db" (10.0.0.5), port 5432 failed: FATAL: database "x" ...``):
    that preamble goes, and the URL's host, database and user where quoted (``_unnamed``).

    ``echoed``: the caller's own text the journal's words may quote (the ids of the request's
    path).  One holding a character no id the broker gives holds (``act_``/``op_`` and
    Crockford base32) -- a ``/`` of a path or URL, a ``"`` of a quoted name -- could hold what
    is taken out, and the journal's words quoting it are not told at all (``withheld``): taken
    out of them, the location would be taken out of the caller's guess too, when right.

    Not ``echoed``: what an altered row holds, quoted by the words that report it (a binding
    row's scope and the invocation it names, ``journal/bindings.py``).  Those words are said
    only of a row someone with write access to the journal altered (the broker writes no row
    its reads refuse) -- who knows where the journal lives -- and they never quote the
    caller's idempotency key (``bindings.py``: scope, invocations and seq only).  No guess of
    the caller's is in them, so taking the location out of them tells the caller nothing."""
    if code not in JOURNAL_WORDS:
        return message
    for text in echoed:
        if not _ID_CHARS.fullmatch(text):
            return withheld(text)
    message = _keyless(message, keys)
    message = _unnamed(message, location)
    # Longest first: a relative name given (``j.db``) ends the resolved path it names.
    for where in sorted(_named(location, opened), key=len, reverse=True):
        if not where or where not in message:
            continue
        message = message.replace(f"journal at {where}", "journal")
        message = message.replace(f"journal {where}", "the journal")
        message = message.replace(where, "the journal")
    return message


def _named(location: str | os.PathLike[str], opened: str | os.PathLike[str] | None) -> set[str]:
    """Every way the journal's words name the journal at ``location``: the URL as messages
    name it and as configured; a file as given, as its backend ``opened`` it, and as it resolves
    now (``names.journal_file``; a reader opened since, by the name, resolved it so) -- the
    directory its derived files are named after (``<file>.results/``, the segment files'
    messages)."""
    said = {journal_where(location), str(location)}
    if opened is not None:
        said.add(os.fspath(opened))
    if not is_url(location):
        with contextlib.suppress(OSError, ValueError):
            said.add(str(journal_file(location)))
    return said


_ID_CHARS = re.compile(r"[A-Za-z0-9_-]*")
"""Every character of an id the broker gives (invocation, operation), and a few more."""
_SERVER = re.compile(
    r'connection to server (?:at "[^"]*"(?: \([^)]*\))?, port \d+|on socket "[^"]*") failed'
)
"""libpq's preamble naming the server it could not connect to: its host, address and port."""


def _keyless(message: str, keys: Iterable[str | os.PathLike[str] | None]) -> str:
    """``message`` without the paths of the key files ``keys`` (as given, absolute, resolved):
    ``key file <path>`` is ``key file``, a path elsewhere (``chmod 600 <path>``, quoted for
    the shell or not) ``the key file``.  Longest first: one path may be the start of another
    (``x.key``, ``x.key2``)."""
    paths: set[str] = set()
    for key in keys:
        if key is None:
            continue
        paths.add(os.fspath(key))
        paths.add(os.path.abspath(key))
        with contextlib.suppress(OSError, ValueError):  # (a key the broker loaded resolves)
            paths.add(os.path.realpath(key))
    # As the words that mend a key file quote it for the shell (``chmod 600 '<path>'``).
    paths |= {shlex.quote(p) for p in paths if p}
    for path in sorted((p for p in paths if p), key=len, reverse=True):
        if path in message:
            message = message.replace(f"file {path}", "file").replace(path, "the key file")
    return message


def _unnamed(message: str, location: str | os.PathLike[str]) -> str:
    """``message`` without the PostgreSQL server's and database's names as the driver words
    them: its preamble (``_SERVER``), and every host, host address, database and user the URL
    names (``_names``), quoted (``"db"``, ``'db'``), in any case -- libpq quotes what it names.
    Never unquoted: a bare name (``db``, ``localhost``) is an id's characters, and a caller's id
    echoed in the words (``echoed``) taken out when it equals a host would confirm the guess."""
    if not is_url(location):
        return message
    message = _SERVER.sub("connection to the journal's server failed", message)
    for name in sorted(_names(str(location)), key=len, reverse=True):
        quoted = re.escape(name)
        message = re.sub(f"\"{quoted}\"|'{quoted}'", "(the journal's)", message, flags=re.I)
    return message


def _names(url: str) -> set[str]:
    """Every host and host address, database and user a libpq URL names: as libpq reads it
    (psycopg's ``conninfo_to_dict``: ``host=a,b`` lists, ``?host=``, ``?hostaddr=``,
    ``?dbname=``, ``?user=``), and as the URL is written -- each host of a multi-host
    authority, each value of a parameter given twice (libpq keeps the last).  A URL that cannot
    be parsed at all is left for ``where`` (the URL itself) to take out."""
    read: list[tuple[str, str]] = []
    try:
        from psycopg.conninfo import conninfo_to_dict

        read += [(k, str(v)) for k, v in conninfo_to_dict(url).items() if v is not None]
    except Exception:  # no psycopg (a SQLite install), or libpq refuses it: as written, below
        pass
    with contextlib.suppress(ValueError):
        parts = split_url(url)  # its password must not stay in urllib's cache
        user, at, hostports = parts.netloc.rpartition("@")
        read += [("user", unquote(user.partition(":")[0]))] if at else []
        for host in hostports.split(","):
            bracketed = host.startswith("[") and "]" in host
            name = host[1 : host.index("]")] if bracketed else host.split(":")[0]
            read.append(("host", unquote(name)))
        read.append(("dbname", unquote(parts.path.lstrip("/"))))
        read += parse_qsl(parts.query)
    names: set[str] = set()
    for key, value in read:
        if key in ("host", "hostaddr"):
            names.update(h.strip() for h in value.split(","))
        elif key in ("dbname", "user"):
            names.add(value)
    return {name for name in names if name}


def withheld(text: str) -> str:
    """The message of a journal-words answer about caller text that is no id's (``unplaced``):
    the same whatever the journal's words were, and wherever it lives."""
    return (
        f"the journal could not answer about {text}; its words are not told for an id with a "
        "character no id the broker gives has"
    )
