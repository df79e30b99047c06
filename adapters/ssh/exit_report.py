"""What the channel's exit report proves (RFC 4254 §6.10), read from libssh's exit state.

RFC 4254 allows one exit report per channel: an exit-status or an exit-signal.  The first one
libssh shows is recorded; one libssh cannot vouch for (an unnamed report, a "signal name" that
is no signal name) is recorded as no exit information, and a report that changed before the
close is judged makes the close prove nothing about which one was the command's.
"""

from __future__ import annotations

import re
from typing import Any

from affidavit.statemachine import Code

from .libssh import SSH_AGAIN, text

__all__ = ["ExitReport"]

_UNNAMED_EXIT = -1
"""``get_exit_state()``'s code for an exit report without a signal name that is not a plain
exit-status it can vouch for: libssh stores 0xFFFFFFFF as the code of every exit-signal, and
ssh-python returns it as -1 — an exit-signal with an *empty* name and an exit-status of
4294967295 both come back as ``(-1, b"", core)``.  Which one was sent cannot be told, so the
driver records neither (see ``ExitReport.read``)."""

_SIGNAL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+@-]{0,63}")
"""An exit-signal name as RFC 4254 §6.10 has them: ``KILL``, ``USR1``, ``name@domain``."""


def _exit_state(status: Any, signal: Any, core: Any) -> tuple[int, bytes, bool]:
    return int(status), bytes(signal or b""), bool(core)


class ExitReport:
    """The exit report recorded for one channel, and what it leaves unproven."""

    def __init__(self) -> None:
        self.exit_status: int | None = None
        self.exit_signal: str | None = None
        self.core_dumped = False
        self.state: tuple[int, bytes, bool] | None = None
        """libssh's exit state when the first exit report was recorded (``read``)."""
        self.unnamed = False
        """libssh holds an exit report it reports as (-1, b"", core)"""
        self.odd_signal = False
        """... or an exit-signal whose name is no signal name"""
        self.doubled = False
        """the exit state read with the exit-signal also held an exit-status (``read``)"""

    @property
    def exited(self) -> bool:
        return self.exit_status is not None or self.exit_signal is not None

    def unproven(self) -> Code:
        """The code of an attempt that ends now, without a complete result: the command ran to
        an exit report whose result is incomplete, or nothing is known of its outcome."""
        return Code.REMOTE_RESULT_INCOMPLETE if self.exited else Code.REMOTE_OUTCOME_UNKNOWN

    def read(self, status: Any, signal: Any, core: Any) -> tuple[str, dict[str, Any]] | None:
        """Read ``get_exit_state()``'s answer while no report is recorded: record the report it
        shows, if libssh can vouch for it; the machine event (with its facts) to fire for a
        report recorded now, None when none is."""
        if signal and not _SIGNAL_NAME.fullmatch(text(signal)):
            # Not a signal name (RFC 4254 §6.10: "KILL", or "name@domain"): remote text of
            # up to a packet's size that would land in exit_signal, the journal and the
            # caller's status line.  Treated like an unnamed report: no exit information.
            self.unnamed = self.odd_signal = True
        elif signal:
            # libssh stores 0xFFFFFFFF (-1) as the status of every exit-signal and keeps the
            # last of each kind: a status beside the name is an exit-status that came after the
            # signal, in the same read (measured: exit-signal KILL then exit-status 0 in one TCP
            # segment reads (0, b"KILL", False)).  Two reports: ``conflicting``.
            self.doubled = int(status) not in (_UNNAMED_EXIT, SSH_AGAIN)
            self.exit_signal = text(signal)
            self.core_dumped = bool(core)
            self.state = _exit_state(status, signal, core)
            return "exit_signal", {"exit_signal": self.exit_signal, "core": bool(core)}
        elif status == _UNNAMED_EXIT:
            # An exit-signal whose name is empty, or exit-status 4294967295: libssh reports
            # both alike.  Neither an exit-status nor a signal is invented; the close that
            # follows is handled as one without exit information (RFC 4254 §6.10 rule).
            self.unnamed = True
        elif status != SSH_AGAIN:
            # RFC 4254 sends a uint32; ssh-python hands it over as a C int.
            self.exit_status = int(status) & 0xFFFFFFFF
            self.state = _exit_state(status, signal, core)
            return "exit_status", {"exit_status": self.exit_status}
        return None

    def missing(self) -> str:
        """Why a close that came without a recorded exit report is no result."""
        if self.odd_signal:
            return "channel closed; its exit-signal's name is not a signal name"
        if self.unnamed:
            return (
                "channel closed; its only exit report was an exit-signal with an"
                " empty name or exit-status 4294967295 (libssh reports both alike)"
            )
        return "channel closed without exit-status or exit-signal"

    def conflicting(self, channel: Any) -> bool:
        """More than one exit report came: an unnamed one besides the recorded one, or libssh's
        exit state differs from the one the recorded report was read from (a later exit-status
        or exit-signal arrived; libssh keeps the last of each), or the state the report was read
        from held an exit-signal and an exit-status at once.  Other reports that arrive in one
        read are not told apart: libssh holds only the last of each kind, and an exit-signal
        overwrites the status (two exit-statuses, or an exit-status then an exit-signal)."""
        if self.unnamed or self.doubled:
            return True
        return _exit_state(*channel.get_exit_state()) != self.state  # no pump: stored

    def summary(self) -> dict[str, Any]:
        return {
            "exit_status": self.exit_status,
            "exit_signal": self.exit_signal,
            "core_dumped": self.core_dumped,
        }
