"""Templates of a reconciliation query: ``{name}`` placeholders filled with an invocation's bound
values, escaped for where they land -- a URL path or query, or a POSIX shell command.

Seed, "Idempotency is defined by the remote contract": "Query the remote state by a stable
identifier, reconcile it, and decide whether a new action is needed."  The identifier is a value
the journal bound to the invocation (its idempotency key, its id, its session); a template never
sees anything else, and a value never changes the template's syntax:

* in an HTTP ``path`` a value is percent-encoded as one path segment or query value: every
  character but ``A-Z a-z 0-9 - . _ ~`` (RFC 3986 unreserved) is escaped, so ``/``, ``?``,
  ``&``, ``=`` and ``#`` in a key stay data;
* in an SSH ``command`` a value must be a *plain word* (``SHELL_WORD``: ``A-Z a-z 0-9`` first,
  then those and ``. _ : @ + -``) and is single-quoted for the POSIX shell besides
  (``shlex.quote``, a no-op on such a word).  Quoting alone is not enough: it protects the value
  from the shell that parses the template, not from a shell the template starts (``sh -c
  "test -e /srv/"{key}``, ``bash -c``, ``eval``, ``su -c``, a second ``ssh``), which parses the
  unquoted value again -- a caller's key ``r1;reboot`` would run there.  A plain word holds no
  character any shell, at any depth, treats as syntax (no quote, ``$``, backquote, ``;``,
  space, glob, ``~``, ``/``), and cannot start an option or name a parent directory.  A value
  that is not one refuses the query (``ValueError``: ``NO_QUERY``), and an SSH action whose
  target's query names the key or session refuses such a value at acceptance
  (``affidavit.protocols.ssh.action``).  The placeholder must also stand outside any quoting of
  the template (``test -e /srv/{key}``, never ``test -e '/srv/{key}'`` or ``"$HOME/{key}"``),
  not right after ``$``, ``\\`` or a ``$NAME`` its letters would extend, and not between
  braces a shell could expand (``_Quoting``): such a template is refused when the config is
  loaded.

``{{`` and ``}}`` are literal braces.
"""

from __future__ import annotations

import re
import shlex
import string
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = [
    "NAMES",
    "SHELL_WORD",
    "SHELL_WORD_RULE",
    "Template",
    "parse_template",
    "shell_escape",
    "url_escape",
]

NAMES = ("invocation_id", "idempotency_key", "session")
"""What a template may name: values bound to the invocation when it was accepted."""


def url_escape(value: str) -> str:
    return urllib.parse.quote(value, safe="")


SHELL_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]*")
"""A value an SSH command template takes: inert in every shell that may parse it, at any depth.
Not ``,`` (bash and zsh read it as syntax between braces: ``/srv/{{old,{key}}}`` with a key
``a,b`` expands to three words) nor ``=`` (zsh expands ``=cmd`` after ``=`` or ``:`` in an
assignment -- ``typeset R={key}`` with a key ``a:=ls`` is ``a:/usr/bin/ls``)."""

SHELL_WORD_RULE = "must be a plain word (A-Z a-z 0-9, then also . _ : @ + -)"


def shell_escape(value: str) -> str:
    """``value`` quoted for the shell; ``ValueError`` if it is not a plain word (``SHELL_WORD``):
    the template may hand it to a second shell, which would parse it unquoted."""
    if not SHELL_WORD.fullmatch(value):
        raise ValueError(SHELL_WORD_RULE)
    return shlex.quote(value)


@dataclass(frozen=True)
class Template:
    text: str
    names: tuple[str, ...]
    """The placeholders it uses, in order of first use."""

    def render(self, values: Mapping[str, str | None], escape: Callable[[str], str]) -> str:
        """The template filled in; ``ValueError`` naming a placeholder the invocation has no
        value for (e.g. no idempotency key), or whose value ``escape`` refuses."""
        out: list[str] = []
        for literal, name, _spec, _conv in string.Formatter().parse(self.text):
            out.append(literal)
            if name is None:
                continue
            value = values.get(name)
            if not value:
                raise ValueError(f"the invocation has no {name} for the query's {{{name}}}")
            try:
                out.append(escape(value))
            except ValueError as exc:
                # The value is the caller's: named by its placeholder, never quoted back.
                what = f"the invocation's {name} for the query's {{{name}}}"
                raise ValueError(f"{what} {exc}") from None
        return "".join(out)

    def __str__(self) -> str:
        return self.text


def parse_template(text: str, *, shell: bool) -> Template:
    """Check a template; ``ValueError`` says what is wrong."""
    try:
        parts = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ValueError(f"is not a template ({exc}); write {{{{ and }}}} for braces") from None
    names: list[str] = []
    quoting = _Quoting()
    for literal, name, spec, conv in parts:
        if shell:
            quoting.feed(literal)
        if name is None:
            continue
        if name not in NAMES or spec or conv:
            known = ", ".join(f"{{{n}}}" for n in NAMES)
            raise ValueError(f"has an unknown placeholder {{{name}}} (known: {known})")
        if shell:
            quoting.check(name)
        if name not in names:
            names.append(name)
    if shell and quoting.quote is not None:
        raise ValueError(f"leaves a {quoting.quote} quote open")
    return Template(text, tuple(names))


class _Quoting:
    """Where the template's literal text leaves the shell's quoting: a placeholder's quoted
    value is only data outside quotes (inside '...' or "..." the quotes would end and restart
    the template's own quoting), and not after ``$`` (``$'...'``) or an escaping backslash.
    Nor where a plain word is still syntax: right after ``$NAME`` (its letters would continue
    the name, ``$DIR{key}`` reading ``$DIRr1``), or between braces opened before it and not yet
    closed, quoted or not (a shell's brace expansion -- here or in a shell the template starts
    -- reads ``..`` in ``{1..99999999}``; ``${{key}}`` would name a variable).  A brace followed
    by a blank opens a group (``f() {{ ...; }}``), never an expansion."""

    def __init__(self) -> None:
        self.quote: str | None = None
        self.last = ""
        self.name = False  # in $NAME (or $1): a letter, digit or _ after it would extend it
        self.braces: list[tuple[bool, str | None]] = []  # open: an expansion? in which quote?

    def feed(self, literal: str) -> None:
        escaped = False
        for ch in literal:
            if self.braces and self.last == "{" and ch in " \t\n":
                self.braces[-1] = (False, self.braces[-1][1])
            if ch == "{":  # quoted or escaped too: a shell the template starts may read it
                self.braces.append((True, self.quote))
            elif ch == "}" and self.braces and self.braces[-1][1] == self.quote and not escaped:
                # Closed in the quoting it was opened in ('{print}'): {a,'}'{key}} expands.
                self.braces.pop()
            word = ch.isascii() and (ch.isalnum() or ch == "_")
            self.name = word and (self.name or self.last == "$")
            if escaped:
                escaped = False
            elif self.quote == "'":
                if ch == "'":
                    self.quote = None
            elif ch == "\\":
                escaped = True
            elif self.quote == '"':
                if ch == '"':
                    self.quote = None
            elif ch in "'\"":
                self.quote = ch
            self.last = ch
        if escaped:
            self.last = "\\"

    def check(self, name: str) -> None:
        if self.quote is not None:
            raise ValueError(
                f"puts {{{name}}} inside {self.quote} quotes: the broker quotes the value itself; "
                "write the placeholder unquoted"
            )
        if self.last in ("$", "\\"):
            raise ValueError(f"puts {{{name}}} right after {self.last!r}")
        if self.name:
            raise ValueError(
                f"puts {{{name}}} right after a $NAME, which its value would extend: write "
                f"${{NAME}}{{{name}}}"
            )
        if any(expands for expands, _quote in self.braces):
            raise ValueError(
                f"puts {{{name}}} between braces ({{{{ and }}}}): a shell's brace expansion "
                "would read its value; leave it outside them"
            )
        self.last = "}"
        self.name = False
