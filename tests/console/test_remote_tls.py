"""A console bound beyond loopback is served only through TLS (docs/console.md, "Security
model"): over plain HTTP to the network a sniffer reads the login link, the session cookie and
the CSRF token, and approves requests with them.  So a non-loopback ``console`` needs an
``https://`` ``console_public_origin`` -- refused otherwise, in the config (at that field), on
``affidavit serve --console`` (exit 2, at the flag) and when the daemon is started with one."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from affidavit.approvals import Operator
from affidavit.config import ConfigError, config_from_dict
from affidavit.console import Console, TokenStore
from affidavit.daemon import Daemon, DaemonError
from tests.broker.helpers import http_target, open_broker
from tests.daemon.kit import DaemonProc, run, start_daemon, stop, write_daemon_config
from tests.external import free_port, on_free_port_async

from .kit import get, operator_config, post, refusal, served

REMOTE = ("0.0.0.0:8470", "192.0.2.1:8470", "[::]:8470", "[2001:db8::1]:8470")


def _load(tmp_path: Path, **service: Any) -> Any:
    base = {"journal": {"path": str(tmp_path / "j.db")}}
    return config_from_dict({**base, "service": service}, base_dir=tmp_path)


@pytest.mark.parametrize("address", REMOTE)
@pytest.mark.parametrize("public", [None, "http://console.example", "http://192.0.2.1:8470"])
def test_a_remote_console_without_an_https_public_origin_is_a_config_error(
    tmp_path: Path, address: str, public: str | None
) -> None:
    settings = {"console": address, "console_allow_remote": True}
    if public is not None:
        settings["console_public_origin"] = public
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, **settings)
    assert info.value.code == "CONFIG_INVALID"
    assert info.value.field == "service.console_public_origin"
    assert "https://" in info.value.message and "plain HTTP" in info.value.message


@pytest.mark.parametrize("address", REMOTE)
def test_a_remote_console_behind_an_https_origin_is_accepted(tmp_path: Path, address: str) -> None:
    public = "https://Console.Example:8443"
    loaded = _load(
        tmp_path, console=address, console_allow_remote=True, console_public_origin=public
    )
    assert loaded.service.console is not None
    assert loaded.service.console_public_origin == "https://console.example:8443"


def test_a_loopback_console_still_takes_plain_http_and_an_http_public_origin(
    tmp_path: Path,
) -> None:
    assert _load(tmp_path, console="127.0.0.1:8470").service.console == ("127.0.0.1", 8470)
    for public in ("http://console.example", "https://console.example"):
        loaded = _load(tmp_path, console="[::1]:8470", console_public_origin=public)
        assert loaded.service.console_public_origin == public


async def test_serve_refuses_a_remote_console_flag_without_an_https_origin(
    tmp_path: Path,
) -> None:
    for n, public in enumerate((None, "http://console.example")):
        service = {"console_allow_remote": True}
        if public is not None:
            service["console_public_origin"] = public
        where = tmp_path / str(n)
        where.mkdir()
        config = write_daemon_config(where, {}, socket=where / "s.sock", service=service)
        flag = f"0.0.0.0:{free_port()}"
        done = await run(
            [sys.executable, "-m", "affidavit", "serve", "--config", str(config), "--console", flag]
        )
        assert done.returncode == 2, done.stderr
        assert b"INVALID_FIELD" in done.stderr and b"--console" in done.stderr
        assert b"plain HTTP" in done.stderr and b"Traceback" not in done.stderr
        assert not (where / "s.sock").exists()


async def test_the_daemon_refuses_a_remote_console_given_to_it_without_tls(
    tmp_path: Path,
) -> None:
    """``serve(config, console=...)`` (the config's address was checked when it was loaded;
    this one was not): refused before the socket or the journal is touched."""
    config = _load(tmp_path, socket=str(tmp_path / "s.sock"))
    with pytest.raises(DaemonError, match="plain HTTP"):
        await Daemon(config, console=("192.0.2.1", 8470)).run()
    assert not (tmp_path / "s.sock").exists() and not (tmp_path / "j.db").exists()


BOUND, PUBLIC = "http://192.0.2.1:8470", "https://console.example"


async def test_a_remote_console_answers_only_under_its_public_origin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under its bound name (``http://192.0.2.1:8470``, plain HTTP across the network) a
    remote console serves nothing: a login link opened or posted there is 421 and not used up,
    a cookie sent there is 421; a form from that origin is 403 under the public name.  Under the
    public origin (the TLS proxy's) it logs in and serves.  (Reached here over loopback: the
    console is told it is bound to ``BOUND``.)"""
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with (
        open_broker(path) as b,
        served(b, tmp_path, bound=BOUND, public_origin=PUBLIC) as (origin, console),
    ):
        token, _ = console.tokens.mint(Operator.current())
        on_bound = {"Host": "192.0.2.1:8470", "Origin": BOUND}
        on_public = {"Host": "console.example", "Origin": PUBLIC}
        status, _, page = await get(f"{origin}/login?token={token}", headers=on_bound)
        assert (status, refusal(page)) == (421, ("HOST_REFUSED", None))
        status, _, page = await post(f"{origin}/login", {"token": token}, on_bound)
        assert (status, refusal(page)) == (421, ("HOST_REFUSED", None))
        from_bound = {**on_public, "Origin": BOUND}
        status, _, page = await post(f"{origin}/login", {"token": token}, from_bound)
        assert (status, refusal(page)) == (403, ("ORIGIN_REFUSED", None))

        status, headers, _ = await post(f"{origin}/login", {"token": token}, on_public)
        assert status == 200  # the link was not used up by the refusals
        assert "; Secure" in headers["set-cookie"]
        cookie = headers["set-cookie"].split(";")[0]
        status, _, page = await get(f"{origin}/approvals", cookie=cookie, headers=on_bound)
        assert (status, refusal(page)) == (421, ("HOST_REFUSED", None))
        status, _, page = await get(f"{origin}/approvals", cookie=cookie, headers=on_public)
        assert status == 200 and b'id="operator"' in page


@pytest.mark.parametrize("public", [None, "http://console.example"])
async def test_a_console_told_it_is_bound_beyond_loopback_needs_an_https_origin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, public: str | None
) -> None:
    """``Console`` itself refuses, whoever builds it (the daemon checks first: above)."""
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b:
        with pytest.raises(ValueError, match="plain HTTP"):
            Console(b, b.view, TokenStore(tmp_path / "t"), origin=BOUND, public_origin=public)


async def test_the_public_name_is_the_same_with_its_default_port_or_in_capitals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy may forward ``Host: console.example:443`` for ``https://console.example``, and
    a name is case-blind: both are the public origin's name.  Another port is not."""
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with (
        open_broker(path) as b,
        served(b, tmp_path, bound=BOUND, public_origin=PUBLIC) as (origin, _),
    ):
        for host, status in (
            ("console.example", 200),
            ("console.example:443", 200),
            ("Console.EXAMPLE", 200),
            ("console.example:80", 421),
            ("console.example:8443", 421),
        ):
            got, _, _ = await get(f"{origin}/login", headers={"Host": host})
            assert got == status, host


async def test_serve_takes_a_remote_console_flag_with_an_https_origin(tmp_path: Path) -> None:
    """``affidavit serve --console 0.0.0.0:PORT`` with ``console_allow_remote`` and an
    ``https://`` public origin starts, and its console answers under the public name only
    (reached here over loopback, which 0.0.0.0 includes)."""
    socket = tmp_path / "s.sock"
    service = {"console_allow_remote": True, "console_public_origin": PUBLIC}
    config = write_daemon_config(tmp_path, {}, socket=socket, service=service)

    async def daemon_on(port: int) -> DaemonProc:
        argv = [sys.executable, "-m", "affidavit", "serve", "--config", str(config)]
        command = [*argv, "--console", f"0.0.0.0:{port}"]
        return await start_daemon(config, socket, tmp_path / "daemon.log", None, command)

    daemon, port = await on_free_port_async(daemon_on)
    try:
        loopback = f"http://127.0.0.1:{port}"
        status, _, _ = await get(f"{loopback}/login", headers={"Host": "console.example"})
        assert status == 200
        status, _, page = await get(f"{loopback}/login", headers={"Host": f"0.0.0.0:{port}"})
        assert (status, refusal(page)) == (421, ("HOST_REFUSED", None))
    finally:
        stop(daemon)
