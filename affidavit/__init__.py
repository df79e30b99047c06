"""Affidavit: a secrets broker whose every error is backed by durable evidence.

async with affidavit.Broker.open("affidavit.toml") as broker:      # embedded
    envelope = await broker.call({...})

async with affidavit.Client.open("/run/affidavit/affidavit.sock") as client:   # the daemon
    envelope = await client.call({...})
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["Broker", "Client", "__version__", "sdk"]

TYPE_CHECKING = False
"""``typing.TYPE_CHECKING`` without importing ``typing``: the modules on a thin client's path
(``affidavit call --socket``: this package, ``affidavit.api``, ``affidavit.api.wire``,
``affidavit.cli``, ``affidavit.cli.call``) spell it this way, which mypy reads as
``typing.TYPE_CHECKING``; importing ``typing`` costs such a process ~5 ms of its 100 ms budget."""

if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

    from affidavit.api.broker import Broker
    from affidavit.api.client import Client

    sdk: ModuleType


def __getattr__(name: str) -> Any:
    # Lazy: `affidavit.statemachine` users (diagrams, property tests) need not import trio/h11,
    # and the thin clients need not import the engine (affidavit.api resolves these lazily too).
    if name in ("Broker", "Client"):
        from affidavit import api

        return getattr(api, name)
    if name == "sdk":
        # `import affidavit` then `affidavit.sdk.call_checked(...)` (docs/deployment.md): the
        # submodule is an attribute only once imported, so import it here on first use.
        import affidavit.sdk as sdk  # not ``from . import sdk``: that asks this hook again

        return sdk
    raise AttributeError(name)
