"""Canary: no secret in any envelope, journal byte, log line, exception or CLI output.

Seed: "Do not put credential contents into either the error or the action record ... If you
record the finished ``Authorization`` header to prove injection, the broker loses its purpose."
A mixed set of calls — env and vault references, bearer / basic / header / query injection,
successes, rejections, dropped connections, cut bodies, a cross-origin redirect, a server that
echoes everything — runs with one canary secret.  Then every byte the broker wrote or printed is
searched for the canary in each form it travels in (raw, base64, percent-encoded).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.secrets.vault import PASSPHRASE_ENV, Vault
from tests.http.hostile import HostileServer, Peer, Received, Reply, scripts

from .helpers import TOKEN_ENV, http_target, open_broker, write_config

LIMIT = 20
# Characters that change under base64 and percent-encoding, so every form differs from raw.
CANARY = "CANARY-" + base64.b32encode(os.urandom(10)).decode().rstrip("=") + "/+="
USER = "svc"


def _forms(secret: str) -> set[bytes]:
    raw = secret.encode()
    out = {raw}
    for value in (raw, f"{USER}:{secret}".encode()):
        for enc in (base64.b64encode(value), base64.urlsafe_b64encode(value)):
            out.add(enc)
            out.add(enc.rstrip(b"="))
    out.add(urllib.parse.quote(secret, safe="").encode())
    out.add(urllib.parse.quote_plus(secret).encode())
    # The distinctive core survives any encoding that leaves [A-Z0-9-] alone.
    out.add(secret.split("/")[0].encode())
    return out


FORMS = _forms(CANARY)


def _assert_clean(where: str, data: bytes) -> None:
    for form in FORMS:
        assert form not in data, f"canary form {form!r} found in {where}"


def _echo(req: Received) -> Reply:
    text = "\n".join(f"{n}: {v}" for n, v in req.headers) + "\n" + req.target + "\n"
    return Reply(
        200,
        headers=[("X-Echo", text.strip().replace("\n", " | ")), ("Set-Cookie", f"s={req.target}")],
        body=text.encode() + req.body,
    )


def _reject_echo(req: Received) -> Reply:
    return Reply(401, headers=[("WWW-Authenticate", "Bearer")], body=repr(req.headers).encode())


async def _cut_echo(peer: Peer) -> None:
    req = await peer.read_request()
    if req is None:
        return
    body = repr(req.headers).encode()
    await peer.send_raw(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + body)
    await peer.close()


@pytest.fixture
def canary_vault(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(PASSPHRASE_ENV, raising=False)
    path = tmp_path / "canary.vault"
    vault = Vault.init(path, "vault pass", n_log2=10)
    vault.unlock("vault pass")
    vault.put("canary", CANARY.encode())
    vault.put("canary_basic", f"{USER}:{CANARY}".encode())
    return path


async def test_canary_never_appears_in_envelopes_journal_logs_or_cli_output(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    canary_vault: Path,
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(TOKEN_ENV, CANARY)
    monkeypatch.setenv("CANARY_BASIC", f"{USER}:{CANARY}")
    envelopes: list[dict[str, Any]] = []
    errors: list[str] = []
    async with (
        HostileServer.running(scripts.serve(_echo)) as echo,
        HostileServer.running(scripts.serve(_reject_echo)) as reject,
        HostileServer.running(scripts.apply_then_close()) as drop,
        HostileServer.running(_cut_echo) as cut,
        HostileServer.running(scripts.serve(_echo)) as elsewhere,
        HostileServer.running(scripts.redirect(f"{elsewhere.url}/x?y=1")) as redirect,
    ):
        targets: dict[str, dict[str, Any]] = {}
        for inject in ("bearer", "basic", "header:X-Api-Key", "query:api_key"):
            basic = inject == "basic"
            env_ref = "env:CANARY_BASIC" if basic else f"env:{TOKEN_ENV}"
            vault_ref = "vault:canary_basic" if basic else "vault:canary"
            slug = inject.split(":")[-1].replace("-", "_").lower()
            for ref_kind, ref in (("env", env_ref), ("vault", vault_ref)):
                for role, srv in (("echo", echo), ("reject", reject)):
                    targets[f"{role}_{slug}_{ref_kind}"] = http_target(
                        srv.url, credential=ref, inject=inject
                    )
                targets[f"drop_{slug}_{ref_kind}"] = http_target(
                    drop.url, credential=ref, inject=inject
                )
                targets[f"cut_{slug}_{ref_kind}"] = http_target(
                    cut.url, credential=ref, inject=inject
                )
                targets[f"redirect_{slug}_{ref_kind}"] = http_target(
                    redirect.url,
                    credential=ref,
                    inject=inject,
                    follow_redirects=True,
                    redirect_origins=[elsewhere.url],
                )
        cfg = write_config(tmp_path, targets, vault=str(canary_vault))
        async with open_broker(cfg) as broker:
            for name in targets:
                for method in ("GET", "POST"):
                    action = {"target": name, "method": method, "path": "/p?q=1"}
                    if method == "POST":
                        action["body"] = "payload"
                    try:
                        with trio.fail_after(LIMIT):
                            envelopes.append(await broker.call(action))
                    except Exception as exc:  # any escape is itself a canary surface
                        errors.append(repr(exc) + str(exc))
            # Validation and caller-side refusals that quote what the caller sent.
            for bad in (
                {"target": CANARY, "method": "GET", "path": "/"},
                {"target": "echo_bearer_env", "method": "GET", "path": "/", "x": CANARY},
                {
                    "target": "echo_bearer_env",
                    "method": "GET",
                    "path": "/",
                    "headers": {"Authorization": CANARY},
                },
            ):
                with trio.fail_after(LIMIT):
                    envelopes.append(await broker.call(bad))
            for env in list(envelopes):
                fetched = await broker.fetch_result(env["invocation_id"])
                assert fetched is not None
                envelopes.append(fetched)
            records = [repr(broker.record(e["invocation_id"])) for e in envelopes]
            events = [repr(broker.events(e["invocation_id"])) for e in envelopes]

        # One CLI call per kind of server, output captured.
        cli_out = b""
        for name in ("echo_bearer_env", "reject_api_key_vault", "cut_basic_env"):
            action = json.dumps({"target": name, "method": "GET", "path": "/c"}).encode()
            with trio.fail_after(LIMIT):
                p = await trio.run_process(
                    [sys.executable, "-m", "affidavit", "call", "-", "--config", str(cfg)],
                    stdin=action,
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )
            assert p.returncode in (0, 1), p.stderr
            cli_out += p.stdout + p.stderr

    # The servers really received the canary (in some form): the absence below is the broker's
    # doing, not a call that never carried it.
    seen = b"".join(
        repr(r.headers).encode() + r.target.encode()
        for srv in (echo, reject, drop, cut)
        for r in srv.requests
    )
    assert any(f in seen for f in FORMS)
    assert len(envelopes) >= 2 * (2 * len(targets) + 3)
    assert errors == []
    results = [e for e in envelopes if isinstance(e.get("result"), dict)]
    assert any("[REDACTED]" in json.dumps(e["result"]) for e in results)

    _assert_clean("envelopes", json.dumps(envelopes).encode())
    _assert_clean("records", "".join(records).encode())
    _assert_clean("events", "".join(events).encode())
    _assert_clean("log output", "\n".join(r.getMessage() for r in caplog.records).encode())
    _assert_clean("log records", repr([r.__dict__ for r in caplog.records]).encode())
    _assert_clean("CLI output", cli_out)
    journal_files = sorted(tmp_path.glob("journal.db*"))
    assert {p.name for p in journal_files} >= {"journal.db", "journal.db.key"}
    for path in journal_files:
        _assert_clean(path.name, path.read_bytes())
