"""``inject = "header:NAME"`` names an end-to-end header (audit 53d, finding 3): a hop-by-hop,
proxy, framing, range, override or routing header is refused at load with its field path --
``Proxy-Authorization`` above all, which a forward proxy on an http:// target consumes (the
credential would go to the proxy, never the origin).  ``Authorization`` (a scheme of the
service's own), ``Cookie`` and the usual API-key headers still load."""

from __future__ import annotations

from pathlib import Path

import pytest

from affidavit.config import ConfigError, load_config

from .helpers import http_target, write_config

REFUSED = [
    "Proxy-Authorization",
    "proxy_authorization",  # as CGI-style servers read it
    "Forwarded",
    "X-Forwarded-Host",
    "Range",
    "Expect",
    "X-HTTP-Method-Override",
    "Keep-Alive",
    "Proxy-Connection",
    "Connection",
    "Via",  # each proxy appends to it or rewrites it
    "via",
    "Content-Type",  # the body's media type
    "Location",  # a response header
]
ACCEPTED = ["Authorization", "Cookie", "X-Api-Key", "Private-Token"]


def _load(tmp_path: Path, name: str) -> object:
    target = http_target("http://127.0.0.1:9/api", inject=f"header:{name}")
    return load_config(write_config(tmp_path, {"api": target}))


@pytest.mark.parametrize("name", REFUSED, ids=REFUSED)
def test_a_hop_or_proxy_header_is_refused_as_the_injection_target(
    tmp_path: Path, name: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, name)
    assert (caught.value.code, caught.value.field) == ("CONFIG_INVALID", "targets.api.inject")
    assert f"header:{name}" in caught.value.message and "Traceback" not in str(caught.value)


@pytest.mark.parametrize("name", ACCEPTED, ids=ACCEPTED)
def test_an_end_to_end_header_is_accepted(tmp_path: Path, name: str) -> None:
    config = _load(tmp_path, name)
    assert config.targets["api"].inject == f"header:{name}"  # type: ignore[attr-defined]
