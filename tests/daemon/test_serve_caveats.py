"""``affidavit serve`` logs what its config allows but is no safeguard (``config.caveats``)
through its own log handler, before anything can refuse the start: docs/approvals.md, a
``commands`` approval list is a convenience, never a boundary."""

from __future__ import annotations

import re
from pathlib import Path

from tests.broker.test_config import KEY_A

from .kit import PYTHON, client_env, run, write_daemon_config

DEPLOY = {
    "kind": "ssh",
    "host": "127.0.0.1",
    "user": "deploy",
    "host_key": KEY_A,
    "credential": "env:K",
}


async def _serve_refused(tmp: Path, approval: dict[str, object]) -> str:
    """serve's stderr for a journal in a directory others can write (refused FILES_EXPOSED
    right after the config loaded: nothing is opened or bound -- a config others can write is
    refused before it is parsed, CONFIG_EXPOSED, with no caveat to log)."""
    shared = tmp / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    config = write_daemon_config(
        tmp,
        {"deploy": {**DEPLOY, "approval": approval}},
        socket=tmp / "affidavit.sock",
        service={"operator_uids": [1001]},
        journal={"path": str(shared / "journal.db")},
    )
    done = await run(
        [PYTHON, "-m", "affidavit", "serve", "--config", str(config)], env=client_env()
    )
    err = done.stderr.decode()
    assert done.returncode == 2 and "affidavit: FILES_EXPOSED: " in err, err
    assert "Traceback" not in err
    return err


async def test_serve_logs_one_warning_for_a_commands_approval_in_its_log_format(
    tmp_path: Path,
) -> None:
    err = await _serve_refused(tmp_path, {"commands": ["^deploy "]})
    lines = [line for line in err.splitlines() if "approval.commands" in line]
    assert len(lines) == 1, err
    assert re.fullmatch(
        r"\S+ \S+ affidavit serve\[\d+\] WARNING targets\.deploy\.approval\.commands: commands "
        r"lists what waits for an operator, .*except_commands.*",
        lines[0],
    ), lines[0]


async def test_serve_logs_no_such_warning_for_an_allow_list(tmp_path: Path) -> None:
    err = await _serve_refused(tmp_path, {"except_commands": ["uptime"]})
    assert "WARNING" not in err, err
