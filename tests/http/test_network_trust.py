"""Whom the driver trusts on the network between the broker and a target: never what the broker's
environment names (``SSL_CERT_FILE``, ``SSL_CERT_DIR``, ``SSLKEYLOGFILE``), a CA file as it
holds it at the handshake, and a Location's host only as the connection would resolve it
(adapters/http/trust.py, urls.py).  Loopback servers only, every wait bounded."""

from __future__ import annotations

import hashlib
import ipaddress
import ssl
import threading
from pathlib import Path

import pytest
import trio
import trustme

from affidavit.adapters.base import SetupError
from affidavit.adapters.http import HttpClient, HttpRequest, RedirectDecision, Timeouts
from affidavit.adapters.http.connect import LOOPBACK_OFF_MACHINE
from affidavit.adapters.http.redirects import CLEARTEXT_REFUSED
from affidavit.statemachine import Code, Outcome
from tests.broker.helpers import FakeResolver, closed_port, custom_resolver

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


def test_the_context_refuses_renegotiation_and_tls_before_1_2(tls: TlsFixture) -> None:
    """A TLS 1.2 server renegotiating mid-response would present a certificate other than the
    one ``cert_sha256`` records.  Nothing is weaker than ``create_default_context`` on this
    Python (from 3.13 it sets VERIFY_X509_STRICT and VERIFY_X509_PARTIAL_CHAIN); PARTIAL_CHAIN
    is set on every version, STRICT exactly where Python's default sets it: the system and the
    ca_file contexts alike."""
    from affidavit.adapters.http.trust import TrustStore

    default = ssl.create_default_context()
    strict = ssl.VerifyFlags.VERIFY_X509_STRICT
    partial = ssl.VerifyFlags.VERIFY_X509_PARTIAL_CHAIN
    store = TrustStore()
    for ctx in (store.get(None).context, store.get(tls.ca_file).context):
        assert ctx.options & ssl.OP_NO_RENEGOTIATION
        assert ctx.minimum_version is ssl.TLSVersion.TLSv1_2
        assert ctx.verify_mode is ssl.CERT_REQUIRED and ctx.check_hostname
        assert ctx.keylog_filename is None
        assert ctx.options & default.options == default.options
        assert ctx.verify_flags & default.verify_flags == default.verify_flags
        assert ctx.verify_flags & partial == partial
        assert ctx.verify_flags & strict == default.verify_flags & strict
        assert [c["name"] for c in ctx.get_ciphers()] == [c["name"] for c in default.get_ciphers()]


async def test_a_ca_file_holding_an_intermediate_trusts_what_it_issued(
    tmp_path: Path, client: HttpClient
) -> None:
    """VERIFY_X509_PARTIAL_CHAIN: a ca_file holding an intermediate (not its root) verifies the
    leaves it issued, on every Python version (docs/configuration.md, ``ca_file``)."""
    root = trustme.CA()
    intermediate = root.create_child_ca()
    ca_file = tmp_path / "intermediate.pem"
    intermediate.cert_pem.write_to_path(str(ca_file))
    async with HostileServer.running(
        scripts.serve(Reply(200)), tls=intermediate.issue_cert("127.0.0.1")
    ) as srv:
        _fe, res = await perform(client, get(srv.url + "/", str(ca_file)))
    assert res.outcome is Outcome.COMMITTED  # type: ignore[attr-defined]


class _StockOpensslLeaf:
    """A leaf issued by a CA as ``openssl req -x509 -subj /CN=CA`` makes it with the stock
    openssl.cnf: basicConstraints not critical, no keyUsage; the leaf without an Authority Key
    Identifier.  Stands in for ``trustme.LeafCert`` (``configure_cert``)."""

    def __init__(self, tmp_path: Path) -> None:
        import datetime

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        now = datetime.datetime.now(datetime.UTC)
        days = datetime.timedelta(days=2)
        ca_key, leaf_key = (
            ec.generate_private_key(ec.SECP256R1()),
            ec.generate_private_key(ec.SECP256R1()),
        )
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "CA")])
        ca = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(1)
            .not_valid_before(now - days)
            .not_valid_after(now + days)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
            .sign(ca_key, hashes.SHA256())
        )
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name)
            .public_key(leaf_key.public_key())
            .serial_number(2)
            .not_valid_before(now - days)
            .not_valid_after(now + days)
            .add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        pem = serialization.Encoding.PEM
        self.ca_file = tmp_path / "stock-ca.pem"
        self.ca_file.write_bytes(ca.public_bytes(pem))
        self._chain = tmp_path / "stock-leaf.pem"
        self._chain.write_bytes(
            leaf.public_bytes(pem)
            + leaf_key.private_bytes(
                pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )

    def configure_cert(self, ctx: ssl.SSLContext) -> None:
        ctx.load_cert_chain(str(self._chain))


STRICT_MESSAGES = (  # docs/configuration.md, ``ca_file``: what 3.13+ says of such a CA
    "CA cert does not include key usage extension",
    "Basic Constraints of CA cert not marked critical",
    "Missing Authority Key Identifier",
)


async def test_a_ca_made_with_stock_openssl_verifies_as_pythons_default_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """VERIFY_X509_STRICT exactly where ``create_default_context`` sets it (3.13+): before, an
    ordinary private CA (no keyUsage, basicConstraints not critical, no Authority Key
    Identifier in its leaf) verifies as it does for any client on that Python; with STRICT
    (3.13's default, forced here on an older Python) it is refused with one of the OpenSSL
    messages docs/configuration.md lists, nothing sent."""
    from affidavit.adapters.http import trust

    stock = _StockOpensslLeaf(tmp_path)
    default = ssl.create_default_context().verify_flags & ssl.VerifyFlags.VERIFY_X509_STRICT
    async with HostileServer.running(scripts.serve(Reply(200)), tls=stock) as srv:  # type: ignore[arg-type]
        if not default:
            async with HttpClient() as client:
                _fe, res = await perform(client, get(srv.url + "/", str(stock.ca_file)))
            assert res.outcome is Outcome.COMMITTED  # type: ignore[attr-defined]
        sent = len(srv.requests)
        monkeypatch.setattr(
            trust, "VERIFY_FLAGS", trust.VERIFY_FLAGS | ssl.VerifyFlags.VERIFY_X509_STRICT
        )
        async with HttpClient() as client:
            with pytest.raises(SetupError) as info:
                await perform(client, get(srv.url + "/", str(stock.ca_file)))
        assert info.value.code is Code.CERTIFICATE_INVALID
        assert info.value.detail in STRICT_MESSAGES
        assert len(srv.requests) == sent


async def test_a_ca_file_edited_after_validation_refuses_the_call(
    tmp_path: Path, client: HttpClient
) -> None:
    """What is recorded is what is used: a request validated with one content of its CA file
    (``ca_sha256``, the digest its account recorded) finding another at the handshake is
    refused CONFIG_CHANGED naming ``ca_file`` (the engine's refusal: no handshake was made),
    before any byte of it is sent -- even when the new content vouches for the server."""
    old, new = trustme.CA(), trustme.CA()
    ca_file = tmp_path / "ca.pem"
    old.cert_pem.write_to_path(str(ca_file))
    validated = "sha256:" + hashlib.sha256(ca_file.read_bytes()).hexdigest()
    new.cert_pem.write_to_path(str(ca_file))
    async with HostileServer.running(
        scripts.serve(Reply(200)), tls=new.issue_cert("127.0.0.1")
    ) as srv:
        with pytest.raises(SetupError) as info:
            await perform(client, get(srv.url + "/", str(ca_file), ca_sha256=validated))
        assert (info.value.code, info.value.setting) == (Code.CONFIG_CHANGED, "ca_file")
        assert info.value.detail == "CA file changed since the call was validated"
        assert srv.requests == []
        now = "sha256:" + hashlib.sha256(ca_file.read_bytes()).hexdigest()
        _fe, res = await perform(client, get(srv.url + "/", str(ca_file), ca_sha256=now))
    assert res.outcome is Outcome.COMMITTED  # type: ignore[attr-defined]
    assert res.facts["peer"]["ca_sha256"] == now  # type: ignore[attr-defined]


async def test_an_empty_system_store_is_named_not_blamed_on_the_peer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tls: TlsFixture
) -> None:
    """A built-in store holding no CA certificate vouches for no server: the call is refused
    naming the broker's store and the fix (``ca_file``), before the handshake -- not a
    certificate the peer got wrong."""
    from affidavit.adapters.http import trust

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "README").write_text("no certificates\n")
    paths = ssl.get_default_verify_paths()
    monkeypatch.setattr(
        ssl,
        "get_default_verify_paths",
        lambda: paths._replace(openssl_cafile=str(empty / "none.pem"), openssl_capath=str(empty)),
    )
    assert not trust.system_anchors()
    async with (
        HostileServer.running(scripts.serve(Reply(200)), tls=tls.good) as srv,
        HttpClient() as client,
    ):
        with pytest.raises(SetupError) as info:
            await perform(client, get(srv.url + "/"))
    assert (info.value.code, info.value.setting) == (Code.CERTIFICATE_INVALID, "ca_file")
    assert info.value.stage == "system_trust_store"  # no handshake was made
    assert info.value.detail == trust.SYSTEM_STORE_EMPTY
    assert srv.requests == []
    words = trust.start_warnings({}, system_store_used=True)
    assert words == [f"HTTPS targets without a ca_file will fail: {trust.SYSTEM_STORE_EMPTY}"]
    assert trust.start_warnings({}, system_store_used=False) == []


def test_a_settled_ca_file_whose_stat_is_unchanged_is_not_read_again(
    tls: TlsFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``TrustStore.get``: once its last read is settled (``SETTLED_NS``) and the stat has not
    moved, the kept ``Trust`` is returned without a read; a moved stat reads again."""
    from affidavit.adapters.http import trust

    reads: list[str] = []
    real = trust.read_regular

    def counting(path: str) -> tuple[bytes, object]:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(trust, "read_regular", counting)
    monkeypatch.setattr(trust, "SETTLED_NS", -(10**18))  # any read is settled
    store = trust.TrustStore()
    first = store.get(tls.ca_file)
    assert store.get(tls.ca_file) is first
    assert reads == [tls.ca_file]
    Path(tls.ca_file).write_bytes(Path(tls.ca_file).read_bytes() + b"\n")  # size moves
    assert store.get(tls.ca_file) is not first
    assert len(reads) == 2

    monkeypatch.setattr(trust, "SETTLED_NS", 10**18)  # no read is settled: read every time
    store = trust.TrustStore()
    store.get(tls.ca_file)
    store.get(tls.ca_file)
    assert len(reads) == 4


async def test_the_driver_reads_a_ca_file_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch, client: HttpClient, tls: TlsFixture
) -> None:
    """A CA file whose stat does not vouch for the last read is read in a worker thread before
    the TCP connect, never on the event loop every call shares (a hung network mount would
    stall them all); one whose stat vouches for it is not read at all."""
    from affidavit.adapters.http import trust

    threads: list[int] = []
    real = trust.read_regular

    def watched(path: str) -> tuple[bytes, object]:
        threads.append(threading.get_ident())
        return real(path)

    monkeypatch.setattr(trust, "read_regular", watched)
    monkeypatch.setattr(trust, "SETTLED_NS", 10**18)  # no read is settled: read every time
    validated = "sha256:" + hashlib.sha256(Path(tls.ca_file).read_bytes()).hexdigest()

    async def call(ca_sha256: str | None) -> list[int]:
        """A new connection (a server of its own: no pooled one reused), the reads it made."""
        threads.clear()
        async with HostileServer.running(scripts.serve(Reply(200)), tls=tls.good) as srv:
            _fe, res = await perform(client, get(srv.url + "/", tls.ca_file, ca_sha256=ca_sha256))
        assert res.outcome is Outcome.COMMITTED  # type: ignore[attr-defined]
        return list(threads)

    for ca_sha256 in (None, validated):  # the pool key's read (unvalidated) and the call's
        read = await call(ca_sha256)
        assert read and threading.get_ident() not in read
    monkeypatch.setattr(trust, "SETTLED_NS", -(10**18))  # any read is settled
    assert await call(validated)  # read once more, now settled
    assert await call(validated) == []  # the stat vouches: no read


async def test_a_trusted_certificate_block_is_refused_naming_ca_file(
    tmp_path: Path, client: HttpClient, tls: TlsFixture
) -> None:
    """OpenSSL's ``TRUSTED CERTIFICATE`` format (trust settings after the certificate) is not
    read as a plain certificate: a file holding one is unusable (the config refuses it at load:
    tests/broker/test_host_names.py), never silently stripped or skipped."""
    pem = Path(tls.ca_file).read_text()
    trusted = pem.replace("BEGIN CERTIFICATE", "BEGIN TRUSTED CERTIFICATE").replace(
        "END CERTIFICATE", "END TRUSTED CERTIFICATE"
    )
    ca_file = tmp_path / "trusted.pem"
    ca_file.write_text(pem + trusted)
    async with HostileServer.running(scripts.serve(Reply(200)), tls=tls.good) as srv:
        with pytest.raises(SetupError) as info:
            await perform(client, get(srv.url + "/", str(ca_file)))
    assert (info.value.code, info.value.setting) == (Code.CERTIFICATE_INVALID, "ca_file")
    assert srv.requests == []


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


async def test_a_loopback_name_resolved_off_the_machine_is_not_connected_to() -> None:
    """Plain HTTP without ``trust_cleartext`` rests on its first hop being loopback: a name
    (``localhost``) the resolver maps off the machine is refused before any connection -- with
    ``trust_cleartext`` it is the operator's word.  (No packet leaves: the refused call never
    connects, and the trusted one's address is a closed loopback port.)"""

    port = closed_port()
    async with HttpClient() as client:
        with (
            custom_resolver(FakeResolver({"localhost": "192.0.2.1"})),
            pytest.raises(SetupError) as info,
        ):
            await perform(client, get(f"http://localhost:{port}/"))
        assert (info.value.code, info.value.stage) == (Code.SETUP_FAILED, "dns")
        assert info.value.detail == LOOPBACK_OFF_MACHINE
        with (
            custom_resolver(FakeResolver({"localhost": "127.0.0.1"})),
            pytest.raises(SetupError) as info,
        ):
            await perform(client, get(f"http://localhost:{port}/"))
        assert info.value.code is Code.CONNECTION_REFUSED  # resolved on the machine: tried


async def test_a_redirect_to_cleartext_off_the_machine_needs_trust_cleartext() -> None:
    """A Location to an http:// origin whose first hop is not loopback is followed only with
    ``trust_cleartext`` (the 3xx stands, ``CLEARTEXT_REFUSED``), and its answer is then
    attributed ``trusted_cleartext``: never a trust the operator did not give."""

    def policy(method: str, url: str) -> RedirectDecision:
        return RedirectDecision(True, False, "other origin")

    async with HostileServer.running(scripts.serve(Reply(200, body=b"there"))) as other:
        location = f"http://other.test:{other.port}/x"
        async with HostileServer.running(scripts.redirect(location)) as srv:
            with custom_resolver(FakeResolver({"other.test": "127.0.0.1"})):
                async with HttpClient() as client:
                    kw = {"follow_redirects": True, "redirect_policy": policy}
                    _fe, refused = await perform(client, get(srv.url + "/", **kw))
                    _fe, trusted = await perform(
                        client, get(srv.url + "/", trust_cleartext=True, **kw)
                    )
                    # the driver asked straight, without the word: no word said
                    _fe, direct = await perform(client, get(f"http://other.test:{other.port}/"))
    facts = refused.facts  # type: ignore[attr-defined]
    assert facts["status"] == 307
    assert facts["redirect_not_followed"]["reason"] == CLEARTEXT_REFUSED
    assert "attribution" not in facts["evidence_from"]
    assert len(other.requests) == 2  # the trusted call's and the direct one's
    assert "attribution" not in direct.facts["evidence_from"]  # type: ignore[attr-defined]
    facts = trusted.facts  # type: ignore[attr-defined]
    assert facts["status"] == 200
    assert facts["evidence_from"]["attribution"] == "trusted_cleartext"


def test_a_ca_file_is_read_as_openssl_reads_a_bundle(tls: TlsFixture) -> None:
    """``pem_certificates``: CERTIFICATE blocks and the old X509 CERTIFICATE label, text and
    other blocks (a CRL) around them skipped; no certificate at all is refused."""
    from affidavit.adapters.http.trust import NO_CERTIFICATE, pem_certificates

    pem = Path(tls.ca_file).read_text()
    old = pem.replace(" CERTIFICATE-----", " X509 CERTIFICATE-----")
    crl = "-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n"
    assert pem_certificates(f"comment\n{crl}{old}trailer\n".encode()) == old.strip()
    assert pem_certificates(pem.encode()) == pem.strip()
    with pytest.raises(ValueError, match="no PEM certificate") as info:
        pem_certificates(crl.encode())
    assert str(info.value) == NO_CERTIFICATE
