"""Affidavit: a secrets broker whose every error is backed by durable evidence.

async with affidavit.Broker.open("affidavit.toml") as broker:      # embedded
    envelope = await broker.call({...})

async with affidavit.Client.open("/run/affidavit/affidavit.sock") as client:   # the daemon
    envelope = await client.call({...})
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Broker", "Client", "__version__"]

if TYPE_CHECKING:
    from affidavit.api.broker import Broker
    from affidavit.api.client import Client


def __getattr__(name: str) -> Any:
    # Lazy: `affidavit.statemachine` users (diagrams, property tests) need not import trio/h11,
    # and the thin clients need not import the engine (affidavit.api resolves these lazily too).
    if name in ("Broker", "Client"):
        from affidavit import api

        return getattr(api, name)
    raise AttributeError(name)
