"""The ways a journal's path enters besides the library (tests/journal/test_derived_names.py):
``[journal] path`` (``Broker.open``, the daemon, its default keys, the console's tokens) and
``--journal`` (``verify``, ``reclaim``) through a link -- the files beside the file it names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from affidavit import Broker
from affidavit.config import load_config
from affidavit.console import token_dir
from affidavit.journal import JournalError
from tests.journal import segkit as kit
from tests.journal.test_derived_names import _left_beside_the_link
from tests.journal.test_derived_names import names as names

from .helpers import http_target, write_config


def test_a_broker_configured_through_a_link_refuses_a_key_left_beside_it(
    names: tuple[Path, Path], tmp_path: Path
) -> None:
    """The daemon's and ``Broker.open``'s way in: ``[journal] path`` a link, the key of an
    earlier version beside it -- refused with the ``mv``, no fresh key made."""
    real, link = names
    old = _left_beside_the_link(real, link, ".key")
    target = {"api": http_target("http://127.0.0.1:9")}
    config = write_config(tmp_path, target, journal={"path": str(link)})

    async def run() -> None:
        with pytest.raises(JournalError, match="sealing key is kept beside it") as info:
            async with Broker.open(config):
                pass
        assert f"mv {old} {real}.key" in str(info.value)

    trio.run(run)
    assert not os.path.lexists(f"{real}.key")
    os.rename(old, f"{real}.key")

    async def opened() -> None:
        async with Broker.open(config) as broker:
            assert broker.journal.read_result("inv-1") is not None

    trio.run(opened)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "affidavit", *args],
        capture_output=True,
        check=False,
        timeout=60,
        env={**os.environ, "AFFIDAVIT_CONFIG": str(cwd / "none.toml")},
        cwd=str(cwd),
    )


def test_verify_and_reclaim_through_a_link_find_the_segments(
    names: tuple[Path, Path], tmp_path: Path
) -> None:
    real, link = names
    trio.run(kit.build, real)
    verify = _cli("journal", "verify", "--journal", str(link), cwd=tmp_path)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert b"1 stored results match their chained hashes" in verify.stdout
    dry = _cli("journal", "reclaim", "--journal", str(link), "--dry-run", "--json", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    seg = json.loads(dry.stdout)["segments"]
    assert (seg["files"], seg["removed"]) == (2, 1)
    kit.check(real)


@pytest.mark.parametrize(
    ("command", "code"),
    [
        (("verify",), "JOURNAL_UNREADABLE"),  # (a read's code for a journal it cannot open)
        (("reclaim", "--dry-run"), "JOURNAL_UNUSABLE"),
    ],
)
def test_the_cli_refuses_a_key_beside_the_link_only_with_a_stable_code(
    names: tuple[Path, Path], tmp_path: Path, command: tuple[str, ...], code: str
) -> None:
    real, link = names
    old = _left_beside_the_link(real, link, ".key")
    done = _cli("journal", *command, "--journal", str(link), cwd=tmp_path)
    err = done.stderr.decode()
    assert done.returncode == 2 and "Traceback" not in err, err
    assert err.startswith(f"affidavit: {code}: "), err
    assert f"mv {old} {real}.key" in err
    assert not os.path.lexists(f"{real}.key")


def test_the_configs_default_keys_and_the_consoles_tokens_are_beside_the_file(
    names: tuple[Path, Path], tmp_path: Path
) -> None:
    real, link = names
    config = tmp_path / "affidavit.toml"
    config.write_text(f'[journal]\npath = "{link}"\n')
    journal = load_config(str(config)).journal
    assert journal.path == link  # (messages name it as the operator did)
    assert (journal.key_file, journal.signing_key) == (
        Path(f"{real}.key"),
        Path(f"{real}.signing.key"),
    )
    assert token_dir(link) == token_dir(real) == Path(f"{real}.console-tokens")
