"""The embedded ``affidavit mcp`` once stopped, as ``affidavit serve`` (the daemon's test says
why): a last write to a stderr nobody reads blocks, and a SIGTERM or SIGINT then ends the
process at once, exit 0 -- before, the two were ignored from the stop's end, and only SIGKILL
ended it.  The write here is a log line after ``run`` returned (its signals let go, the
journal closed), in a ``-c`` script around ``affidavit.cli.main``."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.broker.helpers import write_config
from tests.daemon.kit import wait_until
from tests.daemon.test_stopped_signals import STALL, blocked_writing

from .conftest import Remotes
from .kit import PYTHON
from .test_stop_bounded import BOUND, exit_within, started

MCP = (
    STALL
    + """
import affidavit.mcp as mcp

real = mcp.run

async def run(**kwargs):
    await real(**kwargs)
    stall()
    logging.getLogger("affidavit.mcp").info("stopped")  # blocks in write(2)

mcp.run = run
from affidavit.cli import main
sys.exit(main(["mcp", *sys.argv[1:]]))
"""
)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
async def test_a_stopped_embedded_mcp_blocked_on_its_stderr_ends_at_a_signal(
    tmp_path: Path, remotes: Remotes, token: str, signum: signal.Signals
) -> None:
    cfg = write_config(tmp_path, remotes.targets())
    argv = [PYTHON, "-c", MCP, "--config", str(cfg), "--shutdown-grace", "0.5"]
    async with started(argv, remotes.env(token), tmp_path / "mcp.log") as raw:
        raw.proc.send_signal(signal.SIGTERM)  # the stop: clean, the journal closed
        await wait_until(lambda: blocked_writing(raw.proc.pid, raw.stderr()), "stopped, blocked")
        raw.proc.send_signal(signum)
        status, _ = await exit_within(raw, BOUND)
    assert status == 0, raw.stderr()
    assert "signal 15: stopping" in raw.stderr() and "CRITICAL" not in raw.stderr()
    assert token not in raw.stderr()
