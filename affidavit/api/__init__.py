"""The Python API: ``Broker`` (the engine in the caller's process), ``Client`` (the same calls
made to the daemon over its socket) and the checked SDK style.

Lazy: ``affidavit.api.client`` and ``affidavit.api.wire`` are on the thin clients' path and must
not pull in the engine, the journal or cryptography that ``Broker`` needs."""

from __future__ import annotations

__all__ = ["AffidavitError", "Broker", "Client", "call_checked"]

TYPE_CHECKING = False  # not typing's: see affidavit/__init__.py

if TYPE_CHECKING:
    from typing import Any

    from affidavit.api.broker import Broker
    from affidavit.api.client import Client
    from affidavit.api.sdk import AffidavitError, call_checked


def __getattr__(name: str) -> Any:
    if name == "Broker":
        from affidavit.api.broker import Broker

        return Broker
    if name == "Client":
        from affidavit.api.client import Client

        return Client
    if name in ("AffidavitError", "call_checked"):
        from affidavit.api import sdk

        return getattr(sdk, name)
    raise AttributeError(name)
