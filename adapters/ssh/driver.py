"""The trio driver: ssh-python (libssh) in non-blocking mode, one exec per connection.

Why libssh and not libssh2: see ``docs/ssh-driver.md`` — libssh2 cannot tell exit-status 0 from
no exit-status, so it cannot implement REMOTE_RESULT_INCOMPLETE (RFC 4254 §6.10).

The attempt's phases, each in its own module: ``connect.py`` sets the connection up (TCP, the
SSH transport, the pinned host key, user auth, the session channel) and closes it;
``libssh.py`` makes libssh's non-blocking calls under trio; this module dispatches the exec
request and collects the output and the exit report, which ``exit_report.py`` reads;
``before_reply.py`` checks what the channel holds while the exec reply is pending.

What each failure proves is decided by the protocol machine (``table.py``), never by the name of
the exception: before ``exec`` is handed over everything is ``SetupError``; after it, only a
remote CHANNEL_CLOSE that follows an exit report and EOF — seen while the connection was still
alive — yields a ``RemoteResult``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any, NoReturn

import ssh.exceptions
import trio

from affidavit.adapters.base import (
    AttemptContext,
    AttemptInterrupted,
    RemoteResult,
    ResultTooLarge,
)
from affidavit.statemachine import Code, Outcome

from .before_reply import _UNANSWERED_GRACE, BeforeReply
from .connect import (
    Connection,
    SshTarget,
    SshTimeouts,
    fire,
    hostkey_algorithms,
    no_pinned_key_type,
)
from .exit_report import ExitReport
from .keys import SshCredential
from .libssh import SSH_AGAIN, Park, describe

__all__ = [
    "CHUNK",
    "SshTarget",
    "SshTimeouts",
    "hostkey_algorithms",
    "no_pinned_key_type",
    "perform",
]

CHUNK = 64 * 1024
"""Largest piece read from libssh and handed to the sink at once: output is never held whole."""

_DRAIN_PASSES = 8
"""Passes over both streams in one ``drain`` at most: a round whose drain did not learn the order
makes no call that pumps and goes round again (reading on), so the bound only keeps a round --
its host key and liveness checks -- from waiting on streams that keep delivering."""


_DEADLINE_MARGIN = 0.5
"""Seconds before the engine's deadline for the target's total (``AttemptContext.deadline``)
at which the exec timeout ends the attempt: room for the driver's own ``timed_out`` to be
raised before the engine's cancellation reaches it on a loaded loop."""

_STARVE = 0.05
"""Seconds of drains that did not learn the order (output arriving on both streams at every
read) after which waiting stdin (as much as the open window takes) or ``send_eof`` is written
anyway, each time (the starvation guard, docs/ssh-driver.md): long beside a pause a remote's
output usually makes, short beside a sink's chunk and the stall bound.  It buys no proof: a
remote that keeps §5.3's order sends nothing after its EOF for a write's pump to take in."""


class _Run(BeforeReply):
    """One attempt: fires machine events, observes them, classifies the end."""

    def __init__(
        self,
        target: SshTarget,
        credential: SshCredential,
        command: str,
        stdin: bytes | None,
        ctx: AttemptContext,
    ) -> None:
        self.t = target
        self.command = command
        self.stdin = stdin
        self.ctx = ctx
        self.conn = Connection(target, credential, ctx)
        self.report = ExitReport()
        self.stdin_unsent = 0
        """stdin bytes not written because the remote closed the channel first"""
        self.counts = {"stdout": 0, "stderr": 0}
        self.hashes = {"stdout": hashlib.sha256(), "stderr": hashlib.sha256()}

    # -- machine --------------------------------------------------------------------------------

    def fire(self, event: str, facts: Mapping[str, Any] | None = None) -> None:
        fire(self.ctx, event, facts)

    def interrupted(self, event: str, code: Code, detail: str) -> NoReturn:
        facts = self.result_facts()
        self.fire(event, {"code": code.value})
        raise AttemptInterrupted(code, detail, facts)

    def too_large(self, exc: ResultTooLarge) -> NoReturn:
        """stdout and stderr together passed ``max_result``: nothing more is read or stored; the
        channel and the connection are closed on the way out (``perform``'s ``finally``)."""
        facts = {**self.result_facts(), **exc.facts}
        self.fire("result_size_limit", exc.facts)
        raise AttemptInterrupted(exc.code, exc.detail, facts)

    def result_facts(self) -> dict[str, Any]:
        facts: dict[str, Any] = {**self.report.summary(), "host_key": self.conn.host_key}
        if self.stdin_unsent:
            facts["stdin_unsent"] = self.stdin_unsent
        for name in ("stdout", "stderr"):
            facts[f"{name}_bytes"] = self.counts[name]
            facts[f"{name}_sha256"] = self.hashes[name].hexdigest()
        return facts

    # -- dispatch and result --------------------------------------------------------------------

    def check_host_key(self) -> None:
        """After dispatch: what arrives after a change of host key is not from the pinned host,
        so the attempt ends ``host_key_changed`` -> ``interrupted``, ``unknown``."""
        changed = self.conn.key_changed()
        if changed is not None:
            self.interrupted(
                "host_key_changed",
                Code.REMOTE_OUTCOME_UNKNOWN,
                f"the server re-keyed with another host key: presented {changed}, "
                f"verified {self.conn.host_key}",
            )

    async def dispatch(self, deadline: float) -> None:
        """Through the gate, or a ``SetupError`` before it.  ``deadline``: when the exec
        timeout would end the attempt (``perform``); one already past ends it here, before
        the gate, ``not_attempted`` CONNECT_TIMEOUT -- the code the engine records when the
        target's total runs out before dispatch.  Past the gate it would have been an exec
        timeout at once, before the request was written: a dispatch recorded for nothing sent."""
        machine = self.ctx.machine
        assert machine.crosses_dispatch("exec"), machine.state
        if deadline <= trio.current_time():
            self.conn.setup_failed(
                Code.CONNECT_TIMEOUT,
                machine.state,
                f"less than {_DEADLINE_MARGIN}s of the target's total timeout was left for the "
                "command: it was not requested",
            )
        try:
            changed = self.conn.key_changed()
        except ssh.exceptions.BaseSSHError as exc:
            self.conn.setup_failed(Code.SETUP_FAILED, "host_key", describe(exc))
        if changed is not None:
            # A key exchange during authentication or the session's opening switched keys.
            self.conn.setup_failed(
                Code.HOST_KEY_MISMATCH,
                "host_key",
                f"the server re-keyed with another host key before the command was requested: "
                f"presented {changed}",
            )
        # The engine journals DISPATCH_STARTED durably inside the gate; if it raises, nothing
        # has been written and the exec request never leaves this process.
        await self.ctx.gate(
            {
                "host_key": self.conn.host_key,
                "user": self.t.user,
                "command_sha256": hashlib.sha256(self.command.encode()).hexdigest(),
                "stdin_bytes": len(self.stdin or b""),
            }
        )
        self.fire("exec", {})

    async def request_exec(self) -> RemoteResult | None:
        """Hand the exec request over and wait for CHANNEL_SUCCESS / CHANNEL_FAILURE."""
        assert self.conn.io is not None
        io, channel = self.conn.io, self.conn.channel
        # The gate's barrier is shielded: a deadline that struck while it committed is
        # delivered here, before the first byte -- as HTTP's send_all delivers it.
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            rc = channel.request_exec(self.command)  # writes the request into libssh's transport
            self.fire("exec_sent", {})
            park = Park(io)
            ended_since: float | None = None  # when a look first showed the command's end
            while rc == SSH_AGAIN:  # each call now only polls for the reply
                # Each look may pump: a reply it took in is answered by the request_exec call
                # right after it, and stands (packets taken in by one pump are not told apart:
                # an end found with the reply is after it, as far as the driver can know).
                # What a call takes in is looked at after the park (at most _RECHECK_SECONDS).
                self.overflowed()
                rc = channel.request_exec(self.command)
                if rc != SSH_AGAIN:
                    break
                ended = self.output_ended()
                rc = channel.request_exec(self.command)
                if rc != SSH_AGAIN:
                    break
                # A refusal the server sends right after what ran (``refuseafter``) may come
                # a moment later: ``_UNANSWERED_GRACE`` lets it be read as one (``refused``).
                now = trio.current_time()
                ended_since = (ended_since or now) if ended else None
                if ended_since is not None and now - ended_since >= _UNANSWERED_GRACE:
                    self.ended_unanswered()
                await park()
                rc = channel.request_exec(self.command)
            self.overflowed()  # output that came with the reply, or before it
        except ssh.exceptions.BaseSSHError as exc:
            # CHANNEL_FAILURE is an authoritative refusal only if it arrived on a live
            # connection: libssh raises the same SSHError for a dead socket.  It reports the
            # denied state (SSH_CHANNEL_REQ_STATE_DENIED, i.e. CHANNEL_FAILURE received) as
            # "Channel request exec failed"; a server may close the channel right after
            # refusing, so "still open" is not required (that raced in practice).
            denied = "request exec failed" in describe(exc) and io.alive()
            if denied and self.ctx.machine.state == "exec_requesting":
                # On loopback the first non-blocking call can write the request *and* read the
                # reply: the denial proves the request was sent.
                self.fire("exec_sent", {})
            if denied:
                self.check_host_key()
                seen = self.refused()
                self.fire("exec_failure", {"reply": "CHANNEL_FAILURE"})
                return RemoteResult(
                    Outcome.REJECTED,
                    Code.EXEC_REJECTED,
                    facts={"host_key": self.conn.host_key, "reply": "CHANNEL_FAILURE", **seen},
                    summary=self.report.summary(),
                )
            self.library_error(exc)
        self.check_host_key()
        self.fire("exec_accepted", {})
        return None

    def lost(self, detail: str) -> NoReturn:
        # An exit report without the proven end of the streams is not a result (seed: "send the
        # exit status before the output stream is cut off" must stay unknown).
        self.interrupted("connection_lost", self.report.unproven(), detail)

    def library_error(self, exc: ssh.exceptions.BaseSSHError) -> NoReturn:
        """libssh raised an error after dispatch that no rule of ``request_exec`` or ``collect``
        reads.  On a dead connection it is the connection's loss; on a live one it proves
        nothing about the command either way: the attempt ends ``library_error`` ->
        ``interrupted`` (a recorded closing step, ``unknown``), never with the raw exception."""
        assert self.conn.io is not None
        if not self.conn.io.alive():
            self.lost(describe(exc))
        self.interrupted("library_error", self.report.unproven(), f"libssh failed: {describe(exc)}")

    def stream_broken(self, detail: str) -> NoReturn:
        """The remote broke the channel's stream rules: what it sent is not one result."""
        self.interrupted("stream_broken", self.report.unproven(), detail)

    async def read_stream(self, name: str, eof: dict[str, bool]) -> str:
        """One ``read_nonblocking`` of ``name``: "data" (sunk), "none" or "eof".

        A stream at EOF is still read: libssh keeps data that arrives after the channel's EOF,
        and holds back the CHANNEL_CLOSE ("delayed close") until it is read -- unread, the wait
        lasted until the exec timeout."""
        channel = self.conn.channel
        try:
            _rc, data = channel.read_nonblocking(CHUNK, name == "stderr")
        except ssh.exceptions.EOF:
            eof[name] = True
            return "eof"
        if not data:
            return "none"
        self.check_host_key()  # not a byte from another key reaches the sink
        if eof[name]:
            self.stream_broken(f"{name} data after the channel's EOF (RFC 4254 §5.3)")
        self.counts[name] += len(data)
        self.hashes[name].update(data)
        self.fire(name, {"bytes": len(data)})
        try:
            await self.ctx.sink(name, data)
        except ResultTooLarge as exc:
            self.too_large(exc)
        return "data"

    async def drain(self, eof: dict[str, bool], waiting: bool) -> tuple[bool, bool]:
        """Read both streams until the order of what libssh holds is known; (known, moved).

        libssh 0.11 appends a stream's data to one buffer and keeps the channel's EOF as a flag
        (``channel_rcv_data``, ``channel_rcv_eof``), and a read answers EOF only once the
        buffer is empty.  Data taken off the socket together with the EOF and read after it
        therefore looks like any data -- and a call that pumps more packets before that read
        (``get_exit_state``, a stdin write's flush) may append data sent *after* the EOF to the
        same buffer, where it read back as the stream's own (measured: "out" and EOF, "late"
        0.5 s after, a sink that took 0.8 s for "out": committed ``out\nlate\n``).  A read
        pumps packets only while the flag is unset (``ssh_channel_poll``), so reads after it
        drain the buffers without taking anything more off the socket.  The order is known
        when the last read found nothing and was no EOF -- its pump left the flag unset, so
        everything either buffer holds came before any EOF, and a pump now adds more of it or
        the EOF -- or both streams answered EOF (both drained, the flag set: whatever comes
        now is after the EOF and is caught).  Until then no call that pumps is made.

        ``waiting``: a call that pumps (a stdin write, ``send_eof``) waits for the order, so
        the drain ends at the first read that knows it, output still arriving or not -- a
        remote that prints without pause while it reads stdin never leaves both streams empty
        (one that keeps both busy never gives such a read: ``_STARVE``).
        Otherwise it reads on while output arrives (fewer rounds per byte).  Each stream is
        read at least once (data already in a buffer does not wake a park on the socket);
        a bounded number of passes keeps each round short.  What it proves holds for the next
        call's first read off the socket: a blocking stdin write may take several, and data
        after an EOF taken in by a later one is not told apart (docs/ssh-driver.md)."""
        moved = False
        quiet = 0  # reads in a row that took no data
        for i in range(2 * _DRAIN_PASSES):
            name = ("stdout", "stderr")[i % 2]
            was = eof[name]
            got = await self.read_stream(name, eof)
            moved = moved or got == "data" or eof[name] != was
            quiet = 0 if got == "data" else quiet + 1
            if eof["stdout"] and eof["stderr"]:
                return True, moved
            if i and got == "none" and (waiting or quiet >= 2):
                return True, moved
        return False, moved

    async def collect(self) -> RemoteResult:
        assert self.conn.io is not None
        io, channel = self.conn.io, self.conn.channel
        report = self.report
        pending = memoryview(self.stdin or b"")
        stdin_open = True
        eof = {"stdout": False, "stderr": False}
        eof_fired = False
        starve = min(_STARVE, self.t.timeouts.connect)  # never past the stall bound
        unproven_since: float | None = None  # stdin waiting, and no drain knew the order since
        park = Park(io)
        while True:
            # Each libssh call below may pump packets for the others: note what the channel
            # showed before them, so a change they made is seen before parking on the socket.
            seen = (channel.is_eof(), channel.is_closed(), channel.window_size())
            state: tuple[Any, Any, Any] | None = None  # libssh's exit state, read this round
            try:
                # Every call below that may take packets off the socket comes after a drain
                # that knew the order (``drain``); a round whose drain did not ends here --
                # but for a stdin write starved of that proof for ``starve`` (``_STARVE``).
                began = trio.current_time()
                known, progressed = await self.drain(eof, stdin_open)
                if known or not stdin_open:
                    unproven_since = None
                elif unproven_since is None:
                    unproven_since = began
                # A remote that keeps both streams busy never lets a read find its stream empty:
                # past ``starve`` the write goes out without the proof (``_STARVE``).
                starved = (
                    unproven_since is not None and trio.current_time() - unproven_since >= starve
                )
                wrote = False
                try:
                    # Never more than the remote's window: ssh-python's write loops in C until
                    # all it was given is written, and libssh answers 0 (not "again") while the
                    # window is shut, so a larger write spun on the trio thread until the remote
                    # read again.  A shut window is waited for like any packet (its adjust
                    # arrives as one).
                    room = min(len(pending), CHUNK, channel.window_size()) if stdin_open else 0
                    if (known or starved) and room:
                        wrote = True  # it may pump, whatever it answers
                        # On a worker thread: a key re-exchange holds even a write that fits.
                        stall = self.t.timeouts.connect
                        while room:
                            written = await io.write(channel, bytes(pending[:room]), stall)
                            if written is None:
                                self.lost(
                                    f"a stdin write did not return within {stall}s of beginning "
                                    "(the connect timeout; a key re-exchange holds writes): the "
                                    "connection was ended"
                                )
                            pending = pending[written:]
                            progressed = progressed or written > 0
                            # A proven write is one: its pump spends the proof.  A starved one
                            # had none to spend, so it fills the open window piece by piece --
                            # else a sink slower than the remote's output holds stdin to a
                            # piece per two drains of slow reads.
                            room = min(len(pending), CHUNK, channel.window_size())
                            room = room if starved and written else 0
                    elif (known or starved) and stdin_open and not pending:
                        wrote = True  # its flush may pump: a round of its own, as a write's
                        channel.send_eof()
                        stdin_open = False
                except ssh.exceptions.BaseSSHError:
                    if not io.alive():
                        raise
                    # On a live connection libssh refuses to write only to a channel the remote
                    # closed ("Remote channel is closed"): a command that exits without reading
                    # all its input (``true``, ``head -1``).  Its result is still on the way.
                    stdin_open = False
                    self.stdin_unsent = len(pending)
                    progressed = True
                if wrote:
                    unproven_since = None  # the next unproven write waits its own ``starve``
                    known, moved = await self.drain(eof, stdin_open)
                    progressed = progressed or moved
                if (
                    known
                    and eof["stdout"]
                    and eof["stderr"]
                    and not (channel.is_closed() and io.alive())
                ):
                    # After EOF no read call reads packets, nor does get_exit_state() once
                    # libssh holds any exit report: the CHANNEL_CLOSE has to be pumped.  Before
                    # the exit state is read: a pump that processes the exit report and the
                    # close together must not leave the close seen and the report unread (a
                    # complete result then read as closed without exit-status).
                    # Not once the close is in (seen on a live connection): a pump then reads
                    # only what follows it -- the connection's end, when the server closed TCP
                    # right after the result -- and a dead session's channel reads as closed
                    # too, so the close it had proved would prove nothing any more.  Nothing
                    # else touches the socket after a CHANNEL_CLOSE: the reads answer from the
                    # channel's EOF flag, get_exit_state() from its "closed by the remote" flag.
                    io.pump()
                if known and not report.exited:
                    # get_exit_state() also pumps packets: after EOF the read calls stop doing
                    # so, and exit-status / CHANNEL_CLOSE would never be processed.  Packets
                    # are processed in order, so a close seen below was preceded by any exit
                    # report the remote sent -- read here, after the last pump.  With both
                    # streams at EOF it pumps after ``io.pump`` without a drain between: what
                    # it takes in is after the EOF, and caught by the next read.
                    state = channel.get_exit_state()
            except ssh.exceptions.BaseSSHError as exc:
                if not io.alive():
                    self.lost(describe(exc))
                raise
            if not io.alive():
                self.lost("connection closed")
            # Everything classified below came in over the current keys: from the pinned host
            # only if they were exchanged under its key.
            self.check_host_key()
            step = report.read(*state) if state is not None else None
            if step is not None:
                self.fire(*step)
                progressed = True
            if eof["stdout"] and eof["stderr"] and not eof_fired:
                self.fire("eof", {f"{n}_bytes": self.counts[n] for n in eof})
                eof_fired = True
            if eof_fired and channel.is_closed():
                # Seen on a live connection (checked above): a real CHANNEL_CLOSE.  libssh
                # processes packets in order, so an exit report sent before it is already in.
                if stdin_open and pending:
                    # The remote's window stayed shut until it closed (``head -c 3``).
                    self.stdin_unsent = len(pending)
                facts = self.result_facts()
                if not report.exited:
                    self.interrupted(
                        "channel_closed", Code.REMOTE_RESULT_INCOMPLETE, report.missing()
                    )
                if report.conflicting(channel):
                    self.interrupted(
                        "closed_conflicting",
                        Code.REMOTE_RESULT_INCOMPLETE,
                        "channel closed after more than one exit report (RFC 4254 allows one):"
                        " which one is the command's is not known",
                    )
                # Journaled with the attempt's steps: a committed result keeps only its own facts.
                unsent = {"stdin_unsent": self.stdin_unsent} if self.stdin_unsent else {}
                self.fire("channel_closed", unsent)
                failed = report.exit_signal is not None or report.exit_status != 0
                return RemoteResult(
                    Outcome.COMMITTED,
                    Code.REMOTE_COMMAND_FAILED if failed else None,
                    facts=facts,
                    summary=report.summary(),
                )
            if progressed or (channel.is_eof(), channel.is_closed(), channel.window_size()) != seen:
                park.moved()
                continue
            await park()  # nothing observable changed


async def perform(
    target: SshTarget,
    credential: SshCredential,
    command: str,
    stdin: bytes | None,
    ctx: AttemptContext,
) -> RemoteResult:
    """Run ``command`` once on ``target``; see ``adapters/base.py`` for the contract."""
    run = _Run(target, credential, command, stdin, ctx)
    try:
        await run.conn.setup()
        # Before the gate: a deadline that leaves no time for the command ends the attempt
        # there, nothing sent (``dispatch``), rather than at once after it.
        margin = None if ctx.deadline is None else ctx.deadline - _DEADLINE_MARGIN
        await run.dispatch(math.inf if margin is None else margin)
        began = trio.current_time()
        deadline = began + target.timeouts.exec
        if margin is not None:
            # The engine's deadline for the target's total began before setup: ended by it,
            # the attempt would be a cancellation and this rule's facts never recorded.
            deadline = min(deadline, margin)
        try:
            with trio.fail_at(deadline):
                rejected = await run.request_exec()
                if rejected is not None:
                    return rejected
                return await run.collect()
        except trio.TooSlowError:
            code = run.report.unproven()
            took = round(max(deadline - began, 0.0), 3)
            run.interrupted("timed_out", code, f"no complete result within {took}s")
        except ssh.exceptions.BaseSSHError as exc:
            run.library_error(exc)
    except trio.Cancelled:
        # Whose stop it is -- the caller's, the lease's, a shutdown's -- the driver does not
        # know; the engine records the cause (as HTTP's ``cancelled`` claims none either).
        if ctx.machine.allows("cancelled"):
            run.fire("cancelled", {})
        raise
    finally:
        await run.conn.close()
