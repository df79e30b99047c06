"""Whom the driver trusts on the network between the broker and a target: never what the broker's
environment names (``SSL_CERT_FILE``, ``SSL_CERT_DIR``, ``SSLKEYLOGFILE``), a CA file as it
holds it at the handshake, and a Location's host only as the connection would resolve it
(adapters/http/trust.py, urls.py).  Loopback servers only, every wait bounded."""

from __future__ import annotations

import hashlib
import ssl
from pathlib import Path

import pytest
import trio
import trustme

from affidavit.adapters.base import SetupError
from affidavit.adapters.http import HttpClient, HttpRequest, RedirectDecision, Timeouts
from affidavit.statemachine import Code, Outcome

from .fakes import FakeEngine
from .hostile import HostileServer, Reply, TlsFixture, scripts

FAST = Timeouts(connect=2.0, write=2.0, read=2.0)
TOKEN = "Bearer trust-secret-0001"


def get(url: str, ca_file: str | None = None, **kw: object) -> HttpRequest:
    return HttpRequest(
        "GET",
        url,
        [("Authorization", TOKEN)],
        credential_headers=frozenset({"authorization"}),
        ca_file=ca_file,
        timeouts=FAST,
        **kw,  # type: ignore[arg-type]
    )


async def perform(client: HttpClient, request: HttpRequest) -> tuple[FakeEngine, object]:
    fe = FakeEngine()
    with trio.fail_after(10):
        return fe, await client.perform(request, fe.ctx)


async def test_the_environment_names_no_ca_and_no_key_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tls: TlsFixture
) -> None:
    """A CA only in the bundle ``SSL_CERT_FILE`` names (and a directory ``SSL_CERT_DIR`` names)
    is not trusted for a target without ``ca_file``: refused CERTIFICATE_INVALID, nothing sent;
    ``SSLKEYLOGFILE`` is never written, for the system store or a ``ca_file``."""
    planted = trustme.CA()
    bundle, certs, keylog = tmp_path / "env-bundle.pem", tmp_path / "certs", tmp_path / "keys.log"
    planted.cert_pem.write_to_path(str(bundle))
    certs.mkdir()
    planted.cert_pem.write_to_path(str(certs / "planted.pem"))
    async with (
        # The servers' contexts are made first: the test server's own would read SSLKEYLOGFILE.
        HostileServer.running(
            scripts.serve(Reply(200)), tls=planted.issue_cert("127.0.0.1")
        ) as srv,
        HostileServer.running(scripts.serve(Reply(200)), tls=tls.good) as good,
    ):
        monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
        monkeypatch.setenv("SSL_CERT_DIR", str(certs))
        monkeypatch.setenv("SSLKEYLOGFILE", str(keylog))
        async with HttpClient() as client:
            with pytest.raises(SetupError) as info:
                await perform(client, get(srv.url + "/"))
            _fe, res = await perform(client, get(good.url + "/", tls.ca_file))
    assert (info.value.code, info.value.stage) == (Code.CERTIFICATE_INVALID, "tls_handshake")
    assert srv.requests == []
    assert res.outcome is Outcome.COMMITTED  # type: ignore[attr-defined]
    assert not keylog.exists()


def test_the_context_refuses_renegotiation_and_tls_before_1_2() -> None:
    """A TLS 1.2 server renegotiating mid-response would present a certificate other than the
    one ``cert_sha256`` records."""
    from affidavit.adapters.http.trust import TrustStore

    for ctx in (TrustStore().get(None).context,):
        assert ctx.options & ssl.OP_NO_RENEGOTIATION
        assert ctx.minimum_version is ssl.TLSVersion.TLSv1_2
        assert ctx.verify_mode is ssl.CERT_REQUIRED and ctx.check_hostname
        assert ctx.keylog_filename is None


async def test_a_ca_file_replaced_or_deleted_is_what_the_next_call_trusts(
    tmp_path: Path, client: HttpClient
) -> None:
    """docs/configuration.md, ``ca_file``: the file is read as it is at the handshake.  Replaced
    by another CA, the server the old one vouched for is refused -- its pooled connection (made
    under the old content) is not reused -- and deleted, the call names ``ca_file``; the
    evidence records the digest of the bytes verified with."""
    old, new = trustme.CA(), trustme.CA()
    ca_file = tmp_path / "ca.pem"
    old.cert_pem.write_to_path(str(ca_file))
    async with HostileServer.running(
        scripts.serve(Reply(200)), tls=old.issue_cert("127.0.0.1")
    ) as srv:
        _fe, res = await perform(client, get(srv.url + "/", str(ca_file)))
        assert res.outcome is Outcome.COMMITTED  # type: ignore[attr-defined]
        digest = "sha256:" + hashlib.sha256(ca_file.read_bytes()).hexdigest()
        assert res.facts["peer"]["ca_sha256"] == digest  # type: ignore[attr-defined]
        assert client.idle_connections() == 1

        new.cert_pem.write_to_path(str(ca_file))  # in place: same path, same inode
        with pytest.raises(SetupError) as info:
            await perform(client, get(srv.url + "/", str(ca_file)))
        assert info.value.code is Code.CERTIFICATE_INVALID and info.value.setting is None
        assert len(srv.requests) == 1

        ca_file.unlink()
        with pytest.raises(SetupError) as info:
            await perform(client, get(srv.url + "/", str(ca_file)))
        assert (info.value.code, info.value.setting) == (Code.CERTIFICATE_INVALID, "ca_file")
        assert len(srv.requests) == 1


async def test_a_location_host_with_a_trailing_dot_is_not_followed(client: HttpClient) -> None:
    """``localhost.`` is compared as ``localhost`` by a policy but resolved (no search list)
    and sent as SNI with its dot by a connection: not followed, the 3xx stands."""
    allowed: list[str] = []

    def policy(method: str, url: str) -> RedirectDecision:
        allowed.append(url)
        return RedirectDecision(True, True, "")

    async with HostileServer.running(scripts.serve(Reply(200))) as other:
        location = f"http://localhost.:{other.port}/next"
        async with HostileServer.running(scripts.redirect(location)) as srv:
            _fe, res = await perform(
                client, get(srv.url + "/start", follow_redirects=True, redirect_policy=policy)
            )
    facts = res.facts  # type: ignore[attr-defined]
    assert facts["status"] == 307
    assert facts["redirect_not_followed"]["reason"] == "URL host must not end in a dot"
    assert allowed == [] and other.requests == []
