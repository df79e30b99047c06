"""Before the exec reply: what the channel holds while the exec request waits for its answer.

While the request is pending no channel data is read, so the receive window is never adjusted
(``overflowed``); a channel that shows the command's end without a reply ends the attempt
after a grace (``output_ended``, ``ended_unanswered``); a CHANNEL_FAILURE is taken for "not
run" only if the channel holds nothing of a command that ran (``refused``).  A mixin of the
driver's attempt (``driver._Run``): it reads the connection and the exit report and fires the
machine's events through the attempt (docs/ssh-driver.md, "Before the exec reply").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn

import ssh.exceptions

from affidavit.adapters.base import AttemptInterrupted
from affidavit.statemachine import Code

from .connect import Connection
from .exit_report import ExitReport
from .libssh import SSH_AGAIN, describe

__all__ = ["BeforeReply"]

_LOCAL_WINDOW = 64 * 32768
"""The receive window libssh 0.11 opens a session channel with (``WINDOW_DEFAULT``: 64 packets
of ``CHANNEL_MAX_PACKET``, 2 MiB; measured: of 32,000-byte packets sent past it before the exec
reply, 65 -- 2,080,000 bytes -- were kept).  Were libssh's larger, the check below errs towards
``stream_broken``; were it smaller, ``test_output_past_the_window_before_the_exec_reply_*``
fails."""

_MAX_PACKET = 256 * 1024
"""The largest packet libssh takes in (``MAX_PACKET_LEN``, 262144 bytes): no channel data packet
it processes is longer."""

_UNANSWERED_GRACE = 0.25
"""Seconds the exec reply is still waited for once the channel showed the command's end before
it (``output_ended``): a server that refuses right after what ran sends the refusal a moment
later (measured on loopback: within 0.2 s; one park on the socket was not always enough)."""


class BeforeReply:
    """The attempt's checks while the exec reply is pending; ``_Run`` supplies the rest."""

    conn: Connection
    report: ExitReport

    if TYPE_CHECKING:  # (the attempt's own, driver._Run's: declared for the type check only)

        def fire(self, event: str, facts: Mapping[str, Any] | None = None) -> None: ...

        def result_facts(self) -> dict[str, Any]: ...

        def lost(self, detail: str) -> NoReturn: ...

    def look(self, exit_state: bool = True) -> tuple[dict[str, Any], dict[str, str]]:
        """What the channel holds before the exec reply, without reading it: each stream's
        unread bytes and EOF (``poll_timeout(0)`` counts a stream's buffered bytes, and takes
        nothing off the socket while a stream holds data or EOF; else one non-blocking pump),
        and, with ``exit_state`` (for an attempt that ends now: no machine event is fired for
        it), the exit report, read into ``report``.  An error the look raises is returned as
        ``look_failed``."""
        channel = self.conn.channel
        held: dict[str, Any] = {"unread_stdout_bytes": 0, "unread_stderr_bytes": 0, "eof": False}
        failed: dict[str, str] = {}
        try:
            for name in ("stdout", "stderr"):
                try:
                    held[f"unread_{name}_bytes"] = max(channel.poll_timeout(0, name == "stderr"), 0)
                except ssh.exceptions.EOF:  # ssh-python raises libssh's SSH_EOF: EOF, empty
                    held["eof"] = True
            if exit_state:
                self.report.read(*channel.get_exit_state())
        except ssh.exceptions.BaseSSHError as exc:
            failed["look_failed"] = describe(exc)
        return held, failed

    def overflowed(self) -> None:
        """Before the exec reply no channel data is read, so the channel's receive window
        (``_LOCAL_WINDOW``) is never adjusted: libssh 0.11 drops a data packet the window has no
        room for ("Data packet too big for our window") and goes on, and the output read later
        lacks it -- a result committed from it would be cut short (audit 51a: 2,976,000 bytes
        sent, 2,080,000 recorded).  ssh-python exposes neither libssh's log nor the window's
        accounting, so the unread bytes stand for it: a packet was dropped only if the bytes
        taken in before it, all still unread, left less room than one packet of the largest size
        libssh takes (``_MAX_PACKET``).  Unread bytes that reach that point end the attempt
        ``stream_broken`` (docs/ssh-driver.md, "Output before the exec reply")."""
        held, failed = self.look(exit_state=False)
        unread = held["unread_stdout_bytes"] + held["unread_stderr_bytes"]
        if unread <= _LOCAL_WINDOW - _MAX_PACKET:
            return
        facts = {**held, "window": _LOCAL_WINDOW}
        self.fire("stream_broken", {"code": self.report.unproven().value, **facts})
        raise AttemptInterrupted(
            self.report.unproven(),
            f"{unread} bytes of output arrived before the exec reply, within {_MAX_PACKET} "
            f"bytes of the channel's {_LOCAL_WINDOW}-byte window: libssh may have dropped "
            "output past it, so what it holds is not the command's whole output",
            {**self.result_facts(), **facts, **failed},
        )

    def output_ended(self) -> bool:
        """While the exec reply is pending: the channel shows the command's end -- closed, or
        holding an exit report.  libssh holds a CHANNEL_CLOSE back while a stream holds unread
        data ("delayed close"), so the exit report (``get_exit_state``, which pumps like
        ``request_exec``) is what shows a command that ran and ended; a close after unread
        output and no exit report is seen only at the exec timeout.  EOF alone is no end: a
        server may refuse after it (docs/ssh-driver.md, "Before the exec reply")."""
        channel = self.conn.channel
        if channel.is_closed():
            return True
        status, signal, _core = channel.get_exit_state()
        return status != SSH_AGAIN or bool(signal)

    def ended_unanswered(self) -> NoReturn:
        """The channel showed the command's end (``output_ended``) for ``_UNANSWERED_GRACE``
        while the exec reply was pending: the end proves no result (the command may have run;
        a reply that never came is no refusal), and a server that sends it before the reply
        breaks the order every server keeps (the reply, then the command's output).  The
        attempt ends then -- not at the exec timeout -- ``ended_unanswered`` ->
        ``interrupted``, with what the channel held (as ``refused``) in the facts."""
        assert self.conn.io is not None
        if not self.conn.io.alive():
            self.lost("connection closed before the exec reply")
        held, failed = self.look()
        code = self.report.unproven()
        self.fire("ended_unanswered", {"code": code.value, **held})
        what = _held(held, self.report)
        raise AttemptInterrupted(
            code,
            "the channel showed the command's end (a close or an exit report) while the exec "
            "request was not answered"
            + (f"; it held {what}" if what else "")
            + ": whether the command ran is not known",
            {**self.result_facts(), **held, **failed},
        )

    def refused(self) -> dict[str, Any]:
        """Before a CHANNEL_FAILURE is taken for "not run": unread output or an exit report on
        the channel (libssh processes packets in order: all the remote sent before the refusal
        is in) contradicts it, and the attempt ends ``refusal_contradicted`` -> ``interrupted``,
        REMOTE_RESULT_INCOMPLETE, with what it held in the facts.  ``poll_timeout(0)`` counts a
        stream's buffered bytes without reading them, and takes nothing off the socket while a
        stream holds data or EOF; else, as ``get_exit_state`` without a report, one
        non-blocking pump, whose packets came after the refusal.

        EOF alone contradicts nothing: libssh reports it for an *empty* stream whose remote sent
        CHANNEL_EOF or CHANNEL_CLOSE -- a server may close right after refusing, and a remote
        that ran nothing has sent all it will.  An error the look raises (the connection
        dropped after the refusal) says nothing about the exec either: the refusal arrived on
        a live connection and stands.  Both are returned as facts of the rejection (``eof``,
        ``look_failed``)."""
        held, failed = self.look()
        reported = self.report.exited or self.report.unnamed
        if not (held["unread_stdout_bytes"] or held["unread_stderr_bytes"] or reported):
            return {"eof": held["eof"], **failed}
        facts = {**self.result_facts(), **held, **failed, "reply": "CHANNEL_FAILURE"}
        self.fire("refusal_contradicted", {"code": Code.REMOTE_RESULT_INCOMPLETE.value, **held})
        raise AttemptInterrupted(
            Code.REMOTE_RESULT_INCOMPLETE,
            "the server refused the exec request (CHANNEL_FAILURE) on a channel that already "
            "held " + _held(held, self.report) + ": whether the command ran is not known",
            facts,
        )


def _held(held: Mapping[str, Any], report: ExitReport) -> str:
    """What a refused channel held, in words: ``4 bytes of stdout, an exit report``."""
    parts = [f"{held[f'unread_{n}_bytes']} bytes of {n}" for n in ("stdout", "stderr")]
    parts = [p for p in parts if not p.startswith("0 ")]
    parts += ["EOF"] if held["eof"] else []
    parts += ["an exit report"] if report.exited or report.unnamed else []
    return ", ".join(parts)
