"""A console behind a proxy on this machine: ``[service] console_proxy_user``.

With ``console_public_origin`` the proxy is the TCP peer of the operators' requests, so the
kernel cannot name the operator there.  The loopback listener is still open to every local uid,
though: an agent holding a stolen cookie or login link could connect to it directly.  With the
proxy's user declared, only that uid's connections are the proxy (the cookie is their proof,
and they must name the public origin); every other uid -- and a peer the kernel cannot name --
is checked as on a plain loopback console (docs/console.md, "Security model").
"""

from __future__ import annotations

import pwd
from pathlib import Path
from typing import Any

import pytest

from affidavit.config import ConfigError, config_from_dict

PUBLIC = "https://console.example:8443"


def _unused_uid() -> int:
    uid = 4242
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


def test_the_proxy_s_user_is_resolved_when_the_config_is_loaded(tmp_path: Path) -> None:
    base = {"journal": {"path": str(tmp_path / "j.db")}}

    def load(**service: Any) -> Any:
        settings = {"console": "127.0.0.1:8470", "console_public_origin": PUBLIC, **service}
        return config_from_dict({**base, "service": settings}, base_dir=tmp_path)

    assert load(console_proxy_user="nobody").service.console_proxy_user == 65534
    assert load(console_proxy_user=65534).service.console_proxy_user == 65534
    assert load().service.console_proxy_user is None
    refusals = {
        "no-such-user-here": "no such user on this machine",
        _unused_uid(): "no such user on this machine",
        "65534": "a uid is a number",
        True: "a user name or a numeric uid",
        "": "a user name or a numeric uid",
        -1: "a user name or a numeric uid",
    }
    for value, why in refusals.items():
        with pytest.raises(ConfigError) as info:
            load(console_proxy_user=value)
        assert info.value.field == "service.console_proxy_user", value
        assert why in info.value.message, (value, info.value.message)
    # Only for a console behind a proxy, and only on loopback: a peer on another machine has
    # no row in this machine's socket table, so nothing could be told from the proxy there.
    with pytest.raises(ConfigError) as info:
        load(console_public_origin=None, console_proxy_user="nobody")
    assert info.value.field == "service.console_proxy_user"
    assert "needs console_public_origin" in info.value.message
    with pytest.raises(ConfigError) as info:
        load(console="0.0.0.0:8470", console_allow_remote=True, console_proxy_user="nobody")
    assert info.value.field == "service.console_proxy_user"
    assert "loopback console only" in info.value.message
