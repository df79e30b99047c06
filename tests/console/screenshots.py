"""Regenerate the console screenshots in docs/console/ (linked from the README):

    python -m tests.console.screenshots [OUT_DIR]      # default: docs/console

A real daemon and scripted remotes (``kit.console_world``): one charge waits for an approval,
one transfer was applied by a remote that then hung up (unknown).  The approvals page and that
transfer's invocation page are captured by headless chromium.  Needs chromium and
chromium-driver; tests/console/test_screenshots.py runs it into a temporary directory.
"""

from __future__ import annotations

import secrets
import sys
import tempfile
from pathlib import Path

import trio

from .kit import CHARGE, DROPPED, browser, console_world

DOCS = Path(__file__).resolve().parents[2] / "docs" / "console"
PAGES = ("approvals.png", "invocation.png")


async def capture(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    token = "canary-" + secrets.token_urlsafe(24)
    with (
        tempfile.TemporaryDirectory(prefix="affidavit-shots-") as tmp,
        browser(1200, 860) as chrome,
    ):
        async with console_world(Path(tmp), token, wait="0s") as world:
            await world.call(dict(CHARGE, session="billing-agent", headers={"X-Request": "r-17"}))
            dropped = await world.call(dict(DROPPED, session="billing-agent"))
            await chrome.log_in(await world.login_url())
            await chrome.get(f"{world.origin}/approvals")
            shots = [out / PAGES[0]]
            await chrome.run(lambda d: d.save_screenshot(str(shots[0])))
            # Tall enough for the summary, the reconcile buttons and the lifecycle drawing.
            await chrome.run(lambda d: d.set_window_size(1200, 1500))
            await chrome.get(f"{world.origin}/invocations/{dropped['invocation_id']}")
            shots.append(out / PAGES[1])
            await chrome.run(lambda d: d.save_screenshot(str(shots[1])))
    return shots


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else DOCS
    for path in trio.run(capture, out):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
