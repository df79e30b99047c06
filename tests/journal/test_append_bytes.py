"""The rows the writer appends, byte for byte: a fixed sequence of writes under a fixed signing
key and a fixed clock produces the same ``events`` and ``checkpoints`` rows -- every column,
hashes and signatures included (Ed25519 is deterministic) -- as the commit that recorded
``GOLDEN``.  A change to the append path for speed (issue 15) must leave it as it is; a change
meant to alter the rows updates ``GOLDEN`` and says why.  The group-commit path itself (64 tasks,
an order trio picks) is checked by the journal's own verifier."""

from __future__ import annotations

import hashlib
import itertools
import sqlite3
from pathlib import Path

import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from affidavit.journal import Journal, JournalReader
from affidavit.journal.sealing import write_secret_file
from affidavit.statemachine import Event, EvidenceSource
from affidavit.statemachine import EventKind as E

from .helpers import accepted, happy

GOLDEN = "a85641e5be938d24bf412191c28551e1c39049f14e0de78dd727b87322571e8d"


def _signing_key(path: Path) -> Path:
    key = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    write_secret_file(path, pem)
    return path


def _clock() -> object:
    ticks = itertools.count()
    return lambda: 1_765_000_000.0 + next(ticks) * 0.001_234_567


def _rows_digest(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        h = hashlib.sha256()
        for table in ("events", "checkpoints"):
            for row in conn.execute(f"SELECT * FROM {table} ORDER BY rowid"):
                h.update(repr(row).encode())
        return h.hexdigest()
    finally:
        conn.close()


async def _writes(path: Path, signing: Path) -> None:
    async with Journal.open(path, signing_key=signing, clock=_clock()) as j:  # type: ignore[arg-type]
        # One transaction each: posts queue without a checkpoint, the barrier takes them along.
        for n in range(3):
            iid = f"act_{n:02d}"
            *first, dispatch, sent = happy(iid, session=None if n == 1 else f"s\u00e9{n}")[:5]
            for ev in first:
                await j.post(ev)
            await j.append(dispatch, barrier=True)
            await j.post_many([(sent, None)])
            await j.append(Event(E.REMOTE_RESPONSE_STARTED, iid, {"status": 200, "x": '"\n'}))
            await j.append(
                Event(
                    E.REMOTE_RESPONSE_COMPLETE,
                    iid,
                    {"outcome": "committed", "status": 200},
                    source=EvidenceSource.REMOTE_RESPONSE,
                ),
                barrier=True,
            )
        # An append checked in its transaction (an ``op``, not a plain row), an imported event.
        await j.append(accepted("act_09"), valid_until=2e9)
        await j.append(
            Event(
                E.PREFLIGHT_VALIDATED,
                "act_09",
                {"config_hash": "sha256:c0ff"},
                observer="peer",
                observer_seq=7,
            ),
        )


def test_rows_are_the_recorded_bytes(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    trio.run(_writes, path, _signing_key(tmp_path / "signing.key"))
    with JournalReader.open(path) as r:
        assert r.verify().ok
    assert _rows_digest(path) == GOLDEN


def test_group_commit_rows_verify(tmp_path: Path) -> None:
    """64 tasks appending at once (batches of many rows, in trio's order): every row chained,
    every transaction's checkpoint signed, as the verifier checks them."""
    path = tmp_path / "j.db"

    async def main() -> None:
        async with Journal.open(path) as j:

            async def worker(w: int) -> None:
                for n in range(2):
                    for ev in happy(f"w{w}-{n}", session=f"s{w % 3}"):
                        await j.append(ev, barrier=True)

            async with trio.open_nursery() as nursery:
                for w in range(64):
                    nursery.start_soon(worker, w)

    trio.run(main)
    with JournalReader.open(path) as r:
        report = r.verify()
    assert report.ok
    assert report.count == 64 * 2 * len(happy("x"))
    conn = sqlite3.connect(path)
    try:
        (txns,) = conn.execute("SELECT count(*) FROM checkpoints").fetchone()
    finally:
        conn.close()
    assert txns < 64 * 2 * len(happy("x"))  # rows shared transactions (group commit)
