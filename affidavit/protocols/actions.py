"""Action parsing and validation: the broker's first preflight layer.

Seed, "Validation and credential injection finish before dispatch": "Reject incorrectly specified
targets, unsupported methods, missing fields, oversized payloads, unknown credential references,
and forbidden header overrides before resolving the host name or accessing the secret.  Record
``phase=validation``, ``outcome=not_attempted`` ... Return a stable code ... along with the path to
the field that the caller can fix.  Do not return the rejected secret reference if its name
contains sensitive information."

``parse_action`` is pure: it reads only the action and the loaded config.  Whatever the input
(any JSON value), it returns a frozen action or raises ``ActionInvalid`` — never anything else.
The common part lives here (an object, a configured ``target``, no foreign fields, ``session``);
the target's protocol (``ProtocolSpec.action``) parses the rest, with the helpers below.

``fingerprint`` binds the request to the target snapshot (seed: "bind the normalized target ... and
the request fingerprint to the invocation"); ``is_idempotent`` reads the *configuration*, never
the method name (seed: "The method name serves as evidence, but not as a guarantee").
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from affidavit.schema import Target, canonical_json, snapshot_hash
from affidavit.session import MAX_SESSION, SESSION, SESSION_WORDS
from affidavit.statemachine import KEYED_PREFIX, Code
from affidavit.strictjson import ACTION_NODES, DuplicateField, NotJsonNumber, TooLarge, prescan
from affidavit.strictjson import loads as strict_loads

from .registry import ProtocolLoadError, get, kinds
from .spec import Action, ActionField

__all__ = [
    "COMMON_FIELDS",
    "MAX_DEPTH",
    "MAX_NODES",
    "MAX_TOKEN_FIELD",
    "SESSION_FIELD",
    "VISIBLE",
    "ActionInvalid",
    "accepted_session",
    "action_size_limit",
    "bounded",
    "check_shape",
    "fingerprint",
    "is_idempotent",
    "legacy_fingerprint",
    "load_action_json",
    "no_ctl",
    "parse_action",
    "request_fingerprint",
    "session",
    "strict_json",
    "string",
]

MAX_TOKEN_FIELD = 255
COMMON_FIELDS = frozenset({"target", "session"})
MAX_DEPTH = 16
"""Nesting an action may have (its own needs three: action, headers, a value).  Checked before
anything walks it: 100k nested arrays used to end in a RecursionError traceback."""
MAX_NODES = ACTION_NODES
"""Values (objects, arrays, scalars) an action may hold in all."""
BOUNDED_PREFIX = 64
"""Characters of a refused value kept in the journal (escaped), with its length and hash."""

# Visible ASCII only: these fields travel in headers, journal attrs and envelopes.
VISIBLE = re.compile(r"[\x21-\x7e]+")

SESSION_FIELD = ActionField(
    "session",
    "groups invocations (one agent run); never part of what is sent",
    max_length=MAX_SESSION,
    pattern=SESSION.pattern,
)
"""The common ``session`` field, as ``session()`` reads it."""


class ActionInvalid(Exception):
    """A validation failure: a stable ``code`` (a validation-phase ``Code``), the ``field`` path
    the caller can fix, and a human ``message`` that never echoes a secret-looking value."""

    def __init__(self, code: Code, field: str, message: str) -> None:
        self.code = code
        self.field = field
        self.message = message
        super().__init__(f"{code.value} at {field}: {message}")


class BodyUnread(ActionInvalid):
    """A body refused by its strict reading (a batch's: ``http.batch.items_sent``) in an action
    otherwise parsed -- ``action``, only to recognize a call bound to its idempotency key
    before the refusal existed (its fingerprint), never to run it."""

    def __init__(self, refused: ActionInvalid, action: Any) -> None:
        super().__init__(refused.code, refused.field, refused.message)
        self.action = action


class Configured(Protocol):
    """What action parsing reads of the loaded config."""

    @property
    def targets(self) -> Mapping[str, Target]: ...


def no_ctl(value: str, field: str) -> None:
    # CR/LF/NUL anywhere would split a header, an SSH request or a log line (request smuggling,
    # log forging); they are rejected in every string field, whatever else the field allows.
    if "\r" in value or "\n" in value or "\x00" in value:
        raise ActionInvalid(Code.INVALID_FIELD, field, "must not contain CR, LF or NUL")


def string(obj: Mapping[str, Any], key: str, *, required: bool) -> str | None:
    """A string field without CR, LF or NUL; ``None`` when absent and not required."""
    value = obj.get(key)
    if value is None:
        if required:
            raise ActionInvalid(Code.MISSING_FIELD, key, "is required")
        return None
    if not isinstance(value, str):
        raise ActionInvalid(Code.INVALID_FIELD, key, "must be a string")
    no_ctl(value, key)
    return value


def session(obj: Mapping[str, Any]) -> str | None:
    """The common ``session`` field (who asked; never part of the fingerprint)."""
    value = string(obj, "session", required=False)
    if value is not None and (len(value) > MAX_SESSION or not SESSION.fullmatch(value)):
        raise ActionInvalid(Code.INVALID_FIELD, "session", f"must be {SESSION_WORDS}")
    return value


def load_action_json(data: bytes | bytearray, limit: int) -> object:
    """Decode an action's JSON text -- checked *before* the parser runs: at most ``limit`` bytes
    (PAYLOAD_LIMIT), UTF-8 (INVALID_FIELD), nested at most ``MAX_DEPTH`` deep and holding at
    most ``MAX_NODES`` values (PAYLOAD_LIMIT, in ``check_shape``'s words: ``_prescan``), valid
    JSON (INVALID_FIELD), with no ``NaN``/``Infinity`` (INVALID_FIELD) and no field named
    twice in one object (INVALID_FIELD at that field's path, e.g. ``action.headers.X``); every
    other failure is an ``ActionInvalid`` at ``action``."""
    if len(data) > limit:
        raise ActionInvalid(Code.PAYLOAD_LIMIT, "action", f"is larger than {limit} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ActionInvalid(
            Code.INVALID_FIELD, "action", f"is not UTF-8 text (byte {exc.start})"
        ) from None
    _prescan(text)
    try:
        return strict_json(text)
    except ValueError as exc:  # JSONDecodeError
        where = (
            f" (line {exc.lineno}, column {exc.colno})"
            if isinstance(exc, json.JSONDecodeError)
            else ""
        )
        raise ActionInvalid(Code.INVALID_FIELD, "action", f"is not valid JSON{where}") from None


def strict_json(text: str, root: str = "action") -> Any:
    """``json.loads``, refusing what Python's parser takes but JSON's readers disagree on
    (``affidavit.strictjson``): a field named twice in one object (``ActionInvalid``
    INVALID_FIELD at its path below ``root``: ``action.headers.X``) and
    ``NaN``/``Infinity``/``-Infinity``, an integer of more than 4300 digits (INVALID_FIELD at
    ``root``); ``1e400`` is read as infinity, which the action's fields refuse at their own
    paths.  Any other fault is the
    parser's ``ValueError``."""
    try:
        return strict_loads(text, root, finite=False)  # 1e400: refused at its field
    except DuplicateField as exc:
        raise ActionInvalid(Code.INVALID_FIELD, exc.path, exc.what) from None
    except NotJsonNumber as exc:
        raise ActionInvalid(Code.INVALID_FIELD, root, exc.what) from None


def _prescan(text: str) -> None:
    """Refuse JSON text nested deeper than ``MAX_DEPTH`` or holding more than ``MAX_NODES``
    values -- what ``check_shape`` refuses once parsed, in its words -- before the parser has
    built anything (``strictjson.prescan``: 16 MB of ``[[],[],...]`` was 5.3M lists, RSS 73 ->
    813 MB, before ``check_shape`` refused it, and deep nesting issue 9's RecursionError)."""
    try:
        prescan(text, MAX_DEPTH, MAX_NODES)
    except TooLarge as exc:
        raise ActionInvalid(Code.PAYLOAD_LIMIT, "action", exc.what) from None


def action_size_limit(targets: Iterable[object]) -> int:
    """Bytes of action JSON worth reading for these targets: the largest payload any of them
    accepts (``max_body``, ``max_stdin``), written at worst as 6-character ``\\uXXXX`` escapes,
    plus 1 MiB for the rest (path, headers, command)."""
    payload = max(
        (max(getattr(t, "max_body", 0), getattr(t, "max_stdin", 0)) for t in targets), default=0
    )
    return 6 * payload + (1 << 20)


_SCALARS = frozenset({str, int, float, bool, type(None), bytes})
"""Exact types that hold no values: neither a ``Mapping`` nor a list or tuple."""


def check_shape(obj: object) -> None:
    """An action object (from JSON, or built by a Python caller) nested at most ``MAX_DEPTH``
    deep and holding at most ``MAX_NODES`` values -- walked without recursion, so a deep or
    cyclic object is refused, not a RecursionError."""
    stack: list[tuple[object, int]] = [(obj, 1)]
    nodes = 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise ActionInvalid(Code.PAYLOAD_LIMIT, "action", f"holds more than {MAX_NODES} values")
        kind = type(value)
        if kind in _SCALARS:
            continue  # most values: no ``Mapping`` ABC check each (issue 15)
        # A dict, list or tuple is told by its exact type, without the ABC's Python-level
        # ``__instancecheck__`` (two per call for the action object alone; issue 15).
        children: Iterable[object]
        if type(value) is dict or (
            kind is not list and kind is not tuple and isinstance(value, Mapping)
        ):
            children = value.values()
        elif isinstance(value, list | tuple):
            children = value
        else:
            continue
        if depth > MAX_DEPTH:
            raise ActionInvalid(
                Code.PAYLOAD_LIMIT, "action", f"nests deeper than {MAX_DEPTH} levels"
            )
        stack.extend((child, depth + 1) for child in children)


def bounded(value: object) -> dict[str, Any]:
    """How a refused caller value is journaled: never whole (a refused 5 MB ``session`` grew the
    journal by 15 MB).  Its type, its length, its first ``BOUNDED_PREFIX`` characters with
    anything unprintable escaped, and the SHA-256 of its UTF-8 bytes (lone surrogates escaped)."""
    if not isinstance(value, str):
        return {"type": type(value).__name__}
    head = value[:BOUNDED_PREFIX].encode("ascii", "backslashreplace").decode("ascii")
    head = "".join(c if " " <= c <= "~" else f"\\x{ord(c):02x}" for c in head)
    raw = value.encode("utf-8", "backslashreplace")
    return {
        "type": "str",
        "length": len(value),
        "prefix": head,
        "sha256": hashlib.sha256(raw).hexdigest(),
    }


def accepted_session(obj: object) -> tuple[str | None, dict[str, Any] | None]:
    """The ``session`` to journal with ACTION_ACCEPTED, and, when the caller's value is refused,
    its ``bounded`` description (then the session is None).  Runs before anything is journaled,
    whatever the action: a non-UTF-8 or 5 MB session is recorded bounded, never whole."""
    # A dict (every action from JSON) is told by its type, without the ABC's check (issue 15).
    if not (type(obj) is dict or isinstance(obj, Mapping)) or obj.get("session") is None:
        return None, None
    try:
        return session(obj), None
    except ActionInvalid:
        return None, bounded(obj.get("session"))


def parse_action(obj: object, config: Configured) -> Action:
    """Validate a caller's action (already JSON-decoded) against ``config``."""
    check_shape(obj)
    if not (type(obj) is dict or isinstance(obj, Mapping)):  # (a dict: no ABC check)
        raise ActionInvalid(Code.INVALID_FIELD, "action", "must be a JSON object")
    for key in obj:
        if not isinstance(key, str):
            raise ActionInvalid(Code.INVALID_FIELD, "action", "field names must be strings")
    name = string(obj, "target", required=True)
    assert name is not None
    target = config.targets.get(name)
    if target is None:
        # Never echo the caller's string: an agent that confuses fields may have put a secret
        # reference or the secret itself here (seed: do not return a sensitive reference).
        known = ", ".join(sorted(config.targets)) or "none"
        raise ActionInvalid(
            Code.INVALID_TARGET, "target", f"no such target is configured (known: {known})"
        )
    spec = get(target.kind)
    if spec is None:  # a loaded config names only kinds the registry knows
        raise ActionInvalid(Code.UNSUPPORTED_ACTION, "target", "no protocol for this kind")
    _reject_foreign(obj, COMMON_FIELDS | spec.action.fields)
    parsed = spec.action.parse(obj, name, target)
    if spec.contracts is not None:
        # A batch whose items cannot be told apart is refused here, before anything is
        # recorded or sent (``ResultContracts.batch``); what it returns is bound later.
        spec.contracts.batch(parsed, target)
    return parsed


def _reject_foreign(obj: Mapping[str, Any], own: frozenset[str]) -> None:
    for key in sorted(obj):
        if key in own:
            continue
        if key in _other_protocols_fields():
            raise ActionInvalid(
                Code.UNSUPPORTED_ACTION, key, "is not supported by this target's kind of action"
            )
        # Unknown fields are refused, not dropped: a misspelt "idempotency_key" silently ignored
        # would turn a retryable call into an unretryable one without anybody noticing.
        raise ActionInvalid(Code.INVALID_FIELD, _field_name(key), "unknown field")


def _other_protocols_fields() -> frozenset[str]:
    """Every protocol's action fields (only on the error path, so loading them all is fine).
    A protocol that fails to load cannot vouch for its fields: its would-be fields are then
    plain unknown fields, rather than a failure of validation itself."""
    out: set[str] = set()
    for kind in kinds():
        try:
            spec = get(kind)
        except ProtocolLoadError:
            continue
        if spec is not None:
            out |= spec.action.fields
    return frozenset(out)


def _field_name(key: str) -> str:
    return key if VISIBLE.fullmatch(key) and len(key) <= 64 else "action"


# --- binding --------------------------------------------------------------------------------------


def fingerprint(action: Action, target: Target, target_hash: str) -> str:
    """``sha256:<hex>`` over the canonical request: ``target_hash``, then what the protocol says
    identifies the request (HTTP: method, full path, sorted caller headers, body hash; SSH:
    command, stdin hash).  Excludes the session (who asked is not what is sent) and every secret
    (the credential is bound separately by its non-secret version).

    ``target_hash`` is the engine's hash of the target's snapshot, keyed by the journal's key
    (``ConfigSnapshot.hash``): this layer has no key, and the caller reads the fingerprint back
    -- built on a plain hash of the snapshot, it would confirm a guessed credential reference."""
    return _fingerprint(action, target, 2, target_hash)


def legacy_fingerprint(action: Action, target: Target) -> str:
    """The fingerprint as written before the target hash was keyed (``"v": 1``, the plain
    ``snapshot_hash``): only to recognize an idempotency key bound before the upgrade, which is
    refused as a changed configuration, never matched."""
    return _fingerprint(action, target, 1, snapshot_hash(target))


def request_fingerprint(action: Action, target: Target, keyed: Callable[[str, bytes], str]) -> str:
    """The request alone, without the target's snapshot: what the protocol says identifies it
    (``fingerprint``'s request part).  ACTION_ACCEPTED records it beside the fingerprint, so
    that a same-key call whose fingerprint differs tells the same request under a changed
    configuration (CONFIG_CHANGED, naming the invocation the key is bound to) from another
    request (IDEMPOTENCY_MISMATCH).  Keyed (``keyed``: the journal's ``keyed_digest``) for
    the reason the fingerprint is: a plain digest of a short body confirms a guess of it."""
    doc = {"v": 1, **_request(action, target)}
    return KEYED_PREFIX + keyed("request-fingerprint", canonical_json(doc))


def _request(action: Action, target: Target) -> dict[str, Any]:
    if action.kind != target.kind:
        raise TypeError(f"a {action.kind} action needs a {action.kind} target, not {target.kind}")
    spec = get(target.kind)
    if spec is None:
        raise TypeError(f"no protocol is registered as {target.kind!r}")
    return {"kind": target.kind, **spec.action.fingerprint(action, target)}


def _fingerprint(action: Action, target: Target, version: int, target_hash: str) -> str:
    doc = {"v": version, "target": target_hash, **_request(action, target)}
    return "sha256:" + hashlib.sha256(canonical_json(doc)).hexdigest()


def is_idempotent(action: Action, target: Target) -> bool:
    """Idempotent *by configuration* (the protocol's rule: HTTP's ``idempotent`` methods, SSH's
    exact ``idempotent_commands``).  A GET is not idempotent just because it is called GET
    (seed: "A badly designed GET that triggers a deployment is unsafe despite the method's
    name")."""
    spec = get(target.kind)
    return (
        action.kind == target.kind and spec is not None and spec.action.idempotent(action, target)
    )
