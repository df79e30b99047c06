"""The crash matrix, end to end (seed, "Tests": "Terminate the broker between every pair of
durable transitions, and verify that recovery never claims ``not_attempted`` after
``DISPATCH_STARTED``").

A real broker process (``Broker.open``, forked by ``crashkit``) performs one call and SIGKILLs
itself at a journal commit -- through the journal's own ``around_transaction`` /
``before_commit`` hooks -- at every commit the call makes: right after it, and, from the last
commit before DISPATCH_STARTED on, inside the next transaction (the same durable journal, but
the request may have been sent).  ``Scenario.points`` names the commit points; the uncut call's
commits must all be among them.  Then, for each cut, this test and fresh brokers (in the
``crashkit`` process that forked the dead one) check against what the journal on disk holds:

* the events on disk are exactly the uncut call's up to the cut, and nothing was sent before
  this process's DISPATCH_STARTED was durable;
* while the dead process's lease runs, a fetch and a same-key call answer IN_PROGRESS with the
  outcome so far (never ``not_attempted`` after DISPATCH_STARTED), write nothing, send nothing;
* the record is then closed as docs/journal.md says -- after the lease by any broker's
  ``recover()``, or at once by a broker opening the journal as its only writer (the daemon's
  start-up) -- with exactly what the events prove: ``not_attempted`` / ``backoff`` without
  DISPATCH_STARTED, ``unknown`` with the scenario's hint (``same_idempotency_key``,
  ``reconcile``) after it without RESULT_COMMITTED, the stored result after RESULT_COMMITTED;
* a same-key retry then sends again exactly when that hint allows it (the loopback server and
  sshd record when they ran each action), and ``affidavit journal verify`` passes;
* ``affidavit actions --json`` and ``record ID --json`` say what the record says, and no form
  of the credential is in the journal, an answer or a process's output.

Scenarios: a plain GET; a POST under an idempotency contract; the same-key retry of such a POST
whose first attempt was cut off unanswered (cuts between its RETRY_LEASE_ACQUIRED and its
result); an SSH command on the real sshd (``idempotency_key`` without a remote contract).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit import Broker
from tests.external import SSHD
from tests.http.hostile import HostileServer, Peer, Reply
from tests.ssh.brokerkit import KEY_ENV, leaked, ssh_target
from tests.ssh.sshd import Sshd, SshdUnavailable, make_keys, start_sshd

from .crashkit import SETTINGS, TOTAL
from .helpers import TOKEN_ENV, http_target, raw_kinds, write_config
from .server_process import REPO

LIMIT = 20
"""Seconds any one process of the matrix may take."""
PARALLEL = 3
MISSES = 12
"""Runs of one cut that may put the rows on either side of it into one transaction."""


HTTP_POINTS = ["CREDENTIAL_AUTHORIZED", "DISPATCH_STARTED", "RESULT_COMMITTED", "RESULT_DELIVERED"]
SSH_POINTS = HTTP_POINTS


@dataclass
class Scenario:
    name: str
    keyed: bool
    after_dispatch: str
    """The retry hint of a dispatched call with no result."""
    points: list[str]
    """The last event on disk at each commit point of the call ("": the key bound, no event)."""
    target: dict[str, Any]
    action: Callable[[str], dict[str, Any]]
    """The action of one cut, given its label."""
    ran: Callable[[str], list[float]]
    """When the remote ran the action of that label (wall clock, each time)."""
    env: dict[str, str]
    leaks: Callable[[bytes], list[bytes]] = lambda blob: []
    """The forms of the credential found in ``blob``: none may be in a journal or an answer."""
    prepare: Callable[[Path, dict[str, Any]], Awaitable[None]] | None = None
    """Run before the killed process, in this one: the attempt the killed process retries."""


@dataclass
class Cut:
    n: int
    when: str


class _Kit:
    """One ``crashkit`` process: first the call it forks (and which kills itself), then the
    recovery it runs when told how."""

    def __init__(self, proc: trio.Process, errors: Path) -> None:
        self.proc, self.errors, self.buf = proc, errors, b""

    async def call(self) -> dict[str, Any]:
        """``{"returncode", "call"}`` once the forked broker is gone."""
        assert self.proc.stdout is not None
        with trio.fail_after(LIMIT):
            while b"\n" not in self.buf:
                chunk = await self.proc.stdout.receive_some()
                assert chunk, self.errors.read_text()
                self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        said: dict[str, Any] = json.loads(line)
        return said

    async def recover(self, how: str) -> bytes:
        """Tell it ``how`` to recover (``-``: not at all); what it printed once it exited."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with trio.fail_after(LIMIT):
            await self.proc.stdin.send_all(how.encode() + b"\n")
            await self.proc.stdin.aclose()
            while chunk := await self.proc.stdout.receive_some():
                self.buf += chunk
            await self.proc.wait()
        assert self.proc.returncode == 0, self.errors.read_text()
        return self.buf


@contextlib.asynccontextmanager
async def _kit(sc: Scenario, cfg: Path, action: Path, cut: Cut | None) -> AsyncIterator[_Kit]:
    n, when = (0, "none") if cut is None else (cut.n, cut.when)
    argv = [str(cfg), str(action), str(n), when, "1" if sc.keyed else "0"]
    errors = cfg.parent / "crashkit.err"
    with errors.open("wb") as err:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "tests.broker.crashkit", *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            env=sc.env,
            cwd=REPO,
        )
    try:
        yield _Kit(proc, errors)
    finally:
        with trio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    await pipe.aclose()


async def _setup(tmp: Path, sc: Scenario, label: str) -> tuple[Path, Path]:
    tmp.mkdir()
    cfg = write_config(tmp, {"t": sc.target})
    action = tmp / "action.json"
    action.write_text(json.dumps(sc.action(label)), encoding="utf-8")
    if sc.prepare is not None:
        await sc.prepare(cfg, sc.action(label))
    return cfg, action


async def _uncut(tmp: Path, sc: Scenario) -> tuple[list[int], list[str], dict[str, Any]]:
    """The call without a cut: events on disk after each commit, its events, its envelope."""
    cfg, action = await _setup(tmp, sc, "uncut")
    before = len(sc.ran("uncut"))
    async with _kit(sc, cfg, action, None) as kit:
        done = await kit.call()
        await kit.recover("-")
    assert done["returncode"] == 0, done
    out = done["call"]
    assert "error" not in out["envelope"], out
    assert len(sc.ran("uncut")) == before + 1
    return out["commits"], raw_kinds(tmp / "journal.db"), out["envelope"]


async def _cut(
    tmp: Path, sc: Scenario, cut: Cut, uncut_kinds: list[str], uncut: dict[str, Any]
) -> None:
    for attempt in range(MISSES):
        label = f"{cut.when}-{cut.n}-{attempt}"
        if await _cut_once(tmp, sc, cut, label, uncut_kinds, uncut):
            return
    pytest.fail(f"{sc.name}: no run left exactly {cut.n} events at a commit in {MISSES} tries")


async def _cut_once(
    tmp: Path, sc: Scenario, cut: Cut, label: str, uncut_kinds: list[str], uncut: dict[str, Any]
) -> bool:
    """One run cut at ``cut``: False if this run never left that many events at a commit
    (it put two steps' rows into one transaction: the writer batches what is queued)."""
    cfg, action = await _setup(tmp / label, sc, label)
    db = tmp / label / "journal.db"
    prepared, before = len(raw_kinds(db)) if db.exists() else 0, len(sc.ran(label))
    async with _kit(sc, cfg, action, cut) as kit:
        died = await kit.call()
        if died["returncode"] == 0:
            assert cut.n not in died["call"]["commits"], died
            await kit.recover("-")
            return False
        assert died["returncode"] == -signal.SIGKILL, (label, died)
        kinds = raw_kinds(db)
        where = f"{sc.name} {label}: {kinds}"
        # The durable journal is the uncut call's, cut at a commit.
        assert kinds == uncut_kinds[: cut.n], where
        dispatched = "DISPATCH_STARTED" in kinds  # by this process, or by the attempt before
        committed = "RESULT_COMMITTED" in kinds
        sent = len(sc.ran(label)) - before  # by this process
        # Nothing leaves before its DISPATCH_STARTED is durable; a complete result was received.
        if committed:
            assert sent == 1, where
        assert sent <= (1 if "DISPATCH_STARTED" in kinds[prepared:] else 0), where
        # One cut per call waits out the dead holder's lease (and a key bound with no event
        # yet is the binder's until its lease window ends); the others are recovered as the
        # daemon does at start-up.
        waits = kinds[-1:] in ([], ["DISPATCH_STARTED"]) and cut.when == "after"
        out = await kit.recover("expire" if waits else "owner")
    seen = json.loads(out)
    (tmp / label / "seen.json").write_bytes(out)
    lease = seen["in_lease"]
    # Open unless a result was stored or the attempt was closed (by the attempt before).
    final = committed or kinds[-1:] == ["ATTEMPT_INTERRUPTED"]
    assert lease["held"] == (not final), (where, lease)
    # The phase is the current attempt's last proven boundary (a retry's starts at its lease).
    attempt = (
        kinds[_last(kinds, "RETRY_LEASE_ACQUIRED") :] if "RETRY_LEASE_ACQUIRED" in kinds else kinds
    )
    phase = "remote_execution" if "DISPATCH_STARTED" in attempt else "connection_setup"
    if kinds:
        left = lease["record"]
        assert left is not None, where
        if dispatched:
            assert left["outcome"] != "not_attempted", (where, left)
        assert (left["final"], left["phase"]) == (final, phase), (where, left)
    if lease["held"]:
        assert lease["in_time"], f"{where}: the fresh broker came too late to see the lease"
        # Read while the dead holder's lease runs: in progress, and nothing written.
        assert lease["kinds"] == kinds, where
        if kinds:
            err = lease["fetched"]["error"]
            assert (err["code"], err["retry"]) == ("IN_PROGRESS", "fetch_result"), (where, err)
            assert err["phase"] == phase, (where, err)
            assert err["outcome"] == ("unknown" if dispatched else "not_attempted"), (where, err)
    if sc.keyed and lease["held"]:
        env = lease["call"]
        err = env["error"]
        assert (err["code"], err["retry"]) == ("IN_PROGRESS", "fetch_result"), (where, err)
        assert err["outcome"] == ("unknown" if dispatched else "not_attempted"), (where, err)
        ran = [t for t in sc.ran(label) if t <= lease["done"]]
        assert len(ran) == before + sent, f"{where}: a same-key call within the lease sent again"

    if kinds:
        closed = seen["closed"]
        assert seen["recovered"] == ([] if final else [seen["iid"]]), (where, seen)
        fetched = seen["fetched"]
        assert (closed["final"], closed["phase"]) == (True, phase), (where, closed)
        if not final:  # closed by recovery, with what the current attempt proves
            code = "REMOTE_OUTCOME_UNKNOWN" if "DISPATCH_STARTED" in attempt else "SETUP_FAILED"
            assert fetched["error"]["code"] == code, (where, fetched)
            assert fetched["error"]["phase"] == phase, (where, fetched)
        if committed:
            assert closed["outcome"] == "committed", (where, closed)
            assert "error" not in fetched, (where, fetched)
            assert _essence(fetched["result"]) == _essence(uncut["result"]), (where, fetched)
        elif dispatched:
            assert closed["outcome"] == "unknown", (where, closed)
            assert closed["dispatch_started"], (where, closed)
            assert closed["retry"] == sc.after_dispatch, (where, closed)
            assert fetched["error"]["outcome"] == "unknown", (where, fetched)
            assert fetched["error"]["retry"] == sc.after_dispatch, (where, fetched)
        else:
            assert closed["outcome"] == "not_attempted", (where, closed)
            assert closed["retry"] == "backoff", (where, closed)
            assert fetched["error"]["retry"] == "backoff", (where, fetched)
    if sc.keyed:
        env = seen["retry"]
        resend = not committed and (not dispatched or sc.after_dispatch == "same_idempotency_key")
        if resend or committed:
            assert "error" not in env, (where, env)
        else:
            assert env["error"]["outcome"] == "unknown", (where, env)
            assert env["error"]["retry"] == sc.after_dispatch, (where, env)
        assert len(sc.ran(label)) == before + sent + (1 if resend else 0), where
    assert seen["verify"]["exit"] == 0, (where, seen["verify"])
    files = b"".join(p.read_bytes() for p in (tmp / label).iterdir() if p.name != "journal.db.key")
    errors = (tmp / label / "crashkit.err").read_bytes()
    assert sc.leaks(files + out + json.dumps(died).encode() + errors) == [], where
    # What an operator's views say of the record, read from the journal as it ends.
    assert seen["actions"]["exit"] == 0, (where, seen["actions"])
    if kinds:
        assert seen["shown"]["exit"] == 0, (where, seen["shown"])
        shown = json.loads(seen["shown"]["said"])["record"]
        (row,) = [
            r for r in json.loads(seen["actions"]["said"]) if r["invocation_id"] == seen["iid"]
        ]
        last = seen["last"]
        assert (shown["outcome"], shown["phase"]) == (last["outcome"], last["phase"]), (
            where,
            shown,
        )
        assert row["outcome"] == last["outcome"], (where, row)
        if dispatched:
            assert "not_attempted" not in (shown["outcome"], row["outcome"]), (where, shown, row)
    return True


def _last(kinds: list[str], kind: str) -> int:
    """How many events there are up to the last ``kind``."""
    return len(kinds) - kinds[::-1].index(kind)


def _essence(result: dict[str, Any]) -> dict[str, Any]:
    """What two runs of the same call must agree on (not timings, connections, hops)."""
    return {k: result.get(k) for k in ("status", "body", "exit_status", "stdout")}


async def _matrix(tmp: Path, sc: Scenario) -> None:
    commits, uncut_kinds, uncut = await _uncut(tmp / "uncut", sc)
    assert uncut_kinds[-1] == "RESULT_DELIVERED", uncut_kinds
    # Where the matrix cuts: after each step the engine commits on its own (a barrier, or the
    # preflight before one).  The uncut call's commits must all be among them: a new commit
    # point in the engine fails here until the matrix covers it.
    points = sorted({0 if k == "" else _last(uncut_kinds, k) for k in sc.points})
    assert set(commits) <= set(points), (commits, points, uncut_kinds)
    dispatch = _last(uncut_kinds, "DISPATCH_STARTED")
    cuts = [Cut(n, "after") for n in points]
    # Inside the next transaction, from the last commit before DISPATCH_STARTED on.
    first = points[max(0, points.index(dispatch) - 1)]
    cuts += [Cut(n, "before") for n in points if n >= first][:-1]
    limiter = trio.CapacityLimiter(PARALLEL)

    async def one(cut: Cut) -> None:
        async with limiter:
            await _cut(tmp, sc, cut, uncut_kinds, uncut)

    async with trio.open_nursery() as nursery:
        for cut in cuts:
            nursery.start_soon(one, cut)


@pytest.mark.parametrize("kind", ["get", "post", "post_retry"])
async def test_http_call_killed_at_every_commit(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``post_retry``: the killed process is a same-key retry of a POST whose first attempt
    (made here) was sent and cut off unanswered: unknown, with DISPATCH_STARTED already in the
    record before the retry's RETRY_LEASE_ACQUIRED."""
    arrived: dict[str, list[float]] = {}

    async def api(peer: Peer) -> None:
        while (req := await peer.read_request()) is not None:
            arrived.setdefault(req.target, []).append(time.time())
            if kind == "post_retry" and len(arrived[req.target]) == 1:
                await peer.reset()
                return
            await peer.respond(Reply(200, body=b'{"id":"obj_1"}'))

    token = "crash-" + os.urandom(8).hex()
    monkeypatch.setenv(TOKEN_ENV, token)
    async with HostileServer.running(api) as srv:

        def ran(label: str) -> list[float]:
            return arrived.get(f"/c/{label}", [])

        def action(label: str) -> dict[str, Any]:
            if kind == "get":
                return {"target": "t", "method": "GET", "path": f"/c/{label}"}
            return {
                "target": "t",
                "method": "POST",
                "path": f"/c/{label}",
                "body": '{"amount":1}',
                "idempotency_key": f"key-{label}",
            }

        async def first_attempt(cfg: Path, action: dict[str, Any]) -> None:
            async with Broker.open(cfg, settings=SETTINGS) as broker:
                envelope = await broker.call(action)
            assert envelope["error"]["outcome"] == "unknown", envelope
            assert envelope["error"]["retry"] == "same_idempotency_key", envelope

        target = http_target(
            srv.url,
            methods=["GET", "POST"],
            idempotent=["GET"],
            timeout={"connect": 1, "total": TOTAL},
            idempotency={"header": "Idempotency-Key", "scope": "c", "retention": "1h"},
        )
        points = {
            "get": HTTP_POINTS,
            "post": ["", *HTTP_POINTS],
            # The retry first commits the binding it found (no event), then its lease.
            "post_retry": ["ATTEMPT_INTERRUPTED", "RETRY_LEASE_ACQUIRED", *HTTP_POINTS],
        }[kind]
        sc = Scenario(
            kind,
            kind != "get",
            "backoff" if kind == "get" else "same_idempotency_key",  # GET is idempotent
            points,
            target,
            action,
            ran,
            {**os.environ, TOKEN_ENV: token},
            lambda blob: [token.encode()] if token.encode() in blob else [],
            first_attempt if kind == "post_retry" else None,
        )
        with trio.fail_after(120):
            await _matrix(tmp_path, sc)
    if kind != "get":
        # Every request of a key carried that key.
        assert all(r.header("Idempotency-Key") == "key-" + r.target[3:] for r in srv.requests)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sshd, bytes]]:
    keys = make_keys(tmp_path_factory.mktemp("crash-keys"))
    try:
        with start_sshd(tmp_path_factory.mktemp("crash-sshd"), keys, SSHD.require()) as server:
            yield server, keys.client_key
    except SshdUnavailable as exc:
        pytest.fail(str(exc))


async def test_ssh_command_killed_at_every_commit(tmp_path: Path, sshd: tuple[Sshd, bytes]) -> None:
    server, key = sshd
    marks = tmp_path / "marks"
    marks.mkdir()

    def ran(label: str) -> list[float]:
        f = marks / f"{label}.ran"
        return [float(t) for t in f.read_text().split()] if f.exists() else []

    def action(label: str) -> dict[str, Any]:
        return {
            "target": "t",
            "command": f"date +%s.%N >> {marks}/{label}.ran; echo hello",
            "idempotency_key": f"release-{label}",
        }

    target = {
        **ssh_target(server.port, server.user, server.host_pin),
        "timeout": {"connect": 1, "total": TOTAL},
    }
    env = {**os.environ, KEY_ENV: key.decode()}
    sc = Scenario("ssh", True, "reconcile", ["", *SSH_POINTS], target, action, ran, env)
    sc.leaks = lambda blob: leaked(blob, key)
    with trio.fail_after(120):
        await _matrix(tmp_path, sc)
