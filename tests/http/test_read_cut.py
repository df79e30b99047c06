"""A connection whose read was cut short is never pooled (``Connection.read_cut``): over TLS,
OpenSSL may hold part of a record in its own buffer, which the check before the next request
cannot see -- it frames trio's buffer from a record boundary."""

from __future__ import annotations

import h11
import trio

from affidavit.adapters.http.connect import Connection
from affidavit.adapters.http.pool import Pool


async def _connection(scheme: str = "https") -> tuple[Connection, trio.SocketStream]:
    a, b = trio.socket.socketpair()
    ours = trio.SocketStream(a)
    key = (scheme, "127.0.0.1", 443, None, None)
    conn = Connection("http-1", key, ours, ours, h11.Connection(h11.CLIENT), None, None, False)
    return conn, trio.SocketStream(b)


async def test_a_connection_whose_read_was_cancelled_is_closed_not_pooled() -> None:
    conn, peer = await _connection()
    with trio.move_on_after(0.01) as scope:
        await conn.receive_some(100)  # nothing comes: the read is cancelled mid-way
    assert scope.cancelled_caught and conn.read_cut
    pool = Pool(max_per_origin=4, idle_timeout=60)
    pool.release(conn)
    assert pool.idle_connections() == 0 and conn.socket_stream.socket.fileno() == -1
    await peer.aclose()


async def test_a_connection_whose_reads_all_ended_is_pooled() -> None:
    conn, peer = await _connection()
    await peer.send_all(b"x")
    assert await conn.receive_some(100) == b"x" and not conn.read_cut
    pool = Pool(max_per_origin=4, idle_timeout=60)
    pool.release(conn)
    assert pool.idle_connections() == 1
    await pool.aclose()
    await peer.aclose()


async def test_a_tls_read_cut_then_completed_by_a_read_with_data_is_pooled() -> None:
    """The expect-continue wait cuts a read on purpose and then reads the response whole: the
    read that returns data ended the record, so the connection goes back to the pool."""
    conn, peer = await _connection()
    with trio.move_on_after(0.01):
        await conn.receive_some(100)
    assert conn.read_cut
    await peer.send_all(b"HTTP/1.1 200 OK")
    assert await conn.receive_some(100) and not conn.read_cut
    pool = Pool(max_per_origin=4, idle_timeout=60)
    pool.release(conn)
    assert pool.idle_connections() == 1
    await pool.aclose()
    await peer.aclose()


async def test_a_plain_tcp_read_cut_leaves_nothing_behind_and_marks_nothing() -> None:
    conn, peer = await _connection("http")
    with trio.move_on_after(0.01):
        await conn.receive_some(100)
    assert not conn.read_cut
    await conn.stream.aclose()
    await peer.aclose()
