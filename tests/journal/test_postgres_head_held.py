"""The refusal of a write whose wait for the chain head ran out (``PostgresBackend.begin``,
``_holder``), without a server: a connection that answers as a lost or hostile one would."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from affidavit.journal.errors import HeadHeld
from affidavit.journal.postgres import PostgresBackend, _holder


class _Rows:
    def __init__(self, row: Any) -> None:
        self.row = row

    def fetchone(self) -> Any:
        return self.row


class _Conn:
    """Refuses the head (lock_timeout); then ``lost``: every statement fails as on a dropped
    connection, else the holder's row is ``row``."""

    def __init__(self, *, lost: bool = False, row: Any = None) -> None:
        self.lost = lost
        self.row = row
        self.sent: list[str] = []

    def execute(self, sql: str, *args: Any) -> _Rows:
        self.sent.append(sql)
        if sql.startswith("BEGIN"):
            raise psycopg.errors.LockNotAvailable("canceling statement due to lock timeout")
        if self.lost:
            raise psycopg.OperationalError("the connection is lost")
        return _Rows(self.row)


def test_a_connection_lost_after_the_lock_timeout_is_still_refused_head_held() -> None:
    """The ROLLBACK after the lock timeout failing (the connection lost meanwhile) raised the
    driver's OperationalError instead of HeadHeld: the refusal is the head's, no holder named."""
    backend = PostgresBackend("postgresql://u@127.0.0.1/db")
    conn = _Conn(lost=True)
    with pytest.raises(HeadHeld) as refused:
        backend.begin(conn, barrier=True, wait=1.0)
    assert "ROLLBACK" in conn.sent
    assert "held by" not in str(refused.value) and "(1 s)" in str(refused.value)


def test_the_holder_s_role_name_is_shown_escaped() -> None:
    """A role's name is any text its creator chose (``CREATE ROLE "…"``): a terminal's
    escape sequence or a line break in it is shown escaped in the refusal, never acting."""
    name = "evil\x1b[2J\nrole"
    held = _holder(_Conn(row=(4242, name)))
    assert held.startswith("pid 4242, role evil") and "\x1b" not in held and "\n" not in held
    backend = PostgresBackend("postgresql://u@127.0.0.1/db")
    with pytest.raises(HeadHeld) as refused:
        backend.begin(_Conn(row=(4242, name)), barrier=True, wait=1.0)
    assert f"held by {held}" in str(refused.value)
