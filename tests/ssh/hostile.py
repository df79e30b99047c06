"""A scripted hostile SSH server (asyncssh, test-only) whose exec behaviour is chosen per command.

It runs its own asyncio loop in a daemon thread because our tests run under trio.  Every exec
request that reaches it is recorded (``exec_requests``) so tests can prove that nothing was
requested when the dispatch gate refused.

Commands (the first word selects the behaviour):
  exit <n>         write "out\\n"/"err\\n", send exit-status n, EOF, close
  signal           write "out\\n", send exit-signal KILL, EOF, close
  refuse [close|drop]  reply CHANNEL_FAILURE to the exec request; ``close``: and
                   CHANNEL_CLOSE, in one TCP segment; ``drop``: then abort the TCP connection
  refuseafter <what>...  first send each of ``what`` on the session channel -- ``out`` (stdout
                   "ran\n"), ``err`` (stderr "ran\n"), ``status`` (exit-status 0), ``eof`` --
                   then reply CHANNEL_FAILURE to the exec request: a refusal of a command that
                   ran, as far as the channel says
  noexit           write "partial\\n", EOF, close — never an exit-status (RFC 4254 §6.10)
  closeonly        write "partial\\n", close without EOF or exit-status
  drop             accept exec, write "partial\\n", then abort the TCP connection
  status_then_break  write "partial\\n", send exit-status 0 (no EOF/close), abort the TCP connection
  hang             accept exec and never answer again
  slowclose <s>    write "out\\n", send exit-status 0 and EOF, CHANNEL_CLOSE s seconds later
  unnamedsig <core> <s>  write "out\\n", send exit-signal with an empty name (core dumped if
                   core is 1) and EOF, CHANNEL_CLOSE s seconds later
  status <n> <s>   write "out\\n", send exit-status n (any uint32) and EOF, CHANNEL_CLOSE s
                   seconds later
  reports <r>...   write "out\n", send each exit report 0.1 s apart (``s<n>`` exit-status n,
                   ``k<NAME>`` exit-signal NAME), then EOF and close
  reports1seg <r>...  as ``reports``, with "out", the reports, EOF and CHANNEL_CLOSE corked
                   into one TCP segment (the client's libssh takes them in one read)
  floodthenok <n>  before answering the exec request: n MB of stdout in raw 32,000-byte
                   packets, past the client's window; then CHANNEL_SUCCESS, exit-status 0, EOF
                   and close
  closenoreply [noexit]  "ran\\n" on stdout, exit-status 0, EOF and CHANNEL_CLOSE -- and
                   never an answer to the exec request; ``noexit``: no exit-status
  strayexit        write "partial\n", send exit-status 0 on a channel id the client never
                   opened, then EOF and close the session channel
  lateout [now|split [hold]]  write "out\n", EOF, then "late\n" on stdout after the EOF,
                   exit-status 0, close (0.1 s apart; ``now``: at once, in one TCP segment;
                   ``split``: "out" and EOF in one segment, the rest once the test cues "late"
                   (``HostileServer.cue``), 0.05 s apart; ``hold``: stdin never read)
  echosig          write "out\n", send an exit-signal named ``PASSWORD``, abort the connection
  big <n>          write ``big_output(n)`` (n bytes of numbered ASCII lines), exit-status 0
  exitdrop         write "out\n", exit-status 0, EOF, close, then close the TCP connection at once
  rekey <key> <when>  start a key re-exchange in which the server signs with ``key`` (``same``:
                   the pinned ed25519 key; ``other``: ``other_key``, an ed25519 key never
                   pinned), ``when`` ``first`` (then "out\n", exit-status 0, EOF, close) or
                   ``last`` (after "out\n", exit-status 0 and EOF; the close 0.3 s later)
  stall <s>        read no stdin for s seconds (the receive window, once used up, stays shut),
                   then read it to EOF and write its byte count, exit-status 0, close
  flood <n> <to>   print "tick\n" every 0.2 ms (``to``: ``stdout``, ``stderr``, ``both``, then
                   alternately, or ``each``, one line on each stream every time) until n bytes
                   of stdin were read, then "done\n" on stdout, exit-status 0, EOF, close: a
                   remote that never pauses its output while it needs stdin
  deaf <s>         keep the session's window open but read nothing more off the TCP socket (its
                   receive buffer shrunk to 4 KiB): a client's stdin write blocks in send() once
                   the kernel's buffers are full; the connection dropped s seconds later
  deaflate         as ``deaf``, and meanwhile "out\n" and EOF in one TCP segment, "late\n"
                   0.1 s after them, exit-status 0, close; reading resumes 1 s in
  rekeystall <s>   read no stdin for 0.2 s, then open the window again and start a key
                   re-exchange (one TCP segment) that never finishes: nothing more is read;
                   the connection dropped s seconds later (use with user "smallwin")
Users: "refuse" is denied every authentication; "pwuser" authenticates with password
``PASSWORD`` only; anyone else with any public key.  "rekeyer" is answered its session channel
only after a key re-exchange signed with ``other_key``.  "smallwin" gets a session channel whose
receive window is ``SMALL_WINDOW`` bytes (asyncssh's default is 2 MiB).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator
from typing import Any

import asyncssh
import trio
from asyncssh.constants import (
    MSG_CHANNEL_DATA,
    MSG_CHANNEL_EOF,
    MSG_CHANNEL_EXTENDED_DATA,
    MSG_CHANNEL_FAILURE,
    MSG_CHANNEL_REQUEST,
    MSG_CHANNEL_SUCCESS,
)
from asyncssh.packet import Boolean, String, UInt32

PASSWORD = "correct horse battery staple"
SMALL_WINDOW = 24 * 1024


def big_output(n: int) -> bytes:
    """Deterministic n-byte ASCII output (numbered lines) the test can recompute and hash."""
    line_no = 0
    parts: list[bytes] = []
    size = 0
    while size < n:
        line = b"%09d the quick brown fox jumps over the lazy dog\n" % line_no
        parts.append(line)
        size += len(line)
        line_no += 1
    return b"".join(parts)[:n]


@contextlib.asynccontextmanager
async def garbage_handshake_server(reply: bytes) -> AsyncIterator[int]:
    """A trio TCP listener on 127.0.0.1 that answers every connection with ``reply`` (not a
    valid SSH transport) and closes; yields its port."""

    async def handler(stream: trio.SocketStream) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(reply)
            await trio.sleep(0.2)  # let the client read it before the close
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = int(listeners[0].socket.getsockname()[1])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handler, listeners)
        try:
            yield port
        finally:
            nursery.cancel_scope.cancel()


def _start_rekey(conn: Any, key: Any) -> None:
    """A server-initiated key re-exchange (RFC 4253 §9) signed with ``key``: asyncssh picks its
    host key per exchange from ``_server_host_keys``.  Packets sent after it wait until the
    exchange is done."""
    conn._server_host_keys = {alg: asyncssh.load_keypairs(key)[0] for alg in conn._server_host_keys}
    conn._send_kexinit()
    conn._kexinit_sent = True  # as asyncssh's own rekey does: the peer's KEXINIT answers it


class _Session(asyncssh.SSHServerSession[str]):
    def __init__(self, server: HostileServer) -> None:
        self._srv = server
        self._chan: Any = None
        self._command = ""
        self._stdin = 0
        self._task: asyncio.Task[None] | None = None  # a behaviour that runs on

    def connection_made(self, chan: Any) -> None:
        self._chan = chan

    def exec_requested(self, command: str) -> bool:
        self._srv.exec_requests.append(command)
        self._command = command
        words = command.split()
        if words[:1] == ["floodthenok"]:
            self._task = asyncio.get_running_loop().create_task(self._flood_then_ok(int(words[1])))
            return None  # type: ignore[return-value]  # answered by ``_flood_then_ok``
        if words[:1] == ["closenoreply"]:
            self._close_without_reply(report=words[1:] != ["noexit"])
            return None  # type: ignore[return-value]  # never answered
        if words[:1] == ["refuseafter"]:
            self._send_before_refusing(words[1:])
            return False  # asyncssh answers CHANNEL_FAILURE after what was sent
        if words[:1] == ["refuse"]:
            if words[1:] == ["close"]:
                self._refuse_and_close()
            elif words[1:] == ["drop"]:  # runs once asyncssh has sent the CHANNEL_FAILURE
                asyncio.get_running_loop().call_soon(self._chan.get_extra_info("connection").abort)
            return False
        return True

    def _refuse_and_close(self) -> None:
        """CHANNEL_FAILURE and CHANNEL_CLOSE corked into one TCP segment: the client's libssh
        takes the close in with the refusal (asyncssh sends no reply of its own to a request on
        a closing channel)."""
        chan = self._chan
        conn = chan.get_extra_info("connection")
        sock = conn.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        conn.send_packet(MSG_CHANNEL_FAILURE, UInt32(chan._send_chan))
        chan.close()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)

    async def _flood_then_ok(self, mb: int) -> None:
        """``floodthenok``: stdout packets the client's window has no room for, sent before the
        exec reply (the client reads no channel data while it waits for the reply)."""
        chan = self._chan
        conn = chan.get_extra_info("connection")
        recipient = UInt32(chan._send_chan)
        piece = String(b"x" * 32000)
        for i in range(mb * 1000 * 1000 // 32000):
            conn.send_packet(MSG_CHANNEL_DATA, recipient + piece)
            if i % 16 == 0:
                await asyncio.sleep(0.001)
        await asyncio.sleep(0.5)
        conn.send_packet(MSG_CHANNEL_SUCCESS, recipient)
        chan._send_request(b"exit-status", UInt32(0))
        conn.send_packet(MSG_CHANNEL_EOF, recipient)
        chan.close()

    def _close_without_reply(self, report: bool) -> None:
        """``closenoreply``: a command's whole result and the close, the exec request never
        answered; ``report``: with the exit-status (``noexit``: without)."""
        chan = self._chan
        conn = chan.get_extra_info("connection")
        recipient = UInt32(chan._send_chan)
        conn.send_packet(MSG_CHANNEL_DATA, recipient + String(b"ran\n"))
        if report:
            chan._send_request(b"exit-status", UInt32(0))
        conn.send_packet(MSG_CHANNEL_EOF, recipient)
        chan.close()

    def _reports_in_one_segment(self, reports: list[str]) -> None:
        """``reports1seg``: "out", the exit reports, EOF and close, corked into one segment."""
        chan = self._chan
        conn = chan.get_extra_info("connection")
        recipient = UInt32(chan._send_chan)
        sock = conn.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        conn.send_packet(MSG_CHANNEL_DATA, recipient + String(b"out\n"))
        for word in reports:
            if word.startswith("s"):
                chan._send_request(b"exit-status", UInt32(int(word[1:])))
            else:
                chan._send_request(
                    b"exit-signal", String(word[1:]), Boolean(False), String(""), String("")
                )
        conn.send_packet(MSG_CHANNEL_EOF, recipient)
        chan.close()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)

    def _send_before_refusing(self, what: list[str]) -> None:
        """Packets of a command that ran, written raw (the session has not started, so the
        channel's own writers refuse): they go out before the exec request's reply."""
        chan = self._chan
        conn = chan.get_extra_info("connection")
        recipient = UInt32(chan._send_chan)
        for item in what:
            if item == "out":
                conn.send_packet(MSG_CHANNEL_DATA, recipient + String(b"ran\n"))
            elif item == "err":
                conn.send_packet(
                    MSG_CHANNEL_EXTENDED_DATA, recipient + UInt32(1) + String(b"ran\n")
                )
            elif item == "status":
                chan._send_request(b"exit-status", UInt32(0))
            elif item == "eof":
                conn.send_packet(MSG_CHANNEL_EOF, recipient)
            else:
                raise ValueError(item)

    def session_started(self) -> None:
        words = self._command.split()
        verb = words[0] if words else ""
        chan = self._chan
        conn = chan.get_extra_info("connection")
        loop = asyncio.get_running_loop()
        if verb == "exit":
            chan.write("out\n")
            chan.write_stderr("err\n")
            chan.exit(int(words[1]))
        elif verb == "big":
            chan.write(big_output(int(words[1])).decode("ascii"))
            chan.exit(0)
        elif verb == "signal":
            chan.write("out\n")
            chan.exit_with_signal("KILL")
        elif verb == "noexit":
            chan.write("partial\n")
            chan.write_eof()
            chan.close()
        elif verb == "closeonly":
            chan.write("partial\n")
            chan.close()
        elif verb == "drop":
            chan.write("partial\n")
            loop.call_later(0.1, conn.abort)
        elif verb == "status_then_break":
            chan.write("partial\n")
            # exit-status without EOF or close, then the transport dies (seed: "send the exit
            # status before the output stream is cut off").
            chan._send_request(b"exit-status", UInt32(0))
            loop.call_later(0.1, conn.abort)
        elif verb == "slowclose":
            # A complete result whose CHANNEL_CLOSE comes in a later packet than exit-status and
            # EOF: after those two, no libssh channel call reads packets on its own.
            chan.write("out\n")
            chan._send_request(b"exit-status", UInt32(0))
            chan.write_eof()
            loop.call_later(float(words[1]), chan.close)
        elif verb == "unnamedsig":
            chan.write("out\n")
            core = Boolean(words[1] == "1")
            chan._send_request(b"exit-signal", String(""), core, String(""), String(""))
            chan.write_eof()
            loop.call_later(float(words[2]), chan.close)
        elif verb == "status":
            chan.write("out\n")
            chan._send_request(b"exit-status", UInt32(int(words[1])))
            chan.write_eof()
            loop.call_later(float(words[2]), chan.close)
        elif verb == "reports":
            # Several exit reports, 0.1 s apart, then EOF and CHANNEL_CLOSE: ``s<n>`` an
            # exit-status n, ``k<NAME>`` an exit-signal NAME (RFC 4254 allows one report).
            chan.write("out\n")
            for i, word in enumerate(words[1:]):
                if word.startswith("s"):
                    req = (b"exit-status", UInt32(int(word[1:])))
                else:
                    req = (b"exit-signal", String(word[1:]), Boolean(False), String(""), String(""))
                loop.call_later(0.1 * i, chan._send_request, *req)
            loop.call_later(0.1 * len(words), chan.write_eof)
            loop.call_later(0.1 * len(words) + 0.05, chan.close)
        elif verb == "reports1seg":
            loop.call_later(0.1, self._reports_in_one_segment, words[1:])
        elif verb == "strayexit":
            # exit-status 0 addressed to a channel the client never opened, then EOF and close
            # on the session channel: no exit report for it.
            chan.write("partial\n")
            stray = UInt32(chan._send_chan + 1) + String(b"exit-status") + Boolean(False)
            conn.send_packet(MSG_CHANNEL_REQUEST, stray + UInt32(0))
            loop.call_later(0.1, chan.write_eof)
            loop.call_later(0.15, chan.close)
        elif verb == "lateout" and words[1:] == ["now"]:
            # The same packets with no delay, corked into one TCP segment: the client's libssh
            # takes "out", EOF and "late" off the socket in one read.
            sock = conn.get_extra_info("socket")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
            chan.write("out\n")
            chan.write_eof()
            conn.send_packet(MSG_CHANNEL_DATA, UInt32(chan._send_chan) + String(b"late\n"))
            chan._send_request(b"exit-status", UInt32(0))
            chan.close()
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
        elif verb == "lateout" and words[1:2] == ["split"]:
            # "out" and EOF in one TCP segment (the client's libssh takes both in one read);
            # "late" once the test cues "late" -- when its sink has "out" in hand, so the data
            # in front of the EOF is not yet read when the client's next pump can take the late
            # data in.  ``hold``: no stdin is ever read (with "smallwin" the window stays shut).
            if words[2:] == ["hold"]:
                loop.call_soon(chan.pause_reading)
            sock = conn.get_extra_info("socket")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
            chan.write("out\n")
            chan.write_eof()
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
            self._task = loop.create_task(self._late_on_cue())
        elif verb == "lateout":
            chan.write("out\n")
            chan.write_eof()
            late = UInt32(chan._send_chan) + String(b"late\n")
            loop.call_later(0.1, conn.send_packet, MSG_CHANNEL_DATA, late)
            loop.call_later(0.2, chan._send_request, b"exit-status", UInt32(0))
            loop.call_later(0.25, chan.close)
        elif verb == "exitdrop":
            # A complete result (exit-status, EOF, CHANNEL_CLOSE), then the TCP connection is
            # closed at once, without an SSH disconnect: the result's packets and the FIN arrive
            # together.
            chan.write("out\n")
            chan.exit(0)
            # asyncio flushes what was written, then shuts the sending side (FIN).  Not a full
            # close: with the client's bytes unread that would be a RST, which drops the unsent
            # result on the server's side -- the result must leave, only the connection end.
            conn._transport.write_eof()
        elif verb == "rekey":
            self._rekey(conn, words[1], words[2] == "first")
        elif verb == "stall":
            # asyncssh resumes reading right after this call: pause on the next turn, which runs
            # before the loop reads the stdin the client sends once the exec reply is in.  No
            # data is delivered, so no window adjust is sent.
            loop.call_soon(chan.pause_reading)
            loop.call_later(float(words[1]), chan.resume_reading)
        elif verb == "deaf":
            conn.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            loop.call_soon(conn._transport.pause_reading)
            loop.call_later(float(words[1]), conn.abort)
        elif verb == "deaflate":
            # As ``deaf``, while the client's write waits: "out" and EOF in one TCP segment,
            # "late" 0.1 s later, exit-status 0, close; reading resumes after 1 s.
            sock = conn.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            loop.call_soon(conn._transport.pause_reading)

            def out_eof() -> None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
                chan.write("out\n")
                chan.write_eof()
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)

            late = UInt32(chan._send_chan) + String(b"late\n")
            loop.call_later(0.3, out_eof)
            loop.call_later(0.4, conn.send_packet, MSG_CHANNEL_DATA, late)
            loop.call_later(0.45, chan._send_request, b"exit-status", UInt32(0))
            loop.call_later(0.5, chan.close)
            loop.call_later(1.0, conn._transport.resume_reading)
        elif verb == "rekeystall":
            loop.call_soon(chan.pause_reading)  # as ``stall``: the small window fills and stays
            loop.call_later(0.2, self._rekeystall, conn, float(words[1]))
        elif verb == "flood":
            self._task = loop.create_task(self._tick(int(words[1]), words[2]))
        elif verb == "echosig":
            # A remote that echoes the password it was given as an exit-signal name, then the
            # connection breaks: the name is remote-controlled text like any output.
            chan.write("out\n")
            chan._send_request(
                b"exit-signal", String(PASSWORD), Boolean(False), String(""), String("")
            )
            loop.call_later(0.1, conn.abort)
        # "hang": nothing, ever.

    def _rekey(self, conn: Any, key: str, first: bool) -> None:
        chan = self._chan
        if not first:
            chan.write("out\n")
            chan._send_request(b"exit-status", UInt32(0))
            chan.write_eof()
        _start_rekey(conn, self._srv.other_key if key == "other" else self._srv.host_key)
        if first:
            chan.write("out\n")
            chan._send_request(b"exit-status", UInt32(0))
            chan.write_eof()
            chan.close()
        else:
            asyncio.get_running_loop().call_later(0.3, chan.close)

    async def _late_on_cue(self) -> None:
        """``lateout split``: "late" on stdout once cued (at most 5 s), exit-status 0, close."""
        chan = self._chan
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._srv.cued("late"), 5)
        chan.get_extra_info("connection").send_packet(
            MSG_CHANNEL_DATA, UInt32(chan._send_chan) + String(b"late\n")
        )
        await asyncio.sleep(0.05)
        chan._send_request(b"exit-status", UInt32(0))
        await asyncio.sleep(0.05)
        chan.close()

    async def _tick(self, need: int, to: str) -> None:
        chan, n = self._chan, 0
        with contextlib.suppress(BrokenPipeError):  # the client gave up and closed the channel
            while self._stdin < need:
                if to in ("stdout", "each") or (to == "both" and n % 2 == 0):
                    chan.write("tick\n")
                if to in ("stderr", "each") or (to == "both" and n % 2 == 1):
                    chan.write_stderr("tick\n")
                n += 1
                await asyncio.sleep(0.0002)
            chan.write("done\n")
            chan.exit(0)

    def data_received(self, data: str, datatype: Any) -> None:
        self._stdin += len(data)

    def _rekeystall(self, conn: Any, drop_after: float) -> None:
        """Open the shut window and start a key re-exchange in one TCP segment, so the client
        takes both in one read: it then has window to write into and a session libssh holds
        blocked until the exchange ends.  The exchange never ends (nothing more is read); the
        connection is dropped ``drop_after`` seconds later."""
        sock = conn.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        self._chan.resume_reading()  # delivers the stdin held back: sends the window adjust
        _start_rekey(conn, self._srv.host_key)
        conn._transport.pause_reading()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
        asyncio.get_running_loop().call_later(drop_after, conn.abort)

    def eof_received(self) -> bool:
        if self._command.startswith("stall"):
            self._chan.write(f"{self._stdin}\n")
            self._chan.exit(0)
        return True  # keep the channel half-open: our behaviours decide when to close


class _Server(asyncssh.SSHServer):
    def __init__(self, srv: HostileServer) -> None:
        self._srv = srv
        self._user = ""
        self._conn: Any = None

    def connection_made(self, conn: Any) -> None:
        self._conn = conn
        self._srv.connections.append(conn)

    def begin_auth(self, username: str) -> bool:
        self._user = username
        return True

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: Any) -> bool:
        return username not in ("refuse", "pwuser")

    def password_auth_supported(self) -> bool:
        return True

    def validate_password(self, username: str, password: str) -> bool:
        return username == "pwuser" and password == PASSWORD

    def session_requested(self) -> Any:
        self._srv.sessions_opened += 1
        if self._user == "rekeyer":  # re-keys with ``other_key`` before the session opens
            _start_rekey(self._conn, self._srv.other_key)
        if self._user == "smallwin":
            return self._conn.create_server_channel(window=SMALL_WINDOW), _Session(self._srv)
        return _Session(self._srv)


class HostileServer:
    """Start with ``start()``; ``pin`` is the ed25519 host key as a known_hosts-style pin,
    ``pins`` every host key it offers (``extra_host_keys`` are further key types)."""

    def __init__(self, extra_host_keys: tuple[str, ...] = ()) -> None:
        self.exec_requests: list[str] = []
        self.sessions_opened = 0
        self.connections: list[Any] = []
        """Every connection accepted: ``stop`` aborts those still open (one whose reading a
        behaviour paused never sees the client's end)."""
        self.port = 0
        self._keys = [asyncssh.generate_private_key(t) for t in ("ssh-ed25519", *extra_host_keys)]
        self._key = self._keys[0]
        self.pins = [
            " ".join(k.export_public_key("openssh").decode().split()[:2]) for k in self._keys
        ]
        """One pin per host key, the ed25519 key first, then ``extra_host_keys`` in order."""
        self.pin = self.pins[0]
        self.host_key = self._key
        self.other_key = asyncssh.generate_private_key("ssh-ed25519")
        """A host key never pinned: the ``rekey other`` behaviour signs with it."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: Any = None
        self._cues: dict[str, asyncio.Event] = {}

    def start(self) -> HostileServer:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        fut.result(timeout=10)
        return self

    async def _listen(self) -> None:
        self._server = await asyncssh.create_server(
            lambda: _Server(self),
            "127.0.0.1",
            0,
            server_host_keys=self._keys,
            login_timeout=30,
        )
        self.port = self._server.sockets[0].getsockname()[1]

    def cue(self, name: str) -> None:
        """From any thread: let the behaviour waiting for ``name`` go on."""
        self._loop.call_soon_threadsafe(lambda: self._cues.setdefault(name, asyncio.Event()).set())

    async def cued(self, name: str) -> None:
        """On the server's loop: wait until ``name`` is cued, and consume the cue."""
        await self._cues.setdefault(name, asyncio.Event()).wait()
        del self._cues[name]

    def stop(self) -> None:
        async def _close() -> None:
            self._server.close()
            await self._server.wait_closed()
            for conn in self.connections:
                conn.abort()
            await asyncio.sleep(0)  # let the aborted transports close

        asyncio.run_coroutine_threadsafe(_close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
