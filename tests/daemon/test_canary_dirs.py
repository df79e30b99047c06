"""Every directory the broker keeps its files in is canary-named -- the config file's, the
journal's, its key files', the vault's, a credential file's and a CA file's -- and every failure
a caller can reach through the daemon's socket is driven: a credential file readable by others,
a vault that is not there, a CA file deleted after the config was read, an id or an operation
that is no journal's, an operator route refused, and the views (health, catalog, actions,
sessions, metrics, a record, a result).  No answer names any of those directories; the
daemon's log names the files (the operator's detail)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import trio

from affidavit.api.wire import blocking_request
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import WAIT, api_target, start_daemon, stop, write_daemon_config

DIRS = ("CANARY-config-3a1", "CANARY-journal-7b2", "CANARY-keys-c93", "CANARY-secrets-d04")
SYSTEM_CA = Path("/etc/ssl/certs/ca-certificates.crt")


async def _ask(socket: Path, method: str, target: str, body: bytes | None = None) -> str:
    answer = await trio.to_thread.run_sync(blocking_request, str(socket), method, target, body)
    return bytes(answer.body).decode()


def _call(target: str, method: str = "GET") -> bytes:
    return json.dumps({"target": target, "method": method, "path": "/x"}).encode()


async def test_no_answer_names_a_directory_the_broker_keeps_files_in(
    tmp_path: Path, token: str
) -> None:
    config_dir, home, keys, secrets = (tmp_path / d for d in DIRS)
    for d in (config_dir, home, keys, secrets):
        d.mkdir()
    loose, ca = secrets / "loose.token", secrets / "ca.pem"
    loose.write_text("tok")
    loose.chmod(0o600)  # loosened after the start, which refuses it (FILES_EXPOSED)
    shutil.copy(SYSTEM_CA, ca)
    journal = {
        "path": str(home / "journal.db"),
        "key_file": str(keys / "broker.key"),
        "signing_key": str(keys / "signing.key"),
    }
    socket, log = tmp_path / "affidavit.sock", tmp_path / "daemon.log"
    answers: dict[str, str] = {}
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        api = api_target(srv.url)["api"]
        targets = {
            "api": api,
            "loose": {**api, "credential": f"file:{loose}"},
            "vaulted": {**api, "credential": "vault:token"},
            "tls": {**api, "url": srv.url.replace("http:", "https:"), "ca_file": str(ca)},
        }
        config = write_daemon_config(config_dir, targets, socket=socket, journal=journal)
        with config.open("a") as f:
            f.write(f"\n[vault]\npath = {json.dumps(str(secrets / 'gone.vault'))}\n")
        daemon = await start_daemon(config, socket, log, token)
        try:
            loose.chmod(0o644)  # each call refuses it: CREDENTIAL_INVALID
            with trio.fail_after(WAIT):
                ca.unlink()
                for name in ("api", "loose", "vaulted", "tls"):
                    said = await _ask(socket, "POST", "/v1/calls", _call(name))
                    answers[f"call {name}"] = said
                    iid = json.loads(said)["invocation_id"]
                    for sub in ("", "/result"):
                        view = await _ask(socket, "GET", f"/v1/invocations/{iid}{sub}")
                        answers[f"view {name}{sub}"] = view
                codes = {
                    n: json.loads(answers[f"call {n}"]).get("error", {}).get("code")
                    for n in ("api", "loose", "vaulted", "tls")
                }
                assert codes == {
                    "api": None,
                    "loose": "CREDENTIAL_INVALID",
                    "vaulted": "CREDENTIAL_MISSING",
                    "tls": "CERTIFICATE_INVALID",
                }, answers
                for route in ("health", "catalog", "actions", "sessions", "metrics", "approvals"):
                    answers[route] = await _ask(socket, "GET", f"/v1/{route}")
                for method, route, body in (
                    ("GET", "/v1/invocations/act_0NOSUCH", None),
                    ("GET", "/v1/invocations/act_0NOSUCH/result", None),
                    ("POST", "/v1/operations/op_0NOSUCH", b"{}"),
                    ("POST", "/v1/invocations/act_0NOSUCH/reconcile", b'{"query": true}'),
                    ("GET", "/v1/approvals/act_0NOSUCH", None),
                    ("POST", "/v1/console/login", b"{}"),
                ):
                    answers[f"{method} {route}"] = await _ask(socket, method, route, body)
        finally:
            stop(daemon)
    logged = log.read_text()
    assert "loose.token" in logged and "gone.vault" in logged, logged  # the operator's detail
    for what, said in answers.items():
        for canary in (*DIRS, str(tmp_path)):
            assert canary not in said, (what, canary, said)
