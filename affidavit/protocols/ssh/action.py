"""An SSH action: ``{"target", "command", "stdin", "idempotency_key", "session"}`` validated
against its ``SshTarget`` (``SSH_ACTION``).  A command is one line; a script goes to ``sh -s``
as stdin.

``idempotency_key`` is the caller's stable identifier of the command's effect (a release id).
Seed: SSH "rarely support[s] an idempotency key at the protocol level.  Define retryability in
the command's application contract: create a deployment under a unique release identifier".  So
it is never sent; the journal binds it to the request (the same key with another command is
IDEMPOTENCY_MISMATCH, the same key again answers from the record) and a reconciliation query
may name it (``{idempotency_key}``).  It never makes an unknown outcome retryable: no remote
deduplicates on it (``remote_contract: none``)."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from affidavit.protocols.actions import (
    MAX_TOKEN_FIELD,
    VISIBLE,
    ActionInvalid,
    session,
    string,
)
from affidavit.protocols.placeholders import SHELL_WORD, SHELL_WORD_RULE
from affidavit.protocols.spec import ActionField, ActionSpec, text_payload
from affidavit.statemachine import Code

from .target import SshTarget

__all__ = ["SSH_ACTION", "SSH_FIELDS", "SshAction", "describe"]

MAX_COMMAND = 32768


@dataclass(frozen=True)
class SshAction:
    target: str
    command: str
    stdin: bytes | None
    session: str | None
    idempotency_key: str | None = None
    kind: ClassVar[str] = "ssh"


def parse(obj: Mapping[str, Any], name: str, target: SshTarget) -> SshAction:
    command = string(obj, "command", required=True)
    assert command is not None
    if not command.strip():
        raise ActionInvalid(Code.INVALID_FIELD, "command", "must not be empty")
    if len(command) > MAX_COMMAND:
        raise ActionInvalid(
            Code.PAYLOAD_LIMIT, "command", f"is longer than {MAX_COMMAND} characters"
        )
    try:
        command.encode("utf-8")
    except UnicodeEncodeError:
        raise ActionInvalid(Code.INVALID_FIELD, "command", "is not valid Unicode text") from None
    stdin = _parse_stdin(obj, target.max_stdin)
    key = string(obj, "idempotency_key", required=False)
    if key is not None and (len(key) > MAX_TOKEN_FIELD or not VISIBLE.fullmatch(key)):
        raise ActionInvalid(
            Code.INVALID_FIELD, "idempotency_key", "must be 1-255 visible ASCII characters"
        )
    action = SshAction(
        target=name, command=command, stdin=stdin, session=session(obj), idempotency_key=key
    )
    _query_safe(action, target)
    return action


def _query_safe(action: SshAction, target: SshTarget) -> None:
    """A value the target's reconciliation query puts into its command must be a plain word
    (``affidavit.protocols.placeholders``): the command may start a second shell that parses
    it unquoted.  Refused here, not first when the query runs, so the caller learns it while it
    can still choose another key, and an invocation is never bound to a key its query refuses."""
    names = target.reconcile.command.names if target.reconcile is not None else ()
    for field in ("idempotency_key", "session"):
        value = getattr(action, field)
        if field in names and value is not None and not SHELL_WORD.fullmatch(value):
            raise ActionInvalid(
                Code.INVALID_FIELD,
                field,
                f"{SHELL_WORD_RULE}: the target's reconciliation query passes it to the shell",
            )


def identity(action: SshAction, target: SshTarget) -> dict[str, Any]:
    """The command and the stdin hash (no stdin is not an empty stdin)."""
    stdin = None if action.stdin is None else hashlib.sha256(action.stdin).hexdigest()
    return {"command": action.command, "stdin_sha256": stdin}


def needs_approval(action: SshAction, target: SshTarget) -> bool:
    """The target's ``approval`` covers every command; or the command has stdin, is not simple
    or runs other code (no pattern can vouch for it), or one of its patterns matches
    (``ApprovalPolicy.command_reason``)."""
    return approval_reason(action, target) is not None


def approval_reason(action: SshAction, target: SshTarget) -> str | None:
    """Why the command waits for an operator's yes (shown with it), or None."""
    if target.approval is None:
        return None
    return target.approval.command_reason(action.command, stdin=action.stdin is not None)


STDIN_SHOWN = 16 * 1024


def operator_view(action: SshAction, target: SshTarget) -> dict[str, Any]:
    """What an operator approves: where (user@host:port), the command, stdin, and the
    caller's idempotency key (never sent: the journal binds it, and a reconciliation query may
    name it)."""
    out: dict[str, Any] = {
        "destination": f"{target.user}@{target.host}:{target.port}",
        "command": action.command,
    }
    if action.idempotency_key is not None:
        out["idempotency_key"] = action.idempotency_key
    why = approval_reason(action, target)
    if why is not None:
        out["approval_reason"] = why
    if action.stdin is not None:
        out["stdin_bytes"] = len(action.stdin)
        out["stdin_sha256"] = hashlib.sha256(action.stdin).hexdigest()
        if len(action.stdin) <= STDIN_SHOWN:
            out["stdin"] = action.stdin.decode("utf-8")  # parsed from a str: it decodes
    return out


def _parse_stdin(obj: Mapping[str, Any], limit: int) -> bytes | None:
    """``stdin`` as UTF-8 bytes, at most ``limit``; None when the action gives none."""
    raw = obj.get("stdin")
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise ActionInvalid(Code.INVALID_FIELD, "stdin", "must be a string")
    if len(raw) > limit:
        raise ActionInvalid(Code.PAYLOAD_LIMIT, "stdin", "exceeds this target's max_stdin")
    try:
        stdin = raw.encode("utf-8")
    except UnicodeEncodeError:
        raise ActionInvalid(Code.INVALID_FIELD, "stdin", "is not valid Unicode text") from None
    if len(stdin) > limit:
        raise ActionInvalid(Code.PAYLOAD_LIMIT, "stdin", "exceeds this target's max_stdin")
    return stdin


def operator_contents(action: Mapping[str, Any]) -> dict[str, bytes]:
    """The stdin the operator view names (when the action gives one), from the accepted
    action, as ``parse`` reads it (no limit: the bytes are served only when they hash to what
    the view recorded)."""
    try:
        stdin = _parse_stdin(action, sys.maxsize)
    except ActionInvalid as exc:
        raise ValueError(exc.message) from None
    return {} if stdin is None else {"stdin": stdin}


def idempotent(action: SshAction, target: SshTarget) -> bool:
    """The exact command is listed in the target's ``idempotent_commands`` and has no stdin.

    A listing vouches for a command line, not for the input it runs: with stdin, ``sh``,
    ``python3`` or ``psql`` run the caller's code, and an unknown outcome of an idempotent
    operation is sent again without a look (``decide()``).  Any stdin, empty included, makes
    the command not idempotent, as it defeats every approval pattern (``approval_reason``)."""
    return action.stdin is None and action.command in target.idempotent_commands


def describe(target: SshTarget) -> dict[str, Any]:
    """What a caller may know of the target (``list_targets``): never its key or host keys."""
    return {
        "host": target.host,
        "port": target.port,
        "user": target.user,
        "idempotent_commands": sorted(target.idempotent_commands),
        "max_stdin": target.max_stdin,
    }


SSH_FIELDS = (
    ActionField(
        "command",
        "one command line, run by the remote user's shell",
        required=True,
        max_length=MAX_COMMAND,
        pattern=r"[^\r\n\x00]+",
        checks=(
            (Code.INVALID_FIELD, "only whitespace"),
            (Code.INVALID_FIELD, "not valid Unicode text"),
        ),
    ),
    text_payload(
        "stdin",
        "text for the command's standard input, sent as UTF-8 (a script: command `sh -s`)",
        "max_stdin",
    ),
    ActionField(
        "idempotency_key",
        "your identifier of the command's effect (a release id): never sent; calling again "
        "with it answers from the same invocation, and the target's reconciliation query may "
        "look it up (then it must be a plain word: A-Z a-z 0-9 first, then also . _ : @ + -)",
        max_length=MAX_TOKEN_FIELD,
        pattern=VISIBLE.pattern,
    ),
)

SSH_ACTION = ActionSpec(
    fields=frozenset(f.name for f in SSH_FIELDS),
    parse=parse,
    fingerprint=identity,
    idempotent=idempotent,
    schema=SSH_FIELDS,
    tool="ssh_exec",
    doc="Run one command on a configured SSH target; the broker holds the key.",
    needs_approval=needs_approval,
    operator_view=operator_view,
    operator_contents=operator_contents,
)
