"""How the toy protocol reaches the broker: registered in-process, or installed — a test-made
``.dist-info`` whose ``entry_points.txt`` names ``tests.toy_protocol:PROTOCOL``, put on the
``PYTHONPATH`` of a fresh process, exactly as a third-party distribution would be found."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from affidavit.protocols import register, unregister

from . import PROTOCOL

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def toy_registered() -> Iterator[None]:
    register(PROTOCOL)
    try:
        yield
    finally:
        unregister(PROTOCOL.kind)


@pytest.fixture
def plugin_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a process that has the toy protocol installed."""
    site = tmp_path / "site"
    info = site / "affidavit_toy_protocol-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: affidavit-toy-protocol\nVersion: 0.1\n", encoding="utf-8"
    )
    (info / "entry_points.txt").write_text(
        "[affidavit.protocols]\ntoy = tests.toy_protocol:PROTOCOL\n", encoding="utf-8"
    )
    path = os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path.rstrip(os.pathsep)}
