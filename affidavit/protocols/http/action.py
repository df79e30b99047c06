"""An HTTP action: ``{"target", "method", "path", "headers", "body" | "body_base64",
"idempotency_key", "session"}`` validated against its ``HttpTarget`` (``HTTP_ACTION``).

Seed: "Reject ... unsupported methods, missing fields, oversized payloads ... and forbidden header
overrides before resolving the host name or accessing the secret."
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from affidavit.protocols.actions import (
    MAX_TOKEN_FIELD,
    VISIBLE,
    ActionInvalid,
    BodyUnread,
    no_ctl,
    session,
    string,
)
from affidavit.protocols.spec import ActionField, ActionSpec, text_payload
from affidavit.secrets.credentials import parse_inject
from affidavit.statemachine import Code

from .batch import Sent, items_sent
from .params import check_form_body, check_request_query
from .segments import MAX_DECODES, climbs
from .target import CALLER_REFUSED, TOKEN, HttpTarget, header_key

__all__ = ["HTTP_ACTION", "HTTP_FIELDS", "HttpAction", "describe", "full_path", "query_param"]

MAX_PATH = 8192
MAX_HEADERS = 64
MAX_HEADER_VALUE = 8192

# RFC 3986 origin-form: pchar / "/" / "?" plus "%" for escapes (checked separately).  Anything
# else (space, quotes, backslash, non-ASCII, "#") is either ambiguous between servers or a
# smuggling vector; the caller must percent-encode it.
_PCHAR = r"A-Za-z0-9\-._~!$&'()*+,;=:@"
_TARGET_CHARS = re.compile(rf"[{_PCHAR}/?%]*")
_PRINTABLE = re.compile(r"[\x20-\x7e]+")
_ESCAPE = "%[0-9A-Fa-f]{2}"
# What _check_path's form checks accept, as one expression (for the published schema): a single
# leading "/", then pchar, "/", "?" or a complete escape.
_PATH_FORM = rf"/(?:(?:[{_PCHAR}?]|{_ESCAPE})(?:[{_PCHAR}/?]|{_ESCAPE})*)?"
_BASE64 = r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"
_HEADER_VALUE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?|")


@dataclass(frozen=True)
class HttpAction:
    target: str
    method: str
    path: str
    """As given by the caller (origin-form, relative to the target's base path)."""
    headers: tuple[tuple[str, str], ...]
    """Caller headers, names lower-cased, sorted by name (canonical for the fingerprint)."""
    body: bytes
    idempotency_key: str | None
    session: str | None
    batch: Sent | None = dataclasses.field(default=None, compare=False, repr=False)
    """The items the body sends to a target declaring ``batch`` (``batch.items_sent``), read
    once when the action is parsed; None when it is no batch."""
    kind: ClassVar[str] = "http"


def parse(obj: Mapping[str, Any], name: str, target: HttpTarget) -> HttpAction:
    method = string(obj, "method", required=True)
    assert method is not None
    if not TOKEN.fullmatch(method) or len(method) > 32:
        raise ActionInvalid(Code.INVALID_FIELD, "method", "must be an HTTP method token")
    method = method.upper()
    if method not in target.methods:
        allowed = ", ".join(sorted(target.methods))
        raise ActionInvalid(
            Code.UNSUPPORTED_ACTION, "method", f"not allowed for this target ({allowed})"
        )

    path = string(obj, "path", required=True)
    assert path is not None
    _check_path(path, target)

    headers = _parse_headers(obj.get("headers"), target)
    body = _parse_body(obj, target.max_body)
    body_field = "body" if obj.get("body") is not None else "body_base64"
    if body:
        # The type as servers read it: "Content_Type" is CONTENT_TYPE to CGI/WSGI/PHP stacks
        # (one spelling at most: two are refused as duplicates).
        ctype = next((v for n, v in headers if header_key(n) == "content-type"), None)
        check_form_body(body, ctype, body_field)

    key = string(obj, "idempotency_key", required=False)
    if key is not None:
        if target.idempotency is None:
            # Seed: "Do not silently add an idempotency header for targets that do not document
            # its semantics."  Nor drop one: the caller believes it is protected.
            raise ActionInvalid(
                Code.UNSUPPORTED_ACTION,
                "idempotency_key",
                "this target declares no idempotency contract",
            )
        if len(key) > MAX_TOKEN_FIELD or not VISIBLE.fullmatch(key):
            raise ActionInvalid(
                Code.INVALID_FIELD, "idempotency_key", "must be 1-255 visible ASCII characters"
            )

    action = HttpAction(
        target=name,
        method=method,
        path=path,
        headers=headers,
        body=body,
        idempotency_key=key,
        session=session(obj),
    )
    try:
        return dataclasses.replace(action, batch=items_sent(body, body_field, target))
    except ActionInvalid as exc:
        # A call sent before the strict reading may hold its key (engine.invocation).
        raise BodyUnread(exc, action) from None


def _check_path(path: str, target: HttpTarget) -> None:
    if len(path) > MAX_PATH:
        raise ActionInvalid(Code.PAYLOAD_LIMIT, "path", f"is longer than {MAX_PATH} characters")
    if not path.startswith("/") or path.startswith("//"):
        # "//host/x" is a network-path reference (RFC 3986 §4.2): it would name another host.
        raise ActionInvalid(
            Code.INVALID_FIELD, "path", 'must start with a single "/" (origin-form)'
        )
    if not _TARGET_CHARS.fullmatch(path):
        raise ActionInvalid(
            Code.INVALID_FIELD,
            "path",
            "has characters that must be percent-encoded (space, #, \\, non-ASCII, ...)",
        )
    why = climbs(path.partition("?")[0])  # climbs checks the route's "%"s
    if why is not None:
        raise ActionInvalid(Code.INVALID_FIELD, "path", why)
    check_request_query(path, query_param(target), not target.escaped_query_values)


def query_param(target: HttpTarget) -> str | None:
    """The query parameter the target's credential is injected as (``query:NAME``), or None."""
    scheme, param = parse_inject(target.inject)
    return param if scheme == "query" else None


def _forbidden_headers(target: HttpTarget) -> frozenset[str]:
    names = set(CALLER_REFUSED)
    scheme, header = parse_inject(target.inject)
    if scheme == "header" and header:
        names.add(header.lower())
    if target.idempotency is not None:
        # The broker sends the key it recorded; a caller-set header would bypass the record.
        names.add(target.idempotency.header.lower())
    return frozenset(names)


def _parse_headers(raw: object, target: HttpTarget) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise ActionInvalid(
            Code.INVALID_FIELD, "headers", "must be an object of name: value strings"
        )
    if len(raw) > MAX_HEADERS:
        raise ActionInvalid(Code.PAYLOAD_LIMIT, "headers", f"more than {MAX_HEADERS} headers")
    forbidden = {header_key(n) for n in _forbidden_headers(target)}
    out: dict[str, str] = {}
    seen: set[str] = set()
    for hname, value in raw.items():
        if not isinstance(hname, str):
            raise ActionInvalid(
                Code.INVALID_FIELD, "headers", "a header name is not an RFC 9110 token"
            )
        # The name goes into the field path only when it is short printable ASCII (it is
        # echoed in the envelope and the journal).
        field = (
            f"headers.{hname}" if len(hname) <= 128 and _PRINTABLE.fullmatch(hname) else "headers"
        )
        key = header_key(hname)
        if key in forbidden:
            # Before the token check: "X-Api-Key " is no token, yet the one a lenient server
            # would read as the injected header.
            raise ActionInvalid(
                Code.FORBIDDEN_HEADER,
                field,
                "is set by the broker or the transport, not callers (names compare "
                'case-insensitively, and "_" as "-")',
            )
        if not TOKEN.fullmatch(hname) or len(hname) > 128:
            raise ActionInvalid(
                Code.INVALID_FIELD, "headers", "a header name is not an RFC 9110 token"
            )
        lower = hname.lower()
        if key in seen:
            raise ActionInvalid(
                Code.INVALID_FIELD,
                field,
                'is given twice (names compare case-insensitively, and "_" as "-")',
            )
        seen.add(key)
        if not isinstance(value, str):
            raise ActionInvalid(Code.INVALID_FIELD, field, "must be a string")
        no_ctl(value, field)
        if len(value) > MAX_HEADER_VALUE:
            raise ActionInvalid(
                Code.PAYLOAD_LIMIT, field, f"is longer than {MAX_HEADER_VALUE} characters"
            )
        if not _HEADER_VALUE.fullmatch(value):
            raise ActionInvalid(
                Code.INVALID_FIELD,
                field,
                "must be visible ASCII without leading or trailing whitespace",
            )
        out[lower] = value
    return tuple(sorted(out.items()))


def _parse_body(obj: Mapping[str, Any], limit: int) -> bytes:
    """The body's bytes: ``body`` as UTF-8 or ``body_base64`` decoded, at most ``limit``."""
    text = obj.get("body")
    b64 = obj.get("body_base64")
    if text is not None and b64 is not None:
        raise ActionInvalid(Code.INVALID_FIELD, "body_base64", "give body or body_base64, not both")
    if text is not None:
        if not isinstance(text, str):
            raise ActionInvalid(
                Code.INVALID_FIELD, "body", "must be a string (use body_base64 for bytes)"
            )
        if len(text) > limit:  # every character is at least one UTF-8 byte
            raise ActionInvalid(
                Code.PAYLOAD_LIMIT, "body", f"exceeds this target's max_body ({limit})"
            )
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            raise ActionInvalid(Code.INVALID_FIELD, "body", "is not valid Unicode text") from None
        if len(data) > limit:
            raise ActionInvalid(
                Code.PAYLOAD_LIMIT, "body", f"exceeds this target's max_body ({limit})"
            )
        return data
    if b64 is not None:
        if not isinstance(b64, str):
            raise ActionInvalid(Code.INVALID_FIELD, "body_base64", "must be a base64 string")
        if len(b64) > (limit + 2) // 3 * 4:
            raise ActionInvalid(
                Code.PAYLOAD_LIMIT, "body_base64", f"exceeds this target's max_body ({limit})"
            )
        try:
            data = base64.b64decode(b64.encode("ascii"), validate=True)
        except (binascii.Error, ValueError, UnicodeEncodeError):
            raise ActionInvalid(Code.INVALID_FIELD, "body_base64", "is not valid base64") from None
        if len(data) > limit:
            raise ActionInvalid(
                Code.PAYLOAD_LIMIT, "body_base64", f"exceeds this target's max_body ({limit})"
            )
        return data
    return b""


def full_path(action: HttpAction, target: HttpTarget) -> str:
    """The request target actually sent: the target's base path + the action's path."""
    return target.base_path + action.path


_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
"""The body hash of a request without a body (most: GET), hashed once (issue 15)."""


def identity(action: HttpAction, target: HttpTarget) -> dict[str, Any]:
    """Method, full path, sorted caller headers and the body hash."""
    body = action.body
    return {
        "method": action.method,
        "path": full_path(action, target),
        "headers": [list(h) for h in sorted(action.headers)],
        "body_sha256": hashlib.sha256(body).hexdigest() if body else _EMPTY_SHA256,
    }


def needs_approval(action: HttpAction, target: HttpTarget) -> bool:
    """The target's ``approval`` covers every action, or lists this method."""
    return approval_reason(action, target) is not None


def approval_reason(action: HttpAction, target: HttpTarget) -> str | None:
    """Why the request waits for an operator's yes (shown with it), or None."""
    policy = target.approval
    if policy is None or not policy.requires(method=action.method):
        return None
    if policy.always:
        return "every action of this target needs approval"
    return f"its method {action.method} is listed in methods"


BODY_SHOWN = 16 * 1024
"""Bodies up to this size are shown to the approving operator whole (as text when they are)."""


def operator_view(action: HttpAction, target: HttpTarget) -> dict[str, Any]:
    """What an operator approves: the URL (without the credential: a ``query:`` injection is
    added at dispatch), the caller's headers, the idempotency key with the header the target's
    contract sends it in (``idempotency_header``), and the body -- whole when small.  The key
    is the one that will be sent: the engine gives the view an action holding the key it chose
    when the caller chose none (``affidavit.engine.approval.request_attrs``)."""
    out: dict[str, Any] = {
        "method": action.method,
        "url": target.origin + full_path(action, target),
        "headers": dict(action.headers),
        "body_bytes": len(action.body),
        "body_sha256": hashlib.sha256(action.body).hexdigest(),
    }
    contract = target.idempotency
    if contract is not None and action.idempotency_key is not None:
        out["idempotency_header"] = contract.header
        out["idempotency_key"] = action.idempotency_key
    why = approval_reason(action, target)
    if why is not None:
        out["approval_reason"] = why
        if target.follow_redirects:
            # The binding follows no redirect of an approved request (binding.py).
            out["redirects"] = "not followed: a 3xx answer is the result"
    if len(action.body) <= BODY_SHOWN:
        try:
            out["body"] = action.body.decode("utf-8")
        except UnicodeDecodeError:
            out["body_base64"] = base64.b64encode(action.body).decode("ascii")
    return out


def operator_contents(action: Mapping[str, Any]) -> dict[str, bytes]:
    """The body the operator view names, from the accepted action, as ``parse`` reads it (no
    limit: the bytes are served only when they hash to what the view recorded)."""
    try:
        return {"body": _parse_body(action, sys.maxsize)}
    except ActionInvalid as exc:
        raise ValueError(exc.message) from None


def idempotent(action: HttpAction, target: HttpTarget) -> bool:
    """The method is listed in the target's ``idempotent`` (configuration, not the method name)."""
    return action.method in target.idempotent


def describe(target: HttpTarget) -> dict[str, Any]:
    """What a caller may know of the target (``list_targets``), listed field by field: never
    its credential reference, injection, CA file or proxy."""
    contract = target.idempotency
    return {
        "url": target.url,
        "methods": sorted(target.methods),
        "idempotent": sorted(target.idempotent),
        "idempotency": None
        if contract is None
        else {
            "header": contract.header,
            "scope": contract.scope,
            "retention_s": contract.retention_s,
        },
        "operations": target.operations is not None,
        "batch": target.batch is not None,
        "max_body": target.max_body,
        "follow_redirects": target.follow_redirects,
    }


def _encoded_limit(target: HttpTarget) -> int:
    return (target.max_body + 2) // 3 * 4


# The fields as callers see them (the MCP tool's input schema), from the constants above.
_FORM_CHECKS = (
    (
        Code.FORBIDDEN_HEADER,
        "a form body (urlencoded, multipart, or untyped) or a JSON object naming a field "
        "servers read as the method or path (_method, ...)",
    ),
    (Code.INVALID_FIELD, "a declared form's field name with a control character"),
)

HTTP_FIELDS = (
    ActionField(
        "method",
        "HTTP method; the target allows only its configured ones (list_targets)",
        required=True,
        max_length=32,
        pattern=TOKEN.pattern,
        checks=((Code.UNSUPPORTED_ACTION, "a method this target does not allow"),),
    ),
    ActionField(
        "path",
        "origin-form path and query, appended to the target's base URL; percent-encode "
        "anything else",
        required=True,
        max_length=MAX_PATH,
        pattern=_PATH_FORM,
        checks=(
            (
                Code.INVALID_FIELD,
                'a "." or ".." segment as any server may read one (percent-encoded once or '
                'more, with ";" parameters, "?" or "#", NUL or spaces, full-width); '
                "percent-escapes that are not UTF-8; a segment percent-encoded more than "
                f"{MAX_DECODES} times over",
            ),
            (Code.FORBIDDEN_HEADER, "the query parameter that carries the credential"),
            (
                Code.FORBIDDEN_HEADER,
                "a query parameter servers read as the method or path (_method, "
                "X-HTTP-Method-Override, ...)",
            ),
            (Code.INVALID_FIELD, "a query parameter name with a control character (%00, ...)"),
        ),
    ),
    ActionField(
        "headers",
        "request headers, name: value",
        type="object",
        max_length=MAX_HEADERS,
        keys=ActionField("name", "an RFC 9110 token", max_length=128, pattern=TOKEN.pattern),
        values=ActionField(
            "value",
            "visible ASCII, no leading or trailing space",
            max_length=MAX_HEADER_VALUE,
            pattern=_HEADER_VALUE.pattern,
        ),
        checks=(
            (
                Code.FORBIDDEN_HEADER,
                "credential, framing and hop-by-hop headers, the injected header, the "
                "idempotency header and method/path overrides (X-HTTP-Method-Override, "
                "X-Original-URL, ...): the broker and the transport set them; Range, "
                "If-Range, Request-Range (a window of an echo is too short to redact); "
                "Forwarded, X-Forwarded-Host/-Proto/-Prefix/..., X-Real-IP, True-Client-IP, "
                "... (a proxy's, which applications build URLs and routes from)",
            ),
            (Code.INVALID_FIELD, "a name given twice (names compare case-insensitively)"),
        ),
    ),
    dataclasses.replace(
        text_payload("body", "request body as text, sent as UTF-8", "max_body"),
        checks=(*text_payload("body", "", "max_body").checks, *_FORM_CHECKS),
    ),
    ActionField(
        "body_base64",
        "request body as base64 (for bytes); not together with body",
        limit=_encoded_limit,
        pattern=_BASE64,
        checks=(
            (Code.PAYLOAD_LIMIT, "decodes to more bytes than this target's max_body"),
            (Code.INVALID_FIELD, "given together with body"),
            *_FORM_CHECKS,
        ),
    ),
    ActionField(
        "idempotency_key",
        "your key for this request: calling again with it resumes the same invocation "
        "instead of sending a second one (targets with an idempotency contract only)",
        max_length=MAX_TOKEN_FIELD,
        pattern=VISIBLE.pattern,
        checks=((Code.UNSUPPORTED_ACTION, "the target declares no idempotency contract"),),
    ),
)

HTTP_ACTION = ActionSpec(
    fields=frozenset(f.name for f in HTTP_FIELDS),
    parse=parse,
    fingerprint=identity,
    idempotent=idempotent,
    schema=HTTP_FIELDS,
    tool="http_request",
    doc="Make one HTTP request to a configured target; the broker injects the credential.",
    needs_approval=needs_approval,
    operator_view=operator_view,
    operator_contents=operator_contents,
)
