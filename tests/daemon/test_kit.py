"""The kit's waits watch the daemons they wait on (tests/daemon/kit.py): a daemon that dies
before it binds its socket ends the wait as soon as it has exited -- ``ChildExited`` with its
exit status and what it printed -- instead of the test sitting out ``HUNG``.

The bounds below are ceilings well under ``HUNG`` (what a wait that ignored the exit would sit
out), never timings: the failure's content says why the wait ended."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from .kit import HUNG, ChildExited, launch, start_daemon, stop, wait_until

MISSING = "missing.toml"
"""A config path never written: ``affidavit serve`` exits 2 at once, CONFIG_NOT_FOUND."""


async def test_a_wait_on_a_daemon_that_dies_before_binding_ends_with_its_exit(
    tmp_path: Path, token: str
) -> None:
    config = tmp_path / MISSING
    daemon = launch(config, tmp_path / "affidavit.sock", tmp_path / "daemon.log", token)
    try:
        with trio.fail_after(HUNG / 2), pytest.raises(ChildExited) as failed:
            await wait_until(
                daemon.socket.exists, "the daemon binds its socket", HUNG, watch=[daemon]
            )
    finally:
        stop(daemon)
    # It ended because the daemon had exited: its status, and what it printed, are the failure.
    assert daemon.proc.returncode == 2 == failed.value.returncode
    assert "CONFIG_NOT_FOUND" in failed.value.output and str(config) in failed.value.output
    assert "Traceback" not in failed.value.output
    told = str(failed.value)
    assert told.startswith("the daemon binds its socket: the daemon exited 2 first")
    assert failed.value.output in told
    assert not daemon.socket.exists()


async def test_start_daemon_fails_with_the_exit_status_and_what_the_daemon_printed(
    tmp_path: Path, token: str
) -> None:
    config = tmp_path / MISSING
    log = tmp_path / "daemon.log"
    with trio.fail_after(HUNG / 2), pytest.raises(ChildExited) as failed:
        await start_daemon(config, tmp_path / "affidavit.sock", log, token)
    assert failed.value.returncode == 2
    assert "CONFIG_NOT_FOUND" in failed.value.output and str(config) in failed.value.output
    assert failed.value.output == log.read_text()


async def test_a_wait_whose_predicate_holds_returns_though_the_daemon_has_exited(
    tmp_path: Path, token: str
) -> None:
    """What a daemon printed before it exited is still what the test waited for: the watch
    ends a wait only while its predicate is false."""
    daemon = launch(tmp_path / MISSING, tmp_path / "affidavit.sock", tmp_path / "d.log", token)
    try:
        assert await daemon.wait() == 2
        said = await wait_until(
            lambda: "CONFIG_NOT_FOUND" in daemon.log_text(), "it says why", watch=[daemon]
        )
    finally:
        stop(daemon)
    assert said is True
