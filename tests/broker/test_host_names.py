"""Every host a setting names follows one rule (``affidavit.schema.check_host``): a name beyond
ASCII is refused, never converted (IDNA 2003 maps ``faß.de`` to ``fass.de``, another domain than
the ``xn--fa-hia.de`` a registry means), and so is a trailing dot (``intranet.`` is another DNS
query than ``intranet``); and an ``http://`` url off the machine needs ``trust_cleartext``
(docs/security.md, "Cleartext targets")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from affidavit.config import ConfigError, config_from_dict
from tests.broker.test_config import KEY_A

HTTP = {
    "kind": "http",
    "url": "https://api.example.com/v1",
    "methods": ["GET"],
    "credential": "env:X",
}
SSH = {
    "kind": "ssh",
    "host": "127.0.0.1",
    "user": "deploy",
    "host_key": KEY_A,
    "credential": "env:K",
}


def load(tmp_path: Path, target: dict[str, Any]) -> Any:
    table = {"journal": {"path": str(tmp_path / "j.db")}, "targets": {"t": target}}
    return config_from_dict(table, base_dir=tmp_path).targets["t"]


def refused(tmp_path: Path, target: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, target)
    assert info.value.code == "CONFIG_INVALID"
    return info.value


# (name, the target's settings, the field path refused, words the message says)
BAD_HOSTS = [
    ("idna_deviation_sharp_s", {"url": "https://faß.de"}, "targets.t.url", "xn--"),
    ("idna_deviation_final_sigma", {"url": "https://βόλος.com/x"}, "targets.t.url", "xn--"),
    ("joiner", {"url": "https://ab\u200dc.example"}, "targets.t.url", "xn--"),
    ("plain_non_ascii", {"url": "https://bücher.example"}, "targets.t.url", "xn--"),
    ("proxy", {"proxy": "http://prøxy.example:3128"}, "targets.t.proxy", "xn--"),
    (
        "redirect_origin",
        {"follow_redirects": True, "redirect_origins": ["https://faß.de"]},
        "targets.t.redirect_origins[0]",
        "xn--",
    ),
    ("trailing_dot", {"url": "https://localhost.:8443/"}, "targets.t.url", "ending in"),
    ("trailing_dot_proxy", {"proxy": "http://proxy.:3128"}, "targets.t.proxy", "ending in"),
    (
        "trailing_dot_redirect_origin",
        {"follow_redirects": True, "redirect_origins": ["https://files.example.com."]},
        "targets.t.redirect_origins[0]",
        "ending in",
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("settings", "field", "words"), [r[1:] for r in BAD_HOSTS], ids=[r[0] for r in BAD_HOSTS]
)
def test_an_http_host_beyond_ascii_or_with_a_trailing_dot_is_refused_at_its_path(
    tmp_path: Path, settings: dict[str, Any], field: str, words: str
) -> None:
    err = refused(tmp_path, {**HTTP, **settings})
    assert err.field == field and words in err.message


@pytest.mark.parametrize(("host", "words"), [("faß.de", "xn--"), ("deploy.example.", "ending in")])
def test_an_ssh_host_follows_the_same_rule(tmp_path: Path, host: str, words: str) -> None:
    err = refused(tmp_path, {**SSH, "host": host})
    assert err.field == "targets.t.host" and words in err.message


def test_the_ascii_form_of_a_name_loads_as_written(tmp_path: Path) -> None:
    t = load(tmp_path, {**HTTP, "url": "https://XN--FA-HIA.de/v1"})
    assert t.origin == "https://xn--fa-hia.de:443"
    assert load(tmp_path, {**SSH, "host": "xn--fa-hia.de"}).host == "xn--fa-hia.de"


TRUSTED = {"trust_cleartext": True}
FORWARD = {"trust_forward_proxy": True}
REMOTE_PROXY = {"proxy": "http://10.0.0.5:3128", **FORWARD}
LOCAL_PROXY = {"proxy": "http://127.0.0.1:3128", **FORWARD}


def redirects(*origins: str) -> dict[str, Any]:
    return {"follow_redirects": True, "redirect_origins": list(origins)}


CLEARTEXT = [
    # (url, more settings, the field refused: None when it loads).  The first hop decides:
    # the proxy if set, else the host -- loopback only as an address in 127.0.0.0/8 or ::1
    # (an IPv4-mapped one too) or the name localhost; 127.1 and 0.0.0.0 (which reach this
    # machine through inet_aton and the kernel) are not taken for loopback: trust_cleartext.
    ("http://api.example.com/v1", {}, "targets.t.url"),
    ("http://192.0.2.1:8080", {}, "targets.t.url"),
    ("http://[2001:db8::1]:8080", {}, "targets.t.url"),
    ("http://127.1:8080", {}, "targets.t.url"),
    ("http://0.0.0.0:8080", {}, "targets.t.url"),
    ("http://api.example.com/v1", TRUSTED, None),
    ("http://127.0.0.1:8080", {}, None),
    ("http://127.3.4.5:8080", {}, None),
    ("http://[::1]:8080", {}, None),
    ("http://[::ffff:127.0.0.1]:8080", {}, None),
    ("http://localhost:8080", {}, None),
    ("http://localhost:8080", TRUSTED, "targets.t.trust_cleartext"),
    ("https://api.example.com", TRUSTED, "targets.t.trust_cleartext"),
    # A loopback url through a remote forward proxy crosses the network in clear to it.
    ("http://localhost:1", REMOTE_PROXY, "targets.t.url"),
    ("http://localhost:1", {**REMOTE_PROXY, **TRUSTED}, None),
    ("http://api.example.com/v1", LOCAL_PROXY, None),
    ("http://api.example.com/v1", {**LOCAL_PROXY, **TRUSTED}, "targets.t.trust_cleartext"),
    # A redirect origin off the machine in clear is followed only with trust_cleartext.
    ("https://api.example.com", {**redirects("http://other.example"), **TRUSTED}, None),
    ("https://api.example.com", {**redirects("http://127.0.0.1:9"), **TRUSTED},
     "targets.t.trust_cleartext"),
]  # fmt: skip


@pytest.mark.parametrize(("url", "more", "field"), CLEARTEXT)
def test_an_http_url_off_the_machine_needs_trust_cleartext(
    tmp_path: Path, url: str, more: dict[str, Any], field: str | None
) -> None:
    target = {**HTTP, "url": url, **more}
    if field is None:
        assert load(tmp_path, target).trust_cleartext is more.get("trust_cleartext")
    else:
        err = refused(tmp_path, target)
        assert err.field == field
        assert ("trust_cleartext = true" in err.message) is (field == "targets.t.url")


def test_a_ca_file_in_the_trusted_certificate_format_is_refused_at_load(tmp_path: Path) -> None:
    """OpenSSL's ``TRUSTED CERTIFICATE`` blocks are not read by the driver: refused at load with
    the field's path, not at every call (docs/configuration.md, ``ca_file``)."""
    import trustme

    pem = trustme.CA().cert_pem.bytes().decode()
    (tmp_path / "plain.pem").write_text(pem)
    (tmp_path / "trusted.pem").write_text(
        pem.replace(" CERTIFICATE-----", " TRUSTED CERTIFICATE-----")
    )
    assert load(tmp_path, {**HTTP, "ca_file": "plain.pem"}).ca_file == tmp_path / "plain.pem"
    err = refused(tmp_path, {**HTTP, "ca_file": "trusted.pem"})
    assert err.field == "targets.t.ca_file" and "TRUSTED CERTIFICATE" in err.message
