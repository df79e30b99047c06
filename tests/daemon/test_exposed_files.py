"""``affidavit serve`` is the boundary that keeps the journal, the keys and the vault from every
other account: it refuses to start while group or others can reach one of them (FILES_EXPOSED,
exit 2, each file named with the ``chmod`` that mends it; never a traceback), and serves with
``--allow-exposed-files``, logging each (docs/deployment.md, "Files others can reach")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from affidavit.journal import Journal
from affidavit.secrets.vault import Vault

from .kit import PYTHON, client_env, run, start_daemon, stop, write_daemon_config

LOOSE = ("journal.db", "journal.db.key", "journal.db.signing.key", "affidavit.vault")


def _home(tmp: Path) -> tuple[Path, Path]:
    """A config naming the journal and a vault in ``tmp``, and its socket path."""
    socket = tmp / "affidavit.sock"
    config = write_daemon_config(tmp, {}, socket=socket)
    with config.open("a", encoding="utf-8") as f:
        f.write(f'\n[vault]\npath = "{tmp / "affidavit.vault"}"\n')
    return config, socket


async def _made(tmp: Path) -> None:
    """The journal, its keys and the vault, each 0600 as the broker makes them."""
    async with Journal.open(tmp / "journal.db"):
        pass
    Vault.init(tmp / "affidavit.vault", "a passphrase", n_log2=10)


@pytest.mark.parametrize("name", LOOSE)
async def test_serve_refuses_a_file_others_can_reach_naming_it_and_its_chmod(
    tmp_path: Path, name: str
) -> None:
    config, _ = _home(tmp_path)
    await _made(tmp_path)
    loose = tmp_path / name
    loose.chmod(0o644)
    done = await run(
        [PYTHON, "-m", "affidavit", "serve", "--config", str(config)], env=client_env()
    )
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err.startswith("affidavit: FILES_EXPOSED: "), err
    assert f" {loose} is accessible by group or others (mode 0644): chmod 600 {loose} -- " in err
    assert "--allow-exposed-files" in err and "Traceback" not in err
    assert err.count("chmod 600") == 1 and err.count("\n") == 1, err  # that file alone, one line


async def test_serve_with_the_override_serves_and_logs_each_file(
    tmp_path: Path, token: str
) -> None:
    config, socket = _home(tmp_path)
    await _made(tmp_path)
    db, vault = tmp_path / "journal.db", tmp_path / "affidavit.vault"
    db.chmod(0o640)
    vault.chmod(0o604)
    serve = [PYTHON, "-m", "affidavit", "serve", "--config", str(config), "--allow-exposed-files"]
    daemon = await start_daemon(config, socket, tmp_path / "daemon.log", token, serve)
    try:
        log = daemon.log_text()
    finally:
        stop(daemon)
    for path, mode in ((db, "0640"), (vault, "0604")):
        want = f"is accessible by group or others (mode {mode}): chmod 600 {path}"
        assert "WARNING" in log and want in log, log
    assert "Traceback" not in log
    assert os.stat(db).st_mode & 0o777 == 0o640  # named, not changed: the operator's to mend
