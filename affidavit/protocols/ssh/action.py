"""An SSH action: ``{"target", "command", "stdin", "session"}`` validated against its
``SshTarget`` (``SSH_ACTION``).  A command is one line; a script goes to ``sh -s`` as stdin."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from affidavit.protocols.actions import ActionInvalid, session, string
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
    stdin: bytes | None = None
    raw = obj.get("stdin")
    if raw is not None:
        if not isinstance(raw, str):
            raise ActionInvalid(Code.INVALID_FIELD, "stdin", "must be a string")
        if len(raw) > target.max_stdin:
            raise ActionInvalid(Code.PAYLOAD_LIMIT, "stdin", "exceeds this target's max_stdin")
        try:
            stdin = raw.encode("utf-8")
        except UnicodeEncodeError:
            raise ActionInvalid(Code.INVALID_FIELD, "stdin", "is not valid Unicode text") from None
        if len(stdin) > target.max_stdin:
            raise ActionInvalid(Code.PAYLOAD_LIMIT, "stdin", "exceeds this target's max_stdin")
    return SshAction(target=name, command=command, stdin=stdin, session=session(obj))


def identity(action: SshAction, target: SshTarget) -> dict[str, Any]:
    """The command and the stdin hash (no stdin is not an empty stdin)."""
    stdin = None if action.stdin is None else hashlib.sha256(action.stdin).hexdigest()
    return {"command": action.command, "stdin_sha256": stdin}


def idempotent(action: SshAction, target: SshTarget) -> bool:
    """The exact command is listed in the target's ``idempotent_commands``."""
    return action.command in target.idempotent_commands


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
)

SSH_ACTION = ActionSpec(
    fields=frozenset(f.name for f in SSH_FIELDS),
    parse=parse,
    fingerprint=identity,
    idempotent=idempotent,
    schema=SSH_FIELDS,
    tool="ssh_exec",
    doc="Run one command on a configured SSH target; the broker holds the key.",
)
