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


CLEARTEXT = [
    # (url, trust_cleartext set, the field refused: None when it loads)
    ("http://api.example.com/v1", False, "targets.t.url"),
    ("http://192.0.2.1:8080", False, "targets.t.url"),
    ("http://[2001:db8::1]:8080", False, "targets.t.url"),
    ("http://api.example.com/v1", True, None),
    ("http://127.0.0.1:8080", False, None),
    ("http://127.3.4.5:8080", False, None),
    ("http://[::1]:8080", False, None),
    ("http://localhost:8080", False, None),
    ("http://localhost:8080", True, "targets.t.trust_cleartext"),
    ("https://api.example.com", True, "targets.t.trust_cleartext"),
]  # fmt: skip


@pytest.mark.parametrize(("url", "trusted", "field"), CLEARTEXT)
def test_an_http_url_off_the_machine_needs_trust_cleartext(
    tmp_path: Path, url: str, trusted: bool, field: str | None
) -> None:
    target = {**HTTP, "url": url, **({"trust_cleartext": True} if trusted else {})}
    if field is None:
        assert load(tmp_path, target).trust_cleartext is (True if trusted else None)
    else:
        err = refused(tmp_path, target)
        assert err.field == field
        assert ("trust_cleartext = true" in err.message) is (field == "targets.t.url")
