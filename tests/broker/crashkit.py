"""The processes of the crash matrix (``test_crash_matrix.py``):
``python -m tests.broker.crashkit CONFIG ACTION CUT WHEN KEYED`` from the repository root.

It forks (its imports done, no thread or event loop yet) a child that is the broker under test:
``Broker.open``, the public API, performs ACTION and SIGKILLs itself at the journal commit that
leaves CUT events on disk, through the journal's own ``around_transaction`` and
``before_commit`` hooks (no test hook in the broker): ``after`` -- right after that commit is
durable, before the writer answers anyone; ``before`` -- inside the next transaction, its rows
written and not committed, so the durable journal is the same as ``after``'s but whatever the
broker did between the two commits (sent the request, read the answer) has happened.  A call
with no such commit (the writer put rows of two steps into one transaction this time; or WHEN
``none``) ends normally and says ``{"commits": [events on disk after each commit], "envelope":
...}``.  The parent prints ``{"returncode": ..., "call": what the child said}`` once the child
is gone -- at once, with no interpreter to start: the dead child's lease is short.

Then it reads ``HOW`` on its stdin (``-``: nothing more) and, as fresh brokers, reads what the
dead one left.  While the dead process's lease runs (it ends ``LEASE`` after acceptance), one
reads the record, fetches the result and, ``KEYED``, calls the same action (same key) again.
Then the record is closed as docs/journal.md says: ``HOW`` ``expire`` -- once the lease has
ended, by a broker's ``recover()`` (any broker meeting it would); ``owner`` -- at once, by a
broker that opens the journal as its only writer (the daemon's start-up).  A last broker reads
the record, fetches the result and, ``KEYED``, calls once more; then ``affidavit journal
verify``, ``actions --json`` and ``record ID --json`` run.  Prints what it saw as JSON.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sqlite3
import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any

import trio

from affidavit import Broker
from affidavit.cli import main as cli_main
from affidavit.engine import EngineSettings
from affidavit.journal import Batch
from affidavit.statemachine import Record

LEASE_MARGIN = 0.2
TOTAL = 3.0
"""Every target's total timeout in the matrix: a lease is TOTAL + LEASE_MARGIN from acceptance."""
LEASE = TOTAL + LEASE_MARGIN
SETTINGS = EngineSettings(lease_margin=LEASE_MARGIN)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


async def _call(config: str, action: dict[str, Any], cut: int, when: str) -> dict[str, Any]:
    durable: list[int] = []  # events on disk after each commit

    def on_disk() -> int:
        return int(_count(broker, "SELECT count(*) FROM events"))

    @contextlib.contextmanager
    def around(batch: Batch) -> Iterator[None]:
        yield  # an exception here (a rolled-back transaction) skips the rest: no commit
        durable.append(on_disk())
        if when == "after" and durable[-1] == cut:
            _die()

    def before(batch: Batch) -> None:
        if when == "before" and durable and durable[-1] == cut:
            _die()

    async with Broker.open(config, settings=SETTINGS) as broker:
        broker.journal.around_transaction = around
        broker.journal.before_commit = before
        envelope = await broker.call(action)
    return {"commits": durable, "envelope": envelope}


def _summary(record: Record | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {
        "state": record.state,
        "final": record.final,
        "outcome": record.outcome.value,
        "phase": record.phase.value,
        "retry": record.retry.value,
        "dispatch_started": bool(record.evidence.get("dispatch_started")),
    }


async def _recover(config: str, action: dict[str, Any], keyed: bool, how: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with Broker.open(config, settings=SETTINGS) as broker:
        records = broker.journal.list_actions()
        iid = records[0].invocation_id if records else None
        out["iid"] = iid
        # The dead holder's lease ends LEASE after it accepted the call (or bound its key).
        ends = _lease_ends(broker, iid)
        record = broker.record(iid) if iid else None
        # The dead process held a lease unless the record it left was already closed.
        held = record is None or not record.final
        out["in_lease"] = {"record": _summary(record), "held": held}
        if iid is not None and held:
            out["in_lease"]["fetched"] = await broker.fetch_result(iid)
        if keyed and held:
            out["in_lease"]["call"] = await broker.call(action)
        out["in_lease"]["kinds"] = [e.kind.value for e in broker.events(iid)] if iid else []
        out["in_lease"]["done"] = time.time()
        out["in_lease"]["in_time"] = out["in_lease"]["done"] < ends - 0.05
        if how == "expire":
            # Its lease runs out: the next broker to meet the record closes it.
            await trio.sleep(max(0.0, ends + 0.1 - time.time()))
            out["recovered"] = [r.invocation_id for r in await broker.recover()]
    if how == "owner":
        # The daemon's start-up: the journal's only writer closes every record left open.
        async with Broker.open(config, settings=SETTINGS, owner="crash matrix") as broker:
            out["recovered"] = [r.invocation_id for r in await broker.recover()]
    async with Broker.open(config, settings=SETTINGS) as broker:
        if iid is not None:
            out["closed"] = _summary(broker.record(iid))
            out["fetched"] = await broker.fetch_result(iid)
        if keyed:
            out["retry"] = await broker.call(action)
            iid = out["retry"]["invocation_id"]
        out["kinds"] = [e.kind.value for e in broker.events(iid)] if iid else []
        out["last"] = _summary(broker.record(out["iid"])) if out["iid"] else None
    return out


def _lease_ends(broker: Broker, iid: str | None) -> float:
    """When the latest lease on ``iid`` ends, as its events say -- or, with no event yet, the
    lease window of the key bound first (docs/design-notes.md, "Same-key races")."""
    ends = None
    for event in broker.events(iid) if iid else []:
        at = event.attrs.get("lease_expires_at") or event.attrs.get("expires_at")
        if event.kind.value.endswith(("ACCEPTED", "LEASE_ACQUIRED")) and at is not None:
            ends = float(at)
    if ends is None:
        bound = _count(broker, "SELECT min(created_at) FROM idempotency")
        ends = float(bound) + LEASE
    return ends


def _count(broker: Broker, sql: str) -> Any:
    """One value read from the journal file by a read-only connection of its own."""
    db = sqlite3.connect(f"file:{broker.config.journal.location}?mode=ro", uri=True)
    try:
        return db.execute(sql).fetchone()[0]
    finally:
        db.close()


def main(argv: list[str]) -> None:
    config, action_file, cut, when, keyed = argv
    with open(action_file, encoding="utf-8") as f:
        action = json.load(f)
    print(json.dumps(_fork_call(config, action, int(cut), when)), flush=True)
    how = sys.stdin.readline().strip()
    if how in ("", "-"):
        return
    out = trio.run(_recover, config, action, keyed == "1", how)
    # The commands themselves, once every broker has closed: ``affidavit journal verify``,
    # and the views an operator reads the record with.
    out["verify"] = _cli(["journal", "verify", "--config", config])
    out["actions"] = _cli(["actions", "--json", "--config", config])
    if out["iid"] is not None:
        out["shown"] = _cli(["record", out["iid"], "--json", "--config", config])
    print(json.dumps(out))


def _fork_call(config: str, action: dict[str, Any], cut: int, when: str) -> dict[str, Any]:
    """The call, in a child process: its exit (``-9`` when it killed itself) and what it said."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the broker under test
        os.close(r)
        code = 1
        try:
            said = trio.run(_call, config, action, cut, when)
            with os.fdopen(w, "wb") as pipe:
                pipe.write(json.dumps(said).encode())
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        said_bytes = pipe.read()
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return {"returncode": code, "call": json.loads(said_bytes) if said_bytes else None}


def _cli(argv: list[str]) -> dict[str, Any]:
    """``affidavit ARGV`` in this process: its exit status and what it printed."""
    said, errs = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(errs):
        status = cli_main(argv)
    return {"exit": status, "said": said.getvalue(), "errors": errs.getvalue()}


if __name__ == "__main__":
    main(sys.argv[1:])
