"""Shared pieces for the broker's end-to-end tests: config writing, opening a broker, and
asserting an envelope *and* the durable record behind it.

Every assertion helper reads the journal as well as the envelope: the seed's promise is that the
envelope is rendered from durable evidence, so a test that only looked at the envelope could pass
with a broker that answers from memory.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import os
import socket
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import trio

from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.journal.boot import boot_lapsed
from affidavit.statemachine import Event, EventKind, Record

__all__ = [
    "TOKEN_ENV",
    "FakeResolver",
    "GateStall",
    "StalledCall",
    "affidavit_cli",
    "as_written_before",
    "assert_error",
    "assert_ok",
    "closed_port",
    "custom_resolver",
    "event_kinds",
    "http_target",
    "open_broker",
    "raw_kinds",
    "run_cli",
    "stalled_call",
    "write_config",
]

TOKEN_ENV = "AFFIDAVIT_TEST_TOKEN"


def as_written_before(kind: EventKind, *path: str) -> Callable[..., Event]:
    """An ``Event`` constructor (to patch into the engine module that builds ``kind``) that
    leaves out the attr at ``path`` -- ``("account_hash",)``, ``("operation",
    "request_fingerprint")`` -- as a record written before that attr existed holds it: absent,
    not None."""

    def build(k: EventKind, iid: str, attrs: Mapping[str, Any] | None = None, **kw: Any) -> Event:
        if k is kind and attrs is not None:
            attrs = _leave_out(attrs, path)
        return Event(k, iid, {} if attrs is None else attrs, **kw)

    return build


def _leave_out(attrs: Mapping[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    head, *rest = path
    out = dict(attrs)
    if not rest:
        out.pop(head, None)
    elif isinstance(out.get(head), Mapping):
        out[head] = _leave_out(out[head], tuple(rest))
    return out


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(type(value))


def http_target(url: str, **overrides: Any) -> dict[str, Any]:
    """An HTTP target table with test-friendly defaults (short timeouts, env credential)."""
    target: dict[str, Any] = {
        "kind": "http",
        "url": url,
        "methods": ["GET", "POST", "PUT"],
        "idempotent": ["GET", "PUT"],
        "credential": f"env:{TOKEN_ENV}",
        "inject": "bearer",
        "timeout": {"connect": 2, "total": 5},
    }
    target.update(overrides)
    ops = target.get("operations")
    if isinstance(ops, Mapping) and "min_poll_interval" not in ops:
        # Tests drive a job through its states poll after poll; the pace itself (1 s unless
        # set) is proven where it is set (tests/broker/test_poll_pace.py).
        target["operations"] = {**ops, "min_poll_interval": POLL_PACE}
    return {k: v for k, v in target.items() if v is not None}


POLL_PACE = 1e-6
"""``operations.min_poll_interval`` of an ``http_target`` that sets none (seconds): less than
from one poll's last row to the next poll's check in any test."""


def pg_journal(tmp: Path, url: str, **overrides: Any) -> dict[str, Any]:
    """A ``[journal]`` table on a PostgreSQL journal at ``url``, its key files in ``tmp``;
    ``overrides`` (``reconnect``, say) added to it."""
    return {
        "url": url,
        "key_file": str(tmp / "k"),
        "signing_key": str(tmp / "s"),
        **overrides,
    }


def write_config(
    tmp: Path,
    targets: Mapping[str, Mapping[str, Any]],
    *,
    vault: str | None = None,
    name: str = "affidavit.toml",
    journal: Mapping[str, Any] | None = None,
) -> Path:
    """``journal``: the ``[journal]`` table (default: ``path = <tmp>/journal.db``)."""
    table = journal if journal is not None else {"path": str(tmp / "journal.db")}
    lines = ["[journal]", *(f"{k} = {_toml_value(v)}" for k, v in table.items()), ""]
    if vault is not None:
        lines += ["[vault]", f"path = {_toml_value(vault)}", ""]
    for tname, table in targets.items():
        lines.append(f"[targets.{tname}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in table.items()]
        lines.append("")
    path = tmp / name
    path.write_text("\n".join(lines), encoding="utf-8")
    url = (journal or {}).get("url")
    if isinstance(url, str) and (urlsplit(url).password is not None or "password=" in url):
        # A journal URL with its password in it: not for others to read (FILES_EXPOSED), as
        # docs/deployment.md asks of an operator's config (the group may).
        path.chmod(0o640)
    return path


@contextlib.asynccontextmanager
async def open_broker(config_path: Path) -> AsyncIterator[Broker]:
    async with Broker.open(config=load_config(config_path)) as broker:
        yield broker


def event_kinds(broker: Broker, iid: str) -> list[EventKind]:
    return [e.kind for e in broker.events(iid)]


def _record(broker: Broker, iid: str) -> Record:
    rec = broker.record(iid)
    assert rec is not None, f"no durable record for {iid}"
    return rec


def assert_error(
    broker: Broker,
    env: Mapping[str, Any],
    *,
    phase: str,
    outcome: str,
    retry: str,
    code: str,
) -> Record:
    """The envelope's error and the journal's projected record agree on every enum."""
    err = env.get("error")
    assert err is not None, f"expected an error envelope, got {env}"
    assert (err["phase"], err["outcome"], err["retry"], err["code"]) == (
        phase,
        outcome,
        retry,
        code,
    ), err
    rec = _record(broker, env["invocation_id"])
    assert rec.code is not None
    assert (rec.outcome.value, rec.retry.value, rec.code.value) == (outcome, retry, code)
    assert rec.phase.value == phase
    assert env["evidence"]["outcome"] == outcome
    return rec


def assert_same_result(called: Mapping[str, Any], fetched: Mapping[str, Any]) -> None:
    """A call's result and ``fetch_result``'s are the same result: equal, or -- above the
    inline limit -- the call's names by reference (size and hash of each stream) exactly what
    the fetch returns, and the rest is equal."""
    ref = called.get("by_reference")
    if ref is None:
        assert called == fetched
        return
    streams = set(ref["streams"]) | {f"{n}_base64" for n in ref["streams"]}
    rest = {k: v for k, v in fetched.items() if k not in streams}
    assert {k: v for k, v in called.items() if k != "by_reference"} == rest
    for name, info in ref["streams"].items():
        text = fetched.get(name)
        data = text.encode() if text is not None else base64.b64decode(fetched[f"{name}_base64"])
        assert (len(data), "sha256:" + hashlib.sha256(data).hexdigest()) == (
            info["bytes"],
            info["sha256"],
        )


def assert_ok(broker: Broker, env: Mapping[str, Any]) -> Record:
    assert "error" not in env, env.get("error")
    rec = _record(broker, env["invocation_id"])
    assert rec.code is None
    assert rec.outcome.value == "committed"
    kinds = event_kinds(broker, env["invocation_id"])
    assert EventKind.RESULT_COMMITTED in kinds
    return rec


def assert_redirected(broker: Broker, env: Mapping[str, Any]) -> Record:
    """A 3xx that is the result: committed, stored, and no success -- REMOTE_REDIRECTED,
    ``reconcile`` (whether the server acted on the request is not recorded)."""
    error = env.get("error")
    assert error is not None and (error["code"], error["outcome"], error["retry"]) == (
        "REMOTE_REDIRECTED",
        "committed",
        "reconcile",
    ), error
    assert 300 <= env["result"]["status"] < 400
    rec = _record(broker, env["invocation_id"])
    assert (rec.code.value if rec.code else None, rec.outcome.value, rec.retry.value) == (
        "REMOTE_REDIRECTED",
        "committed",
        "reconcile",
    )
    assert EventKind.RESULT_COMMITTED in event_kinds(broker, env["invocation_id"])
    return rec


def raw_kinds(db: Path, iid: str | None = None) -> list[str]:
    """Event kinds on disk right now, read through a separate read-only SQLite connection —
    what a second process (or crash recovery) would see, independent of the broker's own."""
    uri = f"file:{db}?mode=ro"
    conn = sqlite3.connect(uri, uri=True)
    try:
        if iid is None:
            rows = conn.execute("SELECT kind FROM events ORDER BY seq").fetchall()
        else:
            rows = conn.execute(
                "SELECT kind FROM events WHERE invocation_id = ? ORDER BY seq", (iid,)
            ).fetchall()
    finally:
        conn.close()
    return [str(r[0]) for r in rows]


async def affidavit_cli(
    *args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None, limit: float = 90
) -> Any:
    """Run ``python -m affidavit ARGS`` as a subprocess from trio (the test's peers keep
    serving meanwhile), within ``limit`` seconds; ``env`` adds to this process's environment."""
    with trio.fail_after(limit):
        return await trio.run_process(
            [sys.executable, "-m", "affidavit", *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env={**os.environ, **(env or {})},
            cwd=str(cwd) if cwd is not None else None,
        )


async def signalled(proc: Any, signum: int, limit: float = 30) -> tuple[int, bytes]:
    """Send ``signum`` to the running ``python -m affidavit`` ``proc`` (its stderr a pipe):
    its exit status and all it wrote to stderr, within ``limit`` seconds."""
    proc.send_signal(signum)
    said = b""
    with trio.fail_after(limit):
        code: int = await proc.wait()
        while chunk := await proc.stderr.receive_some(65536):
            said += chunk
    return code, said


def run_cli(*args: str, env: Mapping[str, str] | None = None, stdin: bytes = b"") -> Any:
    """Run ``python -m affidavit ARGS`` synchronously (for CLI tests outside trio)."""
    import subprocess

    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "affidavit", *args],
        input=stdin,
        capture_output=True,
        env=full_env,
        timeout=60,
        check=False,
    )


class FakeResolver(trio.abc.HostnameResolver):
    """A hostname resolver for ``trio.socket.set_custom_hostname_resolver``: maps test names to
    loopback addresses, fails every other name with EAI_NONAME (a real DNS failure, without
    touching the network), and can run a hook at the moment of the lookup — the "DNS stall"
    window between validation and dispatch."""

    def __init__(
        self,
        names: Mapping[str, str],
        on_lookup: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self.names = dict(names)
        self.on_lookup = on_lookup
        self.lookups: list[str] = []

    async def getaddrinfo(
        self,
        host: bytes | None,
        port: bytes | str | int | None,
        family: int = 0,
        type: int = 0,
        proto: int = 0,
        flags: int = 0,
    ) -> list[Any]:
        name = host.decode("ascii") if isinstance(host, bytes) else str(host)
        self.lookups.append(name)
        if self.on_lookup is not None:
            await self.on_lookup(name)
        addr = self.names.get(name)
        if addr is None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return socket.getaddrinfo(addr, port, family, type, proto, flags)

    async def getnameinfo(self, sockaddr: Any, flags: int) -> tuple[str, str]:
        raise NotImplementedError


@contextlib.contextmanager
def custom_resolver(resolver: FakeResolver) -> Iterator[FakeResolver]:
    previous = trio.socket.set_custom_hostname_resolver(resolver)
    try:
        yield resolver
    finally:
        trio.socket.set_custom_hostname_resolver(previous)


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released): connecting is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


class GateStall:
    """A binding whose worker stops, once, right before a dispatch gate -- the first one whose
    hop is ``hop`` or later (1: the first dispatch; 2: a redirect's next hop) -- until
    ``resume`` is set or ``limit`` seconds pass: a paused process, which does nothing (the wait
    is shielded from the call's own deadline)."""

    def __init__(self, real: Any, hop: int = 1, limit: float = 10.0) -> None:
        self.real = real
        self.kind, self.table = real.kind, real.table
        self.hop, self.limit = hop, limit
        self.stopped, self.resume = trio.Event(), trio.Event()

    def prepare(self, *args: Any) -> Any:
        return self.real.prepare(*args)

    def connect_timeout(self, target: Any) -> float:
        return float(self.real.connect_timeout(target))

    async def aclose(self) -> None:
        await self.real.aclose()

    async def perform(self, prepared: Any, ctx: Any) -> Any:
        gate = ctx.gate

        async def stalled(facts: Any, meanwhile: Any = None) -> None:
            if not self.stopped.is_set() and int(facts.get("hop", 1) or 1) >= self.hop:
                self.stopped.set()
                with trio.CancelScope(shield=True), trio.move_on_after(self.limit):
                    await self.resume.wait()
            await gate(facts, meanwhile)

        return await self.real.perform(prepared, dataclasses.replace(ctx, gate=stalled))


@dataclasses.dataclass
class StalledCall:
    """A broker's call stopped at a dispatch gate (``stalled_call``)."""

    stall: GateStall
    nursery: trio.Nursery
    envelope: dict[str, Any] | None = None
    """The call's envelope, once it has ended."""


@contextlib.asynccontextmanager
async def stalled_call(
    broker: Broker,
    action: dict[str, Any],
    *,
    limit: float,
    hop: int = 1,
    binding: Any = None,
    **kw: Any,
) -> AsyncIterator[StalledCall]:
    """``broker`` calls ``action`` (``kw``: ``Broker.call``'s) in a nursery, its worker stalled
    right before the dispatch gate of ``hop`` (``GateStall`` over ``binding``, by default its
    "http" one, for at most ``limit / 2`` seconds); entered once it is stopped there, so that
    another broker acts meanwhile.  On leaving, the call resumes and runs to its end; the
    whole is bounded by ``limit`` seconds."""
    real = broker._engine.bindings["http"] if binding is None else binding
    stall = GateStall(real, hop=hop, limit=limit / 2)
    broker._engine.bindings["http"] = stall
    with trio.fail_after(limit):
        async with trio.open_nursery() as nursery:
            stalled = StalledCall(stall, nursery)

            async def call() -> None:
                stalled.envelope = await broker.call(action, **kw)

            nursery.start_soon(call)
            await stall.stopped.wait()
            try:
                yield stalled
            finally:
                stall.resume.set()


async def until_lease_lapsed(accepted: Event, *, after: float = 0.0, step: float = 0.05) -> None:
    """Wait until the first attempt's lease (``accepted``: its ACTION_ACCEPTED) has run out by
    every clock recovery judges it by (``recovery.recover_stale``): the wall clock
    (``lease_expires_at``, plus ``after``) and, taken on this boot, the boot clock
    (``lease_boot``).  The boot stamp is made a little after the wall-clock deadline, so it ends
    a little later -- tens of milliseconds on a loaded machine, where a recovery judged in
    between found the lease live, closed nothing, and the stopped worker then committed."""
    expires = float(accepted.attrs["lease_expires_at"])
    length = expires - accepted.at
    boot = accepted.attrs.get("lease_boot")
    while time.time() <= expires + after or boot_lapsed(boot, length) is False:
        await trio.sleep(step)


CLOSING_AGREES = ("code", "phase", "outcome", "retry")
"""What an envelope rendered as the closing recovery will write (``engine.delivery``: a result
store the journal refused, nothing after it durable) promises equal to the envelope of the
record once recovery wrote it (docs/design-notes.md).  Not the message: the call's says why
the outcome is unknown now (the journal refused), recovery's why it closed the record (the
broker stopped, the lease lapsed)."""


def assert_closed_as_rendered(rendered: Mapping[str, Any], recovered: Mapping[str, Any]) -> None:
    """``rendered`` (the call's answer) and ``recovered`` (the record's, once closed) agree on
    ``CLOSING_AGREES`` and on the evidence's outcome."""
    ours, theirs = rendered["error"], recovered["error"]
    assert {k: ours[k] for k in CLOSING_AGREES} == {k: theirs[k] for k in CLOSING_AGREES}, (
        ours,
        theirs,
    )
    assert rendered["evidence"]["outcome"] == recovered["evidence"]["outcome"]


UNKNOWN_AFTER_DISPATCH = ("REMOTE_OUTCOME_UNKNOWN", "remote_execution", "unknown", "reconcile")
"""``CLOSING_AGREES`` of a dispatched call whose complete response is not on record: what its
refused result store answers and what recovery closes its record with."""


def assert_unknown_after_dispatch(env: Mapping[str, Any]) -> None:
    """``env`` is ``UNKNOWN_AFTER_DISPATCH``, its message the journal's refusal."""
    from affidavit.engine.recovery import _AFTER_DISPATCH

    err = env["error"]
    assert tuple(err[k] for k in CLOSING_AGREES) == UNKNOWN_AFTER_DISPATCH, err
    assert err["message"] == _AFTER_DISPATCH["journal"], err


async def assert_recovered_as_rendered(config_path: Path, env: Mapping[str, Any]) -> None:
    """The disk free again and the broker gone: recovery at a daemon's start-up (which knows
    the holder is gone) closes ``env``'s record as ``env`` said -- ``CLOSING_AGREES``, the
    evidence's outcome, ATTEMPT_INTERRUPTED last -- with recovery's own message."""
    from affidavit.engine.recovery import _AFTER_DISPATCH

    iid = env["invocation_id"]
    async with open_broker(config_path) as broker:
        await broker._engine.recover_orphans()
        recovered = await broker.fetch_result(iid)
        assert recovered is not None
        assert_closed_as_rendered(env, recovered)
        assert recovered["error"]["message"] == _AFTER_DISPATCH["broker_stopped"]
        code, phase, outcome, retry = UNKNOWN_AFTER_DISPATCH
        assert_error(broker, env, phase=phase, outcome=outcome, retry=retry, code=code)
        assert [e.kind for e in broker.events(iid)][-1] is EventKind.ATTEMPT_INTERRUPTED
