"""``affidavit mcp`` on the command line: what it says when it cannot start."""

from __future__ import annotations

from pathlib import Path

from tests.broker.helpers import http_target, write_config
from tests.daemon.kit import run

from .kit import PYTHON, env_without_secrets

WITHOUT_SDK = (
    "import sys; sys.modules['mcp'] = None; from affidavit.cli import main; "
    "sys.exit(main(sys.argv[1:]))"
)


async def test_without_the_sdk_it_names_the_extra_to_install(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"api": http_target("http://127.0.0.1:9")})
    done = await run(
        [PYTHON, "-c", WITHOUT_SDK, "mcp", "--config", str(cfg)], env=env_without_secrets()
    )
    assert done.returncode == 2
    assert b"pip install 'affidavit[mcp]'" in done.stderr
    assert b"Traceback" not in done.stderr


async def test_a_bad_config_or_a_socket_beside_config_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[targets.x]\nkind = 'http'\n", encoding="utf-8")
    done = await run(
        [PYTHON, "-m", "affidavit", "mcp", "--config", str(bad)], env=env_without_secrets()
    )
    assert done.returncode == 2
    assert b"targets.x" in done.stderr and b"Traceback" not in done.stderr
    both = await run(
        [PYTHON, "-m", "affidavit", "mcp", "--config", str(bad), "--socket", str(tmp_path / "s")],
        env=env_without_secrets(),
    )
    assert both.returncode == 2 and b"--config is for embedded use" in both.stderr
