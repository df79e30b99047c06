"""The cyclic collector of a process that serves calls (issue 15, ``engine/collector.py``):
``affidavit serve`` freezes what start-up allocated and collects the young generation less
often; an embedding application's process is left as it is unless it asks."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

import affidavit.engine
from affidavit.cli.serve import _serve
from affidavit.engine.collector import YOUNG_THRESHOLD

from .helpers import http_target, write_config

_PROBE = """
import gc
from affidavit.engine import tune_collector
before = (gc.get_threshold()[0], gc.get_freeze_count())
tune_collector()
print(before[0], before[1], gc.get_threshold()[0], gc.get_freeze_count())
"""


def test_tune_collector_freezes_start_up_and_raises_the_young_threshold() -> None:
    # In a child: the collector's settings are the whole process's.
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    threshold0, frozen0, threshold, frozen = map(int, out.stdout.split())
    assert (threshold0, frozen0) == (700, 0)
    assert threshold == YOUNG_THRESHOLD
    assert frozen > 1000  # the modules, config and classes start-up made


def test_affidavit_serve_tunes_its_process_before_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trio

    order: list[str] = []
    monkeypatch.setattr(affidavit.engine, "tune_collector", lambda: order.append("tuned"))
    monkeypatch.setattr(trio, "run", lambda *a, **k: order.append("served"))
    cfg = write_config(tmp_path, {"api": http_target("http://127.0.0.1:9")})
    args = argparse.Namespace(config=str(cfg), socket=None, console=None, allow_exposed_files=False)
    umask = os.umask(0o022)
    try:
        assert _serve(args) == 0
    finally:
        os.umask(umask)
    assert order == ["tuned", "served"]
