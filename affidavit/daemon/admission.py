"""Which connections of a listener are served: the daemon's connection cap.

The HTTP/1.1 of each connection is ``h11server.py``'s; a ``Server`` holds one listener's
connections -- those waiting between requests, so that shutdown closes them at once (busy ones
close after their answer) -- and keeps their number bounded:

* more than ``MAX_CONNECTIONS`` open at once (a client opening thousands, to exhaust the
  daemon's file descriptors): a new one takes the place of the connection idle the longest --
  waiting for its next request, or its first, with no byte of it read or in the socket --
  which is closed there, never with part of an answer, so silent connections cannot shut
  others out (operators included).  One with a request in progress is never closed to make
  room: its head or body being read, a route or a call running (whose hang-up would withdraw
  it: link.py), its answer being written -- each bounded by one of ``h11server.py``'s limits,
  or by the call;
* only when every one is busy is the new one answered 503 ``TOO_MANY_CONNECTIONS`` with
  ``Connection: close`` before a byte of it is read, then closed -- within ``TURN_AWAY_WAIT``,
  and never counted among the open ones (nor answered at all past as many again);
* no one uid holds more than ``max_per_uid`` of them (half the cap by default): past its
  share, a uid's new connection takes the place of that uid's own longest-idle one, or is
  answered 503 the same way -- so an agent's uid, even holding every connection it may busy
  (half a head each, reconnecting as soon as one closes), leaves the other half to the rest,
  the operators approving its requests among them (peer uids are the kernel's, peer.py);
* and the peers who are not operators hold no more than ``max_others`` of them *together*
  (half the cap; ``reserved`` tells an operator's peer, by the kernel's uid, gid and groups --
  the daemon's ``_OperatorUids.peer``, as the operator routes decide; None, with no operators
  configured: no reserve): two or three agents' uids each within its share would otherwise
  fill the socket together, busy, and shut the operators out while the approvals they wait
  for expire.  Past it, a new connection of theirs takes the place of their longest-idle one
  (anyone's of theirs: the share is joint), or is answered 503 the same way; an operator's
  at the cap takes the place of an idle one of theirs before an operator's idle longer.  The
  rules above stand: only an idle connection with nothing unread is ever closed;
* and, with such a reserve, no one uid that is not an operator holds more than
  ``max_per_other`` (a quarter of ``max_others``: 32 of 128 by default) -- one agent's uid at
  ``max_per_uid`` held the whole joint share, busy (half a head each, reopened every
  ``HEAD_WAIT``), and every other agent's connection was 503 while the operators were still
  served (audit 48).  Now it takes three more uids to fill the agents' share; a quarter, not
  an even split among the uids connected, because a split would have to close the busy
  connections of the uid holding most when another arrives, and a busy one is never closed.
  Past it, the uid's new connection takes the place of its own longest-idle one, or is 503;
* a peer the daemon's policy refuses (not in ``allow_uids`` / ``allow_gids``) is never served:
  its credentials are known at accept, so ``refuse`` answers its 403 there, before a byte is
  read, bounded and limited as a 503 is, and never counted among the open ones -- so refused
  peers hold no place while they dribble a head.  Their log is one warning per spell of
  refusals and then the spell's count (``_RefusedPeers``: a spell ends once ``REFUSED_QUIET``
  passes without one);
* each spell at a limit logs once, until half the places are free again -- half of those
  of the peers not reserved, for theirs (evictions at info, refusals as a warning).  One
  evicted before its first request is sent the same 503 before it closes (a request
  crossing the eviction reads that it was not run); one evicted between
  requests just closes, as when ``keep_alive`` runs out -- a request crossing that is unread
  and unanswered (the clients retry a read, and call anything else ``AnswerLost``, which never
  claims that it did not run).

A ``Server`` also keeps the bytes its connections hold in memory bounded: request bodies
(``BODY_BUDGET``, ``hold_body``: 503 ``BODIES_IN_FLIGHT`` with ``Retry-After``, shared out by
uid as the answers are -- ``held.Shares``, one rule for both -- each share never less than one
body of ``max_body``: 17 connections of one uid dripping 16 MiB bodies held the whole budget,
audit 53; a spell of refusals in a share logged once) and answers (``ANSWER_BUDGET``,
``hold_answer``: a stored result's answer holds one piece of it while it is written -- results.py
-- a view's page its length; 503 ``ANSWERS_IN_FLIGHT`` with ``Retry-After`` past it, 413
``ANSWER_TOO_LARGE`` past what it could ever hold; a delivered answer over 64 KiB its length
and its decoded inline results', waiting for room instead: ``wait_answer``, answers.py -- but not
one saying nothing was dispatched, ``not_attempted``: no result in it, never counted).  The
answer budget is shared out as the connections are: no one uid holds more than
``answer_per_uid`` of it (half by default), the peers not ``reserved`` no more than
``answer_others`` together (half), and one uid of theirs no more than ``answer_per_other`` (a
quarter of that) -- a piece is held for as long as its reader takes, and ~164 slow readers of
one uid (within its connection share) held all 256 MiB, every other fetch and ``/v1/actions``
503 for as long as they kept reading.

The operator console's listener (TCP, each connection HTTP by hypercorn) has its own, simpler
cap, ``ConsoleCap``: its port is open to every local uid, not only allowed peers, and without one
any of them could take every descriptor the daemon has (the journal's, the socket's, its
calls').  At most ``CONSOLE_MAX_CONNECTIONS`` are served at once; past that a new one is
answered a short 503 unread and closed (within ``TURN_AWAY_WAIT``, and not answered at all past
as many again), logged once per spell.  Nothing is evicted: hypercorn's connections cannot be
told idle from busy from here, and its own ``keep_alive_timeout`` (``server.py``'s
``CONSOLE_HEAD_WAIT``) already closes one that has not sent a whole request head within a few
seconds of opening or of its last answer, and the console's ``FORM_WAIT`` one whose form stops
short -- a place is never held long by a silent connection.  Nor does one local uid hold more
than half the places (``max_per_uid``): a user reopening connections as fast as the head wait
closes them would otherwise keep the console full and the operators out.  Its uid is the
kernel's (``console.peer.owner_of``: one netlink ``SOCK_DIAG`` query of the connection's
4-tuple, or /proc/net/tcp read in a worker thread where netlink does not work -- never parsed on
the event loop), asked once per connection admitted and handed to the console for every request
the connection carries -- never for one turned away at the cap; a connection whose owner cannot
be read counts as one unknown uid.  And the uids that are not operators hold no more than
half the places *together* (``reserved``: the daemon's operator policy, by the user database):
two or three users each filling their share would otherwise still fill the console, while the
operators are the only ones it has anything to show.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

import trio

from affidavit.api.wire import ANSWER_MOST

from ..spells import REFUSED_QUIET, UidSpells
from .h11server import (
    BODY_WAIT,
    HEAD_WAIT,
    TURN_AWAY_WAIT,
    TURNED_AWAY,
    WRITE_WAIT,
    Connection,
    Handler,
)
from .held import OTHER_SHARES, Shares
from .http import MAX_BODY
from .link import GONE, Link
from .peer import Peer

__all__ = [
    "ANSWER_BUDGET",
    "BODY_BUDGET",
    "CONSOLE_MAX_CONNECTIONS",
    "MAX_CONNECTIONS",
    "PARSE_THREADS",
    "ConsoleCap",
    "Server",
]

log = logging.getLogger("affidavit.daemon")

MAX_CONNECTIONS = 256
"""Connections one ``Server`` keeps open at once (see the module docstring for one more)."""
BODY_BUDGET = 256 * 1024 * 1024
"""Bytes of request bodies all of a ``Server``'s connections hold at once, at least (twice its
``max_body`` if that is more, so two of the largest bodies fit): each connection may send one
of ``max_body`` bytes, but not all ``MAX_CONNECTIONS`` at once (``Request.body``: 503
``BODIES_IN_FLIGHT`` when the rest would not fit).  It counts bytes as received: a body being
parsed is held three to nine times over meanwhile (h11server.py says why), and at most
``PARSE_THREADS`` bodies over ``FREE_BODY`` are parsed at once (the rest wait their turn)."""
PARSE_THREADS = 2
"""Worker threads a ``Server`` parses request bodies over ``FREE_BODY`` in at once
(``Request._parsed``): their own, never trio's default ones -- which the calls' journal opens
and closes share -- so a flood of large bodies waits its turn and takes no thread a call
needs."""
ANSWER_BUDGET = ANSWER_MOST
"""Bytes of answers all of a ``Server``'s connections hold at once, at most (``hold_answer``):
a stored result's answer is written a piece at a time (``results.py``: each holds its piece's
worst case, ``results.PIECE_HOLD``, until its last byte is written) and a view's page while it
is written: a view's page or a record (``answers.respond_page``) -- past it, 503
``ANSWERS_IN_FLIGHT`` with ``Retry-After``, before anything is read -- and a delivered answer
over ``http.FREE_BODY`` (a call's envelope, a poll's or a query's answer:
``answers.respond_delivered``), which waits for room instead, ahead of new pages and fetches
(``wait_answer``).  N clients that do not read their answers cannot grow the daemon's memory
without bound, as ``BODY_BUDGET`` keeps their request bodies; a delivered answer up to
``FREE_BODY`` is not counted, as a body that small is not (256 connections: 16 MiB at most), nor
one of a call not attempted (``not_attempted``: it carries no result, and a client told nothing
would have to think the call may have run).
One uid holds half of it at most, the peers who are not operators half together, and -- with
operators configured -- one uid of theirs a quarter of that (``Server.answer_share``,
``answer_others``), as they hold the connections.  Its clients refuse an answer longer than
it (``wire.ANSWER_MOST``, the one number)."""
CONSOLE_MAX_CONNECTIONS = 64
"""Console connections served at once: an operator console has few users (a browser opens
about six per origin)."""

_CONSOLE_BUSY = b"the console has too many open connections; try again in a few seconds\n"
CONSOLE_TURNED_AWAY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nretry-after: 10\r\nconnection: close\r\n\r\n%s"
    % (len(_CONSOLE_BUSY), _CONSOLE_BUSY)
)
"""The answer to a console connection over the cap, whatever it asks (nothing is read)."""


LINGER_BYTES = 64 * 1024
"""What a refused or turned-away connection may still send after its answer, discarded unread
(``_Refusals.answer``), before it is closed anyway."""


class _Refusals:
    """The refusals of one listener being written: each bounded by ``TURN_AWAY_WAIT``, and none
    at all while ``most`` are (a connection turned away holds a descriptor until then).

    Then a lingering close: our side is shut for writing and what the client still sends -- the
    request it wrote before the answer reached it -- is discarded, never parsed, until it closes
    (at most ``LINGER_BYTES``, within ``TURN_AWAY_WAIT`` again), for at most ``most``
    connections at once (beyond that, closed at once, as before).  Closing with its request
    unread would break the pipe of a client still sending: one like curl then reports the
    broken pipe and never reads the answer waiting in its socket."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.writing = 0
        self.lingering = 0

    async def answer(self, stream: trio.SocketStream, answer: bytes) -> None:
        if self.writing >= self.most:
            return  # closed unanswered
        self.writing += 1
        written = False
        try:
            with trio.move_on_after(TURN_AWAY_WAIT), contextlib.suppress(*GONE):
                await stream.send_all(answer)
                written = True
        finally:
            self.writing -= 1
        if not written or self.lingering >= self.most:
            return
        self.lingering += 1
        try:
            with trio.move_on_after(TURN_AWAY_WAIT), contextlib.suppress(*GONE):
                await stream.send_eof()
                left = LINGER_BYTES
                while left > 0:
                    data = await stream.receive_some(left)
                    if not data:
                        break
                    left -= len(data)
        finally:
            self.lingering -= 1


class Server:
    """The connections of one listener, so that shutdown can close the idle ones."""

    def __init__(
        self,
        *,
        keep_alive: float,
        head_wait: float = HEAD_WAIT,
        body_wait: float = BODY_WAIT,
        write_wait: float = WRITE_WAIT,
        max_connections: int = MAX_CONNECTIONS,
        max_per_uid: int | None = None,
        reserved: Callable[[Peer], bool] | None = None,
        max_others: int | None = None,
        refused_quiet: float = REFUSED_QUIET,
        max_body: int = MAX_BODY,
        body_budget: int | None = None,
        answer_budget: int | None = None,
        answer_per_uid: int | None = None,
        answer_others: int | None = None,
        max_per_other: int | None = None,
        answer_per_other: int | None = None,
        body_per_uid: int | None = None,
    ) -> None:
        self.keep_alive = keep_alive
        self.max_body = max_body
        """The bytes a request body may hold (``http.body_limit`` of the daemon's config)."""
        self.body_shares = Shares(
            max(BODY_BUDGET, 2 * max_body) if body_budget is None else body_budget,
            body_per_uid,
            least=max_body,
        )
        """The bytes of request bodies its connections may hold at once (``BODY_BUDGET``),
        shared out by uid as the answers are (``hold_body``)."""
        self._body_spells = UidSpells()
        """The shares (a uid, ``"others"``, ``"all"``) whose bodies were refused (a spell
        each, logged once: ``hold_body``)."""
        self.parse_threads = trio.CapacityLimiter(PARSE_THREADS)
        """The threads large bodies are parsed in (``PARSE_THREADS``)."""
        self.answer_threads = trio.CapacityLimiter(PARSE_THREADS)
        """The threads large delivered answers are encoded in (``answers.encoded``): as many
        as bodies are parsed in, and not theirs -- neither waits for the other."""
        self.answer_shares = Shares(
            ANSWER_BUDGET if answer_budget is None else answer_budget,
            answer_per_uid,
            answer_others,
            answer_per_other,
        )
        """The bytes of answers its connections may hold at once (``ANSWER_BUDGET``), by uid
        (``hold_answer``)."""
        self.answers_peak = 0
        """The most ``answers`` has been (what the budget let in, for the operators' eyes and
        the tests')."""
        self._wakes: set[trio.Event] = set()
        """One per delivered answer waiting for room (``wait_answer``): set when answer bytes
        are dropped or the server closes."""
        self._waiting: dict[int | str, int] = {}
        """Delivered answers waiting for room, by the share they did not fit in (a uid,
        ``"others"``, ``"all"``): new pages and fetches in it are refused meanwhile."""
        self.head_wait = head_wait
        self.body_wait = body_wait
        self.write_wait = write_wait
        self.max_connections = max_connections
        self.max_per_uid = max(1, max_connections // 2) if max_per_uid is None else max_per_uid
        """Connections one peer uid may hold at once (half the cap unless given)."""
        self.reserved = reserved
        """Whether a peer may use the places others may not (an operator's, by the kernel's
        credentials); None: no reserve."""
        self.max_others = max(1, max_connections // 2) if max_others is None else max_others
        """Places the peers not ``reserved`` hold together, at most (busy or idle)."""
        self.max_per_other = (
            max(1, self.max_others // OTHER_SHARES) if max_per_other is None else max_per_other
        )
        """Places one peer uid not ``reserved`` may hold at once (a quarter of ``max_others``
        unless given): one agent's uid cannot hold every place of the agents'."""
        self.open = 0
        """Connections being served (not those being turned away, nor those evicted)."""
        self.others = 0
        """Of them, those of peers not ``reserved`` (0 without a reserve)."""
        self._others_full = False
        """Connections of those peers were turned away since they last held at most half their
        joint share (a spell of its own, logged once)."""
        self._others_evicting = False
        """Idle ones of theirs were evicted for theirs in that time (likewise)."""
        self._refused = _RefusedPeers(refused_quiet)
        self._per_uid: dict[int, int] = {}
        """Connections being served, by peer uid (none listed with 0)."""
        self._refusing = _Refusals(max_connections)
        self._full = False
        """Connections were turned away since one was last served under the cap (logged once
        per spell)."""
        self._uid_spells = UidSpells()
        """Uids turned away at their own share (a spell each)."""
        self._uid_evictions = UidSpells()
        """Uids whose idle connections were evicted for their own at their share (likewise:
        the socket-wide ``_evicting`` ends at any admission with half the places free)."""
        self._evicting = False
        """Idle connections were evicted since one was last served under the cap (likewise)."""
        self.closing = False
        self.stopping = False
        """The stop's grace is over (``give_up_waits``)."""
        self._idle: dict[Connection, trio.CancelScope] = {}
        """The waits of connections between requests (or before their first), longest idle
        first (cancelled by ``close``, and one by ``_evict``)."""

    @property
    def body_budget(self) -> int:
        """The bytes of request bodies its connections may hold at once (``BODY_BUDGET``)."""
        return self.body_shares.budget

    @property
    def bodies(self) -> int:
        """The bytes of request bodies held now (``hold_body``)."""
        return self.body_shares.held

    def hold_body(self, n: int, peer: Peer, other: bool) -> str | None:
        """Count ``n`` more bytes of a request body of ``peer``'s (``other``: one not
        ``reserved``) as held, if they fit in ``body_budget`` and the peer's shares of it
        (``body_shares``: as the answers'): None.  Else nothing is counted and the share they
        do not fit in is named (``"all"``, ``"uid"``, ``"others"``) -- one uid's 17 bodies,
        dripped, held the whole budget and every other uid's large call was 503 (audit 53).
        Each spell of refusals in a share is logged once, and its end (``drop_body``)."""
        full = self.body_shares.full(n, peer.uid, other)
        if full is None:
            self.body_shares.add(n, peer.uid, other)
            return None
        key: int | str = peer.uid if full == "uid" else full
        if self._body_spells.turned_away(key):
            log.warning(
                "request bodies %s hold %d bytes, their most: refusing more (503 "
                "BODIES_IN_FLIGHT) until they hold half of it, first %s",
                _whose(full, peer.uid),
                self.body_shares.limit(full, other),
                peer.describe(),
            )
        return full

    def drop_body(self, n: int, uid: int, other: bool) -> None:
        """A request's bodies are no longer held (its handling is over)."""
        if not n:
            return
        shares = self.body_shares
        left = shares.drop(n, uid, other)
        for key, held, share in (
            (uid, left, shares.share(other)),
            ("others", shares.others_held, shares.others),
            ("all", shares.held, shares.budget),
        ):
            ended = self._body_spells.left(key, held, share)
            if ended is not None:
                log.info(
                    "request bodies %s have room again (%d bytes held); %d were refused",
                    _whose("uid" if key == uid else str(key), uid),
                    held,
                    ended,
                )

    @property
    def answers(self) -> int:
        """The bytes of answers held now (``hold_answer``)."""
        return self.answer_shares.held

    def share(self, other: bool) -> int:
        """The places one uid may hold: ``max_per_uid``, and no more than ``max_per_other`` for
        a peer not ``reserved`` (``other``)."""
        return min(self.max_per_uid, self.max_per_other) if other else self.max_per_uid

    def answer_share(self, other: bool) -> int:
        """The answer bytes one uid may hold at once: ``answer_per_uid``, and no more than
        ``answer_per_other`` for a peer not ``reserved`` (``other``)."""
        return self.answer_shares.share(other)

    def answer_most(self, other: bool) -> int:
        """The largest answer one peer could ever be let hold (``other``: one not
        ``reserved``): its uid's share, within the budget and the others' joint share."""
        return self.answer_shares.most(other)

    def hold_answer(self, n: int, uid: int, other: bool, *, first: bool = False) -> str | None:
        """Count ``n`` bytes of an answer to peer ``uid`` (``other``: one not ``reserved``) as
        held, if they fit in ``answer_budget``, the uid's share (``answer_share``) and --
        ``other`` -- the joint share of the peers not reserved (``answer_others``): None.  Else
        nothing is counted and the one they do not fit in is named: ``"all"``, ``"uid"`` or
        ``"others"``.  Unless ``first`` (a delivered answer's), a share a delivered answer
        waits for room in counts as full: that answer is the record of a call that ran, a
        page or a fetch can be asked again (``wait_answer``).  For ``first`` the uid's own
        share is named before the budget: the answer waits in the narrowest share that
        holds it back, so it keeps only its own uid's pages waiting, not every uid's."""
        full = self.answer_shares.full(
            n, uid, other, None if first else self._waiting, mine_first=first
        )
        if full is not None:
            return full
        self.answer_shares.add(n, uid, other)
        self.answers_peak = max(self.answers_peak, self.answers)
        return None

    async def wait_answer(
        self, n: int, uid: int, other: bool, within: float, link: Link
    ) -> str | None:
        """``hold_answer`` for a delivered answer, waiting up to ``within`` seconds for room:
        None once held, else why not -- at once ``"larger than its share"`` for ``n`` more
        than the shares it must fit in could ever hold; ``"hung up"`` as soon as ``link``'s
        client has; ``"stopping"`` once the stop's grace is over (``give_up_waits``: so the
        failure is recorded before the connections are cancelled); ``"timed out"``.  While
        it waits, new pages and fetches in the share it does not fit in are refused
        (``hold_answer``), so the room that frees is its first."""
        if n > self.answer_most(other):
            return "larger than its share"
        with trio.move_on_after(within):
            while True:
                # The hang-up first: a half-closed client (SHUT_WR) still takes the write, and
                # an answer written after its hang-up was seen is not delivered (link.py).
                if link.hung_up.is_set():
                    return "hung up"
                if self.stopping:
                    return "stopping"
                full = self.hold_answer(n, uid, other, first=True)
                if full is None:
                    break
                share: int | str = uid if full == "uid" else full
                wake = trio.Event()
                self._wakes.add(wake)
                link.on_hang_up.add(wake.set)
                self._waiting[share] = self._waiting.get(share, 0) + 1
                try:
                    await wake.wait()
                finally:
                    self._wakes.discard(wake)
                    link.on_hang_up.discard(wake.set)
                    if self._waiting[share] == 1:
                        del self._waiting[share]
                    else:
                        self._waiting[share] -= 1
            return None
        return "timed out"

    def give_up_waits(self) -> None:
        """The stop's grace is over: a delivered answer waiting for room, now or later, is
        given up (``wait_answer``: ``"stopping"``) -- its failure is recorded while the stop
        still waits for the calls, not cancelled with the connections after it."""
        self.stopping = True
        self._wake()

    def _wake(self) -> None:
        """The delivered answers waiting for room look again (``wait_answer``)."""
        for wake in self._wakes:
            wake.set()

    def drop_answer(self, n: int, uid: int, other: bool) -> None:
        """An answer's bytes are no longer held (written, or its writing given up)."""
        self._wake()
        self.answer_shares.drop(n, uid, other)

    @property
    def idle(self) -> int:
        """Connections waiting for a request (the ones ``_evict`` may close)."""
        return len(self._idle)

    def close(self) -> None:
        """Idle connections close now; busy ones once their answer is written -- a delivered
        answer waiting for room is given up (``give_up_waits``)."""
        self.closing = True
        self.give_up_waits()
        for scope in self._idle.values():
            scope.cancel()
        self._refused.end()

    async def serve(self, link: Link, peer: Peer, handler: Handler) -> None:
        """Serve one accepted connection until it closes (its peer already checked)."""
        other = self.reserved is not None and not self.reserved(peer)
        mine = self._per_uid.get(peer.uid, 0) >= self.share(other)
        theirs = other and self.others >= self.max_others
        full = self.open >= self.max_connections
        if mine or theirs or full:
            # The one closed must free every place this one lacks: its uid's own when the uid
            # holds its share, one of a peer not reserved when those hold theirs together.
            # For an operator's only the total is short: an idle one of the others goes first.
            evicted = self._evict(
                peer.uid if mine else None,
                others_only=theirs,
                others_first=full and not other and self.reserved is not None,
            )
            if evicted is None:
                await self._turn_away(link, peer, mine, theirs and not mine)
                return
            if theirs and not mine:
                if not self._others_evicting:
                    self._others_evicting = True
                    log.info(
                        "peers who are not operators hold %d connections, their most: closing "
                        "their longest-idle one to let each new one of theirs in (first %s's, "
                        "for %s)",
                        self.max_others,
                        evicted.peer.describe(),
                        peer.describe(),
                    )
            elif self._uid_evictions.turned_away(peer.uid) if mine else not self._evicting:
                self._evicting = self._evicting or not mine
                log.info(
                    "%d connections are open%s, the most: closing the longest-idle one to let "
                    "each new one in (first %s's, for %s)",
                    self.share(other) if mine else self.max_connections,
                    f" for uid {peer.uid}" if mine else "",
                    evicted.peer.describe(),
                    peer.describe(),
                )
        elif self.open <= self.max_connections // 2:
            # A spell at a limit ends once half the places are free again, not at the first
            # admission under it: a client reconnecting as fast as its connections close
            # would otherwise make it a log line per connection (as ``ConsoleCap``).
            self._full = self._evicting = False
        if other and self.others <= self.max_others // 2:
            self._others_full = self._others_evicting = False  # their spell, likewise
        self.open += 1
        self.others += other
        self._per_uid[peer.uid] = self._per_uid.get(peer.uid, 0) + 1
        conn = Connection(self, link, peer)
        conn.other = other
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conn.read)
                await conn.serve(handler)
                nursery.cancel_scope.cancel()
        except Exception:
            # A fault of this driver on one connection (h11 refusing what it was asked to
            # send, say) closes that connection, never the daemon and the calls of the others.
            log.exception("the connection of %s failed; it is closed", peer.describe())
        finally:
            if not conn.evicted:  # an evicted one gave its place up when it was chosen
                self._leave(conn)
            with trio.CancelScope(shield=True):
                await link.aclose()

    def _evict(
        self, uid: int | None = None, *, others_only: bool = False, others_first: bool = False
    ) -> Connection | None:
        """Close the connection idle the longest (of peer ``uid``, when given; of a peer not
        ``reserved``, when ``others_only``; such a one first, when ``others_first``), to make
        room: one waiting for its next (or first) request with no byte of it read or waiting in
        its socket.  Never one with a request in progress -- its head or body being read, a
        route or a call running, its answer being written: those are bounded by
        ``HEAD_WAIT``, ``BODY_WAIT``, ``WRITE_WAIT`` or the call itself.  None when every one
        that would do is busy."""
        for only_others in (True, False) if others_first else (others_only,):
            for conn, scope in self._idle.items():
                if uid is not None and conn.peer.uid != uid:
                    continue
                if only_others and not conn.other:
                    continue
                if conn.unread():
                    continue  # a request's first bytes are in: busy now, as far as anyone knows
                # Its server task is parked in the idle wait (nothing woke it: the reader sets
                # ``_bytes`` only after adding to the inbox or seeing the end), so the cancel
                # reaches it there and it returns without reading: a clean close, no answer cut.
                del self._idle[conn]
                conn.evicted = True
                scope.cancel()
                self._leave(conn)
                return conn
        return None

    def _leave(self, conn: Connection) -> None:
        """``conn`` no longer holds a place (closed, or chosen to make room)."""
        self.open -= 1
        self.others -= conn.other
        uid = conn.peer.uid
        left = self._per_uid[uid] - 1
        if left:
            self._per_uid[uid] = left
        else:
            del self._per_uid[uid]
        if not conn.evicted:  # one evicted makes room for its uid's next: no end of the spell
            self._uid_evictions.left(uid, left, self.share(conn.other))  # logged at its start
        ended = self._uid_spells.left(uid, left, self.share(conn.other))
        if ended is not None:
            log.info(
                "uid %s has room again (%d connections); %d were turned away", uid, left, ended
            )

    async def _turn_away(self, link: Link, peer: Peer, mine: bool, theirs: bool = False) -> None:
        """503 and close, not a byte read: bounded by ``TURN_AWAY_WAIT``, and not answered at
        all while as many again are being turned away (each holds a descriptor meanwhile).
        ``mine``: the peer's uid holds its share (``share``: ``max_per_uid``, or
        ``max_per_other``), all of them busy;
        ``theirs``: the peers not ``reserved`` hold theirs together (``max_others``), likewise."""
        if theirs:
            if not self._others_full:
                self._others_full = True
                log.warning(
                    "peers who are not operators hold %d connections, their most: turning "
                    "their new ones away (503), first %s",
                    self.others,
                    peer.describe(),
                )
        elif mine:
            if self._uid_spells.turned_away(peer.uid):
                log.warning(
                    "%d connections are open for uid %s, its most: turning new ones away (503) "
                    "for it until half of them have closed, first %s",
                    self._per_uid.get(peer.uid, 0),
                    peer.uid,
                    peer.describe(),
                )
        elif not self._full:
            self._full = True
            log.warning(
                "%d connections are open, the most: turning new ones away (503), first %s",
                self.open,
                peer.describe(),
            )
        await self._answer(link, TURNED_AWAY)

    async def refuse(self, link: Link, peer: Peer, answer: bytes) -> None:
        """A peer the socket's policy refuses: ``answer`` (its 403) at once, not a byte read
        (what it sends after is discarded unparsed: ``_Refusals``), then close -- bounded as a
        503 is, and never counted among the open connections.  Logged once per spell of
        refusals (``_RefusedPeers``)."""
        self._refused.note(peer)
        await self._answer(link, answer)

    async def _answer(self, link: Link, answer: bytes) -> None:
        try:
            await self._refusing.answer(link.stream, answer)
        finally:
            with trio.CancelScope(shield=True):
                await link.aclose()


def _whose(full: str, uid: int) -> str:
    """The share ``full`` names, in a log line's words."""
    return {"uid": f"of uid {uid}", "others": "of peers who are not operators"}.get(
        full, "of all peers"
    )


class _RefusedPeers:
    """The log of a listener's refused peers: the first refusal of a spell is a warning naming
    its peer; the rest are counted, and the count is logged once the spell is seen over --
    ``quiet`` seconds without a refusal -- at the next refusal (which starts a new spell).  A
    peer reconnecting as fast as it is refused is then one line, not one per connection."""

    def __init__(self, quiet: float) -> None:
        self.quiet = quiet
        self.count = 0
        """Refusals in this spell (0 outside one)."""
        self.uids: set[int] = set()
        """Their uids (the first few)."""
        self._last = 0.0

    def note(self, peer: Peer) -> None:
        now = trio.current_time()
        if self.count and now - self._last >= self.quiet:
            self.end()
        if not self.count:
            log.warning(
                "refused peer %s: not in [service] allow_uids / allow_gids (answered 403; "
                "further refusals are counted until %g s pass without one)",
                peer.describe(),
                self.quiet,
            )
        self.count += 1
        if len(self.uids) < 16:
            self.uids.add(peer.uid)
        self._last = now

    def end(self) -> None:
        """The spell is over: its count, if it was more than its first line."""
        if self.count > 1:
            log.info(
                "refused peers: %d connections were answered 403 in that spell (uids %s)",
                self.count,
                ", ".join(str(u) for u in sorted(self.uids)),
            )
        self.count = 0
        self.uids.clear()


async def _console_owner(stream: trio.SocketStream) -> int | None:
    """The local uid owning the client's end of a console connection, or None: the kernel's
    answer to one netlink query (``console.peer.owner_of``; /proc/net/tcp read off the event
    loop where netlink does not work)."""
    from affidavit.console.peer import owner_of

    try:
        sock = stream.socket
        return await owner_of(sock.getpeername()[:2], sock.getsockname()[:2])
    except (OSError, ValueError):
        return None


class ConsoleCap:
    """The console listener's connections: at most ``max_connections`` served at once, and at
    most ``max_per_uid`` of one local uid (half, unless given; ``owner`` names a connection's
    uid, None when it cannot); the rest answered 503 and closed unread (the module docstring
    says why this one is simpler)."""

    def __init__(
        self,
        *,
        max_connections: int = CONSOLE_MAX_CONNECTIONS,
        max_per_uid: int | None = None,
        owner: Callable[[trio.SocketStream], Awaitable[int | None]] = _console_owner,
        reserved: Callable[[int], bool] | None = None,
        max_others: int | None = None,
    ) -> None:
        self.max_connections = max_connections
        self.max_per_uid = max(1, max_connections // 2) if max_per_uid is None else max_per_uid
        self._owner = owner
        self._reserved = reserved
        """Whether a uid may use the places others may not (an operator's); None: no reserve."""
        self.max_others = max(1, max_connections // 2) if max_others is None else max_others
        """Places the uids not ``reserved`` (and unknown ones) hold together, at most."""
        self.open = 0
        """Connections being served (not those being turned away)."""
        self.others = 0
        """Of them, those of uids not ``reserved`` (0 without a reserve)."""
        self._others_turned_away = 0
        """Connections of those uids turned away in this spell at their joint share."""
        self._per_uid: dict[int | None, int] = {}
        self._uid_spells = UidSpells()
        """Uids turned away at their share (a spell each)."""
        self.turned_away = 0
        """Connections turned away in this spell at the cap (0 outside one)."""
        self._refusing = _Refusals(max_connections)

    async def serve(
        self,
        stream: trio.SocketStream,
        serve: Callable[[trio.SocketStream, int | None], Awaitable[None]],
    ) -> None:
        """``serve(stream, uid)`` if there is room, else the 503; ``stream`` is closed either
        way.  ``uid``: the connection's owner, looked up once here (None: not known) -- the
        console checks every request of the connection against it, never asking again."""
        try:
            if self.open >= self.max_connections:
                await self._turn_away(stream)
                return
            uid = await self._owner(stream)
            if self._per_uid.get(uid, 0) >= self.max_per_uid:
                await self._turn_away(stream, uid)
                return
            other = self._reserved is not None and (uid is None or not self._reserved(uid))
            if other and self.others >= self.max_others:
                await self._turn_away_other(stream)
                return
            self.open += 1
            self.others += other
            self._per_uid[uid] = self._per_uid.get(uid, 0) + 1
            try:
                await serve(stream, uid)
            except Exception:
                # A fault of hypercorn's on one connection closes that one, never the daemon
                # (the agents' socket is served by the same process).
                log.exception("a console connection failed; it is closed")
            finally:
                self.others -= other
                self._left(uid)
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _turn_away(self, stream: trio.SocketStream, uid: int | None = None) -> None:
        """503, not a byte read: bounded by ``TURN_AWAY_WAIT``, and not answered at all while
        as many again are being turned away (each holds a descriptor meanwhile).  ``uid``: the
        connection's owner, when it is its uid's share that is full (a spell of its own)."""
        if uid is None and not self.turned_away:
            log.warning(
                "the console has %d connections open, the most: turning new ones away (503) "
                "until half of them have closed",
                self.open,
            )
        if uid is None:
            self.turned_away += 1
        elif self._uid_spells.turned_away(uid):
            log.warning(
                "uid %s holds %d console connections, its most: turning its new ones away "
                "(503) until half of them have closed",
                uid,
                self._per_uid.get(uid, 0),
            )
        await self._refusing.answer(stream, CONSOLE_TURNED_AWAY)

    async def _turn_away_other(self, stream: trio.SocketStream) -> None:
        """503 for a connection of a uid that is not an operator while such uids hold their
        joint share (a spell of its own, logged once)."""
        if not self._others_turned_away:
            log.warning(
                "local users who are not operators hold %d console connections, their most: "
                "turning their new ones away (503) until half of them have closed",
                self.others,
            )
        self._others_turned_away += 1
        await self._refusing.answer(stream, CONSOLE_TURNED_AWAY)

    def _left(self, uid: int | None) -> None:
        """A connection of ``uid`` closed: its place is free (and a spell may end)."""
        self.open -= 1
        if self._others_turned_away and self.others <= self.max_others // 2:
            log.info(
                "local users who are not operators have room again on the console (%d "
                "connections); %d were turned away",
                self.others,
                self._others_turned_away,
            )
            self._others_turned_away = 0
        left = self._per_uid[uid] - 1
        if left:
            self._per_uid[uid] = left
        else:
            del self._per_uid[uid]
        # A spell ends once half the places are free again, not at the first one: a client
        # reconnecting as fast as its connections close would otherwise make it a line per
        # connection.
        if self.turned_away and self.open <= self.max_connections // 2:
            log.info(
                "the console has room again (%d connections open); %d were turned away",
                self.open,
                self.turned_away,
            )
            self.turned_away = 0
        ended = self._uid_spells.left(uid, left, self.max_per_uid)
        if ended is not None:
            log.info(
                "uid %s has room again on the console (%d connections); %d were turned away",
                uid,
                left,
                ended,
            )
