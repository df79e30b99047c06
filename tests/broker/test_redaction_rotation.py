"""A rotated credential's old value leaves the redaction plan cache (``redaction.retain``).

The cache keeps plans -- and their keys -- for values the broker injects: before ``retain`` a
rotated token stayed in memory until 64 newer plans pushed it out.  Here the cache objects are
walked (every object reachable from them) for the old value, as bytes or in any form a plan
keeps of it (its needles: base64, hex ...)."""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import trio

from affidavit.api.broker import Broker
from affidavit.cli.tour import DemoServer, demo_config
from affidavit.config import load_config
from affidavit.secrets import redaction
from affidavit.secrets.redaction import Redactor, retain, secret_forms


def _token() -> bytes:
    """A fresh value per use: values sharing a fragment would find each other's plans."""
    return b"tok-" + os.urandom(12).hex().encode()


def _cached_bytes() -> list[bytes]:
    """Every bytes object reachable from the plan cache (bounded walk: no module objects)."""
    seen: set[int] = set()
    found: list[bytes] = []
    todo: list[Any] = [redaction._plans]
    while todo and len(seen) < 200_000:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, type) or type(obj).__name__ == "module":
            continue
        seen.add(id(obj))
        if isinstance(obj, bytes):
            found.append(obj)
            continue
        todo.extend(gc.get_referents(obj))
    return found


def _holds(value: bytes) -> bool:
    forms = secret_forms(value)
    return any(form in b or (len(b) >= 8 and b in form) for b in _cached_bytes() for form in forms)


def test_rotation_drops_the_old_values_plans() -> None:
    owner = (object(), "env:TOKEN")
    old_value, new_value = _token(), _token()
    old = (old_value, b"Bearer " + old_value)
    Redactor(old).sub(b"x " + old_value)  # the plan built and its pattern compiled, as a call does
    retain(owner, "v1", old)
    assert _holds(old_value)  # the walk finds a cached value
    new = (new_value, b"Bearer " + new_value)
    Redactor(new)
    retain(owner, "v2", new)
    assert not _holds(old_value)
    assert _holds(new_value)


def test_a_call_still_using_the_old_value_keeps_its_plan_but_not_the_cache() -> None:
    owner = (object(), "env:TOKEN")
    old_value, new_value = _token(), _token()
    old = (old_value, b"Bearer " + old_value)
    in_flight = Redactor(old)
    retain(owner, "v1", old)
    retain(owner, "v2", (new_value,))
    # The call's own redactor still redacts; a stream it starts late shares its plan ...
    assert in_flight.fresh().sub(b"a " + old_value + b" b") == b"a [REDACTED] b"
    # ... and a redactor built from the old values again is not put back into the cache.
    assert Redactor(old).sub(old_value) == b"[REDACTED]"
    assert not _holds(old_value)
    # Rotating back to it caches it again (no pattern rebuilt on every call).
    retain(owner, "v3", old)
    assert Redactor(old)._plan is Redactor(old)._plan
    assert _holds(old_value)


def test_a_value_another_reference_still_uses_stays() -> None:
    scope = object()
    old_value, new_value = _token(), _token()
    shared = (old_value,)
    retain((scope, "env:A"), "a1", shared)
    retain((scope, "env:B"), "b1", shared)
    retain((scope, "env:A"), "a2", (new_value,))
    assert _holds(old_value)  # env:B still injects it
    retain((scope, "env:B"), "b2", (new_value,))
    assert not _holds(old_value)


async def test_the_engine_drops_a_rotated_file_credential(tmp_path: Path) -> None:
    old_value, new_value = _token(), _token()
    token = tmp_path / "token.txt"
    token.write_bytes(old_value + b"\n")
    token.chmod(0o600)
    cfg = tmp_path / "affidavit.toml"
    server = DemoServer()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve)
        cfg.write_text(
            demo_config(tmp_path, port).replace(
                'credential = "env:AFFIDAVIT_DEMO_TOKEN"', f'credential = "file:{token}"'
            ),
            encoding="utf-8",
        )
        hello = {"target": "api", "method": "GET", "path": "/hello"}
        with trio.fail_after(20):
            async with Broker.open(config=load_config(cfg)) as broker:
                assert "error" not in await broker.call(hello)
                assert _holds(old_value)
                token.write_bytes(new_value + b"\n")
                assert "error" not in await broker.call(hello)
                assert not _holds(old_value)
                assert _holds(new_value)
            # A closed broker's credentials leave the cache with it.
            assert not _holds(new_value)
        nursery.cancel_scope.cancel()
