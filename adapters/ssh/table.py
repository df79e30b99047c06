"""The SSH protocol machine, declared as data.

Rule 1 (as in h11's ``_state.py``): everything the driver learns from the wire that matters for
classification becomes an event of this table, and nothing else decides the outcome.

Why these states (seed, "Connection setup needs a precise end point" and RFC 4254):

* Setup ends at ``session_open``: transport negotiation, host verification, user authentication
  and session channel creation are done, and none of them can run a command.  A failure there is
  ``setup_failed`` and proves ``not_attempted``.
* ``session_open --exec--> exec_requesting`` is the **dispatch boundary**: the engine journals
  DISPATCH_STARTED before the driver hands the ``exec`` channel request to libssh.
* RFC 4254 §6.5: the success reply to ``exec`` means only "accepted"; CHANNEL_FAILURE is a
  complete, authoritative refusal (``exec_rejected`` completes the machine as a rejection) --
  unless the channel already holds unread output or an exit report: a refusal of a command the
  channel shows running proves nothing (``refusal_contradicted`` -> ``interrupted``), and
  neither does a channel that shows the command's end (a close, an exit report) before any
  reply (``ended_unanswered`` -> ``interrupted``).
* RFC 4254 §6.10: ``exit-status`` is *optional* and may arrive before or after the channel EOF.
  The machine therefore tracks the two facts separately (``exit_*_seen`` = status known, streams
  still open; ``eof`` = streams ended, no status yet; ``drained`` = both) and only a remote
  CHANNEL_CLOSE from ``drained`` proves a complete result.  A close from anywhere else is
  ``closed_incomplete`` (REMOTE_RESULT_INCOMPLETE): the stream ended but nothing says how the
  command did.
* Anything that stops the driver after dispatch (connection lost, our exec timeout, caller
  cancellation, data after the channel's EOF, output past the target's ``max_result``, an error
  libssh raised that no rule above reads, on a live connection, a key re-exchange signed with
  another host key than the verified one) lands in ``interrupted``: dispatched, not complete,
  so the engine reports ``unknown``.
"""

from __future__ import annotations

from types import MappingProxyType

from affidavit.statemachine import ProtocolTable, register

__all__ = ["SSH_TABLE"]

_PRE_DISPATCH = (
    "start",
    "tcp_connected",
    "transport_ready",
    "host_key_verified",
    "authenticated",
    "session_open",
)
_RUNNING = ("exec_accepted", "stdout", "stderr")
_OUTPUT_OPEN = (*_RUNNING, "exit_status_seen", "exit_signal_seen")
_POST_DISPATCH_OPEN = (
    "exec_requesting",
    "exec_sent",
    *_RUNNING,
    "eof",
    "exit_status_seen",
    "exit_signal_seen",
    "drained",
)

_STATES = {
    "start": "nothing done yet",
    "tcp_connected": "TCP connected by trio (TCP_NODELAY), fd handed to libssh",
    "transport_ready": "SSH transport negotiated (version exchange, key exchange)",
    "host_key_verified": "the presented host key matched a pinned key (compared by the broker)",
    "authenticated": "user authentication accepted",
    "session_open": "session channel open; setup is complete, nothing requested yet",
    "setup_failed": "setup stopped before dispatch; the command was never requested",
    "exec_requesting": "DISPATCH boundary crossed (journaled); the exec request is being written",
    "exec_sent": "the exec request was handed to libssh's transport; no reply yet",
    "exec_rejected": "the server refused the exec request (CHANNEL_FAILURE)",
    "exec_accepted": "the server accepted the exec request (CHANNEL_SUCCESS); command running",
    "stdout": "receiving stdout data",
    "stderr": "receiving extended (stderr) data",
    "eof": "both streams ended (CHANNEL_EOF), no exit-status or exit-signal yet",
    "exit_status_seen": "exit-status received; output streams still open",
    "exit_signal_seen": "exit-signal received; output streams still open",
    "drained": "exit reported and both streams ended; only CHANNEL_CLOSE is missing",
    "closed": "CHANNEL_CLOSE after exit report and EOF: the result is complete",
    "closed_incomplete": "channel closed without exit-status or exit-signal (RFC 4254 §6.10), "
    "or after exit reports that disagree",
    "interrupted": "stopped after dispatch without a complete result (drop, timeout, cancel, "
    "data after EOF, output past max_result, an unexpected libssh error, a host key changed "
    "at a re-exchange, a refusal after output or an exit report, a command's end before the "
    "exec reply, output before it up to the channel's window)",
}

_T: dict[str, dict[str, str]] = {
    "start": {"tcp_connected": "tcp_connected"},
    "tcp_connected": {"transport_ready": "transport_ready"},
    "transport_ready": {"host_key_verified": "host_key_verified"},
    "host_key_verified": {"authenticated": "authenticated"},
    "authenticated": {"session_open": "session_open"},
    "session_open": {"exec": "exec_requesting"},
    "exec_requesting": {"exec_sent": "exec_sent"},
    # A CHANNEL_FAILURE on a channel that already holds unread output or an exit report
    # contradicts itself: no proof the command did not run.  EOF alone (libssh: an empty
    # stream, after CHANNEL_EOF or CHANNEL_CLOSE) does not.
    "exec_sent": {
        "exec_accepted": "exec_accepted",
        "exec_failure": "exec_rejected",
        "refusal_contradicted": "interrupted",
        # A close or an exit report with the reply still pending: it may have run.
        "ended_unanswered": "interrupted",
    },
    "eof": {
        "exit_status": "drained",
        "exit_signal": "drained",
        "channel_closed": "closed_incomplete",
    },
    # RFC 4254 §6.10 allows one exit report: a close after two that disagree (exit-status 0,
    # then 1 or an exit-signal) proves no result.
    "drained": {"channel_closed": "closed", "closed_conflicting": "closed_incomplete"},
    "setup_failed": {},
    "exec_rejected": {},
    "closed": {},
    "closed_incomplete": {},
    "interrupted": {},
}
for _s in _PRE_DISPATCH:
    _T[_s]["setup_failed"] = "setup_failed"
for _s in _RUNNING:
    _T[_s] = {
        "stdout": "stdout",
        "stderr": "stderr",
        "eof": "eof",
        "exit_status": "exit_status_seen",
        "exit_signal": "exit_signal_seen",
        "channel_closed": "closed_incomplete",
    }
for _s in ("exit_status_seen", "exit_signal_seen"):
    # Output may still arrive after exit-status (RFC 4254 §6.10 does not order them).
    _T[_s] = {"stdout": _s, "stderr": _s, "eof": "drained"}
for _s in _POST_DISPATCH_OPEN:
    _T[_s].update(
        {
            "connection_lost": "interrupted",
            "timed_out": "interrupted",
            "cancelled": "interrupted",
            "stream_broken": "interrupted",
            "result_size_limit": "interrupted",
            "library_error": "interrupted",
            "host_key_changed": "interrupted",
        }
    )
assert all(s in _T for s in _OUTPUT_OPEN)

SSH_TABLE: ProtocolTable = register(
    ProtocolTable(
        name="ssh",
        initial="start",
        states=_STATES,
        transitions=MappingProxyType(_T),
        dispatch=frozenset({("session_open", "exec")}),
        completes=frozenset({("drained", "channel_closed"), ("exec_sent", "exec_failure")}),
        final=frozenset(
            {"setup_failed", "exec_rejected", "closed", "closed_incomplete", "interrupted"}
        ),
        # The engine records the seed's REQUEST_SENT / REMOTE_RESPONSE_STARTED on first entry.
        milestones={"exec_sent": "REQUEST_SENT", "exec_accepted": "REMOTE_RESPONSE_STARTED"},
        doc=__doc__ or "",
    )
)
