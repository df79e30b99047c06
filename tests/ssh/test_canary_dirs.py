"""SSH through the daemon's socket, every file the broker reads for it in a canary-named
directory -- the private key (the target's ``file:`` credential), the ``known_hosts`` file, the
config and the journal: a call that runs, one refused by the host (a known_hosts that pins
another key), one whose key sshd does not authorise, a key file readable by others, one that
is gone, a public key given as the credential and a port that refuses.  No envelope, record
view, result, catalog or health answer names any of those directories (libssh's words stay in
the operator's detail); the daemon's log names the key file."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import trio

from affidavit.api.wire import blocking_request
from tests.daemon.kit import WAIT, start_daemon, stop, write_daemon_config

from .brokerkit import ssh_target
from .hostile import HostileServer
from .sshd import Sshd, SshKeys

DIRS = ("CANARY-ssh-config-5e0", "CANARY-ssh-journal-a17", "CANARY-ssh-keys-6c2")


async def _ask(socket: Path, method: str, target: str, body: bytes | None = None) -> str:
    answer = await trio.to_thread.run_sync(blocking_request, str(socket), method, target, body)
    return bytes(answer.body).decode()


def _private(path: Path, data: bytes, mode: int = 0o600) -> str:
    path.write_bytes(data)
    path.chmod(mode)
    return f"file:{path}"


async def test_no_ssh_answer_names_a_directory_the_broker_keeps_files_in(
    tmp_path: Path, sshd: Sshd, ssh_keys: SshKeys, hostile: HostileServer
) -> None:
    config_dir, home, keys = (tmp_path / d for d in DIRS)
    for d in (config_dir, home, keys):
        d.mkdir()
    known, wrong, nine = keys / "known_hosts", keys / "wrong_hosts", keys / "port9_hosts"
    shutil.copy(sshd.known_hosts, known)
    wrong.write_text(f"[127.0.0.1]:{sshd.port} {hostile.pin}\n")
    nine.write_text(f"[127.0.0.1]:9 {sshd.host_pin}\n")
    pub = ssh_keys.client_key_path.with_suffix(".pub").read_bytes()

    def target(port: int, credential: str, hosts: Path = known) -> dict[str, object]:
        t = ssh_target(port, sshd.user, "", credential=credential, known_hosts=str(hosts))
        del t["host_key"]
        return t

    targets = {
        "box": target(sshd.port, _private(keys / "id", ssh_keys.client_key)),
        "pinned": target(sshd.port, _private(keys / "id2", ssh_keys.client_key), wrong),
        "stranger": target(sshd.port, _private(keys / "other", ssh_keys.other_key)),
        "loose": target(sshd.port, _private(keys / "loose", ssh_keys.client_key)),
        "gone": target(sshd.port, f"file:{keys / 'gone'}"),
        "public": target(sshd.port, _private(keys / "id.pub", pub)),
        "refused": target(9, _private(keys / "id3", ssh_keys.client_key), nine),
    }
    journal = {"path": str(home / "journal.db")}
    socket, log = tmp_path / "affidavit.sock", tmp_path / "daemon.log"
    config = write_daemon_config(config_dir, targets, socket=socket, journal=journal)
    answers: dict[str, str] = {}
    codes: dict[str, str | None] = {}
    daemon = await start_daemon(config, socket, log, None)
    try:
        (keys / "loose").chmod(0o644)  # after the start, which refuses it: each call does
        with trio.fail_after(WAIT * 2):
            for name in targets:
                call = json.dumps({"target": name, "command": "echo hi"}).encode()
                said = answers[f"call {name}"] = await _ask(socket, "POST", "/v1/calls", call)
                env = json.loads(said)
                codes[name] = env.get("error", {}).get("code")
                for sub in ("", "/result"):
                    route = f"/v1/invocations/{env['invocation_id']}{sub}"
                    answers[f"view {name}{sub}"] = await _ask(socket, "GET", route)
            for route in ("catalog", "actions", "health"):
                answers[route] = await _ask(socket, "GET", f"/v1/{route}")
    finally:
        stop(daemon)
    assert codes == {
        "box": None,
        "pinned": "HOST_KEY_MISMATCH",
        "stranger": "REMOTE_AUTH_FAILED",
        "loose": "CREDENTIAL_INVALID",
        "gone": "CREDENTIAL_MISSING",
        "public": "CREDENTIAL_INVALID",
        "refused": "CONNECTION_REFUSED",
    }, answers
    assert str(keys / "loose") in log.read_text()  # the operator's detail
    for what, said in answers.items():
        for canary in (*DIRS, str(tmp_path), os.fspath(sshd.known_hosts.parent)):
            assert canary not in said, (what, canary, said)
