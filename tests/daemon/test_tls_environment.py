"""``affidavit serve`` started with ``SSL_CERT_FILE``, ``SSL_CERT_DIR`` and ``SSLKEYLOGFILE`` in
its environment: each is named once in a start-up WARNING as ignored (its value left out), a CA
only in that bundle vouches for nothing (CERTIFICATE_INVALID, nothing sent) and no TLS key is
logged (adapters/http/trust.py; docs/deployment.md, "TLS trust and the environment")."""

from __future__ import annotations

import json
from pathlib import Path

import trio
import trustme

from tests.daemon.kit import api_target, cli, daemon_env, start_daemon, stop, write_daemon_config
from tests.http.hostile import HostileServer, Reply, scripts

GET = {"target": "api", "method": "GET", "path": "/x"}


async def test_the_tls_variables_of_the_environment_are_named_and_ignored(
    tmp_path: Path, token: str
) -> None:
    planted = trustme.CA()
    bundle, certs, keylog = tmp_path / "env-bundle.pem", tmp_path / "certs", tmp_path / "keys.log"
    planted.cert_pem.write_to_path(str(bundle))
    certs.mkdir()
    planted.cert_pem.write_to_path(str(certs / "planted.pem"))
    env = daemon_env(token) | {
        "SSL_CERT_FILE": str(bundle),
        "SSL_CERT_DIR": str(certs),
        "SSLKEYLOGFILE": str(keylog),
    }
    leaf = planted.issue_cert("127.0.0.1")
    async with HostileServer.running(scripts.serve(Reply(200)), tls=leaf) as srv:
        socket = tmp_path / "affidavit.sock"
        config = write_daemon_config(tmp_path, api_target(srv.url), socket=socket)
        daemon = await start_daemon(config, socket, tmp_path / "daemon.log", token, env=env)
        try:
            with trio.fail_after(30):
                done = await cli(daemon, "call", "-", stdin=json.dumps(GET).encode())
        finally:
            stop(daemon)
    envelope = json.loads(done.stdout)
    assert envelope["error"]["code"] == "CERTIFICATE_INVALID", envelope
    assert srv.requests == []
    assert not keylog.exists()
    warnings = [line for line in daemon.log_text().splitlines() if "WARNING" in line]
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR", "SSLKEYLOGFILE"):
        assert sum(f"WARNING {name} is set and ignored" in w for w in warnings) == 1, warnings
    assert not any(str(tmp_path) in w for w in warnings), warnings
