"""Where the journal lives, kept out of what a caller is told (``unplaced``).

The journal's own words name its file or its database's URL (``journal /var/lib/x.db: ...``,
``cannot connect to journal postgresql://broker@db/affidavit: ...``).  A caller -- an agent,
through the daemon's socket or an MCP server embedded in the config owner's process -- has no
business knowing it: every surface answering one takes it out with this one function, and the
operator's log keeps it."""

from __future__ import annotations

import os
from collections.abc import Iterable

from affidavit.journal.backend import where as journal_where

from .recovery import READ_DECLINED, UNREADABLE, CallNotRecorded

__all__ = ["JOURNAL_WORDS", "unplaced", "withheld"]

JOURNAL_WORDS = frozenset(
    {
        UNREADABLE,
        READ_DECLINED,
        CallNotRecorded.code,
        "RESULT_UNVERIFIED",
        "CONSOLE_TOKENS",
    }
)
"""The codes of answers whose message may hold the journal's (or its files') own words, and so
its location.  Not ``OPERATION_ERROR``: its message names the operation id the caller sent
(``no operation <id> in the journal``), or the target's configuration -- never the journal's
words (a journal that fails the poll is ``poll_failure``'s, under these codes)."""


def unplaced(
    code: str, message: str, location: str | os.PathLike[str], echoed: Iterable[str] = ()
) -> str:
    """``message`` (an answer coded ``code``) without where the journal at ``location`` lives:
    ``the journal`` stands for it -- for the file's path, for the URL as messages name it
    (``journal_where``: without its password) and for the URL as configured, password and all.
    Only answers that carry the journal's words (``JOURNAL_WORDS``) are changed: another echoes
    what the caller sent (a path, an id), and a guess of the location echoed back as ``the
    journal`` would tell the caller it guessed right.

    ``echoed``: the caller's own text the journal's words may quote (the ids of the request's
    path).  One holding a ``/`` could hold the location (every one holds a ``/``: an absolute
    path, a URL) -- no id the broker gives does -- and the journal's words quoting it are not
    told at all (``withheld``): taken out of them, the location would be taken out of the
    caller's guess too, when right."""
    if code not in JOURNAL_WORDS:
        return message
    for text in echoed:
        if "/" in text:
            return withheld(text)
    for where in dict.fromkeys((journal_where(location), str(location))):
        if not where or where not in message:
            continue
        message = message.replace(f"journal at {where}", "journal")
        message = message.replace(f"journal {where}", "the journal")
        message = message.replace(where, "the journal")
    return message


def withheld(text: str) -> str:
    """The message of a journal-words answer about caller text holding a ``/``
    (``unplaced``): the same whatever the journal's words were, and wherever it lives."""
    return (
        f"the journal could not answer about {text}; its words are not told for an id holding "
        "'/' (no id the broker gives holds one)"
    )
