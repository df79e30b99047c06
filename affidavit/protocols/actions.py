"""Action parsing and validation: the broker's first preflight layer.

Seed, "Validation and credential injection finish before dispatch": "Reject incorrectly specified
targets, unsupported methods, missing fields, oversized payloads, unknown credential references,
and forbidden header overrides before resolving the host name or accessing the secret.  Record
``phase=validation``, ``outcome=not_attempted`` ... Return a stable code ... along with the path to
the field that the caller can fix.  Do not return the rejected secret reference if its name
contains sensitive information."

``parse_action`` is pure: it reads only the action and the loaded ``Config``.  Whatever the input
(any JSON value), it returns a frozen action or raises ``ActionInvalid`` — never anything else.

``fingerprint`` binds the request to the target snapshot (seed: "bind the normalized target ... and
the request fingerprint to the invocation"); ``is_idempotent`` reads the *configuration*, never
the method name (seed: "The method name serves as evidence, but not as a guarantee").
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from affidavit.config.loader import (
    CREDENTIAL_HEADERS,
    TRANSPORT_HEADERS,
    Config,
    HttpTarget,
    SshTarget,
    Target,
    canonical_json,
    snapshot_hash,
)
from affidavit.secrets.credentials import parse_inject
from affidavit.statemachine import Code

__all__ = [
    "ActionInvalid",
    "HttpAction",
    "SshAction",
    "fingerprint",
    "full_path",
    "is_idempotent",
    "parse_action",
]

MAX_PATH = 8192
MAX_HEADERS = 64
MAX_HEADER_VALUE = 8192
MAX_COMMAND = 32768
MAX_TOKEN_FIELD = 255

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# RFC 3986 origin-form: pchar / "/" / "?" plus "%" for escapes (checked separately).  Anything
# else (space, quotes, backslash, non-ASCII, "#") is either ambiguous between servers or a
# smuggling vector; the caller must percent-encode it.
_TARGET_CHARS = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/?%]*")
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
# Visible ASCII only: these fields travel in headers, journal attrs and envelopes.
_VISIBLE = re.compile(r"[\x21-\x7e]+")
_SESSION = re.compile(r"[\x20-\x7e]+")
_HEADER_VALUE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?|")
# Hop-by-hop headers (RFC 9110 §7.6.1) are the transport's to manage, as are framing headers.
_HOP_HEADERS = frozenset({"keep-alive", "proxy-connection", "proxy-authenticate"})

_HTTP_FIELDS = frozenset(
    {"target", "method", "path", "headers", "body", "body_base64", "idempotency_key", "session"}
)
_SSH_FIELDS = frozenset({"target", "command", "stdin", "session"})


class ActionInvalid(Exception):
    """A validation failure: a stable ``code`` (a validation-phase ``Code``), the ``field`` path
    the caller can fix, and a human ``message`` that never echoes a secret-looking value."""

    def __init__(self, code: Code, field: str, message: str) -> None:
        self.code = code
        self.field = field
        self.message = message
        super().__init__(f"{code.value} at {field}: {message}")


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
    kind: ClassVar[str] = "http"


@dataclass(frozen=True)
class SshAction:
    target: str
    command: str
    stdin: bytes | None
    session: str | None
    kind: ClassVar[str] = "ssh"


Action = HttpAction | SshAction


def _bad(code: Code, field: str, message: str) -> ActionInvalid:
    return ActionInvalid(code, field, message)


def _no_ctl(value: str, field: str) -> None:
    # CR/LF/NUL anywhere would split a header, an SSH request or a log line (request smuggling,
    # log forging); they are rejected in every string field, whatever else the field allows.
    if "\r" in value or "\n" in value or "\x00" in value:
        raise _bad(Code.INVALID_FIELD, field, "must not contain CR, LF or NUL")


def _string(obj: Mapping[str, Any], key: str, *, required: bool) -> str | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise _bad(Code.MISSING_FIELD, key, "is required")
        return None
    if not isinstance(value, str):
        raise _bad(Code.INVALID_FIELD, key, "must be a string")
    _no_ctl(value, key)
    return value


def _session(obj: Mapping[str, Any]) -> str | None:
    session = _string(obj, "session", required=False)
    if session is not None and (len(session) > MAX_TOKEN_FIELD or not _SESSION.fullmatch(session)):
        raise _bad(Code.INVALID_FIELD, "session", "must be 1-255 printable ASCII characters")
    return session


def parse_action(obj: object, config: Config) -> HttpAction | SshAction:
    """Validate a caller's action (already JSON-decoded) against ``config``."""
    if not isinstance(obj, Mapping):
        raise _bad(Code.INVALID_FIELD, "action", "must be a JSON object")
    for key in obj:
        if not isinstance(key, str):
            raise _bad(Code.INVALID_FIELD, "action", "field names must be strings")
    name = _string(obj, "target", required=True)
    assert name is not None
    target = config.targets.get(name)
    if target is None:
        # Never echo the caller's string: an agent that confuses fields may have put a secret
        # reference or the secret itself here (seed: do not return a sensitive reference).
        known = ", ".join(sorted(config.targets)) or "none"
        raise _bad(Code.INVALID_TARGET, "target", f"no such target is configured (known: {known})")
    if isinstance(target, HttpTarget):
        return _parse_http(obj, name, target)
    return _parse_ssh(obj, name, target)


def _reject_foreign(obj: Mapping[str, Any], own: frozenset[str], other: frozenset[str]) -> None:
    for key in sorted(obj):
        if key in own:
            continue
        if key in other:
            raise _bad(
                Code.UNSUPPORTED_ACTION, key, "is not supported by this target's kind of action"
            )
        # Unknown fields are refused, not dropped: a misspelt "idempotency_key" silently ignored
        # would turn a retryable call into an unretryable one without anybody noticing.
        raise _bad(Code.INVALID_FIELD, _field_name(key), "unknown field")


def _field_name(key: str) -> str:
    return key if _VISIBLE.fullmatch(key) and len(key) <= 64 else "action"


def _parse_http(obj: Mapping[str, Any], name: str, target: HttpTarget) -> HttpAction:
    _reject_foreign(obj, _HTTP_FIELDS, _SSH_FIELDS)

    method = _string(obj, "method", required=True)
    assert method is not None
    if not _TOKEN.fullmatch(method) or len(method) > 32:
        raise _bad(Code.INVALID_FIELD, "method", "must be an HTTP method token")
    method = method.upper()
    if method not in target.methods:
        allowed = ", ".join(sorted(target.methods))
        raise _bad(Code.UNSUPPORTED_ACTION, "method", f"not allowed for this target ({allowed})")

    path = _string(obj, "path", required=True)
    assert path is not None
    _check_path(path, target)

    headers = _parse_headers(obj.get("headers"), target)
    body = _parse_body(obj, target)

    key = _string(obj, "idempotency_key", required=False)
    if key is not None:
        if target.idempotency is None:
            # Seed: "Do not silently add an idempotency header for targets that do not document
            # its semantics."  Nor drop one: the caller believes it is protected.
            raise _bad(
                Code.UNSUPPORTED_ACTION,
                "idempotency_key",
                "this target declares no idempotency contract",
            )
        if len(key) > MAX_TOKEN_FIELD or not _VISIBLE.fullmatch(key):
            raise _bad(
                Code.INVALID_FIELD, "idempotency_key", "must be 1-255 visible ASCII characters"
            )

    return HttpAction(
        target=name,
        method=method,
        path=path,
        headers=headers,
        body=body,
        idempotency_key=key,
        session=_session(obj),
    )


def _check_path(path: str, target: HttpTarget) -> None:
    if len(path) > MAX_PATH:
        raise _bad(Code.PAYLOAD_LIMIT, "path", f"is longer than {MAX_PATH} characters")
    if not path.startswith("/") or path.startswith("//"):
        # "//host/x" is a network-path reference (RFC 3986 §4.2): it would name another host.
        raise _bad(Code.INVALID_FIELD, "path", 'must start with a single "/" (origin-form)')
    if not _TARGET_CHARS.fullmatch(path):
        raise _bad(
            Code.INVALID_FIELD,
            "path",
            "has characters that must be percent-encoded (space, #, \\, non-ASCII, ...)",
        )
    if _BAD_PERCENT.search(path):
        raise _bad(Code.INVALID_FIELD, "path", 'has a "%" not followed by two hex digits')
    route, _, query = path.partition("?")
    # A "." or ".." segment (also percent-encoded) would let the path climb out of the
    # target's base path once the server normalizes it (RFC 3986 §5.2.4).
    # Servers that decode "%2F" (or "%5C", "\\" on Windows/IIS) before normalizing see
    # "..%2Fadmin" as "../admin", so the decoded segment is split on both separators too.
    for segment in route.split("/"):
        for part in re.split(r"[/\\]", urllib.parse.unquote(segment)):
            if part in (".", ".."):
                raise _bad(Code.INVALID_FIELD, "path", 'must not contain "." or ".." segments')
    scheme, param = parse_inject(target.inject)
    if scheme == "query" and query:
        for pair in query.split("&"):
            pname = urllib.parse.unquote_plus(pair.partition("=")[0])
            if pname == param:
                raise _bad(
                    Code.FORBIDDEN_HEADER,
                    "path",
                    f"query parameter {param} carries the credential; the broker sets it",
                )


def _forbidden_headers(target: HttpTarget) -> frozenset[str]:
    names = set(CREDENTIAL_HEADERS | TRANSPORT_HEADERS | _HOP_HEADERS)
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
        raise _bad(Code.INVALID_FIELD, "headers", "must be an object of name: value strings")
    if len(raw) > MAX_HEADERS:
        raise _bad(Code.PAYLOAD_LIMIT, "headers", f"more than {MAX_HEADERS} headers")
    forbidden = _forbidden_headers(target)
    out: dict[str, str] = {}
    for hname, value in raw.items():
        if not isinstance(hname, str) or not _TOKEN.fullmatch(hname) or len(hname) > 128:
            raise _bad(Code.INVALID_FIELD, "headers", "a header name is not an RFC 9110 token")
        field = f"headers.{hname}"
        lower = hname.lower()
        if lower in forbidden:
            raise _bad(
                Code.FORBIDDEN_HEADER, field, "is set by the broker or the transport, not callers"
            )
        if lower in out:
            raise _bad(Code.INVALID_FIELD, field, "is given twice (names are case-insensitive)")
        if not isinstance(value, str):
            raise _bad(Code.INVALID_FIELD, field, "must be a string")
        _no_ctl(value, field)
        if len(value) > MAX_HEADER_VALUE:
            raise _bad(Code.PAYLOAD_LIMIT, field, f"is longer than {MAX_HEADER_VALUE} characters")
        if not _HEADER_VALUE.fullmatch(value):
            raise _bad(
                Code.INVALID_FIELD,
                field,
                "must be visible ASCII without leading or trailing whitespace",
            )
        out[lower] = value
    return tuple(sorted(out.items()))


def _parse_body(obj: Mapping[str, Any], target: HttpTarget) -> bytes:
    text = obj.get("body")
    b64 = obj.get("body_base64")
    if text is not None and b64 is not None:
        raise _bad(Code.INVALID_FIELD, "body_base64", "give body or body_base64, not both")
    limit = target.max_body
    if text is not None:
        if not isinstance(text, str):
            raise _bad(Code.INVALID_FIELD, "body", "must be a string (use body_base64 for bytes)")
        if len(text) > limit:  # every character is at least one UTF-8 byte
            raise _bad(Code.PAYLOAD_LIMIT, "body", f"exceeds this target's max_body ({limit})")
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            raise _bad(Code.INVALID_FIELD, "body", "is not valid Unicode text") from None
        if len(data) > limit:
            raise _bad(Code.PAYLOAD_LIMIT, "body", f"exceeds this target's max_body ({limit})")
        return data
    if b64 is not None:
        if not isinstance(b64, str):
            raise _bad(Code.INVALID_FIELD, "body_base64", "must be a base64 string")
        if len(b64) > (limit + 2) // 3 * 4:
            raise _bad(
                Code.PAYLOAD_LIMIT, "body_base64", f"exceeds this target's max_body ({limit})"
            )
        try:
            data = base64.b64decode(b64.encode("ascii"), validate=True)
        except (binascii.Error, ValueError, UnicodeEncodeError):
            raise _bad(Code.INVALID_FIELD, "body_base64", "is not valid base64") from None
        if len(data) > limit:
            raise _bad(
                Code.PAYLOAD_LIMIT, "body_base64", f"exceeds this target's max_body ({limit})"
            )
        return data
    return b""


def _parse_ssh(obj: Mapping[str, Any], name: str, target: SshTarget) -> SshAction:
    _reject_foreign(obj, _SSH_FIELDS, _HTTP_FIELDS)
    command = _string(obj, "command", required=True)
    assert command is not None
    if not command.strip():
        raise _bad(Code.INVALID_FIELD, "command", "must not be empty")
    if len(command) > MAX_COMMAND:
        raise _bad(Code.PAYLOAD_LIMIT, "command", f"is longer than {MAX_COMMAND} characters")
    try:
        command.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(Code.INVALID_FIELD, "command", "is not valid Unicode text") from None
    stdin: bytes | None = None
    raw = obj.get("stdin")
    if raw is not None:
        if not isinstance(raw, str):
            raise _bad(Code.INVALID_FIELD, "stdin", "must be a string")
        if len(raw) > target.max_stdin:
            raise _bad(Code.PAYLOAD_LIMIT, "stdin", "exceeds this target's max_stdin")
        try:
            stdin = raw.encode("utf-8")
        except UnicodeEncodeError:
            raise _bad(Code.INVALID_FIELD, "stdin", "is not valid Unicode text") from None
        if len(stdin) > target.max_stdin:
            raise _bad(Code.PAYLOAD_LIMIT, "stdin", "exceeds this target's max_stdin")
    return SshAction(target=name, command=command, stdin=stdin, session=_session(obj))


# --- binding ------------------------------------------------------------------------------------


def full_path(action: HttpAction, target: HttpTarget) -> str:
    """The request target actually sent: the target's base path + the action's path."""
    return target.base_path + action.path


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fingerprint(action: Action, target: Target) -> str:
    """``sha256:<hex>`` over the canonical request: the target snapshot hash, then method, full
    path, sorted caller headers and the body hash (HTTP) or the command and stdin hash (SSH).
    Excludes the session (who asked is not what is sent) and every secret (the credential is
    bound separately by its non-secret version)."""
    if isinstance(action, HttpAction):
        if not isinstance(target, HttpTarget):
            raise TypeError("an HTTP action needs an HTTP target")
        doc: dict[str, Any] = {
            "v": 1,
            "kind": "http",
            "target": snapshot_hash(target),
            "method": action.method,
            "path": full_path(action, target),
            "headers": [list(h) for h in sorted(action.headers)],
            "body_sha256": _sha256(action.body),
        }
    else:
        if not isinstance(target, SshTarget):
            raise TypeError("an SSH action needs an SSH target")
        doc = {
            "v": 1,
            "kind": "ssh",
            "target": snapshot_hash(target),
            "command": action.command,
            "stdin_sha256": None if action.stdin is None else _sha256(action.stdin),
        }
    return "sha256:" + _sha256(canonical_json(doc))


def is_idempotent(action: Action, target: Target) -> bool:
    """Idempotent *by configuration*: the method is listed in the target's ``idempotent``, or
    (SSH) the exact command is listed in ``idempotent_commands``.  A GET is not idempotent just
    because it is called GET (seed: "A badly designed GET that triggers a deployment is unsafe
    despite the method's name")."""
    if isinstance(action, HttpAction) and isinstance(target, HttpTarget):
        return action.method in target.idempotent
    if isinstance(action, SshAction) and isinstance(target, SshTarget):
        return action.command in target.idempotent_commands
    return False
