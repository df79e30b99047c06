"""The HTTP protocol table and its sans-IO exchange, without sockets."""

from __future__ import annotations

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.adapters.http import HTTP_TABLE, FramingError, HttpExchange
from affidavit.adapters.http.machine import MAX_INFORMATIONAL, MAX_INFORMATIONAL_BYTES
from affidavit.statemachine import ProtocolMachine, ProtocolViolation, Step, registered
from tests.statemachine.lifecycle_helpers import protocol_paths, protocol_walks

ALL_EVENTS = sorted({ev for row in HTTP_TABLE.transitions.values() for ev in row})
PATHS = protocol_paths(HTTP_TABLE)
"""state -> the events that lead there from the initial state"""
PRE_DISPATCH_SETUP = {
    "idle",
    "dns_resolved",
    "tcp_connected",
    "proxy_tunnel_open",
    "tls_established",
    "connection_reused",
    "setup_failed",
    "abandoned",
}


def test_table_is_sound_and_registered() -> None:
    assert HTTP_TABLE.problems() == []
    assert registered()["http"] is HTTP_TABLE


def test_dispatch_is_the_first_request_byte_and_completion_is_end_of_final_response() -> None:
    assert {ev for _s, ev in HTTP_TABLE.dispatch} == {"send_headers"}
    assert {HTTP_TABLE.transitions[s][e] for s, e in HTTP_TABLE.dispatch} == {"headers_sent"}
    assert HTTP_TABLE.complete_states == frozenset({"framing_complete"})
    # 1xx never completes: no completes mark leaves the informational state.
    assert all(src != "informational" for src, _ in HTTP_TABLE.completes)


def test_setup_states_are_pre_dispatch_and_everything_after_headers_is_post_dispatch() -> None:
    post = HTTP_TABLE.post_dispatch
    assert PRE_DISPATCH_SETUP.isdisjoint(post)
    assert set(HTTP_TABLE.states) - PRE_DISPATCH_SETUP == set(post)


@given(st.sampled_from(sorted(HTTP_TABLE.states)), st.sampled_from(ALL_EVENTS))
def test_every_state_event_pair_lands_in_a_declared_state_or_is_refused(
    state: str, event: str
) -> None:
    # h2's shape: feed every (state, input) pair, the state reached through the table itself.
    m = ProtocolMachine(HTTP_TABLE)
    m.fire_all(PATHS[state])
    if event in HTTP_TABLE.transitions.get(state, {}):
        step = m.fire(event)
        assert step.dest in HTTP_TABLE.states
    else:
        with pytest.raises(ProtocolViolation):
            m.fire(event)
        assert m.state == state


@settings(max_examples=300)
@given(protocol_walks(HTTP_TABLE))
def test_random_walks_never_return_before_dispatch(events: list[str]) -> None:
    _check_walk(events)


def test_the_walks_checks_hold_on_every_edge() -> None:
    # The walk above follows enabled transitions; this proves its checks hold on every edge of
    # the table (each reached by its shortest path), whatever a run happens to draw.
    taken: set[tuple[str, str, str]] = set()
    for src, ev, _dst in HTTP_TABLE.edges():
        taken |= _check_walk([*PATHS[src], ev])
    assert taken == set(HTTP_TABLE.edges())


def _check_walk(events: list[str]) -> set[tuple[str, str, str]]:
    """Fire ``events`` (refused ones leave the state as it was); return the edges taken."""
    m = ProtocolMachine(HTTP_TABLE)
    was_dispatched = False
    taken = set()
    steps: list[Step] = []
    for ev in events:
        before = m.state
        if not m.allows(ev):
            with pytest.raises(ProtocolViolation):
                m.fire(ev)
            assert m.state == before
            continue
        steps.append(m.fire(ev))
        taken.add((before, ev, m.state))
        if was_dispatched:
            assert m.state in HTTP_TABLE.post_dispatch
            assert m.dispatched
        was_dispatched = m.dispatched
        if m.complete:
            assert any(s.dest == "framing_complete" for s in steps)
    return taken


def _exchange() -> tuple[ProtocolMachine, HttpExchange]:
    m = ProtocolMachine(HTTP_TABLE)
    ex = HttpExchange(m)
    ex.setup("resolve")
    ex.setup("connect")
    return m, ex


def _send_get(m: ProtocolMachine, ex: HttpExchange) -> None:
    assert m.crosses_dispatch("send_headers")
    obs, head = ex.start_request("GET", "/", [("Host", "example")], has_body=False)
    assert obs.step.crossed_dispatch and head.startswith(b"GET / HTTP/1.1\r\n")
    ex.body_bytes(b"")
    ex.body_written()


def test_complete_response_fires_completion_and_leaves_connection_reusable() -> None:
    m, ex = _exchange()
    _send_get(m, ex)
    obs = ex.receive(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Request-Id: r1\r\n\r\nhel")
    assert [o.step.event for o in obs] == ["response_headers", "body"]
    assert obs[0].status == 200 and ("X-Request-Id", "r1") in obs[0].headers
    assert obs[0].facts["header_names"] == ["content-length", "x-request-id"]
    assert not m.complete
    obs = ex.receive(b"lo")
    assert [o.step.event for o in obs] == ["body", "end"]
    assert m.complete and m.state == "framing_complete" and ex.reusable
    assert b"".join(o.data for o in obs) == b"lo"


def test_informational_response_does_not_complete() -> None:
    m, ex = _exchange()
    _send_get(m, ex)
    obs = ex.receive(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n")
    assert [o.step.event for o in obs] == ["informational"]
    assert not m.complete and ex.informational_seen == [103]
    assert not ex.response_started


def test_interim_responses_past_the_bound_are_malformed_not_a_started_result() -> None:
    """``MAX_INFORMATIONAL`` 1xx answers pass; the next makes the exchange malformed.  No final
    head was parsed: the flood still unparsed is no sign of one (``response_started``), and the
    statuses kept are the bound's number -- however many the peer sent in the same read."""
    m, ex = _exchange()
    _send_get(m, ex)
    head = b"HTTP/1.1 102 Processing\r\n\r\n"
    with pytest.raises(FramingError) as info:
        ex.receive(head * (MAX_INFORMATIONAL + 50))
    assert info.value.observations[-1].step.event == "malformed" and m.state == "closed_early"
    assert ex.informational_seen == [102] * MAX_INFORMATIONAL
    assert not ex.response_started and ex.progress()["final_response_started"] is False
    assert str(info.value) == f"more than {MAX_INFORMATIONAL} informational (1xx) responses"


def test_the_bound_number_of_interim_responses_still_reaches_the_final_one() -> None:
    m, ex = _exchange()
    _send_get(m, ex)
    ex.receive(b"HTTP/1.1 102 Processing\r\n\r\n" * MAX_INFORMATIONAL)
    ex.receive(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    assert m.complete and ex.informational_seen == [102] * MAX_INFORMATIONAL


def test_interim_heads_past_their_byte_bound_are_malformed() -> None:
    """Few interim heads, each under h11's own 16 KiB, together past
    ``MAX_INFORMATIONAL_BYTES``: the head that crosses it is refused."""
    m, ex = _exchange()
    _send_get(m, ex)
    big = b"HTTP/1.1 103 Early Hints\r\nLink: <" + b"a" * 12_000 + b">\r\n\r\n"
    crossing = MAX_INFORMATIONAL_BYTES // len(big) + 1
    assert crossing < MAX_INFORMATIONAL
    with pytest.raises(FramingError) as info:
        for _ in range(crossing):
            ex.receive(big)
    assert ex.informational_seen == [103] * (crossing - 1)
    assert m.state == "closed_early" and not ex.response_started
    assert "heads past" in str(info.value)


def test_close_before_any_response_is_not_a_cut_result() -> None:
    m, ex = _exchange()
    _send_get(m, ex)
    with pytest.raises(FramingError):
        ex.receive(b"")
    assert m.state == "closed_early" and m.dispatched and not m.complete
    assert not ex.response_started


@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/1.1 200 OK\r\nContent-Le",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n5\r\nab",
    ],
    ids=["mid-headers", "mid-body-length", "mid-body-chunked"],
)
def test_cut_responses_end_closed_early_with_a_started_result(data: bytes) -> None:
    m, ex = _exchange()
    _send_get(m, ex)
    ex.receive(data)
    with pytest.raises(FramingError) as info:
        ex.receive(b"")
    assert m.state == "closed_early" and not m.complete
    assert ex.response_started
    assert "HTTP/1.1" not in str(info.value)


def test_malformed_framing_fires_malformed_without_eof() -> None:
    m, ex = _exchange()
    _send_get(m, ex)
    with pytest.raises(FramingError) as info:
        ex.receive(b"HTTP/1.1 200 OK\r\nContent-Length: nope\r\n\r\n")
    assert info.value.observations[-1].step.event == "malformed" and m.state == "closed_early"


def test_expect_continue_body_follows_the_100() -> None:
    m, ex = _exchange()
    ex.start_request(
        "POST",
        "/",
        [("Host", "x"), ("Content-Length", "3"), ("Expect", "100-continue")],
        has_body=True,
    )
    assert ex.awaiting_body
    obs = ex.receive(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert m.state == "informational" and [o.step.event for o in obs] == ["informational"]
    assert ex.body_bytes(b"abc").endswith(b"abc")
    ex.body_written()
    assert m.state == "body_sent"
    ex.receive(b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n")
    assert m.complete


def test_abort_is_ignored_once_complete_and_recorded_before() -> None:
    m, ex = _exchange()
    _send_get(m, ex)
    obs = ex.abort("timed_out")
    assert obs is not None and m.state == "closed_early"
    assert obs.facts["response_bytes"] == 0
    m2, ex2 = _exchange()
    _send_get(m2, ex2)
    ex2.receive(b"HTTP/1.1 204 No Content\r\n\r\n")
    assert ex2.abort("timed_out") is None and m2.state == "framing_complete"


def test_gate_refusal_before_request_leaves_h11_idle() -> None:
    m = ProtocolMachine(HTTP_TABLE)
    ex = HttpExchange(m)
    ex.setup("reuse")
    ex.setup("gate_refused")
    assert m.state == "abandoned" and not m.dispatched
    assert ex.conn.our_state is h11.IDLE


def test_a_proxys_own_complete_error_never_completes() -> None:
    m, ex = _exchange()
    ex.proxy_judge = lambda status, headers: status == 502
    _send_get(m, ex)
    obs = ex.receive(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 2\r\n\r\nno")
    assert [o.step.event for o in obs] == ["proxy_response_headers", "proxy_body", "proxy_end"]
    assert m.state == "proxy_error_complete" and ex.finished
    assert not m.complete and m.dispatched


def test_an_unencodable_head_s_error_carries_nothing_of_h11_s_message() -> None:
    """h11's refusal of a head may quote a header value -- the injected credential's; the error
    raised instead neither says it nor chains it (a traceback would print the cause)."""
    canary = "canary-4f1d-secret"
    _, ex = _exchange()
    ex.conn.send = lambda event: (_ for _ in ()).throw(  # type: ignore[method-assign]
        h11.LocalProtocolError(f"Illegal header value b'Bearer {canary}'")
    )
    with pytest.raises(ValueError) as info:
        ex.start_request("GET", "/", [("Host", "example")], has_body=False)
    assert canary not in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def _steps(reads: list[bytes], *, piecewise: bool) -> tuple[list[tuple[str, bytes]], str, bool]:
    """Every step and body piece ``reads`` fire, in order, as the driver takes them
    (``piecewise``: ``receive`` then ``more`` while ``held``) or in one go per read."""
    m, ex = _exchange()
    _send_get(m, ex)
    out: list[tuple[str, bytes]] = []
    try:
        for data in reads:
            out += [(o.step.event, o.data) for o in ex.receive(data, piecewise=piecewise)]
            for _ in range(64):  # bounded: a few pieces per read here
                if not ex.held:
                    break
                out += [(o.step.event, o.data) for o in ex.more()]
            assert not ex.held
    except FramingError as e:
        out += [(o.step.event, o.data) for o in e.observations]
        out.append(("FramingError", b""))
    return out, m.state, ex.reusable


@pytest.mark.parametrize(
    "reads",
    [
        [b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcHTTP/1.1 200 OK\r\n\r\n"],
        [b"HTTP/1.1 103 EH\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"],
        [
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2\r\nde\r\n0\r\nX: 1\r\n\r\n"
        ],
        [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nZZ\r\n"],
        [b"HTTP/1.1 200 OK\r\n\r\nabc", b""],
        [b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc", b"def", b""],
        [b"HTTP/1.1 204 No Content\r\n\r\nxyz"],
        [b"HTTP/1.1 302 Found\r\nLocation: /b\r\nContent-Length: 2\r\n\r\nhi"],
    ],
    ids=["extra", "1xx-final", "chunked-trailers", "chunked-bad", "close", "cut", "204", "302"],
)
def test_piecewise_fires_the_same_steps_once_each_and_leaves_nothing_held(
    reads: list[bytes],
) -> None:
    """Taken a piece at a time, a read fires exactly the steps it fires in one go (none lost,
    none fired twice), ``held`` cleared once h11 has nothing more."""
    assert _steps(reads, piecewise=True) == _steps(reads, piecewise=False)


def test_piecewise_stops_after_a_piece_before_the_end_of_message_read_with_it() -> None:
    m, ex = _exchange()
    _send_get(m, ex)
    obs = ex.receive(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc", piecewise=True)
    assert [o.step.event for o in obs] == ["response_headers", "body"] and ex.held
    assert m.state == "body" and m.allows("result_size_limit")
    assert [o.step.event for o in ex.more()] == ["end"] and not ex.held
    assert m.state == "framing_complete"


def test_a_close_delimited_body_cut_by_a_fin_leaves_the_connection_unreusable() -> None:
    """h11 ends an HTTP/1.1 body without Content-Length or Connection: close at the peer's EOF
    with both sides DONE; the exchange ended ``closed_early`` there, and ``reusable`` says so
    on its own (not only because the driver closes on ``FramingError``)."""
    m, ex = _exchange()
    _send_get(m, ex)
    ex.receive(b"HTTP/1.1 200 OK\r\n\r\nabc")
    with pytest.raises(FramingError):
        ex.receive(b"")
    assert ex.conn.our_state is h11.DONE and ex.conn.their_state is h11.DONE
    assert m.state == "closed_early" and not ex.reusable


@pytest.mark.parametrize("proxy", [False, True], ids=["origin-over-tls", "proxy-error"])
def test_a_response_complete_at_the_peer_s_close_is_not_reusable(proxy: bool) -> None:
    """A close-delimited body proven whole at EOF (TLS's close_notify; a proxy's own error)
    completes its framing, but the peer has closed: the connection is not pooled."""
    m, ex = _exchange()
    ex.eof_ends_body = not proxy
    ex.proxy_judge = lambda status, headers: proxy
    _send_get(m, ex)
    ex.receive(b"HTTP/1.1 502 Bad Gateway\r\n\r\nabc")
    assert [o.step.event for o in ex.receive(b"")] == ["proxy_end" if proxy else "end"]
    assert ex.finished and ex.conn.their_state is h11.DONE
    assert not ex.reusable
