"""A tiny request/ack/result protocol, for tests only.

It proves the ``ProtocolTable`` / ``ProtocolMachine`` base without HTTP or SSH: a connection is set
up, the request is written (the dispatch boundary), the peer acknowledges it, streams a result and
ends it (the completes transition).  It is deliberately *not* registered, so it never leaks into
``diagrams/``; tests that need it registered do so with ``monkeypatch``.
"""

from __future__ import annotations

from affidavit.statemachine import ProtocolTable

EXAMPLE = ProtocolTable(
    name="example",
    initial="idle",
    states={
        "idle": "nothing done yet",
        "connected": "transport up; nothing of the request written",
        "setup_failed": "the connection failed before any request byte was written",
        "request_sent": "the request was handed to the transport",
        "acked": "the peer acknowledged the request",
        "receiving": "result chunks are arriving",
        "complete": "the end-of-result marker arrived: the result is complete",
        "closed_early": "the peer closed after dispatch without a complete result",
        "closed": "closed after a complete result",
    },
    transitions={
        "idle": {"connect": "connected", "connect_failed": "setup_failed"},
        "connected": {"send_request": "request_sent", "close": "setup_failed"},
        "request_sent": {"ack": "acked", "close": "closed_early"},
        "acked": {"chunk": "receiving", "end": "complete", "close": "closed_early"},
        "receiving": {"chunk": "receiving", "end": "complete", "close": "closed_early"},
        "complete": {"close": "closed"},
    },
    dispatch=frozenset({("connected", "send_request")}),
    completes=frozenset({("acked", "end"), ("receiving", "end")}),
    final=frozenset({"setup_failed", "closed_early", "complete", "closed"}),
    milestones={"request_sent": "REQUEST_SENT", "acked": "REMOTE_RESPONSE_STARTED"},
    doc="request, ack, streamed result, end marker",
)
