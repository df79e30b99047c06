"""Affidavit: a secrets broker whose every error is backed by durable evidence.

async with affidavit.Broker.open("affidavit.toml") as broker:
    envelope = await broker.call({...})
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Broker", "__version__"]

if TYPE_CHECKING:
    from affidavit.api.broker import Broker


def __getattr__(name: str) -> Any:
    # Lazy: `affidavit.statemachine` users (diagrams, property tests) need not import trio/h11.
    if name == "Broker":
        from affidavit.api.broker import Broker

        return Broker
    raise AttributeError(name)
