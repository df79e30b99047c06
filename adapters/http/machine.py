"""The HTTP protocol table and its sans-IO core (bytes in, events out; no sockets here).

Rule 1 (after h11's ``_state.py``): every step an HTTP attempt can take lives in ``HTTP_TABLE``
below.  The driver never decides phase or outcome by itself; it fires table events and the
``ProtocolMachine`` derives ``dispatched`` / ``complete`` from the two marks:

* **dispatch** — ``send_headers`` from a connected (or reused) state: the first byte of the
  application request is about to be handed to the transport (seed, "Dispatch shifts the burden
  of proof": "For HTTP, dispatch begins before the first byte of the request is passed to the
  connection").  Every redirect hop crosses it again from its own ``redirect_*`` states.
* **completes** — ``end`` (h11 ``EndOfMessage``) of a *final* response.  A 1xx never completes
  (seed: "Informational HTTP responses do not determine the outcome of the action").  Nor does
  the end of a close-delimited body at a plain-TCP FIN (``eof_ends_body``): it fires
  ``peer_closed`` instead, since only TLS's ``close_notify`` proves such a body whole.

Rule 2: a post-dispatch state never leads to a pre-dispatch state (``ProtocolTable`` refuses
that).  So a redirect hop's connection setup has its own ``redirect_*`` states and its own
``redirect_setup_failed``; they are post-dispatch because the previous hop was dispatched.

Pre-dispatch (connection_setup)::

    idle ─resolve─▶ dns_resolved ─connect─▶ tcp_connected ─tunnel─▶ proxy_tunnel_open
      │                                          │  └─tls─▶ tls_established ◀─tls─┘
      └─reuse─▶ connection_reused                 │
    any of them ─setup_fail─▶ setup_failed;  ─gate_refused─▶ abandoned

Post-dispatch (remote_execution)::

    {tcp_connected, tls_established, connection_reused, redirect_*} ─send_headers─▶ headers_sent
    headers_sent ─send_body─▶ body_sent ─informational─▶ informational ─response_headers─▶ …
    response_headers ─body─▶ body ─end─▶ framing_complete ─follow_redirect─▶ redirect_pending
    … ─proxy_response_headers─▶ proxy_error_headers ─proxy_body / proxy_end─▶ proxy_error_complete
      (a proxy's own error: complete framing, yet never a completes transition)
    any unfinished state ─peer_closed | malformed | timed_out | transport_error | cancelled
      | result_size_limit─▶ closed_early
    {response_headers, body, framing_complete} ─refused─▶ redirect_refused  (a hop sent
      without the credential answered with a refusal: decided at its head, its body never read
      -- redirects.py; from framing_complete when the whole refusal came in its head's read)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Final

import h11

from affidavit.statemachine import ProtocolMachine, ProtocolTable, Step, register

from .receive_buffer import client_connection

__all__ = [
    "ABORT_EVENTS",
    "CONTENT_CODINGS",
    "HEAD_BYTES_KEPT",
    "HTTP_TABLE",
    "MAX_INFORMATIONAL",
    "MAX_INFORMATIONAL_BYTES",
    "FramingError",
    "HttpExchange",
    "Observation",
    "content_coding",
]

ABORT_EVENTS: Final = (
    "peer_closed",
    "malformed",
    "timed_out",
    "transport_error",
    "cancelled",
    "result_size_limit",
)
"""Ways an unfinished exchange ends early; all lead to ``closed_early`` (outcome decided by the
last proven boundary, never by which of these it was).  ``result_size_limit``: the body grew past
the target's ``max_result`` and the broker stopped reading it."""

MAX_INFORMATIONAL: Final = 16
"""Interim (1xx) responses one hop accepts before its final one; one more makes the exchange
``malformed``.  RFC 9110 §15.2 sets no limit, but each costs a step of evidence and re-arms the
read deadline, so a peer sending them without end would grow both until the target's total
timeout.  Go's net/http stops at 5; a few more leave room for ``102 Processing`` repeated during
a long operation and ``103 Early Hints`` before the answer."""
MAX_INFORMATIONAL_BYTES: Final = 64 * 1024
"""Bytes of one hop's interim (1xx) heads together; past it the exchange is ``malformed``.  h11
bounds each head alone (16 KiB, ``max_incomplete_event_size``), the final one included."""

HEAD_BYTES_KEPT: Final = MAX_INFORMATIONAL_BYTES + 2 * 16 * 1024
"""Bytes received before the final head that ``head_bytes`` keeps: every interim head (past
``MAX_INFORMATIONAL_BYTES`` the exchange is refused) and a final head up to h11's own bound
(16 KiB, ``max_incomplete_event_size``), with room for the head that crossed the first bound."""

CONTENT_CODINGS: Final = frozenset({"gzip", "x-gzip", "deflate", "identity"})
"""Content codings (RFC 9110 §8.4.1) named as themselves in ``content_coding``; any other is
``"other"``, so the fact stays a closed, secret-free set whatever the peer sent."""


def content_coding(headers: tuple[tuple[str, str], ...]) -> list[str]:
    """The codings of every Content-Encoding field in the order applied (RFC 9110 §8.4: "If one
    or more encodings have been applied ... the sender MUST list them in the order in which they
    were applied"), lower-cased; a coding outside ``CONTENT_CODINGS`` is ``"other"``."""
    out: list[str] = []
    for name, value in headers:
        if name.lower() == "content-encoding":
            for token in value.split(","):
                coding = token.strip().lower()
                if coding:
                    out.append(coding if coding in CONTENT_CODINGS else "other")
    return out


_SETUP_FAIL = {"setup_fail": "setup_failed", "gate_refused": "abandoned"}
_REDIRECT_FAIL = {"setup_fail": "redirect_setup_failed", "gate_refused": "redirect_abandoned"}
_ABORT = dict.fromkeys(ABORT_EVENTS, "closed_early")
_RESPONSE_START = {
    "informational": "informational",
    "response_headers": "response_headers",
    # Seed: "Do not pass off an intermediary's certainty about its own response as certainty
    # about the effects on the origin system" — a proxy's complete error never completes.
    "proxy_response_headers": "proxy_error_headers",
}

_STATES: Final = {
    # -- before dispatch: connection_setup ------------------------------------------------------
    "idle": "no connection chosen yet",
    "dns_resolved": "the origin (or proxy) host name resolved to addresses",
    "tcp_connected": "a fresh TCP connection to the origin or proxy is open",
    "proxy_tunnel_open": "an HTTP CONNECT tunnel through the proxy is open (not yet TLS)",
    "tls_established": "TLS handshake done; certificate and host name verified",
    "connection_reused": "an idle pooled connection (already verified) was taken",
    "setup_failed": "connection setup failed; no request byte was handed to the transport",
    "abandoned": "the dispatch gate refused; nothing was written",
    # -- after dispatch: remote_execution -------------------------------------------------------
    "headers_sent": "the request head was handed to the transport (the dispatch boundary)",
    "body_sent": "the whole request body and its framing were handed to the transport",
    "informational": "a 1xx response arrived; the final response is still pending",
    "response_headers": "the final response head arrived",
    "body": "final-response body bytes are arriving",
    "framing_complete": "h11 EndOfMessage of the final response: a complete result",
    "closed_early": "the exchange ended without a complete final response",
    "proxy_error_headers": "a proxy's own error response head arrived (not the origin's result)",
    "proxy_error_body": "the proxy's error body is arriving",
    "proxy_error_complete": "the proxy's error response is complete; the origin's outcome is not",
    # -- redirect hops (each one dispatches again) ----------------------------------------------
    "redirect_pending": "a complete 3xx is being followed; the next hop is not connected yet",
    "redirect_dns_resolved": "next hop: host name resolved",
    "redirect_tcp_connected": "next hop: TCP connection open",
    "redirect_proxy_tunnel_open": "next hop: CONNECT tunnel open",
    "redirect_tls_established": "next hop: TLS verified",
    "redirect_connection_reused": "next hop: pooled connection taken",
    "redirect_setup_failed": "next hop: connection setup failed before its request was written",
    "redirect_abandoned": "next hop: the dispatch gate refused; nothing was written",
    "redirect_refused": "next hop, sent without the credential, refused at its head: its body "
    "is not read, the connection closed; the 3xx before it is the result",
}

_TRANSITIONS: Final[dict[str, dict[str, str]]] = {
    "idle": {
        "resolve": "dns_resolved",
        "reuse": "connection_reused",
        # An idle pooled socket that turned readable (EOF/RST) is discarded before the
        # boundary; a self-loop keeps that evidence in the protocol summary's path.
        "stale_connection_discarded": "idle",
        **_SETUP_FAIL,
    },
    "dns_resolved": {"connect": "tcp_connected", **_SETUP_FAIL},
    "tcp_connected": {
        "tunnel": "proxy_tunnel_open",
        "tls": "tls_established",
        "send_headers": "headers_sent",
        **_SETUP_FAIL,
    },
    "proxy_tunnel_open": {"tls": "tls_established", **_SETUP_FAIL},
    "tls_established": {"send_headers": "headers_sent", **_SETUP_FAIL},
    "connection_reused": {"send_headers": "headers_sent", **_SETUP_FAIL},
    "setup_failed": {},
    "abandoned": {},
    "headers_sent": {"send_body": "body_sent", **_RESPONSE_START, **_ABORT},
    "body_sent": {**_RESPONSE_START, **_ABORT},
    "informational": {"send_body": "body_sent", **_RESPONSE_START, **_ABORT},
    "response_headers": {
        "body": "body",
        "end": "framing_complete",
        "refused": "redirect_refused",
        **_ABORT,
    },
    "body": {"body": "body", "end": "framing_complete", "refused": "redirect_refused", **_ABORT},
    # ``refused`` here too: a refusal framed whole in the read that brought its head (a 401
    # with ``Content-Length: 0``) has reached ``end`` before the driver stops at it.
    "framing_complete": {"follow_redirect": "redirect_pending", "refused": "redirect_refused"},
    "closed_early": {},
    "proxy_error_headers": {
        "proxy_body": "proxy_error_body",
        "proxy_end": "proxy_error_complete",
        **_ABORT,
    },
    "proxy_error_body": {
        "proxy_body": "proxy_error_body",
        "proxy_end": "proxy_error_complete",
        **_ABORT,
    },
    "proxy_error_complete": {},
    "redirect_pending": {
        "resolve": "redirect_dns_resolved",
        "reuse": "redirect_connection_reused",
        "stale_connection_discarded": "redirect_pending",
        **_REDIRECT_FAIL,
    },
    "redirect_dns_resolved": {"connect": "redirect_tcp_connected", **_REDIRECT_FAIL},
    "redirect_tcp_connected": {
        "tunnel": "redirect_proxy_tunnel_open",
        "tls": "redirect_tls_established",
        "send_headers": "headers_sent",
        **_REDIRECT_FAIL,
    },
    "redirect_proxy_tunnel_open": {"tls": "redirect_tls_established", **_REDIRECT_FAIL},
    "redirect_tls_established": {"send_headers": "headers_sent", **_REDIRECT_FAIL},
    "redirect_connection_reused": {"send_headers": "headers_sent", **_REDIRECT_FAIL},
    "redirect_setup_failed": {},
    "redirect_abandoned": {},
    "redirect_refused": {},
}

HTTP_TABLE: Final = register(
    ProtocolTable(
        name="http",
        initial="idle",
        states=_STATES,
        transitions=_TRANSITIONS,
        dispatch=frozenset(
            (src, "send_headers")
            for src in (
                "tcp_connected",
                "tls_established",
                "connection_reused",
                "redirect_tcp_connected",
                "redirect_tls_established",
                "redirect_connection_reused",
            )
        ),
        completes=frozenset({("response_headers", "end"), ("body", "end")}),
        # The seed's REQUEST_SENT / REMOTE_RESPONSE_STARTED, recorded by the engine on entry.
        milestones={"body_sent": "REQUEST_SENT", "response_headers": "REMOTE_RESPONSE_STARTED"},
        final=frozenset(
            {
                "setup_failed",
                "abandoned",
                "framing_complete",
                "closed_early",
                "proxy_error_complete",
                "redirect_setup_failed",
                "redirect_abandoned",
                "redirect_refused",
            }
        ),
        doc="HTTP/1.1 over h11: setup, dispatch at the first request byte, completion at "
        "EndOfMessage of the final response; redirect hops dispatch again.",
    )
)


class FramingError(Exception):
    """The peer broke HTTP/1.1 framing (RFC 9112) or closed mid-message.  The message names the
    problem only — never a header value or URL (they may carry the credential).
    ``observations`` are the steps fired by the failing ``receive`` call (ending with the abort
    step), so the driver can still report them."""

    def __init__(self, message: str, observations: list[Observation] | None = None) -> None:
        super().__init__(message)
        self.observations = list(observations or [])


_FAULTY_FRAMING: Final = {
    "conflict": "response framed by both Transfer-Encoding and Content-Length",
    "te_in_1_0": "HTTP/1.0 response framed by Transfer-Encoding",
}
"""``_body_framing``'s faulty framings, with the ``FramingError`` each ends the exchange with."""


def _body_framing(method: str, ev: h11.Response) -> str:
    """How a final response's body is framed, by RFC 9112 §6.3 in its order of precedence (as
    h11 applies it, ``h11._connection._body_framing``): ``"none"`` -- a response to HEAD, a 204
    or 304 (item 1), or a 2xx to CONNECT (item 2: a tunnel, ``_refuse_paused``), whatever its
    fields say (``"none_te"`` when one is Transfer-Encoding: complete, but the connection is
    not pooled -- §6.1: "A server MUST NOT send a Transfer-Encoding header field in any
    response with a status code of 1xx (Informational) or 204 (No Content)", so its peer's
    framing is in doubt; a HEAD or 304 answer MAY carry it, naming its GET's coding, but a
    connection closed costs only a reconnect, and telling the two apart would trust the peer
    that sent it); ``"conflict"`` -- both Transfer-Encoding and Content-Length (item 3:
    "ought to be handled as an error"; h11 lets chunked win, which a peer smuggling a second
    response counts on); ``"te_in_1_0"`` -- Transfer-Encoding in an HTTP/1.0 response (§6.1: "A
    client MUST treat ... as faulty", with or without Content-Length; h11 reads it chunked);
    ``"framed"`` -- one of them; ``"close"`` -- neither: the body runs to the connection's
    close (item 8)."""
    # ``raw_items``: a list, not the ``Sequence`` protocol's ``__getitem__`` per header.
    names = {n.lower() for n, _ in ev.headers.raw_items()}
    te, cl = b"transfer-encoding" in names, b"content-length" in names
    if ev.status_code in (204, 304) or method == "HEAD":
        return "none_te" if te else "none"
    if method == "CONNECT" and 200 <= ev.status_code < 300:
        return "none"
    if te and ev.http_version == b"1.0":
        return "te_in_1_0"
    if te and cl:
        return "conflict"
    return "framed" if te or cl else "close"


@dataclass(frozen=True, slots=True, init=False)
class Observation:
    """One fired step with its secret-free facts; ``data`` carries body bytes for the sink."""

    step: Step
    facts: Mapping[str, Any]
    data: bytes = b""
    status: int | None = None
    reason: str = ""
    headers: tuple[tuple[str, str], ...] = ()

    def __init__(
        self,
        step: Step,
        facts: Mapping[str, Any],
        data: bytes = b"",
        status: int | None = None,
        reason: str = "",
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        # The generated frozen ``__init__`` with each field stored by its slot's own setter
        # instead of ``object.__setattr__`` by name (as ``Event.__init__``): a call makes about
        # six observations (issue 15).  Same signature and defaults
        # (tests/http/test_observation_init.py).
        _set_step(self, step)
        _set_facts(self, facts)
        _set_data(self, data)
        _set_status(self, status)
        _set_reason(self, reason)
        _set_headers(self, headers)


_set_step, _set_facts, _set_data, _set_status, _set_reason, _set_headers = (
    Observation.__dict__[f.name].__set__ for f in fields(Observation)
)


@dataclass
class HttpExchange:
    """One request/response exchange of one hop, sans-IO.

    The driver owns the bytes; this object owns the h11 connection state and fires the table's
    events on ``machine``.  Call order, mirroring the driver::

        ex.setup("resolve" | "connect" | "tunnel" | "tls" | "reuse", facts)
        if machine.crosses_dispatch("send_headers"): await gate(...)   # driver's job
        head = ex.start_request(method, target, headers, has_body)     # fires send_headers
        -> write head; ex.body_bytes(body) -> write; ex.body_written()  # fires send_body
        ex.receive(data) / ex.receive(b"") -> [Observation, ...]       # fires response steps
        (the driver: ``receive(data, piecewise=True)``, handles the steps, ``faulty_framing()``,
        then ``more()`` while ``held``)
        ex.abort("peer_closed" | ...)                                  # on any early end
    """

    machine: ProtocolMachine
    conn: h11.Connection = field(default_factory=client_connection)
    hop: int = 1
    bytes_received: int = 0
    final_response_started: bool = False
    final_status: int | None = None
    informational_seen: list[int] = field(default_factory=list)
    body_bytes_received: int = 0
    request_body_bytes: int = 0
    request_body_cut: bool = False
    """The request body was not written whole: a complete final response read during the
    write answered the hop (``exchange._Hop.send_body``); the response head's facts say so."""
    proxy_judge: Callable[[int, tuple[tuple[str, str], ...]], bool] | None = None
    """Set by the driver: does this final response head come from a proxy about its own
    attempt?  Then the proxy_* events fire and the exchange can never complete."""
    head_echoed: Callable[[], str | None] | None = None
    """Set by the driver: does a response head received on this exchange (parsed, or bytes
    still unparsed) hold a secret?  Then ``response_bytes``, which counts the head, would
    measure it (docs/redaction.md, "What was received"): ``progress`` withholds it."""
    proxy_response: bool = False
    eof_ends_body: bool = False
    """Set by the driver: can the transport's end of stream prove a close-delimited body whole?
    Only TLS can (a ``close_notify``; ``connect.py`` opens it with ``https_compatible=False``).
    A TCP FIN cannot: a server that crashed, or a middlebox that cut the stream, sends the same
    FIN as one that finished (RFC 9112 §6.3 item 8), so such a body is never complete."""
    request_method: str = ""
    close_delimited: bool = False
    """The final response's body is delimited by the connection's close (RFC 9112 §6.3: no
    Transfer-Encoding, no Content-Length, a status and method that allow a body)."""
    http_version: str = ""
    """The final response's HTTP version as h11 parsed it (``"1.1"``, ``"1.0"``)."""
    held: bool = False
    """``receive(piecewise=True)`` stopped after a body piece: h11 may hold more events
    (``more``)."""
    stream_ended: bool = False
    """``receive(b"")`` was called: the transport's stream has ended, no byte can follow (a flag,
    not h11's ``trailing_data``, which copies its buffer on each look)."""
    heads: list[tuple[str, tuple[tuple[str, str], ...]]] = field(default_factory=list)
    """The reason and header fields of every response head parsed (interim and final), kept as
    it is parsed -- before any abort -- for ``head_echoed``."""
    head_bytes: bytearray = field(default_factory=bytearray)
    """The first ``HEAD_BYTES_KEPT`` bytes received while no final head was parsed (emptied at
    it): a head h11 refuses (a malformed field line) is taken out of its buffer before it is
    refused, so neither ``heads`` nor the unparsed bytes would show an echo in it."""
    framing_fault: str | None = None
    """The final head's framing is faulty (``_body_framing``): why.  The driver ends the
    exchange ``malformed`` once it has decided on the head (``faulty_framing``)."""
    unpoolable: bool = False
    """The final response is complete, but its connection may not be pooled (``reusable``): a
    HEAD, 204 or 304 answer carrying Transfer-Encoding."""
    interim_refused: bool = False
    """The interim (1xx) responses passed ``MAX_INFORMATIONAL`` or ``MAX_INFORMATIONAL_BYTES``:
    the exchange ended ``malformed`` with no final head parsed, and the bytes left unparsed are
    no sign of one (``response_started``)."""

    # -- setup --------------------------------------------------------------------------------

    def setup(self, event: str, facts: Mapping[str, Any] | None = None) -> Observation:
        step = self.machine.fire(event)
        return Observation(step, {"hop": self.hop, **(facts or {})})

    # -- request ------------------------------------------------------------------------------

    def start_request(
        self,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        *,
        has_body: bool,
        encoded: tuple[dict[str, Any], bytes] | None = None,
    ) -> tuple[Observation, bytes]:
        """Fire ``send_headers`` (the dispatch boundary) and return the head's bytes --
        ``encoded``'s, when ``encode_request`` already made them (while the gate's barrier
        committed).

        The caller must already have passed the dispatch gate when ``crosses_dispatch`` said so:
        unless the head was encoded ahead, h11 is told about the request only now, so a refused
        gate leaves a pooled connection untouched and reusable."""
        step = self.machine.fire("send_headers")
        facts, head = encoded or self.encode_request(method, target, headers, has_body=has_body)
        return Observation(step, facts), head

    def encode_request(
        self, method: str, target: str, headers: list[tuple[str, str]], *, has_body: bool
    ) -> tuple[dict[str, Any], bytes]:
        """The head's bytes and ``send_headers``'s facts, without firing it: h11 now holds the
        request as sent (the connection is of no use to another request until it is), the
        machine has not crossed the boundary.  Nothing is written."""
        self.request_method = method.upper()
        try:
            head = self.conn.send(
                h11.Request(method=method, target=target.encode("ascii"), headers=headers)
            )
        except h11.LocalProtocolError:
            # Our own request was unencodable; h11's message may quote a header value.
            raise ValueError("request head could not be encoded") from None
        assert head is not None
        # Not the head's size: it is the caller's own bytes plus the injected credential, and
        # the facts reach the record a caller reads -- the credential's length by subtraction.
        facts = {
            "hop": self.hop,
            "method": method,
            "header_names": sorted({n.lower() for n, _ in headers}),
            "expects_body": has_body,
        }
        return facts, head

    @property
    def untouched(self) -> bool:
        """h11 has not heard of a request on this cycle (a pooled connection stays usable)."""
        return self.conn.our_state is h11.IDLE

    def body_bytes(self, body: bytes) -> bytes:
        """The body plus its framing (Content-Length or chunked terminator), not yet sent."""
        out = b""
        if body:
            data = self.conn.send(h11.Data(data=body))
            out += data or b""
        out += self.conn.send(h11.EndOfMessage()) or b""
        self.request_body_bytes = len(body)
        return out

    def body_written(self) -> Observation:
        step = self.machine.fire("send_body")
        return Observation(step, {"hop": self.hop, "body_bytes": self.request_body_bytes})

    @property
    def awaiting_body(self) -> bool:
        """True while h11 still expects our request body (e.g. after ``Expect: 100-continue``)."""
        return self.conn.our_state is h11.SEND_BODY

    # -- response -----------------------------------------------------------------------------

    def receive(self, data: bytes, *, piecewise: bool = False) -> list[Observation]:
        """Feed bytes read from the transport (``b""`` = EOF) and fire every resulting step.

        ``piecewise``: stop after the first body piece (``held`` is then set; ``more`` fires the
        rest).  The driver decides on a piece (``max_result``) before the end of message that
        may follow it in the same read is fired: a body past the limit ends ``closed_early``
        whatever the read boundaries, never ``framing_complete`` first.

        A final head whose framing is faulty (``framing_fault``) is the last step returned:
        the driver judges it, then calls ``faulty_framing``.

        Raises ``FramingError`` after firing ``malformed`` or ``peer_closed`` when the response
        cannot complete; partial body bytes already returned were only ever *chunks* — the
        driver never presents them as a result (seed: "never present a partial body")."""
        self.bytes_received += len(data)
        if not data:
            self.stream_ended = True
        elif not self.final_response_started:
            room = HEAD_BYTES_KEPT - len(self.head_bytes)
            if room > 0:
                self.head_bytes += memoryview(data)[:room]  # one copy, not a slice and one
        try:
            self.conn.receive_data(data)
        except RuntimeError as e:  # data after EOF: our bug, not the peer's
            raise FramingError("bytes after end of stream") from e
        return self._pull(piecewise)

    def more(self) -> list[Observation]:
        """The steps of the events h11 holds past the body piece ``receive(piecewise=True)``
        stopped at (``held``), up to the next piece."""
        self.held = False
        return self._pull(True)

    def _pull(self, piecewise: bool) -> list[Observation]:
        out: list[Observation] = []
        while True:
            try:
                ev = self.conn.next_event()
            except h11.RemoteProtocolError as e:
                closed = self._receive_closed()
                self._fire_abort(out, "peer_closed" if closed else "malformed")
                raise FramingError(self._framing_reason(closed), out) from e
            if ev is h11.NEED_DATA or ev is h11.PAUSED:
                if ev is h11.PAUSED:
                    self._refuse_paused(out)
                if self.stream_ended:
                    # No byte can come after the end of stream: an exchange h11 left waiting
                    # there never ends, and a driver reading on would spin on a closed socket
                    # (each read ``b""`` at once) until its deadline.  (h11 0.16 raises for a
                    # message cut at EOF itself; this holds whatever state it waits in.)
                    self._fire_abort(out, "malformed")
                    raise FramingError("end of stream with the response unfinished", out)
                return out
            # By exact type: h11's event classes are ABCs, and an ``isinstance`` against one
            # costs an ``ABCMeta.__instancecheck__`` call (up to four per event, issue 15).
            # h11 makes these classes themselves, never subclasses; anything else is refused
            # below as it was.
            if type(ev) is h11.InformationalResponse:
                fields_ = tuple(
                    (n.decode("latin-1"), v.decode("latin-1")) for n, v in ev.headers.raw_items()
                )
                reason = ev.reason.decode("latin-1")
                self.heads.append((reason, fields_))  # before any abort: ``head_echoed``
                self._bound_interim(out)
                self.informational_seen.append(ev.status_code)
                step = self.machine.fire("informational")
                seen = {"hop": self.hop, "status": ev.status_code}
                out.append(Observation(step, seen, reason=reason, headers=fields_))
            elif type(ev) is h11.Response:
                self.final_response_started = True
                self.final_status = ev.status_code
                self.http_version = ev.http_version.decode("ascii", "replace")
                framing = _body_framing(self.request_method, ev)
                self.close_delimited = framing == "close"
                self.unpoolable = framing == "none_te"
                headers = tuple(
                    (n.decode("latin-1"), v.decode("latin-1")) for n, v in ev.headers.raw_items()
                )
                reason = ev.reason.decode("latin-1")
                # Kept before anything can abort (``head_echoed``); the copy of the bytes
                # before it is no longer needed: this head is parsed.
                self.heads.append((reason, headers))
                self.head_bytes = bytearray()
                self.proxy_response = bool(
                    self.proxy_judge and self.proxy_judge(ev.status_code, headers)
                )
                step = self.machine.fire(
                    "proxy_response_headers" if self.proxy_response else "response_headers"
                )
                facts = {
                    "hop": self.hop,
                    "status": ev.status_code,
                    "header_names": sorted({n.lower() for n, _ in headers}),
                    "content_coding": content_coding(headers),
                }
                if self.request_body_cut:
                    facts["request_body_cut"] = True
                out.append(
                    Observation(
                        step,
                        facts,
                        status=ev.status_code,
                        reason=reason,
                        headers=headers,
                    )
                )
                if framing in _FAULTY_FRAMING:
                    # Faulty framing: the head is recorded (its field names show why), its body
                    # is never read as a result, and the connection, its framing unknowable,
                    # never pooled.  Flagged, not aborted here: the driver decides on the head
                    # first (a refusal at it wins, ``redirects.py``), then ends the exchange
                    # (``faulty_framing``).
                    self.framing_fault = _FAULTY_FRAMING[framing]
                    return out
            elif type(ev) is h11.Data:
                # Not copied to ``bytes``: h11 made this bytearray for this event alone (a
                # slice of its buffer, or the buffer itself handed over: receive_buffer.py) and
                # nothing writes to it; the sink copies it once, into its stored chunks (issue 15).
                chunk = ev.data
                self.body_bytes_received += len(chunk)
                step = self.machine.fire("proxy_body" if self.proxy_response else "body")
                out.append(
                    Observation(
                        step,
                        {"hop": self.hop, "bytes": len(chunk), "total": self.body_bytes_received},
                        data=chunk,
                    )
                )
                if piecewise:
                    self.held = True
                    return out
            elif type(ev) is h11.EndOfMessage:
                if self.close_delimited and not self.eof_ends_body and not self.proxy_response:
                    # h11 ends a close-delimited body at EOF; over plain TCP that EOF proves
                    # nothing (seed: "never present a partial body as a complete remote
                    # result").  The body already streamed stays as chunks, never a result.
                    self._fire_abort(out, "peer_closed")
                    raise FramingError(
                        "close-delimited response body ended by a TCP close: completeness unproven",
                        out,
                    )
                step = self.machine.fire("proxy_end" if self.proxy_response else "end")
                out.append(
                    Observation(step, {"hop": self.hop, "body_bytes": self.body_bytes_received})
                )
                return out
            elif type(ev) is h11.ConnectionClosed:
                self._fire_abort(out, "peer_closed")
                raise FramingError("connection closed before a complete response", out)
            else:  # pragma: no cover - h11 emits no other client-side events
                raise FramingError(f"unexpected h11 event {type(ev).__name__}", out)

    def _bound_interim(self, out: list[Observation]) -> None:
        """Refuse an interim response past ``MAX_INFORMATIONAL``, or interim heads past
        ``MAX_INFORMATIONAL_BYTES`` (the bytes h11 has parsed so far: every one of them was a
        1xx head, no final one has come)."""
        if len(self.informational_seen) >= MAX_INFORMATIONAL:
            reason = f"more than {MAX_INFORMATIONAL} informational (1xx) responses"
        elif self.bytes_received - len(self.conn.trailing_data[0]) > MAX_INFORMATIONAL_BYTES:
            reason = f"informational (1xx) heads past {MAX_INFORMATIONAL_BYTES} bytes"
        else:
            return
        self.interim_refused = True
        self._fire_abort(out, "malformed")
        raise FramingError(reason, out)

    def _refuse_paused(self, out: list[Observation]) -> None:
        """h11 stops parsing (``PAUSED``) once the peer switched protocols -- a 2xx to CONNECT
        (RFC 9110 §9.3.6: the connection becomes a tunnel), a 101 to an Upgrade (§15.2.2) --
        and never reports an end of message: the exchange can never complete, so it ends
        ``malformed`` at the read that brought the switch, the stream open or not.  (h11 also
        pauses with a whole response read and bytes past it; ``_pull`` has returned at that
        end of message already.)  A target may not list CONNECT (``methods``), and callers may
        not send ``Upgrade``: this holds whatever reaches the exchange."""
        self._fire_abort(out, "malformed")
        raise FramingError("the peer switched protocols: no HTTP/1.1 response can complete", out)

    def faulty_framing(self) -> None:
        """Raise ``FramingError`` (after firing ``malformed``) when the final head's framing was
        faulty (``framing_fault``); the driver calls this once it has decided on the head."""
        fault = self.framing_fault
        if fault is None:
            return
        out: list[Observation] = []
        self._fire_abort(out, "malformed")
        raise FramingError(fault, out)

    def abort(self, event: str, facts: Mapping[str, Any] | None = None) -> Observation | None:
        """Record an early end (timeout, reset, cancellation) if the exchange is unfinished."""
        if not self.machine.allows(event):
            return None
        step = self.machine.fire(event)
        return Observation(step, {"hop": self.hop, **self.progress(), **(facts or {})})

    def refuse(self) -> Observation | None:
        """Fire ``refused``: the final head is a refusal the driver stops at (a hop sent without
        the credential), its body not read on -- or read already, when the whole response came
        in the head's read (h11 fired ``end``: ``framing_complete``, left for
        ``redirect_refused`` all the same, since that answer is not the result).  None only when
        the exchange ended otherwise first."""
        if not self.machine.allows("refused"):
            return None
        step = self.machine.fire("refused")
        return Observation(step, {"hop": self.hop, "body_bytes": self.body_bytes_received})

    def progress(self) -> dict[str, Any]:
        """Secret-free progress facts for an early end.  ``response_bytes`` counts the head:
        withheld (``received_withheld``) when the head echoed a secret (``head_echoed``)."""
        facts: dict[str, Any] = {
            "response_bytes": self.bytes_received,
            "final_response_started": self.response_started,
            "informational": list(self.informational_seen),
            "body_bytes": self.body_bytes_received,
        }
        word = self.head_echoed() if self.head_echoed is not None else None
        if word:
            # Null, not absent: the record merges a retry's summary over the last one's.
            facts["response_bytes"] = None
            facts["received_withheld"] = word
        return facts

    @property
    def finished(self) -> bool:
        """The final response (the origin's or a proxy's own) was fully framed."""
        return self.machine.state in ("framing_complete", "proxy_error_complete")

    @property
    def response_started(self) -> bool:
        """Did any byte of a *final* response arrive (parsed or still buffered)?  Decides
        REMOTE_RESULT_INCOMPLETE (a result was cut) versus REMOTE_OUTCOME_UNKNOWN (nothing of a
        result arrived)."""
        return self.final_response_started or (self._pending() and not self.interim_refused)

    @property
    def reusable(self) -> bool:
        """Both sides finished cleanly with keep-alive, the final response was fully framed
        (``finished``), the peer has not closed its side and nothing unasked-for was read past
        the response: the connection may go back to the pool.  (Bytes already in h11's buffer
        are invisible to the pool's readability check, and would answer the next request.)

        h11 alone is not enough: it ends a close-delimited HTTP/1.1 body at the peer's EOF with
        both sides ``DONE``, though the exchange ended ``closed_early`` (a TCP FIN proves no
        such body whole) and the stream is closed."""
        conn = self.conn
        return (
            conn.our_state is h11.DONE
            and conn.their_state is h11.DONE
            and self.finished
            and not self._receive_closed()
            and not self._pending()
            and not self.unpoolable
        )

    # -- internals ----------------------------------------------------------------------------

    def _pending(self) -> bool:
        data, _closed = self.conn.trailing_data
        return bool(data)

    def _receive_closed(self) -> bool:
        return bool(self.conn.trailing_data[1])

    def _framing_reason(self, closed: bool) -> str:
        if self.final_response_started:
            return "response body framing broken or cut short"
        if self._pending():
            return "response head cut short or malformed"
        return "connection closed before any response" if closed else "malformed response"

    def _fire_abort(self, out: list[Observation], event: str) -> None:
        obs = self.abort(event)
        if obs is not None:
            out.append(obs)
