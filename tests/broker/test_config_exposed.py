"""A config another user can change is refused by every process that would act on its
credentials (CONFIG_EXPOSED, ``affidavit.api.trusted``): a ``./affidavit.toml`` planted in a
directory another user owns would otherwise send the operator's vault secret where the planter
chose (audit 50b, ``cwdcfg.sh``).  The message names the path and the owner or mode, never what
the file says."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from affidavit.api.broker import Broker
from affidavit.config import ConfigError
from affidavit.secrets.vault import Vault
from tests.daemon.kit import NOBODY, PYTHON, client_env, run
from tests.external import require_root

CANARY = "sk_live_CANARY_cfg50"


def _write(config: Path, vault: Path, port: int) -> None:
    config.write_text(
        f'[journal]\npath = "{config.parent / "j.db"}"\n[vault]\npath = "{vault}"\n'
        f'[targets.t]\nkind = "http"\nurl = "http://127.0.0.1:{port}"\nmethods = ["GET"]\n'
        'idempotent = []\ncredential = "vault:tok"\ninject = "bearer"\n',
        encoding="utf-8",
    )


def _vault(tmp: Path) -> Path:
    """The operator's unlocked vault holding the canary."""
    path = tmp / "op" / "s.vault"
    path.parent.mkdir(mode=0o700)
    Vault.init(path, "pw", n_log2=10)
    vault = Vault.open(path)
    vault.unlock("pw")
    vault.put("tok", CANARY.encode())
    return path


def _listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    s.setblocking(False)
    return s


def _reached(s: socket.socket) -> bool:
    try:
        s.accept()[0].close()
    except BlockingIOError:
        return False
    return True


async def test_a_planted_cwd_config_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    """``affidavit call`` in a directory another user owns, reading its ``./affidavit.toml``."""
    require_root()
    vault = _vault(tmp_path)
    ws = tmp_path / "ws"
    ws.mkdir()
    with _listener() as listener:
        config = ws / "affidavit.toml"
        _write(config, vault, listener.getsockname()[1])
        os.chown(ws, NOBODY, NOBODY)
        os.chown(config, NOBODY, NOBODY)
        env = client_env()
        in_ws = ["sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", str(ws)]
        argv = [*in_ws, PYTHON, "-m", "affidavit", "call", "-"]  # ./affidavit.toml: the planted
        done = await run(argv, stdin=b'{"target":"t","method":"GET","path":"/"}', env=env)
        err = done.stderr.decode()
        assert done.returncode == 2, err
        assert err.startswith(f"affidavit: CONFIG_EXPOSED: {config}: refused: "), err
        assert f"config file {config} is owned by uid {NOBODY}" in err, err
        assert f"directory {ws} (on the path to the config file) is owned by uid {NOBODY}" in err
        assert "127.0.0.1" not in err and "Traceback" not in err and err.count("\n") == 1, err
        assert not _reached(listener)


async def test_a_directory_another_user_owns_is_never_told_to_be_chowned(tmp_path: Path) -> None:
    """A ``chown`` of another user's directory (their home, a shared project) would take it
    from them: the config is told to live where only this user or root may write.  The file
    itself keeps its ``chown``: a config is this user's or root's to hold."""
    require_root()
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    config = home / "affidavit.toml"
    _write(config, tmp_path / "s.vault", 9)
    os.chown(home, NOBODY, NOBODY)
    os.chown(config, NOBODY, NOBODY)
    with pytest.raises(ConfigError) as caught:
        async with Broker.open(config):
            pass
    said = str(caught.value)
    assert caught.value.code == "CONFIG_EXPOSED", said
    assert f"config file {config} is owned by uid {NOBODY}, not by this process's uid 0: " in said
    assert f"chown 0 {config}" in said, said
    assert f"directory {home} (on the path to the config file) is owned by uid {NOBODY}" in said
    assert (
        "keep the config in a directory only this user or root can write "
        "(/etc/affidavit/affidavit.toml, say, once what"
    ) in said, said
    assert "pass --config /etc/affidavit/affidavit.toml" in said, said
    assert said.count("chown 0 ") == 1 and f"chown {NOBODY}" not in said, said  # the file's


@pytest.mark.parametrize("mode", [0o666, 0o620])
async def test_an_embedded_broker_refuses_a_config_others_can_write(
    tmp_path: Path, mode: int
) -> None:
    config = tmp_path / "affidavit.toml"
    _write(config, tmp_path / "s.vault", 9)
    config.chmod(mode)
    with pytest.raises(ConfigError) as caught:
        async with Broker.open(config):
            pass
    assert caught.value.code == "CONFIG_EXPOSED"
    want = f"config file {config} is writable by group or others (mode {mode:04o})"
    assert want in str(caught.value) and "[targets" not in str(caught.value)


async def test_a_config_in_a_directory_others_can_write_is_refused_unless_sticky(
    tmp_path: Path,
) -> None:
    """Whoever can write the directory can rename another file over the config."""
    home = tmp_path / "proj"
    home.mkdir()
    config = home / "affidavit.toml"
    _write(config, tmp_path / "s.vault", 9)
    home.chmod(0o777)
    with pytest.raises(ConfigError) as caught:
        async with Broker.open(config):
            pass
    assert caught.value.code == "CONFIG_EXPOSED"
    assert f"directory {home} (on the path to the config file) is writable" in str(caught.value)
    home.chmod(0o1777)  # sticky: only the file's owner (this user) may rename it
    async with Broker.open(config):
        pass


async def test_serve_refuses_an_exposed_config_even_with_the_override(tmp_path: Path) -> None:
    config = tmp_path / "affidavit.toml"
    _write(config, tmp_path / "s.vault", 9)
    config.chmod(0o646)
    argv = [PYTHON, "-m", "affidavit", "serve", "--config", str(config), "--allow-exposed-files"]
    done = await run(argv, env=client_env())
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err.startswith(f"affidavit: CONFIG_EXPOSED: {config}: "), err
    assert f"(mode 0646): chmod 644 {config}" in err and "Traceback" not in err, err


async def test_vault_put_refuses_the_vault_an_exposed_config_names(tmp_path: Path) -> None:
    """A planted config's vault is the planter's, unlocked with their key: a secret put there
    is theirs to read."""
    config = tmp_path / "affidavit.toml"
    vault = tmp_path / "s.vault"
    _write(config, vault, 9)
    Vault.init(vault, "pw", n_log2=10)
    Vault.open(vault).unlock("pw")
    config.chmod(0o666)
    argv = [PYTHON, "-m", "affidavit", "vault", "put", "--config", str(config), "tok"]
    done = await run(argv, stdin=CANARY.encode(), env=client_env())
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err.startswith(f"affidavit: CONFIG_EXPOSED: {config}: "), err
    assert Vault.open(vault).list() == []


NO_ID = "00000000-0000-0000-0000-000000000000"


@pytest.mark.parametrize(
    "command",
    [["mcp"], ["result", NO_ID], ["approvals", "approve", NO_ID]],  # (--config after them all)
    ids=["mcp", "result", "approvals-approve"],
)
async def test_every_embedded_command_refuses_an_exposed_config(
    tmp_path: Path, command: list[str]
) -> None:
    """``affidavit mcp --config``, ``result`` and ``approvals approve``, embedded: refused before
    the journal is opened (none is made), one line, no traceback."""
    config = tmp_path / "affidavit.toml"
    _write(config, tmp_path / "s.vault", 9)
    config.chmod(0o666)
    argv = [PYTHON, "-m", "affidavit", *command, "--config", str(config)]
    done = await run(argv, env=client_env())
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err.startswith(f"affidavit: CONFIG_EXPOSED: {config}: refused: "), err
    assert f"(mode 0666): chmod 644 {config}" in err and "Traceback" not in err, err
    assert not (tmp_path / "j.db").exists()
