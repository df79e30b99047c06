"""``affidavit serve`` keeps a large result's freed read buffers for the next read
(affidavit/heap.py): counted in page faults, not time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.external import require_glibc

_READS = """
import resource, sys
if sys.argv[1] == "tuned":
    from affidavit.heap import keep_freed_buffers
    assert keep_freed_buffers() == []

def reads():  # a large body's reads, as the reading thread handles them (sizes ~1 MiB)
    held = b"y" * 40
    for i in range(48):
        data = b"x" * ((1 << 20) - (i * 4099) % 300000)
        buf = bytearray()
        buf += data
        piece = bytes(buf)
        whole = held + piece
        lower = whole.lower()
        chunks = [bytes(memoryview(whole)[j : j + 65536]) for j in range(0, len(whole), 65536)]
        held = whole[-40:]
        del buf, piece, lower, data, whole, chunks

reads()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
reads()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str, **env: str) -> int:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    environ.pop("GLIBC_TUNABLES", None)
    out = subprocess.run(
        [sys.executable, "-c", _READS, mode],
        check=True,
        capture_output=True,
        text=True,
        env={**environ, **env},
        timeout=120,
    )
    return int(out.stdout)


def test_a_second_large_body_faults_in_no_fresh_buffers() -> None:
    require_glibc()
    # 48 reads of ~1 MiB, five buffers each: untuned, glibc faulted in ~65k pages here.
    assert _faults("tuned") < 1000


def test_serve_sets_them_and_an_embedded_broker_does_not() -> None:
    root = Path(__file__).resolve().parents[2]
    for runner in ("serve.py", "mcp.py"):  # the two that run calls in a process of their own
        assert "keep_freed_buffers()" in (root / "affidavit" / "cli" / runner).read_text("utf-8")
    for embedded in ("affidavit/api/broker.py", "affidavit/engine/engine.py"):
        assert "keep_freed_buffers" not in (root / embedded).read_text(encoding="utf-8")
