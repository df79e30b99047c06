"""What a broker's start says about TLS trust (``Broker.open``, which ``affidavit serve`` goes
through too): the ``SSL_*`` variables it ignores and a system store holding no CA certificate,
each as one WARNING per process; and a call relying on that empty store is refused naming the
broker's store and ``ca_file``, not the peer (adapters/http/trust.py)."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

import pytest
import trio

import affidavit.api.broker as api_broker
from affidavit.adapters.http.trust import SYSTEM_STORE_EMPTY
from tests.http.hostile import HostileServer, Reply, make_tls, scripts

from .helpers import http_target, open_broker, write_config
from .http_rows import LIMIT

GET = {"target": "api", "method": "GET", "path": "/x"}


@pytest.fixture
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if no broker had opened in this process yet."""
    monkeypatch.setattr(api_broker, "_warned", set())


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


async def test_the_embedded_broker_names_the_ignored_tls_variables_once_a_process(
    tmp_path: Path,
    token: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fresh_process: None,
) -> None:
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "secret-bundle-path.pem"))
    monkeypatch.setenv("SSLKEYLOGFILE", str(tmp_path / "keys.log"))
    cfg = write_config(tmp_path, {"api": http_target("https://127.0.0.1:9")})
    caplog.set_level(logging.WARNING)
    for _ in range(2):
        async with open_broker(cfg):
            pass
    words = _warnings(caplog)
    for name in ("SSL_CERT_FILE", "SSLKEYLOGFILE"):
        assert sum(w.startswith(f"{name} is set and ignored") for w in words) == 1, words
    assert not any("SSL_CERT_DIR" in w or str(tmp_path) in w for w in words), words


async def test_an_empty_system_store_is_warned_of_and_named_by_its_calls(
    tmp_path: Path,
    token: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fresh_process: None,
) -> None:
    empty = tmp_path / "empty-store"
    empty.mkdir()
    paths = ssl.get_default_verify_paths()
    monkeypatch.setattr(
        ssl,
        "get_default_verify_paths",
        lambda: paths._replace(openssl_cafile=str(empty / "cert.pem"), openssl_capath=str(empty)),
    )
    tls = make_tls(tmp_path)
    caplog.set_level(logging.WARNING)
    async with HostileServer.running(scripts.serve(Reply(200)), tls=tls.good) as srv:
        # A target with its own ca_file needs nothing of the system store: no warning for it.
        own = write_config(tmp_path, {"api": http_target(srv.url, ca_file=tls.ca_file)})
        async with open_broker(own):
            pass
        assert not any(SYSTEM_STORE_EMPTY in w for w in _warnings(caplog))
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(GET)
    words = [w for w in _warnings(caplog) if SYSTEM_STORE_EMPTY in w]
    assert len(words) == 1 and "ca_file" in words[0], words
    assert env["error"]["code"] == "CERTIFICATE_INVALID", env
    assert env["error"]["field"] == "targets.api.ca_file"
    assert env["evidence"]["outcome"] == "not_attempted"
    assert SYSTEM_STORE_EMPTY in env["error"]["message"]
    assert env["evidence"]["http"]["stage"] == "system_trust_store"  # no handshake was made
    assert srv.requests == []
