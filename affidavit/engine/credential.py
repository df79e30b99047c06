"""The credential step's one piece shared by a dispatch and an approval request: resolve the
target's credential and prepare the request with it.

Seed, "Validation and credential injection finish before dispatch": everything here is local;
a failure is a ``CredentialError`` (credential_injection, not_attempted) before any connection
exists.  An approval request prepares the request only to bind the credential's version and the
resolved injection (``approval.py``); the prepared request itself is dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from affidavit.protocols import Binding, Prepared
from affidavit.secrets.credentials import Credential, resolve

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["prepare_request"]


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
