"""``affidavit mcp``'s resident memory under a client that sends requests and reads nothing,
before and after the bounds on open requests (``transport.OPEN_MARGIN``, ``OPEN_BYTES``) and
on unwritten reads (``server.READS_OPEN``), side by side in one run.

    .venv/bin/python tests/benchmarks/mcp_unread.py [--pinned N] [--listings M]

Each mode is a fresh embedded server (``[service] max_calls = 256``, the default) on a fresh
journal.  ``before``: the same code with the three bounds lifted (set to 10**12 in the server
process), as it was before them (the 30 s write limit plays no part within ``SEND_FOR``);
``after``: as shipped.  Scenarios, each after 40 ``tools/list`` requests that fill the stdout
pipe:

* ``pinned``: N ``list_targets`` calls each carrying a 5 MiB unknown argument (refused: the
  request is held until its answer is written);
* ``listings``: 150 calls, read back, then M ``list_actions`` with ``limit`` 1000, unread.

The client's writes run ``SEND_FOR`` seconds at most (after the bound they stall: the
server's OVERLOADED answers wait on the full pipe, its reader with them); then VmRSS and VmHWM
of the server are read from /proc (``idle``: its VmRSS just before the scenario's requests).
A script, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.broker.helpers import TOKEN_ENV, http_target, write_config
from tests.http.hostile import HostileServer, Reply, scripts
from tests.mcp.kit import PYTHON, env_without_secrets
from tests.mcp.test_protocol import FAST, INIT, Raw, call

SEND_FOR = 20.0
LIFTED = (
    "import sys, affidavit.mcp.transport as t, affidavit.mcp.server as s; "
    "t.OPEN_MARGIN = t.OPEN_BYTES = s.READS_OPEN = 10**12; "
    "from affidavit.cli import main; sys.exit(main())"
)


def status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of ``pid``, MiB (and ``measure``: ``idle``, VmRSS before the scenario)."""
    found = {}
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = row.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) // 1024
    return found


async def measure(lifted: bool, scenario: str, count: int, url: str) -> dict[str, int]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = write_config(Path(tmp), {"ok": http_target(url)})
        cfg.write_text(cfg.read_text() + "\n[service]\nmax_calls = 256\n")
        head = ["-c", LIFTED] if lifted else ["-m", "affidavit"]
        log = Path(tmp) / "mcp.log"
        with log.open("ab") as errlog:
            proc = await trio.lowlevel.open_process(
                [PYTHON, *head, "mcp", "--config", str(cfg)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errlog,
                env=env_without_secrets(**{TOKEN_ENV: "bench-token"}),
            )
        raw = Raw(proc, log)
        try:
            await raw.send(INIT)
            await raw.answer(0)
            await raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            if scenario == "listings":
                for n in range(150):
                    await raw.send(call(f"seed{n}", "http_request", FAST))
                    await raw.answer(f"seed{n}")
            for n in range(40):
                await raw.send({"jsonrpc": "2.0", "id": f"fill{n}", "method": "tools/list"})
            await trio.sleep(1)
            idle = status(proc.pid)["VmRSS"]
            with trio.move_on_after(SEND_FOR):
                for n in range(count):
                    await raw.send(request(scenario, n))
            await trio.sleep(2)
            return {"idle": idle, **status(proc.pid)}
        finally:
            proc.kill()
            await proc.wait()


def request(scenario: str, n: int) -> dict[str, Any]:
    if scenario == "pinned":
        return call(n, "list_targets", {"pad": "A" * (5 << 20)})
    return call(n, "list_actions", {"limit": 1000})


def figures(found: dict[str, int]) -> str:
    return f"{found['idle']}/{found['VmRSS']}/{found['VmHWM']}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pinned", type=int, default=60)
    parser.add_argument("--listings", type=int, default=3000)
    counts = vars(parser.parse_args())
    print(
        f"{'scenario':<20}{'before idle/RSS/HWM MiB':>26}{'after idle/RSS/HWM MiB':>26}"
        f"{'HWM ratio':>11}"
    )
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as remote:
        for scenario, count in counts.items():
            before = await measure(True, scenario, count, remote.url)
            after = await measure(False, scenario, count, remote.url)
            shown = f"{scenario} x{count}"
            ratio = before["VmHWM"] / max(after["VmHWM"], 1)
            print(
                f"{shown:<20}{figures(before):>26}{figures(after):>26}{ratio:>10.1f}x", flush=True
            )
    print(json.dumps({"send_for_s": SEND_FOR}))


if __name__ == "__main__":
    trio.run(main)
