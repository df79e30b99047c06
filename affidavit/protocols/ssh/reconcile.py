"""The ``reconcile`` setting of an SSH target: the command that settles an unknown outcome.

Seed, "Idempotency is defined by the remote contract": for SSH, "define retryability in the
command's application contract: create a deployment under a unique release identifier ... or
run a query to confirm the desired state"::

    reconcile = { command = "test -e /srv/releases/{idempotency_key}",
                  committed_if = "exit:0", rejected_if = "exit:1" }

The command runs on the same target (host, user, key) as an invocation linked to the one it
reconciles (``affidavit.reconcile``); its placeholders are the invocation's bound values, each
single-quoted for the shell (``affidavit.protocols.placeholders``).  A condition reads the
command's own complete result: ``exit:N`` -- it exited with status N (a command killed by a
signal, or one without an exit status, matches nothing: seed, "If the channel closed after
stdout without an exit status or signal ... the broker ... does not know whether the command
succeeded").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from affidavit.protocols.placeholders import Template, parse_template, shell_escape
from affidavit.protocols.settle import SETTLE
from affidavit.schema import Field, Read, Schema
from affidavit.statemachine import Outcome

if TYPE_CHECKING:
    from .target import SshTarget

__all__ = ["RECONCILE", "ReconcileCommand", "parse_reconcile", "query", "verdict"]


@dataclass(frozen=True)
class ReconcileCommand:
    command: Template
    committed_if: int | None
    """The exit status that proves the effect present."""
    rejected_if: int | None
    """The exit status that proves it absent."""
    settle: float
    """Seconds after the attempt ended before an absent finding is believed (``settle.py``)."""


def _command(r: Read) -> Template:
    text: str = r.string(max_len=32768)
    try:
        return parse_template(text, shell=True)
    except ValueError as exc:
        raise r.error(str(exc)) from None


def _exit(r: Read) -> int | None:
    raw = r.raw()
    if raw is None:
        return None
    source, _, status = raw.partition(":") if isinstance(raw, str) else ("", "", "")
    if source != "exit" or not status.isdigit() or int(status) > 255:
        raise r.error('must be "exit:N", N an exit status 0-255')
    return int(status)


def _rejected_if(r: Read) -> int | None:
    status = _exit(r)
    committed = r.values["committed_if"]
    if status is None and committed is None:
        raise r.error("give committed_if, rejected_if or both: a query that can decide nothing")
    if status is not None and status == committed:
        raise r.error("must differ from committed_if")
    return status


RECONCILE = Schema(
    ReconcileCommand,
    (
        Field("command", _command, encode=str, doc="command with placeholders"),
        Field("committed_if", _exit, default=None),
        Field("rejected_if", _rejected_if, default=None),
        SETTLE,
    ),
)


def parse_reconcile(r: Read) -> ReconcileCommand | None:
    return RECONCILE.parse_optional_table(r)


def query(target: SshTarget, values: Mapping[str, str | None]) -> dict[str, Any]:
    rc = target.reconcile
    if rc is None:
        raise ValueError(f"target {target.name} declares no reconcile query")
    return {"target": target.name, "command": rc.command.render(values, shell_escape)}


def verdict(
    target: SshTarget,
    summary: Mapping[str, Any],
    streams: Mapping[str, bytes],
    values: Mapping[str, str | None],
) -> tuple[Outcome | None, str | None]:
    """The exit status against ``committed_if`` / ``rejected_if`` (``values``, the
    invocation's bound values, are not read: an exit status echoes nothing)."""
    rc = target.reconcile
    assert rc is not None
    status = summary.get("exit_status")
    if not isinstance(status, int) or isinstance(status, bool):
        return None, None
    if status == rc.committed_if:
        return Outcome.COMMITTED, f"exit:{status}"
    if status == rc.rejected_if:
        return Outcome.REJECTED, f"exit:{status}"
    return None, None
