"""``affidavit serve`` started with ``SSL_CERT_FILE``, ``SSL_CERT_DIR`` and ``SSLKEYLOGFILE`` in
its environment: each is named once in a start-up WARNING as ignored (its value left out), a CA
only in that bundle vouches for nothing (CERTIFICATE_INVALID, nothing sent) and no TLS key is
logged (adapters/http/trust.py; docs/deployment.md, "TLS trust and the environment")."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import trio
import trustme

from tests.daemon.kit import api_target, cli, daemon_env, start_daemon, stop, write_daemon_config
from tests.external import OPENSSL
from tests.http.hostile import HostileServer, Reply, scripts

GET = {"target": "api", "method": "GET", "path": "/x"}
VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR", "SSLKEYLOGFILE")


def _planted(name: str, tmp_path: Path, ca: trustme.CA, leaf: Path) -> str:
    """The variable's value: a bundle holding ``ca``, a directory OpenSSL reads it from (its
    ``<subject hash>.0`` name -- checked by OpenSSL verifying ``leaf`` against it, so the
    directory is one the broker would trust if it looked), or a key log's path."""
    if name == "SSL_CERT_FILE":
        bundle = tmp_path / "env-bundle.pem"
        ca.cert_pem.write_to_path(str(bundle))
        return str(bundle)
    if name == "SSL_CERT_DIR":
        openssl = OPENSSL.require()
        certs = tmp_path / "certs"
        certs.mkdir()
        pem = tmp_path / "planted.pem"
        ca.cert_pem.write_to_path(str(pem))
        hashed = (
            subprocess.run(
                [openssl, "x509", "-subject_hash", "-noout", "-in", str(pem)],
                capture_output=True,
                check=True,
                timeout=10,
            )
            .stdout.decode()
            .strip()
        )
        pem.rename(certs / f"{hashed}.0")
        verified = subprocess.run(
            [openssl, "verify", "-CApath", str(certs), "-no-CAfile", str(leaf)],
            capture_output=True,
            timeout=10,
        )
        assert verified.returncode == 0, verified.stderr
        return str(certs)
    return str(tmp_path / "keys.log")


@pytest.mark.parametrize("name", VARIABLES)
async def test_a_tls_variable_of_the_environment_is_named_and_ignored(
    tmp_path: Path, token: str, name: str
) -> None:
    """Each variable alone: a CA only where it points vouches for nothing, no key is logged,
    and the start-up warns once naming it, never its value."""
    planted = trustme.CA()
    leaf = planted.issue_cert("127.0.0.1")
    leaf_pem = tmp_path / "leaf.pem"
    leaf.cert_chain_pems[0].write_to_path(str(leaf_pem))
    value = _planted(name, tmp_path, planted, leaf_pem)
    env = daemon_env(token) | {name: value}
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
    assert not (tmp_path / "keys.log").exists()
    warnings = [line for line in daemon.log_text().splitlines() if "WARNING" in line]
    for other in VARIABLES:
        said = sum(f"WARNING {other} is set and ignored" in w for w in warnings)
        assert said == (other == name), warnings
    assert not any(str(tmp_path) in w for w in warnings), warnings
