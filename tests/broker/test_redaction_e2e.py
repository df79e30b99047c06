"""The redaction promise end to end: random secrets x every listed encoder x every surface,
through a real ``Broker.call`` against a scripted server that echoes them.

Seed: "Exclude secrets, full authorization headers, private keys, and unfiltered remote bodies"
from the envelope; "Do not put credential contents into either the error or the action record."
Issue 9: the credential came back as a re-encoded query value, inside JSON, in a gzip body and
base64'd in a response header.

Each example injects a fresh secret (bearer, a custom header, or a query parameter -- the only
injection that takes non-ASCII), and the server echoes every encoding of the secret and of the
whole injected value at once: one per line of the body (plain, gzip or deflate), one per header
value, as header names where the encoding is a token, and all of them in the reason phrase.
Nothing of them may be found in the envelope, the fetched result, the journal's db/wal/shm bytes
or a log record.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import logging
import re
import tempfile
import urllib.parse
import zlib
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.http.hostile import HostileServer, Received, Reply, scripts

from .encoders import ENCODERS, SECRET_CHARS
from .helpers import TOKEN_ENV, http_target, open_broker, write_config

_ASCII = st.sampled_from([*'+/=%"\\&?#:@~_-.!aZ9'])
_SCHEMES = {
    # bearer: visible ASCII, no space (inject_http refuses anything else)
    "bearer": st.lists(_ASCII, min_size=8, max_size=16).map("".join),
    # a header value may hold inner spaces
    "header:X-Api-Key": st.lists(_ASCII | st.just(" "), min_size=8, max_size=16)
    .map("".join)
    .filter(lambda s: s == s.strip()),
    # a query value is percent-encoded: any text
    "query:api_key": st.lists(SECRET_CHARS, min_size=6, max_size=14).map("".join),
}
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def _injected(scheme: str, secret: bytes) -> bytes:
    """The whole value the broker sends, as the server receives it."""
    if scheme == "bearer":
        return b"Bearer " + secret
    if scheme.startswith("query:"):
        return urllib.parse.quote_from_bytes(secret, safe="").encode()
    return secret


def _echo(shown: dict[str, bytes], compression: str | None) -> Any:
    def reply(req: Received) -> Reply:
        body = b"\n".join(b"%s: <%s>" % (name.encode(), form) for name, form in shown.items())
        headers = [(f"X-Echo-{i}", b"<" + form + b">") for i, form in enumerate(shown.values())]
        headers += [(b"X-" + form, b"1") for form in shown.values() if _TOKEN.fullmatch(form)]
        if compression == "gzip":
            body, headers = gzip.compress(body), [*headers, ("Content-Encoding", "gzip")]
        elif compression == "deflate":
            body, headers = zlib.compress(body), [*headers, ("Content-Encoding", "deflate")]
        reason = b" ".join(shown.values()).replace(b"\r", b"").replace(b"\n", b"")
        return Reply(200, headers=headers, body=body, reason=reason)

    return reply


def _strings(value: Any) -> list[bytes]:
    """Every string of a JSON value (keys included), as bytes -- UTF-8, and latin-1 where a
    header value carried raw bytes."""
    if isinstance(value, str):
        out = [value.encode("utf-8", "surrogatepass")]
        with contextlib.suppress(UnicodeEncodeError):
            out.append(value.encode("latin-1"))
        return out
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _result_bytes(envelope: dict[str, Any]) -> list[bytes]:
    out = _strings(envelope)
    body64 = (envelope.get("result") or {}).get("body_base64")
    if body64:
        out.append(base64.b64decode(body64))
    return out


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.text: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.text.append(self.format(record))


@pytest.mark.parametrize("compression", [None, "gzip", "deflate"])
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scheme=st.sampled_from(sorted(_SCHEMES)), data=st.data())
def test_no_listed_form_of_the_secret_survives_any_surface(
    compression: str | None, scheme: str, data: st.DataObject, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = data.draw(_SCHEMES[scheme]).encode()
    injected = _injected(scheme, secret)
    shown: dict[str, bytes] = {}
    for name, encoder in sorted(ENCODERS.items()):
        for label, value in (("secret", secret), ("injected", injected)):
            try:
                shown[f"{name}({label})"] = encoder(value, data)
            except UnicodeDecodeError:  # a JSON encoder needs text
                continue
    assume(all(b"\r" not in f and b"\n" not in f for f in shown.values()))
    monkeypatch.setenv(TOKEN_ENV, secret.decode())
    logs = _Records()
    root = logging.getLogger()
    root.addHandler(logs)
    previous = root.level
    root.setLevel(logging.DEBUG)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            envelope, fetched = trio.run(_call, Path(tmp), scheme, _echo(shown, compression))
            journal = b"".join(p.read_bytes() for p in Path(tmp).glob("journal.db*") if p.is_file())
    finally:
        root.removeHandler(logs)
        root.setLevel(previous)
    assert "error" not in envelope, envelope
    if compression:
        assert envelope["result"]["content_encoding_decoded"] == compression
    surfaces = {
        "envelope": _result_bytes(envelope),
        "fetched result": _result_bytes(fetched),
        "journal files": [journal],
        "log records": [t.encode() for t in logs.text],
    }
    for where, blobs in surfaces.items():
        for blob in blobs:
            assert secret not in blob, f"the raw secret in the {where}"
            for name, form in shown.items():
                assert form not in blob, f"{name} = {form!r} in the {where}"


async def _call(tmp: Path, scheme: str, reply: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    with trio.fail_after(30):
        async with HostileServer.running(scripts.serve(reply)) as srv:
            cfg = write_config(tmp, {"echo": http_target(srv.url, inject=scheme)})
            async with open_broker(cfg) as broker:
                env = await broker.call({"target": "echo", "method": "GET", "path": "/echo"})
                fetched = await broker.fetch_result(env["invocation_id"])
                assert fetched is not None
                return env, json.loads(json.dumps(fetched))


@pytest.mark.parametrize(
    "secret",
    [
        b"9f86d081884c7d659a2feaa0c55ad015",
        b"3F2504E0-4F89-11D3-9A0C-0305E82C3301",
        b"sk_live_Ab3Xy9Zq+Cd7/Ef8Gh==",
        b"Zt-Q7pLm_V2xKw9-Rb4_nY",
    ],
)
async def test_a_token_echoed_in_another_case_is_redacted_in_the_body(
    tmp_path: Path, secret: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Canary: a hex token, a UUID, a base64 or URL-safe token echoed with its letters' case
    changed (a ``%X`` format, an error page that upper-cases the request line) still carries
    the credential.  Its body echo -- plain, in JSON, after ``BEARER `` -- is redacted in the
    envelope, the fetched result and the journal's bytes (docs/redaction.md)."""
    monkeypatch.setenv(TOKEN_ENV, secret.decode())
    other = secret.swapcase()
    shown = {"plain": other, "json": json.dumps({"t": other.decode()}).encode()}
    shown["bearer"] = b"BEARER " + other

    def reply(req: Received) -> Reply:
        assert req.header("authorization") == "Bearer " + secret.decode()
        return Reply(200, body=b"\n".join(b"%s: <%s>" % (k.encode(), v) for k, v in shown.items()))

    envelope, fetched = await _call(tmp_path, "bearer", reply)
    journal = b"".join(p.read_bytes() for p in tmp_path.glob("journal.db*") if p.is_file())
    assert "error" not in envelope, envelope
    bodies = [b for b in _result_bytes(envelope) if b.startswith(b"plain: ")]
    assert bodies and all(b.count(b"[REDACTED]") == 3 for b in bodies), bodies
    for blob in [*_result_bytes(envelope), *_result_bytes(fetched), journal]:
        for form in (secret.lower(), secret.upper(), other):
            assert form not in blob
