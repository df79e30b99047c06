"""A journal writer in its own process, driven by the crash and lease tests.  PATH is a SQLite
file or a PostgreSQL URL (then $CHILD_KEY_FILE and $CHILD_SIGNING_KEY name the key files).

    python child.py crash PATH          append the happy path + result, one barrier at a time,
                                        printing "durable SEQ KIND" after each; then wait forever
    python child.py midbody PATH        append the happy path up to the response's start, store
                                        two body chunks (as the engine posts them: generation 0),
                                        print "mid-body", then wait forever
    python child.py midtxn PATH N       append N events, then block inside the next transaction
                                        (after its rows are written, before COMMIT): "in-txn"
    python child.py bulk PATH           64 tasks append big-payload invocations forever,
                                        printing "durable SEQ" after each barrier
    python child.py worker PATH HOLDER  JSON commands on stdin, one JSON answer per line
    python child.py refused PATH FAULT THEN
                                        append up to DISPATCH_STARTED, whose COMMIT fails: FAULT
                                        "sync" (LD_PRELOAD=failsync.so) its -wal sync, "size" its
                                        -wal write (RLIMIT_FSIZE: EFBIG); print "wal BYTES" (its
                                        size before), the error's class and the last kind this
                                        process reads; THEN "commit":
                                        append a SETUP_FAILED barrier first; then die (os._exit)

Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys
import time
from typing import Any

import trio

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from affidavit.journal import Batch, Journal, LeaseBusy, LeaseLost
from affidavit.statemachine import Event, EventKind
from tests.journal.helpers import happy, until_dispatch


def _open(path: str) -> Any:
    keys: dict[str, str] = {}
    if os.environ.get("CHILD_KEY_FILE"):
        keys = {"key_file": os.environ["CHILD_KEY_FILE"]}
        keys["signing_key"] = os.environ["CHILD_SIGNING_KEY"]
    return Journal.open(path, **keys)  # type: ignore[arg-type]


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def crash(path: str) -> None:
    async with _open(path) as j:
        for ev in happy("inv-1"):
            stored = await j.append(ev, barrier=True)
            say(f"durable {stored.seq} {stored.kind.value}")
        for i, part in enumerate([b"chunk-0 ", b"chunk-1 ", b"chunk-2"]):
            await j.put_result_chunk("inv-1", "body", i, part)
            say(f"chunk {i}")
        stored = await j.commit_result(
            Event(EventKind.RESULT_COMMITTED, "inv-1"), summary={"status": 201}
        )
        say(f"durable {stored.seq} {stored.kind.value}")
        stored = await j.append(Event(EventKind.RESULT_DELIVERED, "inv-1"), barrier=True)
        say(f"durable {stored.seq} {stored.kind.value}")
        await trio.sleep_forever()


async def midbody(path: str) -> None:
    async with _open(path) as j:
        for ev in happy("inv-1")[:-1]:  # through REMOTE_RESPONSE_STARTED
            await j.append(ev, barrier=True)
        for i, part in enumerate([b"chunk-0 ", b"chunk-1 "]):
            await j.put_result_chunk("inv-1", "body", i, part, generation=0)
        say("mid-body")
        await trio.sleep_forever()


async def midtxn(path: str, n: int) -> None:
    events = happy("inv-1")
    async with _open(path) as j:
        for ev in events[:n]:
            await j.append(ev, barrier=True)

        def block(_: Batch) -> None:
            say("in-txn")
            time.sleep(3600)

        j.before_commit = block
        await j.append(events[n], barrier=True)


async def bulk(path: str) -> None:
    payload = {"body": "x" * 20_000}
    async with _open(path) as j:

        async def worker(w: int) -> None:
            for n in range(1_000_000):
                for ev in happy(f"w{w}-{n}"):
                    stored = await j.append(ev, barrier=True, payload=payload)
                    say(f"durable {stored.seq}")

        async with trio.open_nursery() as nursery:
            for w in range(64):
                nursery.start_soon(worker, w)


async def worker(path: str, holder: str) -> None:
    async with _open(path) as j:
        while True:
            line = await trio.to_thread.run_sync(sys.stdin.readline)
            if not line:
                return
            cmd = json.loads(line)
            try:
                if cmd["op"] == "acquire":
                    lease = await j.acquire_lease(cmd["iid"], holder, cmd["ttl"])
                    say(json.dumps({"ok": True, "generation": lease.generation}))
                elif cmd["op"] == "dispatch":
                    ev = Event(EventKind.DISPATCH_STARTED, cmd["iid"], {"attempt": cmd["attempt"]})
                    stored = await j.append(ev, lease=(holder, cmd["generation"]))
                    say(json.dumps({"ok": True, "seq": stored.seq}))
            except LeaseBusy as exc:
                say(json.dumps({"ok": False, "error": "busy", "holder": exc.current.holder}))
            except LeaseLost as exc:
                say(json.dumps({"ok": False, "error": "lost", "seq": exc.seq}))


async def refused(path: str, fault: str, then: str) -> None:
    j = await _open(path).__aenter__()  # never closed: the process dies with it open
    for ev in until_dispatch("inv-1")[:3]:
        await j.append(ev, barrier=True)
    wal = os.path.getsize(path + "-wal")
    say(f"wal {wal}")
    if fault == "sync":
        ctypes.CDLL(os.environ["LD_PRELOAD"]).failsync_arm(1)
    else:  # "size": no file may grow past its size now -- the -wal's next frame is refused
        resource.setrlimit(resource.RLIMIT_FSIZE, (wal, resource.RLIM_INFINITY))
    # Larger than the SETUP_FAILED written over it (a payload of pages that do not compress):
    # its last frames, its commit frame among them, stay in the -wal past that commit.
    payload = {"blob": os.urandom(24_000).hex()}
    try:
        await j.append(Event(EventKind.DISPATCH_STARTED, "inv-1"), barrier=True, payload=payload)
        say("committed")
    except Exception as exc:
        say(type(exc).__name__)
    say(j.events("inv-1")[-1].kind.value)
    if then == "commit":
        attrs = {"code": "SETUP_FAILED", "stage": "journal"}
        await j.append(Event(EventKind.SETUP_FAILED, "inv-1", attrs), barrier=True)
        say("closed")
    os._exit(0)


def main() -> None:
    mode, path, *rest = sys.argv[1:]
    if mode == "crash":
        trio.run(crash, path)
    elif mode == "midbody":
        trio.run(midbody, path)
    elif mode == "midtxn":
        trio.run(midtxn, path, int(rest[0]))
    elif mode == "bulk":
        trio.run(bulk, path)
    elif mode == "worker":
        trio.run(worker, path, rest[0])
    elif mode == "refused":
        trio.run(refused, path, rest[0], rest[1])


if __name__ == "__main__":
    main()
