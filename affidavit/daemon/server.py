"""``affidavit serve``: the broker as its own process, on a Unix socket -- its journal's only
writer, or, on a shared PostgreSQL journal, one of several daemons writing it.

Life of the daemon:

1. Refuse to start if the socket's directory is writable by another user (unless sticky) or
   owned by one, if another daemon holds the socket path (``<socket>.lock``, locked before the
   path is touched and held until the daemon's socket is gone: of two daemons starting on one
   path, one is refused, and never removes the other's socket), if a live daemon answers on it
   (a stale socket file left by a killed one is removed), or if another process writes a
   SQLite journal: it is opened as its only writer (``owner=``; an exclusive lock embedded
   writers respect).  A shared journal takes no such lock: several daemons write it by design,
   one chain ordered by the database.
2. Start-up recovery: every record left non-final is closed with what its durable events prove
   -- dispatched without a result is unknown, never not_attempted (``Broker.recover``).  On a
   SQLite journal the exclusive lock proves their holders are gone, so their leases need not be
   waited out; on a shared (PostgreSQL) journal other daemons may be running them, so only those
   whose lease expired are closed -- the rest as their leases run out (``[service]
   lease_margin``), by whichever daemon meets them.  An approval still waiting for a decision or
   a dispatcher stays open (an expired one is closed APPROVAL_EXPIRED); the dispatcher sends the
   approved ones (``dispatcher.py``).
3. Listen: the socket is created mode 0660 (umask around ``bind``; never a ``chmod``).  Each
   accepted connection's peer is read from the kernel (SO_PEERCRED) and checked against
   ``[service] allow_uids`` / ``allow_gids`` before a byte of it is parsed.  HTTP/1.1 on the
   socket is the daemon's own small h11 driver (``h11server.py``, which says why: hypercorn's
   ASGI machinery cost as much CPU per request as the broker's work).
   With ``--console HOST:PORT`` (or ``[service] console``) the operator console
   (``affidavit.console``, docs/console.md) is served on that TCP address too -- loopback unless
   ``console_allow_remote``, and then only through TLS -- by hypercorn, per connection
   (``TCPServer``), HTTP/1.1 only (``_H11Only``: never h2c): the console is a full ASGI
   app; its users are operators logged in with a one-time token, never socket peers.
   Its port is open to every local uid, so its connections are capped too (``ConsoleCap``,
   admission.py), and one that has not sent a whole request head within ``CONSOLE_HEAD_WAIT``
   of opening (or of its last answer) is closed: a flood of them can neither take the
   descriptors the journal and the socket need nor keep places for long.
4. SIGTERM or SIGINT (under ``affidavit serve`` taken by a thread of the daemon's own,
   ``affidavit.stopping.signals``, whatever the event loop is doing; run inside another program,
   by trio's receiver on the loop; during the start-up, they end it: the journal closed, exit
   0): stop accepting (the socket file goes; ``<socket>.lock`` says "stopping" and the latest
   the process ends, or "unbounded", so a daemon started on the path meanwhile is told so),
   answer 503 to new calls on open connections, let calls in flight finish within ``[service]
   shutdown_grace``, then stop the rest (``calls.py``), close idle connections, let the answers
   go out, close the journal. The whole stop is bounded (``affidavit.stopping.bound``), from the
   signal's arrival -- or, for a stop no signal started (a failure, a cancellation), from when
   the journal's close begins: a journal write or read that never returns -- a disk that stopped
   answering, a database that holds its connection and never answers -- ends the process past
   ``stop_bound`` with one log line naming what was pending, exit 74.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import resource
import signal
import socket
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import h11
import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Closed, Updated
from hypercorn.events import Event as HypercornEvent
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState

from affidavit.api.broker import Broker
from affidavit.approvals import Operator, OperatorPolicy
from affidavit.config import Config, console_origin, is_loopback, served_through_tls
from affidavit.console import Console, TokenStore, token_dir
from affidavit.console.request import OWNER
from affidavit.engine import EngineSettings
from affidavit.journal import Exposure, Journal, JournalError
from affidavit.journal.backend import where as journal_where
from affidavit.journal.compact import NOT_A_DIRECTORY, not_a_directory, refusal_message
from affidavit.journal.exposure import serving
from affidavit.stopping.bound import (
    ANSWER_WAIT,
    EXIT_STOP_UNFINISHED,
    StopBound,
    journal_pending,
    stop_bound,
)
from affidavit.stopping.signals import NOT_MAIN_THREAD, StopSignals, off_the_main_thread
from affidavit.text import named

from .admission import ConsoleCap, Server
from .app import Api
from .calls import Calls
from .dispatcher import dispatch_approvals
from .http import body_limit
from .link import Link
from .peer import Peer, PeerPolicy, peer_credentials_supported, peer_of
from .socketfile import (
    BACKLOG,
    DaemonError,
    bind_socket,
    claim_socket_path,
    note_state,
    unlink_if_ours,
    warn_if_no_group_reaches,
)

__all__ = ["Daemon", "DaemonError", "serve"]

log = logging.getLogger("affidavit.daemon")

KEEP_ALIVE = 300.0
"""Idle keep-alive connections live this long: a client pool reuses them across calls."""
CONSOLE_HEAD_WAIT = 10.0
"""A console connection that has not sent a whole request head this long after it opened (or
after its last answer) is closed: hypercorn's ``keep_alive_timeout``, which runs exactly then
(from the connection's start, and from each answer until the next request's head is parsed)."""
CONSOLE_MAX_HEAD = 16 * 1024
"""Bytes of a console request head at most (hypercorn's ``h11_max_incomplete_size``: 431)."""
MAX_OPEN_FILES = 65536
"""The soft limit on open files ``serve`` raises to (the hard one if lower): the caps keep the
daemon's own use far below it, but calls in flight hold their remotes' connections too."""


async def _prune_view_readers(broker: Broker) -> None:
    """Upkeep for the daemon's life: the view readers idle longer than their bound closed
    (``ViewReaders.prune``) even when no view comes to prune them -- a quiet daemon holds no
    database session, and no descriptor of a journal file replaced or removed meanwhile.
    Closed in a thread: a database's goodbye is not the event loop's to wait for."""
    readers = broker.view_readers
    while True:
        await trio.sleep(readers.idle_for / 2)
        await trio.to_thread.run_sync(readers.prune)


async def _reclaim_chunks(broker: Broker) -> None:
    """Start-up upkeep, once the records a stopped broker left open are closed: drop the stored
    result chunks no committed result names, of closed records (``journal/reclaim.py``: side
    storage outside the chain; an interrupted attempt's chunks prove nothing).  Run in the
    background once the socket is bound (``Daemon._serve``): its read of the chunk tables grows
    with them, and the daemon serves meanwhile; a shutdown cancels it.  Upkeep only: a journal
    that refuses it -- or any other failure -- is logged, and the daemon serves all the same:
    its calls meet that journal as they would have.

    Then, on SQLite, the segment bytes of results that never committed are given back
    (``journal/compact.py``): the daemon is the journal's only writer, and its own segments --
    results in flight -- are locked, so left alone.  Cancelled by a shutdown, the compaction's
    thread is abandoned: every step of it is crash-safe, the next start finishes it."""
    try:
        done = await broker.journal.reclaim(segments=True)
    except JournalError as exc:
        log.warning("start-up reclamation of uncommitted result chunks not done: %s", exc)
        return
    except Exception as exc:  # upkeep never stops the daemon; the type, never a message
        log.error(
            "start-up reclamation of uncommitted result chunks failed: %s", type(exc).__name__
        )
        return
    dropped = done.dropped
    if done.compacted is not None and done.compacted.refused is not None:
        log.warning("%s", refusal_message(broker.journal.where, done.compacted.refused))
    elif done.compacted is not None and done.compacted.bytes:
        c = done.compacted
        log.info(
            "start-up returned %d bytes of result segment files no committed result names "
            "(%d file(s) looked at, %d removed whole)",
            c.bytes,
            c.segments,
            c.removed,
        )
    if dropped:
        # A caller leaves such records by the thousand (every call it cancels mid-body): the
        # first few are named, never one log line of every id.
        log.info(
            "start-up reclaimed the uncommitted result chunks of %d closed record(s): %s",
            len(dropped),
            named(dropped),
        )


def _refuse_unusable_segments(broker: Broker) -> None:
    """No start on a SQLite journal whose ``<path>.results`` is there but is not a directory
    (``SEGMENT_DIR_UNUSABLE``, as the start-up reclaim names it): every call with a long
    result would be sent, then end ``RESULT_STORE_FAILED`` -- refused now, before recovery
    writes anything and before the socket is bound, rather than call by call later."""
    if not_a_directory(broker.journal.backend.segments):
        where, results = broker.journal.where, broker.journal.backend.segments
        raise DaemonError(
            f"journal {where}: {results} is not a directory ({NOT_A_DIRECTORY}): a "
            "broker keeps a long result's bytes in segment files there, so every call with "
            "one would be sent and its result not stored; move what is at that path away, "
            "then start the daemon again",
            NOT_A_DIRECTORY,
        )


class _OperatorUids:
    """Whether a local uid is an operator (``OperatorPolicy.admits_uid``) or the declared
    console proxy's (through which operators come), remembered per uid: the console asks once
    per connection, and a user database behind the network (LDAP) must not be asked at the
    rate a local user can open connections.  Bounded: a uid asked past ``LIMIT`` different
    ones starts the memory afresh."""

    LIMIT = 4096

    def __init__(self, policy: OperatorPolicy, proxy_uid: int | None = None) -> None:
        self._policy = policy
        self._proxy_uid = proxy_uid
        self._known: dict[int, bool] = {}

    def peer(self, peer: Peer) -> bool:
        """Whether a socket peer is an operator by the kernel's credentials -- its uid, gid and
        supplementary groups (SO_PEERCRED, SO_PEERGROUPS), as ``is_operator`` decides its
        commands on the socket -- so the user database is not asked at all.  (The console's
        proxy is not one here: operators come through it to the console, not to the socket.)"""
        return self._policy.is_operator(Operator(peer.uid, peer.gid, peer.groups, via="socket"))

    def __call__(self, uid: int) -> bool:
        if uid == self._proxy_uid:
            return True
        known = self._known.get(uid)
        if known is None:
            if len(self._known) >= self.LIMIT:
                self._known.clear()
            known = self._known[uid] = self._policy.admits_uid(uid)
        return known


class Daemon:
    def __init__(
        self,
        config: Config,
        *,
        socket_path: str | os.PathLike[str] | None = None,
        console: tuple[str, int] | None = None,
        exposed: Sequence[Exposure] | None = None,
    ):
        self.config = config
        self.exposed = exposed
        """The files ``affidavit serve`` found exposed before it started this (``Broker.open``
        logs them); None: the broker looks."""
        self.socket_path = Path(socket_path) if socket_path else config.service.socket
        self.console_address = console or config.service.console
        """Where the operator console listens (already checked: ``console_address``)."""
        service = config.service
        uids = service.allow_uids if service.allow_uids is not None else (os.getuid(),)
        # Operators reach the socket too: their commands go through it (docs/approvals.md).
        self.policy = PeerPolicy(
            frozenset(uids) | frozenset(service.operator_uids),
            frozenset(service.allow_gids) | frozenset(service.operator_gids),
        )
        self.shutdown = trio.Event()
        """Set to stop the daemon (SIGTERM and SIGINT set it)."""
        self.console: Console | None = None
        """The console's one application (its sessions live in it), while it is served."""
        self.console_cap: ConsoleCap | None = None
        """The console listener's connections, while it is served."""
        self._lock = -1
        """``<socket>.lock``'s descriptor while the daemon holds it (``claim_socket_path``)."""
        self.exit_when_stop_unfinished: int | None = None
        """The exit status the process ends with when the stop outlives ``stop_bound``
        (``serve``: ``EXIT_STOP_UNFINISHED``); None, run inside another program: logged only.
        The watchdog's status only: the signals stay trio's (``_process_ours``)."""
        self._process_ours = False
        """The process is the daemon's (``serve``'s choice, never a host's): SIGTERM and SIGINT
        are taken by its own thread (``StopSignals``), and once it stopped they end the process
        (``exit_after``) -- a host's handlers are not put back."""
        self._stop_bound: StopBound | None = None
        """The stop's watchdog, armed at the stop's start, disarmed once the journal is closed."""
        self._journal: Journal | None = None
        self._calls: Calls | None = None
        """What the watchdog's log line names, once there (``_pending``)."""
        self._serving = False
        """The socket answers: a signal stops the daemon (before: it ends the start-up)."""
        self._startup = trio.CancelScope()
        """The start-up and the serving, cancelled by a signal that comes before the serving."""
        self._over = False
        """The journal is closed (or the path's claim refused): a signal's stop that reaches the
        loop now has nothing to stop."""
        self._noting = threading.Lock()
        """Held to write ``<socket>.lock``'s stopping state or to close it: the signals' thread
        writes it too (``_note_stopping``), never to a descriptor closed under it."""
        self._noted_unbounded = False
        """``<socket>.lock`` says "stopping unbounded": a later arming that succeeds says its
        end instead."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        refused = off_the_main_thread("the daemon")
        if refused is not None:
            raise DaemonError(refused, NOT_MAIN_THREAD)
        if not peer_credentials_supported():
            raise DaemonError("this platform has no SO_PEERCRED: peers could not be identified")
        if (
            self.console_address is not None
            and self.config.service.console_proxy_user is not None
            and not is_loopback(self.console_address[0])
        ):
            raise DaemonError(
                f"[service] console_proxy_user applies to a loopback console only, not "
                f"{self.console_address[0]}: a peer on another machine cannot be identified"
            )
        if self.console_address is not None:  # (``serve(console=...)``: not the config's)
            try:
                served_through_tls(
                    self.console_address[0], self.config.service.console_public_origin
                )
            except ValueError as exc:
                raise DaemonError(f"console: {exc}") from None
        self._stop_bound = StopBound(self._pending, self.exit_when_stop_unfinished)
        try:
            await self._signals_taken(task_status)
        finally:
            # A signal may have armed the bound from the moment it exists -- before the path
            # was claimed, before the journal opened: however the daemon ended, nothing is
            # left to bound.
            try:
                self._stop_bound.disarm()
            finally:
                with self._noting:
                    if self._lock != -1:
                        os.close(self._lock)  # only now may another daemon take the path
                        self._lock = -1
        log.info("stopped")

    async def _signals_taken(self, task_status: trio.TaskStatus[None]) -> None:
        """The daemon's life with SIGTERM and SIGINT its stop's."""
        if self._process_ours:  # (``serve``)
            token = trio.lowlevel.current_trio_token()
            # Once stopped, the process only ends: a signal then ends it at once, exit 0 with
            # the journal closed -- out of a last log line's write that blocks, too.
            with StopSignals(functools.partial(self._signalled, token), exit_after=True):
                await self._claimed(task_status)
        else:  # run inside another program: trio's receiver, a task (``stopping.signals``)
            try:
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._watch_signals, signals)
                        await self._claimed(task_status)
                        nursery.cancel_scope.cancel()
            except BaseExceptionGroup as group:  # (the watcher raises nothing: the daemon's)
                if len(group.exceptions) == 1:
                    raise group.exceptions[0] from None
                raise

    async def _claimed(self, task_status: trio.TaskStatus[None]) -> None:
        """The daemon's life on its socket's path, the path's lock held throughout (let go by
        ``run``, once the bound is disarmed)."""
        try:
            self._lock = claim_socket_path(self.socket_path)
            # (``serving``: its files' warnings: root here is the broker, journal.exposure)
            with self._startup, serving():
                await self._run(task_status)
        finally:
            # The journal is closed, or was never opened (the claim refused): set before the
            # signals are let go, so a stop they asked for meanwhile finds nothing to stop.
            self._over = True

    async def _watch_signals(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            self._stop(signum)

    def _signalled(self, token: trio.lowlevel.TrioToken, signum: int) -> None:
        """SIGTERM or SIGINT, on the thread that took it (``stopping.signals``), whatever the loop
        is doing: the stop's bound starts now, then the loop is asked to stop -- it may never
        get to it (held in a read of a journal that stopped answering): the bound ends it."""
        try:
            self._arm_stop_bound()  # (may fail: no thread left to start)
        finally:  # the stop is asked for all the same
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._stop, signum)

    def _stop(self, signum: int) -> None:
        """On the loop: a signal's stop -- the serving's (``shutdown``), or the start-up's.
        Nothing once the journal is closed (a signal the thread took as the daemon stopped
        reaches the loop after "stopped")."""
        if self._over:
            return
        log.info("received %s", signal.Signals(signum).name)
        self.shutdown.set()
        if not self._serving:  # start-up recovery and the rest: cancelled, the journal closed
            self._startup.cancel()

    async def _run(self, task_status: trio.TaskStatus[None]) -> None:
        owner = f"affidavit serve (pid {os.getpid()}) on {self.socket_path}"
        # Every route names its socket peer: one that did not would be refused, never taken
        # as the daemon's own uid (``EngineSettings.peer_askers``).
        settings = EngineSettings(lease_margin=self.config.service.lease_margin, peer_askers=True)
        async with Broker.open(
            config=self.config, owner=owner, settings=settings, exposed=self.exposed
        ) as broker:
            self._journal = broker.journal
            try:
                await self._broker_run(broker, task_status)
            except BaseException:
                # A stop no signal started (a failure, a cancellation): closing the journal,
                # next, is bounded all the same.
                self._arm_on_the_loop()
                raise

    async def _broker_run(self, broker: Broker, task_status: trio.TaskStatus[None]) -> None:
        _refuse_unusable_segments(broker)
        recovered = await broker.recover()
        if recovered:  # (as many as the reclaim's: the first few named)
            log.warning(
                "start-up recovery closed %d record(s) a stopped broker left open: %s",
                len(recovered),
                named([f"{r.invocation_id} {r.outcome.value}" for r in recovered]),
            )
        calls = self._calls = Calls(self.config.service.max_calls)
        api = Api(broker, self.policy, calls)
        console = None
        if self.console_address is not None:
            console = _bind_tcp(*self.console_address)
            port = console.socket.getsockname()[1]
            bound = console_origin(self.console_address[0], port)
            public = self.config.service.console_public_origin
            api.console_url = public or bound  # where login links lead
            api.tokens = TokenStore(token_dir(self.config.journal.path))
            proxy = self.config.service.console_proxy_user
            read, read_summarized = api.console_reads()
            self.console = Console(
                broker,
                read,
                api.tokens,
                origin=bound,
                public_origin=public,
                proxy_uid=proxy,
                summary=api.summary,
                read_summarized=read_summarized,
                slot=calls.console,
            )
            log.info("operator console on %s", api.console_url)
            if public is not None and proxy is None and is_loopback(self.console_address[0]):
                log.warning(
                    "operator console: direct connections to %s are not owner-checked "
                    "(console_public_origin is set, so the cookie is the only proof): any "
                    "local user holding an operator's cookie or login link can act as "
                    "that operator; set [service] console_proxy_user to the proxy's user",
                    bound,
                )
        listener, inode = bind_socket(self.socket_path)
        note_state(self._lock, "serving")
        log.info(
            "listening on %s (allow uids %s, gids %s); journal %s",
            self.socket_path,
            sorted(self.policy.uids),
            sorted(self.policy.gids),
            journal_where(self.config.journal.location),
        )
        warn_if_no_group_reaches(self.socket_path, inode, self.policy.gids)
        try:
            await self._serve(api, calls, listener, inode, console, task_status)
        finally:
            listener.socket.close()
            if console is not None:
                console.socket.close()
            unlink_if_ours(self.socket_path, inode)

    async def _serve(
        self,
        api: Api,
        calls: Calls,
        listener: trio.SocketListener,
        inode: int,
        console: trio.SocketListener | None,
        task_status: trio.TaskStatus[None],
    ) -> None:
        operators = OperatorPolicy.of(self.config.service)
        # Without operators nobody can log in or decide: no places to keep for them.
        keep = operators.uids or operators.gids
        proxy = self.config.service.console_proxy_user
        reserved = _OperatorUids(operators, proxy) if keep else None
        # The socket's peers are known by the kernel's credentials, groups included.
        # A body may be as large as an embedded `affidavit call` reads for these targets.
        server = Server(
            keep_alive=KEEP_ALIVE,
            reserved=reserved.peer if reserved else None,
            max_body=body_limit(self.config.targets.values()),
        )
        cap = ConsoleCap(reserved=reserved)
        self.console_cap = cap if console is not None else None
        hconfig = console_http_config()
        context = WorkerContext(None)

        async def connection(stream: trio.SocketStream) -> None:
            try:
                peer = peer_of(stream.socket)
            except OSError:
                log.warning("closed a connection that has no peer credentials")
                await stream.aclose()
                return
            refusal = api.refusal(peer)
            if refusal is not None:  # at once: no head read, no place held
                await server.refuse(Link(stream), peer, refusal)
                return
            await server.serve(Link(stream), peer, api.handle)

        async def console_connection(stream: trio.SocketStream) -> None:
            assert self.console is not None
            await serve_admitted_console(self.console, cap, hconfig, context, stream)

        async with trio.open_nursery() as outer:
            await outer.start(calls.run)
            await outer.start(dispatch_approvals, api.broker, calls)
            async with trio.open_nursery() as connections:
                accepting = trio.CancelScope()
                accepting_console = trio.CancelScope()
                connections.start_soon(_accept, listener, connection, connections, accepting)
                if console is not None:
                    connections.start_soon(
                        _accept, console, console_connection, connections, accepting_console
                    )
                # Upkeep once the socket answers, never before (a shutdown cancels it).
                outer.start_soon(_reclaim_chunks, api.broker)
                outer.start_soon(_prune_view_readers, api.broker)
                if self.console is not None:
                    outer.start_soon(self.console.keep_refusal_log)
                self._serving = True
                task_status.started()
                await self.shutdown.wait()
                self._arm_on_the_loop()
                # Stop accepting: no new connection, and the socket file goes at once (a
                # client sees "no daemon", not a hang), before the grace starts.
                accepting.cancel()
                accepting_console.cancel()
                await listener.aclose()
                if console is not None:
                    await console.aclose()
                unlink_if_ours(self.socket_path, inode)
                # A daemon started on the path now is told the truth: this one stops.
                self._note_stopping()
                await self._drain(calls, server, context, connections)
            outer.cancel_scope.cancel()

    def _arm_stop_bound(self) -> None:
        """From here the stop has ``stop_bound`` seconds, whatever the journal does (the first
        call counts; any thread)."""
        assert self._stop_bound is not None
        self._stop_bound.arm(self._bound())
        self._note_stopping(again=True)

    def _arm_on_the_loop(self) -> None:
        """The bound armed by the stop itself: one that cannot be is logged, and the stop goes
        on unbounded (``StopBound.arm_on_the_loop``)."""
        assert self._stop_bound is not None
        self._stop_bound.arm_on_the_loop(self._bound())
        self._note_stopping(again=True)

    def _note_stopping(self, *, again: bool = False) -> None:
        """``<socket>.lock`` says the daemon stops, and the latest it ends: its bound's end, or
        "unbounded" (the watchdog could not be started) -- and, ``again``, after an arming,
        written anew only if it said "unbounded": a later arming that succeeded (a signal's,
        once a thread could be started) gives the stop an end, which the file then names."""
        assert self._stop_bound is not None
        with self._noting:
            if self._lock == -1 or (again and not self._noted_unbounded):
                return
            deadline = self._stop_bound.deadline
            note_state(self._lock, "stopping", deadline)
            self._noted_unbounded = deadline is None

    def _bound(self) -> float:
        shared = self.config.journal.url is not None
        return stop_bound(
            self.config.service.shutdown_grace,
            ANSWER_WAIT,
            self.config.journal.reconnect if shared else None,
        )

    def _pending(self) -> str:
        """The watchdog's account of what the stop still waited for (its thread)."""
        journal, calls = self._journal, self._calls
        running = (
            [c.control.invocation_id or "none accepted" for c in list(calls.running)]
            if calls
            else []
        )
        return journal_pending(journal, running)

    async def _drain(
        self, calls: Calls, server: Server, context: WorkerContext, connections: trio.Nursery
    ) -> None:
        grace = self.config.service.shutdown_grace
        log.info("shutting down: %d call(s) in flight, grace %gs", len(calls.running), grace)
        stopped = await calls.drain(grace, server.give_up_waits)
        if stopped:
            log.warning("the grace ran out: %d call(s) stopped (BROKER_SHUTDOWN)", stopped)
        # Idle keep-alive connections close now; busy ones once their answer is written.
        server.close()
        await context.terminated.set()
        connections.cancel_scope.deadline = trio.current_time() + ANSWER_WAIT


def console_http_config() -> HypercornConfig:
    """hypercorn's settings for the console's connections (``CONSOLE_HEAD_WAIT``,
    ``CONSOLE_MAX_HEAD``, read when called: a test may change them)."""
    hconfig = HypercornConfig()
    hconfig.keep_alive_timeout = CONSOLE_HEAD_WAIT
    hconfig.h11_max_incomplete_size = CONSOLE_MAX_HEAD
    hconfig.accesslog = None
    hconfig.errorlog = logging.getLogger("affidavit.daemon.http")
    return hconfig


async def serve_admitted_console(
    console: Console,
    cap: ConsoleCap,
    hconfig: HypercornConfig,
    context: WorkerContext,
    stream: trio.SocketStream,
) -> None:
    """One console connection as the daemon admits it: a place under ``cap``, whose owner
    lookup (once, at admission: ``ConsoleCap.serve``) every request of it is checked against
    (``serve_console_stream``'s ``owner``)."""

    async def admitted(s: trio.SocketStream, uid: int | None) -> None:
        await serve_console_stream(console, hconfig, context, s, owner=(uid,))

    await cap.serve(stream, admitted)


async def serve_console_stream(
    console: Console,
    hconfig: HypercornConfig,
    context: WorkerContext,
    stream: trio.abc.Stream,
    *,
    owner: tuple[int | None] | None = None,
) -> None:
    """One console connection, served until it ends (``_ConsoleServer``): the daemon's way,
    which the console's tests serve it by too.  ``owner``: the uid owning the client's end,
    looked up at admission (None in it: nobody identified), given to each request in its ASGI
    scope (``request.OWNER``); without it a request asks the kernel itself."""
    app = ASGIWrapper(console if owner is None else _Owned(console, owner))  # type: ignore[arg-type]
    await _ConsoleServer(app, hconfig, context, ConnectionState({}), stream).run()  # type: ignore[arg-type]


class _Owned:
    """``console`` with the connection's owner in each request's scope (``request.OWNER``)."""

    def __init__(self, console: Console, owner: tuple[int | None]) -> None:
        self.console, self.owner = console, owner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self.console({**scope, OWNER: self.owner}, receive, send)


class _H2Refused(Exception):
    """A console request asked for HTTP/2 (``_H11Only``): answered 400, the connection ends."""


class _H11Only(H11Protocol):
    """hypercorn's HTTP/1.1, never switching to HTTP/2 in clear (h2c).

    hypercorn (0.18) has no setting for it: a request ``PRI * HTTP/2.0`` (the prior-knowledge
    preface, RFC 9113 §3.3) or one with ``Upgrade: h2c`` (RFC 7540 §3.2) turns the connection
    into HTTP/2, where ``h11_max_incomplete_size`` (``CONSOLE_MAX_HEAD``) bounds no header
    block and one connection -- ``ConsoleCap``'s unit -- carries many requests at once.  No
    browser speaks h2c: either is answered 400 (``connection: close``) and the connection ends,
    before the application sees it."""

    async def _check_protocol(self, event: h11.Request) -> None:
        upgrade = [v for n, v in event.headers if n.lower() == b"upgrade"]
        if event.http_version == b"2.0" or any(b"h2c" in v.lower() for v in upgrade):
            await self._send_error_response(400)
            raise _H2Refused


class _ConsoleServer(TCPServer):
    """hypercorn's connection, except that it speaks HTTP/1.1 only (``_H11Only``), and that
    one its client has closed is let go at once.

    hypercorn (0.18, pinned) keeps an idle connection whose client sent its end -- its
    descriptor, and its place under ``ConsoleCap`` -- until ``keep_alive_timeout`` runs out:
    its idle timer still runs, and its task group waits for it.  Once the reading is over
    (the end, or a broken connection) nothing more can come, so the timer stops and is not
    started again; a request in progress is let finish as hypercorn would (it is told of the
    disconnect)."""

    _ended = False

    async def _read_data(self) -> None:
        # (``run`` made the connection's HTTP/1.1 protocol, not yet fed a byte: replaced.)
        w = self.protocol
        if type(w.protocol) is not H11Protocol:
            # HTTP/2 chosen in a TLS handshake (ALPN h2): its SETTINGS are sent already, and an
            # HTTP/1.1 answer now would be garbage to the client.  The console is served over
            # plain TCP (TLS is its proxy's): a stream with TLS is the daemon's own mistake.
            log.error(
                "console: a connection speaks %s, not HTTP/1.1: closed (serve the console over "
                "plain TCP; TLS belongs to its proxy)",
                type(w.protocol).__name__,
            )
            await self.protocol_send(Closed())  # the stream, and the protocol's own tasks
        else:
            w.protocol = _H11Only(
                w.app, w.config, w.context, w.task_group, w.state, w.ssl, w.client, w.server, w.send
            )
            with contextlib.suppress(_H2Refused):  # (answered; ``run`` closes the connection)
                await super()._read_data()
        self._ended = True
        await self.idle_task.stop()

    async def protocol_send(self, event: HypercornEvent) -> None:
        if self._ended and isinstance(event, Updated) and event.idle:
            return  # no next request can come: no idle wait for it
        await super().protocol_send(event)


async def _accept(
    listener: trio.SocketListener,
    handler: object,
    nursery: trio.Nursery,
    scope: trio.CancelScope,
) -> None:
    with scope:
        await trio.serve_listeners(handler, [listener], handler_nursery=nursery)  # type: ignore[arg-type]


def _bind_tcp(host: str, port: int) -> trio.SocketListener:
    """The console's listening TCP socket (the address was checked by ``console_address``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise DaemonError(
            f"cannot serve the console on {host}:{port}: {exc.strerror or exc}"
        ) from None
    return trio.SocketListener(trio.socket.from_stdlib_socket(sock))


async def serve(
    config: Config,
    *,
    socket_path: str | os.PathLike[str] | None = None,
    console: tuple[str, int] | None = None,
    exposed: Sequence[Exposure] | None = None,
    _cli: bool = False,
) -> None:
    """Run the daemon until SIGTERM or SIGINT; ``console`` overrides ``[service] console``;
    ``exposed``: the files found exposed at the start (``Daemon``).

    Called by a program of its own, the daemon runs inside it (``Daemon.run``): SIGTERM and
    SIGINT are trio's receiver's while it runs and the handlers found are put back when it
    returns; a stop past its bound is logged, not an exit.  Only ``affidavit serve`` (``_cli``:
    private) makes the process the daemon's: its own signals' thread, exit 74 past the bound,
    and a signal once it stopped ending the process, 0 (``affidavit.stopping.signals``) -- in
    a caller's program that would end the caller.  Called off the main thread (no signal could
    reach its stop) it is refused: ``DaemonError``, ``NOT_MAIN_THREAD`` -- before anything,
    the process's open-files limit included."""
    refused = off_the_main_thread("the daemon")
    if refused is not None:
        raise DaemonError(refused, NOT_MAIN_THREAD)
    _raise_open_files()
    daemon = Daemon(config, socket_path=socket_path, console=console, exposed=exposed)
    if _cli:
        daemon.exit_when_stop_unfinished = EXIT_STOP_UNFINISHED
        daemon._process_ours = True
    await daemon.run()


def _raise_open_files() -> None:
    """The soft RLIMIT_NOFILE up to the hard one (at most ``MAX_OPEN_FILES``), as servers do:
    the usual soft 1024 is a default, not this daemon's need.  Never fails the start."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = MAX_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, MAX_OPEN_FILES)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            log.info("open files: soft limit raised from %d to %d (hard %s)", soft, want, hard)
    except (OSError, ValueError) as exc:
        log.info("open files: the soft limit stays as it is (%s)", exc)
