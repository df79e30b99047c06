"""A stop or the caller's cancellation at every step of an SSH call (tests/broker's walk, over a
real sshd): the exec request leaves only after DISPATCH_STARTED is durable, and the record's
outcome agrees with what is on disk.

The command itself reads the journal file when it runs -- the DISPATCH_STARTED rows durable at
that moment -- and appends its call's number and that count to a marker file: a command that
ran before its barrier was durable would find fewer than the rows before its call plus its
own.  A call stopped after its exec leaves the command running: its line may come later, so
the lines are checked once the marker has stayed unchanged for a while (bounded).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
import trio

from tests.broker.helpers import open_broker, raw_kinds, write_config
from tests.broker.test_cancel_every_step import call_cancelled_at

from .brokerkit import ssh_target
from .sshd import Sshd

pytestmark = pytest.mark.usefixtures("key_env")


def _command(db: Path, marker: Path, k: int) -> str:
    count = (
        "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]+'?mode=ro',uri=True); "
        'print(sys.argv[2], c.execute("SELECT count(*) FROM events WHERE '
        "kind='DISPATCH_STARTED'\").fetchone()[0])"
    )
    argv = [sys.executable, "-c", count, f"file:{db}", str(k)]
    return " ".join(shlex.quote(a) for a in argv) + f" >> {shlex.quote(str(marker))}"


def _ran(marker: Path) -> list[tuple[int, int]]:
    """(call, DISPATCH_STARTED rows durable when its command ran), one per run."""
    if not marker.exists():
        return []
    pairs = [line.split() for line in marker.read_text().splitlines()]
    return [(int(k), int(n)) for k, n in pairs]


async def _settled(marker: Path) -> list[tuple[int, int]]:
    """The marker once no straggling command has added to it for 1 s (at most 20 s)."""
    with trio.fail_after(20):
        last = _ran(marker)
        while True:
            await trio.sleep(1)
            now = _ran(marker)
            if now == last:
                return now
            last = now


@pytest.mark.parametrize("when", ["blocked", "resuming"])
@pytest.mark.parametrize("how", ["stop", "caller"])
async def test_an_ssh_call_cancelled_at_any_step_never_execs_before_its_barrier(
    tmp_path: Path, sshd: Sshd, how: str, when: str
) -> None:
    db, marker = tmp_path / "journal.db", tmp_path / "ran"
    cfg = write_config(tmp_path, {"box": ssh_target(sshd.port, sshd.user, sshd.host_pin)})
    base: dict[int, int] = {}  # DISPATCH_STARTED rows before each call
    started: dict[int, bool] = {}  # each call's own DISPATCH_STARTED on disk
    async with open_broker(cfg) as broker:
        action = {"target": "box", "command": _command(db, marker, 0)}
        env, _, total = await call_cancelled_at(broker, action, 0, how, blocked=False)
        assert env is not None and "error" not in env, env
        assert _ran(marker) == [(0, 1)]  # uncancelled, the command ran after its barrier
        assert 5 < total < 400
        for k in range(1, total + 2):
            base[k] = raw_kinds(db).count("DISPATCH_STARTED")
            action = {"target": "box", "command": _command(db, marker, k)}
            env, iid, _ = await call_cancelled_at(broker, action, k, how, when == "blocked")
            if iid is None:
                assert env is None
                started[k] = False
                continue
            rec = broker.record(iid)
            assert rec is not None and rec.final, (k, rec)
            started[k] = "DISPATCH_STARTED" in raw_kinds(db, iid)
            assert (rec.outcome.value == "not_attempted") == (not started[k]), (k, rec.outcome)
            if env is not None and "error" in env:
                assert (env["error"]["outcome"] == "not_attempted") == (not started[k]), (k, env)
        assert broker.journal.verify().ok
    for k, durable in (await _settled(marker))[1:]:
        # call k's command ran: its barrier was durable before, and is on disk
        assert started[k] and durable >= base[k] + 1, (k, base[k], durable)
