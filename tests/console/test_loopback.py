"""Which console address is loopback: one rule (``affidavit.config.is_loopback``) for the config
(``[service] console``), ``affidavit serve --console`` and the console itself, the same on every
Python -- 3.13's ``ipaddress`` counts an IPv4-mapped ``::ffff:127.0.0.1`` as loopback, 3.11's
does not (gh-117566); the stricter answer holds."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest

from affidavit.config import ConfigError, config_from_dict, is_loopback
from affidavit.console import Console, TokenStore


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.255.255.254", True),  # all of 127.0.0.0/8
        ("::1", True),
        ("::1%lo", True),  # a zone changes nothing
        ("::ffff:127.0.0.1", False),  # IPv4-mapped: on every Python
        ("::ffff:7f00:1", False),  # the same, written in hex
        ("::127.0.0.1", False),  # IPv4-compatible (deprecated): ::7f00:1, not ::1
        ("128.0.0.1", False),
        ("0.0.0.0", False),
        ("::", False),
        ("fe80::1%lo", False),
        ("localhost", False),  # a name: console_address turns it into 127.0.0.1 first
        ("example.com", False),
        ("127.1", False),  # not the dotted-quad form ipaddress reads
        (" 127.0.0.1", False),
        ("[::1]", False),  # brackets belong to HOST:PORT, not to the address
        ("", False),
    ],
)
def test_loopback_is_127_0_0_0_8_and_1_only(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def _load(tmp_path: Path, **service: Any) -> Any:
    base = {"journal": {"path": str(tmp_path / "j.db")}}
    return config_from_dict({**base, "service": service}, base_dir=tmp_path)


def _console(tmp_path: Path, origin: str, public: str | None = None) -> Console:
    return Console(
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        TokenStore(tmp_path / "t"),
        origin=origin,
        public_origin=public,
    )


def _as_python_3_13(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python 3.13's ``IPv6Address.is_loopback`` (a mapped address takes its IPv4 address's
    answer), put in place on an older Python."""
    plain = ipaddress.IPv6Address.is_loopback.fget  # type: ignore[attr-defined]

    def newer(self: ipaddress.IPv6Address) -> bool:
        mapped = self.ipv4_mapped
        return mapped.is_loopback if mapped is not None else bool(plain(self))

    monkeypatch.setattr(ipaddress.IPv6Address, "is_loopback", property(newer))
    assert ipaddress.ip_address("::ffff:127.0.0.1").is_loopback


@pytest.mark.parametrize("python", ["this", "3.13"])
def test_the_config_and_the_console_judge_a_mapped_address_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, python: str
) -> None:
    if python == "3.13":
        _as_python_3_13(monkeypatch)
    assert not is_loopback("::ffff:127.0.0.1")
    assert is_loopback("::1") and is_loopback("127.0.0.1")
    mapped = "[::ffff:127.0.0.1]:8470"
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, console=mapped)
    assert (info.value.code, info.value.field) == ("CONFIG_INVALID", "service.console")
    assert "not a loopback address" in info.value.message
    with pytest.raises(ValueError, match="beyond loopback"):
        _console(tmp_path, f"http://{mapped}")
    # As any address beyond loopback: allowed, served through TLS, its bound name refused.
    public = "https://console.example"
    loaded = _load(
        tmp_path, console=mapped, console_allow_remote=True, console_public_origin=public
    )
    assert loaded.service.console == ("::ffff:127.0.0.1", 8470)
    console = _console(tmp_path, f"http://{mapped}", public)
    assert console.origins == {public} and not console.check_peer
    # ``::1`` is loopback to both: plain HTTP, its bound name answered, its peers checked.
    assert _load(tmp_path, console="[::1]:8470").service.console == ("::1", 8470)
    console = _console(tmp_path, "http://[::1]:8470")
    assert console.origins == {"http://[::1]:8470"} and console.check_peer
