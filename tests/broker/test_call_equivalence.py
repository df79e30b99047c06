"""What a fixed set of calls answers and records, pinned: the envelope of each call and every
event of its record (kind, source, attrs), through one broker -- a 200, a 404, a redirect
followed, a body echoing the credential (redacted), a proxy's 502 with its ``Proxy-Status``
(``received-status``), a 503 with ``Retry-After``, a request refused in validation and a call
with an idempotency key.  A change to the call path for speed (issue 15) must leave all of it as
it is; a change meant to alter it updates ``GOLDEN`` and says why.

What differs from run to run is replaced before hashing (``_normalized``): the invocation ids
(by their order), the server's port, wall-clock times and durations, the lease holder, and the
digests keyed by the journal's random key (config hash, fingerprint, holder tag, credential
version) -- each by a placeholder naming it (and the value's type), so the rest (every other
field, its type, the order of the events) is compared whole.  The journal's own rows are
pinned by tests/journal/test_append_bytes.py."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.http.hostile import HostileServer, Received, Reply, scripts

from .helpers import TOKEN_ENV, http_target, open_broker, write_config

GOLDEN = "e2fd8acb3de7edf05d14b55917aefd8fd75dd278f700a774b30f11cda474cf87"

TOKEN = "tok-equivalence-0123456789abcdef"

_VARYING = frozenset(
    {
        "at",
        "lease_expires_at",
        "expires_at",
        "created_at",
        "holder",
        "config_hash",
        "fingerprint",
        "peer",
        "elapsed_ms",
        "marker_sha256",
        "sealed_summary_sha256",
        "summary_sha256",
        "lease_boot",
        "boot",
        "requester",
    }
)
"""Keys whose values change from run to run: times, the peer, and what is keyed by the
journal's random key or covers what is (the stored result's marker and sealed summary -- the
summary itself is in the envelope), the machine's boot id (``lease_boot``; an idempotency key's
``boot`` mark) and the uid running the tests (``requester``).  Each is replaced by a
placeholder naming the key and the value's type: the type stays pinned."""

_HMAC = re.compile(r"hmac-sha256:(?:[0-9a-f]{64}|[0-9a-f]{32})(?![0-9a-f])")
"""A digest keyed by the journal's random key (a config hash, a holder tag: 64 hex; a
credential's version: 32)."""


def _reply(req: Received) -> Reply:
    json_ = [("content-type", "application/json")]
    if req.target == "/ok":
        return Reply(200, [*json_, ("x-request-id", "req-1")], b'{"ok":true}')
    if req.target == "/missing":
        return Reply(404, json_, b'{"error":"no such thing"}', reason=b"Not Found")
    if req.target == "/moved":
        return Reply(307, [("location", "/ok")])
    if req.target == "/proxied":
        return Reply(
            502, [("proxy-status", "edge; error=http_response_timeout; received-status=504")]
        )
    if req.target == "/busy":
        return Reply(503, [("retry-after", "7")], b"busy")
    if req.target == "/echo":
        seen = (req.header("authorization") or "").encode()
        return Reply(200, [("content-type", "text/plain")], b"you sent: " + seen)
    return Reply(500)


CALLS: list[dict[str, Any]] = [
    {"target": "api", "method": "GET", "path": "/ok"},
    {"target": "api", "method": "GET", "path": "/missing", "session": "eq-1"},
    {"target": "api", "method": "GET", "path": "/moved"},
    {"target": "api", "method": "GET", "path": "/echo"},
    {"target": "api", "method": "GET", "path": "/proxied"},
    {"target": "api", "method": "GET", "path": "/busy"},
    {"target": "api", "method": "GET", "path": "/ok", "color": "blue"},
    {"target": "api", "method": "PUT", "path": "/ok", "body": "{}", "idempotency_key": "k-1"},
    {"target": "nowhere", "method": "GET", "path": "/ok"},
]


def _walk(value: Any, key: str | None, subs: list[tuple[str, str]]) -> Any:
    if key in _VARYING and value is not None:
        return f"<{key}:{type(value).__name__}>"
    if isinstance(value, dict):
        return {k: _walk(v, k, subs) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_walk(v, None, subs) for v in value]
    if isinstance(value, str):
        value = _HMAC.sub("<hmac>", value)  # first: a digest's hex may hold an id or the port
        for old, new in subs:
            value = value.replace(old, new)
    return value


def _normalized(out: list[Any], port: int, iids: list[str]) -> Iterator[str]:
    """``out`` as lines of JSON, each run-dependent value replaced: the port only where it is
    one (``127.0.0.1:<port>``), never a run of digits that happens to match it."""
    subs = [(iid, f"<iid{n}>") for n, iid in enumerate(iids)]
    subs.append((f"127.0.0.1:{port}", "127.0.0.1:<port>"))
    for item in out:
        yield json.dumps(_walk(item, None, subs), sort_keys=True)


async def _run(tmp_path: Path) -> tuple[list[str], str]:
    async with HostileServer.running(scripts.serve(_reply)) as srv:
        target = http_target(srv.url, follow_redirects=True)
        target["idempotency"] = {"header": "Idempotency-Key", "scope": "eq", "retention": "1h"}
        cfg = write_config(tmp_path, {"api": target})
        out: list[Any] = []
        iids: list[str] = []
        async with open_broker(cfg) as broker:
            for action in CALLS:
                with trio.fail_after(10):
                    env = await broker.call(action)
                iids.append(env["invocation_id"])
                out.append(env)
            for iid in iids:
                out.extend(
                    [e.kind.value, e.source.value, e.observer, e.attrs] for e in broker.events(iid)
                )
        port = int(srv.url.rsplit(":", 1)[1])
    lines = list(_normalized(out, port, iids))
    return lines, hashlib.sha256("\n".join(lines).encode()).hexdigest()


def test_calls_answer_and_record_as_pinned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    lines, digest = trio.run(_run, tmp_path)
    text = "\n".join(lines)
    assert TOKEN not in text  # (the echo is redacted in the envelope and the record)
    assert digest == GOLDEN, (digest, text)


def test_only_what_varies_is_replaced() -> None:
    """A stable digest whose hex holds the port's digits keeps them (once ~0.2% of runs failed
    so); a keyed digest of either length goes whole, before an id it may hold is replaced."""
    port = 41983
    stable = {"sha256": f"ab{port}cd", "origin": f"http://127.0.0.1:{port}", "n": port}
    keyed = {"version": "env:hmac-sha256:" + "0" * 27 + "41983", "tag": "hmac-sha256:" + "a" * 64}
    (line,) = _normalized([[stable, keyed]], port, ["0000041983"])
    assert json.loads(line) == [
        {"sha256": f"ab{port}cd", "origin": "http://127.0.0.1:<port>", "n": port},
        {"version": "env:<hmac>", "tag": "<hmac>"},
    ], line
