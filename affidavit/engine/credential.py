"""The credential step shared by a dispatch and an approval request: write the events before
it, resolve the target's credential and prepare the request with it.

Seed, "Validation and credential injection finish before dispatch": everything here is local;
a failure is a ``CredentialError`` (credential_injection, not_attempted) before any connection
exists.  An approval request prepares the request only to bind the credential's version and the
resolved injection (``approval.py``); the prepared request itself is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from affidavit.protocols import Binding, Prepared
from affidavit.secrets.credentials import Credential, CredentialError, resolve
from affidavit.statemachine import Event, EventKind

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["Preamble", "prepare_request", "write_and_prepare"]

Preamble = tuple[tuple[Event, Mapping[str, Any] | None], ...]
"""Events written before the credential step, each with its sealed payload (or None)."""


def prepare_request(
    engine: Engine, action: Any, target: Any, binding: Binding, key: str | None
) -> tuple[Credential, Prepared]:
    """Resolve the target's credential and prepare the request with it (``CredentialError``)."""
    credential = resolve(
        target.credential,
        vault=engine.vault,
        base_dir=engine.config.path.parent if engine.config.path else None,
    )
    return credential, binding.prepare(action, target, credential, key)


async def write_and_prepare(
    engine: Engine,
    iid: str,
    action: Any,
    target: Any,
    binding: Binding,
    key: str | None,
    preamble: Preamble,
) -> tuple[Credential, Prepared] | dict[str, Any]:
    """Write ``preamble``, then resolve the credential and prepare the request; a
    ``CredentialError`` is recorded CREDENTIAL_FAILED and its envelope returned.  The caller
    holds a shield over this and whatever it writes next (one cancel scope for the section)."""
    recorder = engine.recorder
    for event, payload in preamble:
        await recorder.write(event, payload=payload)
    try:
        return prepare_request(engine, action, target, binding, key)
    except CredentialError as exc:
        failed = Event(EventKind.CREDENTIAL_FAILED, iid, {"code": exc.code.value})
        return await recorder.finish(iid, failed)
