"""Request parameters as servers read them: a caller may not name, in the query or in a form
body (urlencoded, multipart or untyped) or a JSON object body's top-level keys, a parameter a
server reads as the method or path, nor one with a control character, nor (in the query) the
injected credential parameter under another spelling.

Seed: "Reject ... forbidden header overrides before resolving the host name or accessing the
secret."  Rails (``Rack::MethodOverride``), Laravel/Symfony and Express's method-override read
``_method`` from a POST's form body or query: through it a POST the target allows would run as
a DELETE it does not, with the credential.  The override headers are refused in action.py; the
same names as parameters are refused here, with the same code (``FORBIDDEN_HEADER``).
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Final

from affidavit.protocols.actions import ActionInvalid
from affidavit.statemachine import Code

from .segments import MAX_DECODES, bad_percent

__all__ = [
    "OVERRIDE_HEADERS",
    "check_form_body",
    "check_query",
    "check_request_query",
    "credential_spelling",
    "query_key",
]

# Headers servers read as the request's method or path instead of the request line (ASP.NET,
# Express's method-override, Google's APIs, Symfony; IIS and Symfony for the path): through
# them a GET the target allows -- and retries as idempotent -- would run as DELETE, and a path
# inside the base path would reach another, with the credential.
OVERRIDE_HEADERS: Final = frozenset(
    {
        "x-http-method-override",
        "x-http-method",
        "x-method-override",
        "x-original-url",
        "x-rewrite-url",
    }
)
# C0 controls, DEL and C1 controls: a parameter name holding one (``_method%00x``) is read as
# something else by a C-string parser, or cut there by a logger or a WAF -- never a real name.
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_FORM_TYPES: Final = frozenset({"application/x-www-form-urlencoded", "multipart/form-data"})
# Rack's media type ends at the first ";" or "," (``Rack::MediaType::SPLIT_PATTERN``), so
# ``application/x-www-form-urlencoded,x`` is a form there; Laravel's ``isJson`` is a
# ``/json`` or ``+json`` anywhere in the header's value.
_MEDIA_END: Final = re.compile(r"[;,]")
_JSON_TYPE: Final = re.compile(r"[/+]json")
_JSON_HINT: Final = re.compile(rb"method|url|\\u", re.IGNORECASE)
# What every override name holds, as written or percent-encoded in part.
_OVERRIDE_HINT: Final = re.compile(rb"method|url|%", re.IGNORECASE)
# A multipart part's header that names its field: Content-Disposition (RFC 7578 §4.2), or
# Content-ID, which Rack takes as the name of a part without a Content-Disposition; its value
# runs on over folded lines (CRLF then a space or tab), as Rack 3 reads it.
_PART_HEADER: Final = re.compile(
    rb"content-(disposition|id)[ \t]*:([^\r\n]*(?:\r?\n[ \t][^\r\n]*)*)", re.IGNORECASE
)
# A ``name`` (or RFC 2231 ``name*``, as busboy reads it) parameter anywhere in a
# Content-Disposition value, after ";" or whitespace (Rack 1's ``\s+name=``), quoted (with
# backslash escapes, as Rack 3 undoes them) or not; every one counts (Rack 2 and 3 take the
# last, this check read the first).
_NAME_AT: Final = re.compile(r"(?:(?<=[;\s])|^)name(\*?)\s*=\s*", re.IGNORECASE)
# A value as far as an override's spelling can reach (with every character escaped, and
# percent-encoded twice): what lies further cannot make it one, and reading on from each of
# many "name=" starts to the end of a long header would be quadratic.
_NAME_VALUE: Final = re.compile(r'"((?:[^"\\]|\\.){0,256})"?|([^;]{0,128})', re.DOTALL)
# What a name must hold to be read as an override (as written, or percent-encoded in part): a
# part name without it is only checked for control characters.
_NAME_HINT: Final = re.compile(r"method|url|%", re.IGNORECASE)
_MAX_PARAMS: Final = 16
_RACK2_KEY: Final = re.compile(r"[\[\]]")
_BACKSLASH: Final = re.compile(r"\\(.)", re.DOTALL)


def query_key(name: str) -> str:
    """A query parameter name as frameworks may read it: case-insensitively, and with ``.``,
    `` ``, ``[`` and ``-`` read as ``_`` (PHP turns ``a.b`` and ``a b`` into ``a_b``; CGI-style
    stacks fold case and dashes) -- so a caller cannot shadow the injected parameter with a
    spelling that one of them reads as it (issue 9)."""
    return re.sub(r"[-. \[]", "_", name.strip().lower())


def _array_key(name: str) -> str:
    """``a[...]`` as PHP, Rack and qs (Express) read it: the parameter ``a``, an array or a map
    (qs then holds a caller's ``api_key[]`` value beside the injected ``api_key``)."""
    name = name.strip()
    bracket = name.find("[")
    if bracket > 0 and "]" in name[bracket:]:
        name = name[:bracket]
    return query_key(name)


# The overrides as parameters (names as ``query_key`` reads them): Rails', Laravel's and
# Symfony's ``_method``, Express's method-override getter, Salesforce's ``_HttpMethod``, and the
# override headers' names, which some stacks also read from the query.
_OVERRIDES: Final = frozenset({"_method", "_httpmethod"} | {query_key(h) for h in OVERRIDE_HEADERS})


def _readings(name: str) -> set[str]:
    """The names servers read ``name`` as (``query_key``): whole, before a "[...]" (PHP, Rack
    3), and as Rack 2 reads it -- leading "[" and "]" dropped, the key up to the next one
    (``[_method]`` and ``]_method`` are ``_method``)."""
    nested = _RACK2_KEY.split(name.lstrip("[]"), maxsplit=1)[0]
    return {query_key(name), query_key(name.partition("[")[0]), query_key(nested)}


def credential_spelling(param: str) -> Callable[[str], bool]:
    """Whether a query parameter name (percent-decoded once, as ``parse_qsl`` gives it) is one
    ``check_query`` refuses as ``param``'s -- a server may read it as the credential's
    parameter: the driver drops every such name from a redirect's query before it puts the
    credential back (adapters/http/urls.py, ``set_query``)."""
    injected = query_key(param)

    def same(once: str) -> bool:
        return any(
            injected in _readings(n) | {_array_key(n)}
            for n in (once, urllib.parse.unquote_plus(once))
        )

    return same


def _check_name(
    once: str,
    field: str,
    injected: str | None,
    param: str | None,
    controls: bool = True,
    hop: str | None = None,
) -> None:
    """One parameter name, percent-decoded once (as UTF-8, like the frameworks); checked as
    decoded once and twice, whatever the target: no parameter a caller means is named
    ``%255Fmethod`` or ``api%255Fkey``, and a stack that decodes a name once more (a second
    ``unquote`` in an application's own parameter handling) reads it as the override or the
    credential's.  ``hop``: the name exists only once a decoding hop decoded what ``hop``
    says (``SEPARATORS``, ``PATH_TAIL``: ``check_query``), and the message says so."""
    for name in (once, urllib.parse.unquote_plus(once)):
        if controls and _CONTROL.search(name):
            raise ActionInvalid(
                Code.INVALID_FIELD,
                field,
                "a parameter name holds a control character (also percent-encoded, like %00)",
            )
        readings = _readings(name)
        said = "a decoding hop would read a parameter" if hop else "a parameter"
        if readings & _OVERRIDES:
            raise ActionInvalid(
                Code.FORBIDDEN_HEADER,
                field,
                f"{said} servers read as the method or path (_method, "
                "X-HTTP-Method-Override, ...; in any case, percent-encoded, and with "
                '"-", "." or " " for "_") here; it is not allowed: the request line says them',
            )
        if injected is not None and injected in readings | {_array_key(name)}:
            if hop:
                why = (
                    f"a decoding hop would read query parameter {param}, the credential's, "
                    f"here ({hop} decoded)"
                )
            else:
                why = f"query parameter {param} carries the credential"
            raise ActionInvalid(
                Code.FORBIDDEN_HEADER,
                field,
                f'{why} (in any case, with "-", "." or " " for "_", or as an array, '
                "NAME[]); the broker sets it",
            )


SEPARATORS = "its escaped separators"
"""What a decoding hop decoded to make a query's name: its ``%26``, ``%3B``, ``%3D``."""
PATH_TAIL = 'the path\'s escaped "?"'
"""What a decoding hop decoded to make a path's tail a query: its ``%3F``."""


def check_request_query(path: str, credential_param: str | None, decoding_hop: bool) -> None:
    """The query of a request target (origin-form ``path``) as servers read it, at field
    ``path``: every "%" an escape, and ``check_query``'s names.  An action's path and a
    followed redirect's Location to the target's own origin are held to it alike
    (``action.py``, ``binding.py``).  ``decoding_hop``: true unless the
    target sets ``escaped_query_values`` (``check_query``)."""
    route, _, query = path.partition("?")
    why = bad_percent(query)
    if why is not None:
        raise ActionInvalid(Code.INVALID_FIELD, "path", why)
    if query:
        check_query(query, credential_param, decoding_hop)
    # A proxy that decodes the path and forwards it unescaped (segments.py's class:
    # CVE-2024-38474) sends ``/items/1%3F_method%3DDELETE`` as ``/items/1?_method=DELETE``: the
    # application reads a query there.  Each decoding's "?" tail is checked as one, for every
    # target: no path a caller means holds an escaped "?" followed by such a name.
    for _ in range(MAX_DECODES):
        if "%" not in route:
            break
        route = urllib.parse.unquote(route)
        if "?" in route:
            check_query(route.partition("?")[2], credential_param, decoding_hop, hop=PATH_TAIL)


def check_query(
    query: str, credential_param: str | None, decoding_hop: bool, hop: str | None = None
) -> None:
    """The names of a request's query (split on ``&`` and ``;``), at field ``path``.

    ``decoding_hop`` (true unless a target sets ``escaped_query_values``): a hop in front of
    the application forwards the query percent-decoded, so its ``%26``, ``%3B`` and ``%3D``
    are separators there (``a%26_method%3DDELETE`` is ``a&_method=DELETE``) -- the query is
    then decoded up to
    ``MAX_DECODES`` times, as a path's tails are, and each decoding re-split: a name it makes
    that servers read as an override or the credential's is refused; an escaped "&" that forms
    neither (``q=a%26b``) is the value's own.  Off, the escaped separators of values are
    theirs: a URL-valued parameter (``url=https%3A%2F%2Fme.example%2Fcb%3Fa%3D1%26key%3Dabc``),
    a JSON value holding ``&key=``, a ``return_to`` holding ``_method`` -- for a target whose
    operator says its callers pass such values and no such hop is there
    (docs/configuration.md, ``escaped_query_values``): the refusing reading is the default."""
    injected = query_key(credential_param) if credential_param else None
    for pair in re.split(r"[&;]", query):
        once = urllib.parse.unquote_plus(pair.partition("=")[0])
        _check_name(once, "path", injected, credential_param, hop=hop)
    if not decoding_hop:
        return
    for _ in range(MAX_DECODES):
        if "%" not in query:
            return
        query = urllib.parse.unquote(query)
        for pair in re.split(r"[&;]", query):
            once = urllib.parse.unquote_plus(pair.partition("=")[0])
            _check_name(
                once, "path", injected, credential_param, controls=False, hop=hop or SEPARATORS
            )


def check_form_body(body: bytes, content_type: str | None, field: str) -> None:
    """The field names of a form body: ``application/x-www-form-urlencoded`` -- or a body
    without a ``Content-Type`` (or with an empty one), which Rack parses as a form too (there,
    overrides only) -- each part of ``multipart/form-data``, and the top-level keys of a JSON
    object (Laravel reads ``_method`` from a JSON body: its request bag is the JSON).  The
    media type is read as Rack reads it: up to the first ``;`` or ``,``.  Any other body is the
    application's own."""
    if content_type and _JSON_TYPE.search(content_type.lower()):
        # Laravel looks for "/json" anywhere in the header ("text/plain, application/json",
        # "...; x=/json"), Rack at the type before ";" or ",": both readings are checked.
        _check_json(body, field)
    media = _MEDIA_END.split(content_type or "", maxsplit=1)[0].strip().lower()
    if media and media not in _FORM_TYPES:
        return
    # Control characters only in a declared form: a body without a type may be any bytes, and
    # is read whole only if an override's letters (or an escape) are in it at all.
    declared = bool(media)
    if not declared and not _OVERRIDE_HINT.search(body):
        return
    if media == "multipart/form-data":
        for part in _part_names(body):
            if _NAME_HINT.search(part) or (declared and _CONTROL.search(part)):
                _check_name(part, field, None, None, declared)
        return
    for pair in re.split(rb"[&;]", body):
        name = pair.partition(b"=")[0].replace(b"+", b" ")
        once = urllib.parse.unquote_to_bytes(name).decode("utf-8", "replace")
        _check_name(once, field, None, None, declared)


def _check_json(body: bytes, field: str) -> None:
    """A JSON object's top-level keys (what Laravel's ``$request->get('_method')`` reads),
    parsed only if an override's letters or a ``\\u`` escape are in the body at all; a body
    that is no JSON object is the application's own."""
    if not _JSON_HINT.search(body):
        return
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return
    # A key given twice is one name either way (PHP keeps the last value, so does Python).
    for key in doc if isinstance(doc, dict) else ():
        _check_name(key, field, None, None, controls=False)


def _part_names(body: bytes) -> Iterator[str]:
    """Every name a multipart parser may give a part: the first 16 and the last ``name``
    parameters of each Content-Disposition (quoted as written and with its backslash escapes
    undone, unquoted whole and up to a space; ``name*``'s value after its charset and
    language), and each Content-ID's value.  A superset of what Rack 1-3, busboy and PHP read,
    so a spelling one of them reads as ``_method`` is not missed."""
    for m in _PART_HEADER.finditer(body):
        value = m.group(2).decode("utf-8", "replace")
        if m.group(1).lower() == b"id":
            yield value.strip()
            continue
        # Each "name=" is a start (not consumed by the value before it: Rack 1 reads the last
        # "\s+name=" of the line, which may stand inside another parameter's value).  Rack 3
        # reads the first 16 parameters, Rack 1 and 2, PHP and busboy the last name: those.
        ats = list(_NAME_AT.finditer(value))
        for at in ats[:_MAX_PARAMS] + ats[_MAX_PARAMS:][-1:]:
            v = _NAME_VALUE.match(value, at.end())
            assert v is not None  # the second alternative matches the empty string
            quoted, bare = v.group(1), v.group(2)
            names = [quoted, _BACKSLASH.sub(r"\1", quoted)] if quoted is not None else []
            if bare is not None:
                names += [bare.strip(), *bare.split()[:1]]
            for name in dict.fromkeys(names):
                yield name.rpartition("'")[2] if at.group(1) else name
