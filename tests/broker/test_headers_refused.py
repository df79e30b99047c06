"""Headers a caller may not set, beyond the credential's: each is refused at parse,
``FORBIDDEN_HEADER`` at ``headers.<name>``, before anything is resolved or sent -- names
compared as servers read them (any case, ``_`` as ``-``).

* ``Expect``: the transport sends ``100-continue`` itself or not at all, and drops a caller's;
  accepted, it would be recorded (fingerprint, operator view) but never sent -- the record
  would claim more than was sent.
* ``Forwarded``, ``X-Forwarded-Host``/``-Proto``/``-Port``/``-Prefix``/``-Scheme``/``-Ssl``/
  ``-For``/``-Server``/``-Uri``, ``X-Real-IP`` and the other proxies', CDNs' and frameworks'
  names (``ROUTING_HEADERS``): what a reverse proxy tells the application it was reached as
  and for whom; an application behind a trusted proxy builds its URLs (a reset link, a redirect)
  and routes from them.  ``X-Original-URL`` and ``X-Rewrite-URL`` rewrite the path (they are
  method/path overrides, refused since before).

An idempotency contract may not name any header a caller may not set, compared the same way:
the broker sends that header with the key it recorded, so ``X_Api_Key`` beside
``inject = "header:X-Api-Key"`` would be a second credential header to a CGI-style server, and
``X-HTTP-Method-Override`` would carry the key as a method.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from affidavit.config import config_from_dict, load_config
from affidavit.protocols.actions import ActionInvalid, parse_action
from affidavit.schema import ConfigError
from affidavit.statemachine import Code

from .helpers import http_target, write_config

REFUSED = [
    "Expect",
    "expect",
    "EXPECT",
    "Forwarded",
    "X-Forwarded-Host",
    "x_forwarded_host",
    "X-Forwarded-Prefix",
    "X-Forwarded-Proto",
    "X-Forwarded-Port",
    "X-Forwarded-Scheme",
    "X-Forwarded-Ssl",
    "X-Forwarded-For",
    "X-Real-IP",
    "X-Original-Host",
    "X-Forwarded-Server",
    "X-Host",
    "X-HTTP-Host-Override",
    "X-Forwarded-Uri",
    "X-Original-Uri",
    "X-Envoy-Original-Path",
    "True-Client-IP",
    "CF-Connecting-IP",
    "X-Client-IP",
    "X-Cluster-Client-IP",
    "Client-IP",
    "client_ip",
    "Front-End-Https",
    "X-Url-Scheme",
    "X-Original-URL",
    "X-Rewrite-URL",
]


def _parse(tmp_path: Path, headers: dict[str, str]) -> object:
    config = config_from_dict(
        {"targets": {"t": http_target("http://127.0.0.1:9/api", methods=["POST"])}},
        base_dir=tmp_path,
    )
    action = {"target": "t", "method": "POST", "path": "/x", "headers": headers, "body": "hi"}
    return parse_action(action, config)


@pytest.mark.parametrize("name", REFUSED)
def test_a_header_the_transport_or_the_target_s_routing_owns_is_refused(
    tmp_path: Path, name: str
) -> None:
    with pytest.raises(ActionInvalid) as info:
        _parse(tmp_path, {name: "100-continue", "Content-Type": "text/plain"})
    assert (info.value.code, info.value.field) == (Code.FORBIDDEN_HEADER, f"headers.{name}")


def test_other_headers_stay_allowed(tmp_path: Path) -> None:
    assert _parse(tmp_path, {"Accept": "text/plain", "X-Request-Id": "r1"})


@pytest.mark.parametrize(
    "header",
    [
        "X_Api_Key",
        "x-api-key",
        "X-HTTP-Method-Override",
        "x_original_url",
        "Expect",
        "Keep-Alive",
        "Proxy_Connection",
        "Cookie",
        "Transfer_Encoding",
        "Range",
    ],
)
def test_an_idempotency_contract_may_not_name_a_header_callers_may_not_set(
    tmp_path: Path, header: str
) -> None:
    contract = {"header": header, "scope": "s", "retention": "1h"}
    target = http_target("http://127.0.0.1:9/api", inject="header:X-Api-Key", idempotency=contract)
    with pytest.raises(ConfigError) as info:
        load_config(write_config(tmp_path, {"t": target}))
    assert info.value.field == "targets.t.idempotency.header"


def test_an_idempotency_contract_s_own_header_loads(tmp_path: Path) -> None:
    contract = {"header": "Idempotency_Key", "scope": "s", "retention": "1h"}
    target = http_target("http://127.0.0.1:9/api", inject="header:X-Api-Key", idempotency=contract)
    config = load_config(write_config(tmp_path, {"t": target}))
    assert config.targets["t"].idempotency.header == "Idempotency_Key"  # type: ignore[union-attr]
