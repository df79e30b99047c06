"""``affidavit serve`` -- and ``affidavit mcp`` run embedded -- keep a large result's freed read
buffers for the next read (affidavit/heap.py): the tuning seen called by the entry point itself,
before its loop, with glibc taking both settings; and its effect counted in page faults beside an
untuned run, not in time.

Why the call and ``mallopt``'s answers, not the thresholds read back from the entry point's
process: glibc has no call that reads them, and what ``mallinfo2`` shows of them depends on the
heap's state -- a block over ``M_MMAP_THRESHOLD`` is carved from a heap top kept by
``M_TRIM_THRESHOLD`` before an ``mmap`` is considered, so ``serve``'s own process, tuned, handed
a 16 MiB block out of its heap; and untuned, glibc's own thresholds move with what the process
freed before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.broker.helpers import TOKEN_ENV
from tests.external import require_glibc, require_module

from .kit import api_target, write_daemon_config

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

_TUNING_SEEN = """
import importlib, json, runpy, sys
import trio
import affidavit.heap

calls = []
real = affidavit.heap.keep_freed_buffers

def observed():  # the tuning as it is, its answer kept (empty: glibc took both settings)
    calls.append(real())
    return calls[-1]

affidavit.heap.keep_freed_buffers = observed

async def loop(*args, **kwargs):  # in place of the daemon's (or the MCP server's) loop
    print(json.dumps(calls))

async def embedded(config):  # a program that embeds the broker, its calls run
    from affidavit.api.broker import Broker
    async with Broker.open(config):
        await loop()

where, *argv = sys.argv[1:]
if where == "broker":
    trio.run(embedded, *argv)
else:  # "module:name" replaced by the loop, then `python -m affidavit ARGV` as it runs
    module, _, name = where.partition(":")
    setattr(importlib.import_module(module), name, loop)
    sys.argv = ["affidavit", *argv]
    runpy.run_module("affidavit", run_name="__main__", alter_sys=True)
"""


def _env(**extra: str) -> dict[str, str]:
    """This environment without the operator's allocator settings (they would win)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    environ.pop("GLIBC_TUNABLES", None)
    return {**environ, **extra}


def _run(script: str, *argv: str, **env: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", script, *argv],
        check=True,
        capture_output=True,
        text=True,
        env=_env(**env),
        timeout=120,
    )
    return out.stdout


def _tuning_seen(*argv: str, **env: str) -> Any:
    """The answers of every ``keep_freed_buffers`` call made before the loop would run."""
    return json.loads(_run(_TUNING_SEEN, *argv, **env).splitlines()[-1])


def test_a_second_large_body_faults_in_no_fresh_buffers_where_untuned_it_does() -> None:
    require_glibc()
    # 48 reads of ~1 MiB, five buffers each, run twice; the second run's faults.  Untuned,
    # glibc gives each freed buffer back (the heap top trimmed past its own threshold, twice the
    # largest block it has freed) and faults the next one in: 65k pages here, run after run.
    tuned, untuned = int(_run(_READS, "tuned")), int(_run(_READS, "untuned"))
    assert tuned < 1000, (tuned, untuned)
    assert untuned > 10 * 1000, (tuned, untuned)  # the settings make the difference


@pytest.mark.parametrize(
    ("replaced", "argv", "tuned"),
    [
        ("affidavit.daemon:serve", "serve --config {config}", True),
        ("affidavit.mcp:run", "mcp --config {config}", True),  # embedded: it runs the calls
        ("affidavit.mcp:run", "mcp --socket {socket}", False),  # a proxy: it runs none
        ("broker", "{config}", False),  # a program that embeds the broker (Broker.open)
    ],
)
def test_serve_and_an_embedded_mcp_set_them_first_and_a_proxy_or_a_host_does_not(
    tmp_path: Path, token: str, replaced: str, argv: str, tuned: bool
) -> None:
    """Each entry point run as ``python -m affidavit`` runs it, up to its loop: the tuning
    called once before the loop, and glibc took both settings (``mallopt`` answered 1); a host
    program's allocator is left as it is."""
    require_glibc()
    if replaced.startswith("affidavit.mcp"):
        require_module("mcp", "mcp")
    socket = tmp_path / "affidavit.sock"
    config = write_daemon_config(tmp_path, api_target("http://127.0.0.1:9"), socket=socket)
    args = [arg.format(config=config, socket=socket) for arg in argv.split()]
    calls = _tuning_seen(replaced, *args, **{TOKEN_ENV: token})
    assert calls == ([[]] if tuned else []), (argv, calls)
