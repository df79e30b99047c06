"""A pooled connection keeps no credential: nothing reachable from the client after a call --
its pool, the idle connections, their h11 state -- holds the injected value (docs/security.md,
"Credential lifetime").  HTTP credentials are per request (headers, query), so a connection
reused for another target of the same origin carries none of the first one's."""

from __future__ import annotations

import gc
import types
from typing import Any

import trio

from affidavit.adapters.http import HttpClient

from .fakes import FakeEngine
from .hostile import HostileServer, Reply, scripts
from .test_canary import CANARY, request, same_origin_only

_OPAQUE = (type, types.ModuleType, types.FrameType, types.CoroutineType)


def _referents(obj: Any) -> list[Any]:
    """What ``obj`` holds -- of a function only its closure and defaults (its globals are the
    module's, not state of the client)."""
    if isinstance(obj, types.FunctionType):
        cells = [c.cell_contents for c in obj.__closure__ or () if c.cell_contents is not None]
        return cells + list(obj.__defaults__ or ())
    if isinstance(obj, types.BuiltinFunctionType | types.MethodType):
        return [getattr(obj, "__self__", None)]
    return list(gc.get_referents(obj))


def _holding_canary(root: Any, limit: int = 100_000) -> list[str]:
    """The type paths from ``root`` to every string or bytes holding the canary."""
    seen = {id(root)}
    queue: list[tuple[Any, tuple[str, ...]]] = [(root, ())]
    found: list[str] = []
    while queue and len(seen) < limit:
        obj, path = queue.pop()
        if isinstance(obj, str | bytes | bytearray):
            data = obj.encode("latin-1", "replace") if isinstance(obj, str) else bytes(obj)
            if CANARY.encode() in data:
                found.append(" > ".join(path))
            continue
        if isinstance(obj, _OPAQUE):
            continue
        for ref in _referents(obj):
            if id(ref) not in seen:
                seen.add(id(ref))
                queue.append((ref, (*path, type(obj).__name__)))
    assert len(seen) < limit, "walk did not end"
    return found


async def test_no_credential_stays_on_a_pooled_connection() -> None:
    client = HttpClient()
    try:
        async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as b:
            redirect = scripts.redirect(f"{b.url}/next?y=1")
            async with HostileServer.running(redirect) as a:
                with trio.fail_after(10):
                    await client.perform(request(b.url + "/"), FakeEngine().ctx)
                    await client.perform(
                        request(
                            a.url + "/",
                            follow_redirects=True,
                            redirect_policy=same_origin_only(a.origin),
                        ),
                        FakeEngine().ctx,
                    )
                assert CANARY in a.requests[0].target  # sanity: injected
                assert client.idle_connections() == 2  # both origins' connections pooled
                assert _holding_canary(client) == []
    finally:
        await client.aclose()
