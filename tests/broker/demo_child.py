"""``affidavit demo`` in its own process, held at a known point so that a test's SIGTERM lands
there -- not wherever the tour happens to be when the test reads its output.

    python demo_child.py slow [--keep]   the tour's server holds the caller-timeout scene's
                                         request for ever (its 0.5 s timeout lifted): prints
                                         "demo-child: /slow received" once it has it whole
    python demo_child.py open [--keep]   the broker never opens: prints "demo-child: opening"

Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import trio

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from affidavit.api.broker import Broker
from affidavit.cli import main, tour


def _say(line: str) -> None:
    sys.stdout.write(f"demo-child: {line}\n")
    sys.stdout.flush()


def _hold_slow() -> None:
    answer = tour.DemoServer._answer

    async def held(self: Any, conn: Any, stream: Any, request: Any, body: bytes) -> bool:
        if request.target.split(b"?", 1)[0] == b"/slow":
            _say("/slow received")  # the request read whole: the call is under way
            await trio.sleep_forever()
        return await answer(self, conn, stream, request, body)

    tour.DemoServer._answer = held  # type: ignore[method-assign]
    [n] = [i for i, (_, action, _) in enumerate(tour.SCENES) if action["path"] == "/slow"]
    title, action, _ = tour.SCENES[n]
    tour.SCENES[n] = (title, action, None)  # only the signal ends it, not its own timeout


def _hold_open() -> None:
    @contextlib.asynccontextmanager
    async def never(*args: Any, **kwargs: Any) -> AsyncIterator[Broker]:
        _say("opening")
        await trio.sleep_forever()
        yield  # type: ignore[misc]

    Broker.open = never  # type: ignore[assignment,method-assign]


if __name__ == "__main__":
    {"slow": _hold_slow, "open": _hold_open}[sys.argv[1]]()
    sys.exit(main(["demo", *sys.argv[2:]]))
