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
    # Lazy: `affidavit.statemachine` users (diagrams, property tests) need not import trio/h11.
    if name == "Broker":
        from affidavit.api.broker import Broker

        return Broker
    if name == "Client":
        from affidavit.api.client import Client

        return Client
    raise AttributeError(name)
