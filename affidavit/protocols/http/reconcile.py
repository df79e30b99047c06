"""The ``reconcile`` setting of an HTTP target: the query that settles an unknown outcome.

Seed, "Idempotency is defined by the remote contract" -- one of the three safe paths out of
``unknown`` is to "query the remote state by a stable identifier, reconcile it, and decide
whether a new action is needed"::

    reconcile = { method = "GET", path = "/v1/charges?idempotency_key={idempotency_key}",
                  committed_if = ["status:200", "json:/idempotency_key={idempotency_key}"],
                  rejected_if = ["status:404", "json:/error/idempotency_key={idempotency_key}"] }

The query is an ordinary action on the *same* target (its credential, origin and base path;
never elsewhere), run by the engine as an invocation linked to the one it reconciles
(``affidavit.reconcile``).  Its placeholders are the invocation's bound values, percent-encoded
(``affidavit.protocols.placeholders``).  A condition reads the query's own complete result:

* ``status:NNN`` -- the final status is NNN;
* ``json:/POINTER=VALUE`` -- the JSON body's value at the RFC 6901 pointer is VALUE, typed
  where VALUE is a JSON literal (``Condition.typed``: ``=404`` an integer, never ``"404"``;
  ``=true`` the JSON true, never ``"true"``; ``="true"`` that string);
* ``header:NAME=VALUE`` -- the header's values (joined with ", ") are VALUE.

VALUE takes the path's placeholders, filled with the reconciled invocation's own values as they
are (no escaping) and compared exactly: an answer echoing the key is about this request, not
another's (an unknown placeholder is refused at load; a value the invocation lacks settles
nothing).

An array of conditions holds when every one of them does.  Only a complete, authoritative answer
is read at all -- its body whole (no ``body_withheld``, no ``body_truncated``) and its final hop
on the target's origin (a redirect elsewhere settles nothing): ``engine/readable.py``; nor
does an answer a followed redirect reached on the target's own origin -- another resource's
(``reconcile.service.REDIRECTED``: only an answer to the query itself decides); one that
both or neither of ``committed_if`` / ``rejected_if`` match settles nothing
(``RECONCILE_INCONCLUSIVE``), nor does a non-empty body read by a ``json:`` condition that is
no JSON text, or JSON readers disagree on -- a field named twice, ``NaN``, ``1e400``, a
5000-digit integer, invalid UTF-8 in a string, nesting Python gives up on
(``selectors.UNREADABLE``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from affidavit.protocols.placeholders import Template, parse_template, url_escape
from affidavit.protocols.settle import SETTLE
from affidavit.schema import Field, Read, Schema
from affidavit.statemachine import Outcome

from .selectors import (
    ABSENT,
    UNREADABLE,
    Selector,
    json_body,
    parse_selector,
    scalar,
    select,
)

if TYPE_CHECKING:
    from .target import HttpTarget

__all__ = ["RECONCILE", "Condition", "ReconcileQuery", "parse_reconcile", "query", "verdict"]

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


@dataclass(frozen=True)
class Condition:
    """``status:NNN`` (``selector`` None) or ``json:/p=VALUE`` / ``header:N=VALUE``.  VALUE is
    a template: the path's placeholders (``{idempotency_key}``, ``{invocation_id}``,
    ``{session}``) stand for the reconciled invocation's bound values, compared exactly (no
    escaping) -- an answer that echoes the key is this request's, not someone else's."""

    text: str
    status: int | None
    selector: Selector | None
    value: Template | None
    typed: str = "string"
    """What a ``json:`` VALUE compares with (``_typed``): "number" (an integer literal without
    placeholders: a JSON integer of that text only), "literal" (``true``, ``false``, ``null``:
    that JSON literal only, never the string "true"), "quoted" (a JSON string literal, e.g.
    ``"true"``: a string equal to its decoded text), or "string" (any other VALUE, and every
    ``header:`` one: a non-empty string equal to it, whole)."""
    literal: Any = None
    """The JSON value of a "literal" or "quoted" VALUE."""

    def expected(self, values: Mapping[str, str | None]) -> str | None:
        """VALUE with its placeholders filled; ``ValueError`` when the invocation has no value
        for one (nothing can then be compared)."""
        return None if self.value is None else self.value.render(values, _exact)

    def holds(self, summary: Mapping[str, Any], doc: Any, values: Mapping[str, str | None]) -> bool:
        return self.results(summary, doc, values)[0]

    def results(
        self, summary: Mapping[str, Any], doc: Any, values: Mapping[str, str | None]
    ) -> tuple[bool, bool]:
        """(whether the condition holds, whether the text comparison it replaced -- the value's
        first ``MAX_SCALAR`` characters as text equal to VALUE -- would have said it does).
        (False, True) is an ambiguous answer: ``verdict`` settles nothing on it."""
        if self.selector is None:
            held = summary.get("status") == self.status
            return held, held
        found = select(self.selector, summary.get("headers", ()), doc)
        expected = self.expected(values)
        text = scalar(found)
        was = text is not None and str(text) == expected
        if self.typed == "literal":
            # true, false and null are singletons once read: never the string "true", nor 1.
            return found is self.literal, was
        if self.typed == "quoted":
            return isinstance(found, str) and found == self.literal, was
        if self.typed == "number":
            # Not the string "404" for =404, nor True (an int to Python) for =1.
            return type(found) is int and str(found) == expected, was
        # Not the integer 404 for a VALUE "ok", nor a string's first MAX_SCALAR characters.
        return isinstance(found, str) and found != "" and found == expected, was


def _exact(value: str) -> str:
    return value


_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_INTEGER = re.compile(r"0|-?[1-9][0-9]*")
_LITERALS = {"true": True, "false": False, "null": None}


def _typed(source: str, template: Template) -> tuple[str, Any]:
    """``Condition.typed`` and ``literal`` of a VALUE: typed where it is a JSON literal written
    as is.  A VALUE that could never match is refused (``ValueError``), never loaded silently:
    an empty one, a JSON number that is no integer (a fraction, an exponent, ``-0``: the reader
    compares integers only), a quoted VALUE that is no JSON string or holds a placeholder."""
    text = template.text if template.names else template.render({}, _exact)  # "{{" -> "{"
    if source != "json":
        if not text:
            raise ValueError("is empty: a header's value is compared only when non-empty")
        return "string", None
    if text.startswith('"'):
        if template.names:
            raise ValueError(
                "in quotes takes no placeholder (write it bare: its value compares as a string)"
            )
        try:
            decoded = json.loads(text)
        except ValueError:
            decoded = None
        if not isinstance(decoded, str):
            raise ValueError('in quotes must be one JSON string ("true" matches the string true)')
        return "quoted", decoded
    if template.names:
        return "string", None
    if not text:
        raise ValueError('is empty: write json:/POINTER="" to match the empty string')
    if text in _LITERALS:
        return "literal", _LITERALS[text]
    if _JSON_NUMBER.fullmatch(text):
        if not _INTEGER.fullmatch(text):
            raise ValueError(
                "is a JSON number but no integer (a fraction, an exponent or -0): only "
                "integers are compared, so it would match nothing"
            )
        return "number", None
    return "string", None


def parse_condition(text: str) -> Condition:
    source, colon, rest = text.partition(":")
    if source == "status" and colon:
        if not (rest.isdigit() and len(rest) == 3 and 100 <= int(rest) <= 599):
            raise ValueError("status: takes a 3-digit HTTP status (status:200)")
        return Condition(text, int(rest), None, None)
    if source in ("json", "header") and colon:
        where, eq, value = rest.partition("=")
        if not eq:
            raise ValueError(
                f"{source}: takes {source}:{'/POINTER' if source == 'json' else 'NAME'}=VALUE"
            )
        try:
            template = parse_template(value, shell=False)
        except ValueError as exc:
            raise ValueError(f"VALUE {exc}") from None
        selector = parse_selector(f"{source}:{where}", (source,))
        try:
            typed, literal = _typed(source, template)
        except ValueError as exc:
            raise ValueError(f"VALUE {exc}") from None
        return Condition(text, None, selector, template, typed, literal)
    raise ValueError('must be "status:NNN", "json:/POINTER=VALUE" or "header:NAME=VALUE"')


def _conditions(r: Read) -> tuple[Condition, ...] | None:
    raw = r.raw()
    if raw is None:
        return None
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items or not all(isinstance(i, str) for i in items):
        raise r.error("must be a condition or a non-empty array of them (all must hold)")
    out = []
    for i, text in enumerate(items):
        try:
            out.append(parse_condition(text))
        except ValueError as exc:
            raise r.error(str(exc), "" if isinstance(raw, str) else f"[{i}]") from None
    return tuple(out)


@dataclass(frozen=True)
class ReconcileQuery:
    method: str
    path: Template
    committed_if: tuple[Condition, ...] | None
    rejected_if: tuple[Condition, ...] | None
    settle: float
    """Seconds after the attempt ended before an absent finding is believed (``settle.py``)."""


def _method(r: Read) -> str:
    method: str = r.string(max_len=32)
    if not _TOKEN.fullmatch(method):
        raise r.error("is not an HTTP method token")
    method = method.upper()
    assert r.outer is not None
    if method not in r.outer.values["methods"]:
        raise r.error("must be one of the target's methods: the query is an action on it")
    return method


def _path(r: Read) -> Template:
    text: str = r.string(max_len=8192)
    if not text.startswith("/") or text.startswith("//"):
        raise r.error('must start with a single "/" (origin-form, under the target\'s base path)')
    try:
        return parse_template(text, shell=False)
    except ValueError as exc:
        raise r.error(str(exc)) from None


STATUS_ONLY_REJECTED = (
    "reads no json: condition (status and header conditions alone): any such status -- a "
    "reverse proxy's, a load balancer's, an API gateway's 404 during a deploy, with its "
    "server=nginx -- would read as proof the effect is absent, and the caller would send it "
    "again; add a json: condition only the application's own not-found answer meets, e.g. an "
    'echo of the key ("json:/error/idempotency_key={idempotency_key}") or the API\'s error '
    'code ("json:/error/code=resource_missing")'
)
"""Why an HTTP ``rejected_if`` without a ``json:`` condition is refused at load -- stable
text.  A rejection settles ``rejected`` / ``after_correction``: the one verdict that invites
a second payment, so it must name something only the application's own answer says."""


def reads_no_json(conditions: Sequence[Condition] | None) -> bool:
    """Whether ``conditions`` are given and none of them reads the body (``json:``): status and
    header conditions alone, which a proxy's, a gateway's or a login page's answer can meet."""
    return bool(conditions) and not any(
        c.selector is not None and c.selector.source == "json" for c in conditions or ()
    )


def _rejected_if(r: Read) -> tuple[Condition, ...] | None:
    conditions = _conditions(r)
    if conditions is None and r.values["committed_if"] is None:
        raise r.error("give committed_if, rejected_if or both: a query that can decide nothing")
    if reads_no_json(conditions):
        raise r.error(STATUS_ONLY_REJECTED)
    return conditions


def status_only_warnings(targets: Sequence[HttpTarget]) -> list[str]:
    """A start-up word for each target whose ``committed_if`` reads no ``json:`` condition
    (status and header conditions alone): a captive portal's or a login page's 200 -- and its
    ``Content-Type`` -- would read as proof the effect exists."""
    return [
        f"targets.{t.name}.reconcile.committed_if reads no json: condition: any answer meeting "
        "its status and headers -- a captive portal's or a login page's 200 -- would settle the "
        "invocation "
        "committed; add a body condition only the application's own answer meets, e.g. an "
        'echo of the key ("json:/idempotency_key={idempotency_key}")'
        for t in targets
        if t.reconcile is not None and reads_no_json(t.reconcile.committed_if)
    ]


def _encode_conditions(value: tuple[Condition, ...] | None) -> list[str] | None:
    return None if value is None else [c.text for c in value]


RECONCILE = Schema(
    ReconcileQuery,
    (
        Field("method", _method, default="GET", doc="one of the target's methods"),
        Field("path", _path, encode=str, doc="origin-form path with placeholders"),
        Field("committed_if", _conditions, default=None, encode=_encode_conditions),
        Field("rejected_if", _rejected_if, default=None, encode=_encode_conditions),
        SETTLE,
    ),
)


def parse_reconcile(r: Read) -> ReconcileQuery | None:
    return RECONCILE.parse_optional_table(r)


def query(target: HttpTarget, values: Mapping[str, str | None]) -> dict[str, Any]:
    """The query's action on ``target``; ``ValueError`` (for the operator) when there is none
    or a value it needs is missing."""
    rq = target.reconcile
    if rq is None:
        raise ValueError(f"target {target.name} declares no reconcile query")
    return {
        "target": target.name,
        "method": rq.method,
        "path": rq.path.render(values, url_escape),
    }


def _asks_body(
    conditions: Sequence[Condition] | None,
    summary: Mapping[str, Any],
    values: Mapping[str, str | None],
) -> bool:
    """Whether a side would hold but for its ``json:`` conditions, and has one."""
    if not conditions:
        return False
    on_body = [c.selector is not None and c.selector.source == "json" for c in conditions]
    return any(on_body) and all(
        c.holds(summary, ABSENT, values)
        for c, json in zip(conditions, on_body, strict=True)
        if not json
    )


AMBIGUOUS = (
    "the condition {condition} does not hold of the answer's typed value, yet its text would "
    'have matched ("404" for =404, "true" for =true, a longer string equal in its first '
    "256 characters): the answer settles nothing"
)
"""Why an answer a condition reads ambiguously leaves the invocation unknown -- stable text.
A typed comparison may only turn a match into none, and "none" on one side may turn "both sides
match" into "one side matches": so a condition the text comparison would have met is no
failure either, and nothing is decided on it."""

MISSING = "the invocation has no {name} to compare the answer with"
"""Why a condition naming a bound value the invocation lacks (no idempotency key) settles
nothing -- stable text."""


def _missing(conditions: Sequence[Condition], values: Mapping[str, str | None]) -> str | None:
    for c in conditions:
        for name in c.value.names if c.value is not None else ():
            if not values.get(name):
                return MISSING.format(name="{" + name + "}")
    return None


def verdict(
    target: HttpTarget,
    summary: Mapping[str, Any],
    streams: Mapping[str, bytes],
    values: Mapping[str, str | None],
) -> tuple[Outcome | None, str | None]:
    """What the query's complete answer says of the reconciled request (``values``: its bound
    values, as the query's path was filled with): (committed | rejected, the conditions that
    held), or (None, why or None) when it settles nothing: both or neither side match
    (None), a condition names a value the invocation does not have (``MISSING``), or reads
    the answer ambiguously (``AMBIGUOUS``)."""
    rq = target.reconcile
    assert rq is not None
    every = (*(rq.committed_if or ()), *(rq.rejected_if or ()))
    missing = _missing(every, values)
    if missing is not None:
        return None, missing
    body = streams.get("body")
    doc = json_body(body)
    if (
        body
        and (doc is UNREADABLE or doc is ABSENT)
        and any(
            _asks_body(conditions, summary, values)
            for conditions in (rq.committed_if, rq.rejected_if)
        )
    ):
        # A body that is no JSON Python reads alike with other readers ({"found": "no",
        # "found": "yes"}, invalid UTF-8 in a string, a 5000-digit integer): what it says is a
        # guess, and a status condition on the other side must not win by the body's silence --
        # only when that side's own other conditions hold (a 404 whose body is "Not Found"
        # under committed_if = ["status:200", "json:..."] is the rejection it says).
        return None, None
    found = []
    for outcome, conditions in (
        (Outcome.COMMITTED, rq.committed_if),
        (Outcome.REJECTED, rq.rejected_if),
    ):
        if not conditions:
            continue
        results = [(c, *c.results(summary, doc, values)) for c in conditions]
        if any(not held and not was for _c, held, was in results):
            continue  # a condition fails outright: this side does not match
        unsure = [c for c, held, _was in results if not held]
        if unsure:
            return None, AMBIGUOUS.format(condition=unsure[0].text)
        found.append((outcome, " and ".join(c.text for c in conditions)))
    return found[0] if len(found) == 1 else (None, None)
